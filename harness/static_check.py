"""Static anti-cheat check of a candidate's source, before anything of it runs.

Flags, with the offending line: threads, processes and subprocesses; changing attributes of
imported modules (torch, time, triton, builtins, ...: monkey-patching timers or comparisons);
frame, garbage-collector and interpreter introspection; file, environment and network access;
loading native code; Tensor subclasses, ``__torch_function__`` overrides and pickling hooks;
extra CUDA streams; changing global numeric modes (TF32, thread counts); seeding or setting the
random generator (lookup tables of the reference's inputs); building or calling the reference
``Model``.

It also flags the roads around those rules that pass through allowed modules: a dangerous
module reached as an attribute (``torch.os``, ``torch.sys.modules``, ``triton.runtime.build.
subprocess``, ``torch._jit_internal.builtins``, ``...atexit``), dangerous functions by name on any
object (``.system``, ``.popen``, ``.fork``, ``.exec``, ``.b64decode``, ``.decompress``, ``.loads``,
``.finalize``, ...), payload decoders (``base64``, ``zlib``, ``marshal``, ...), replacing a timer or
a comparison on any object (``m.perf_counter = ...``), the reference's ``Model`` reached as an
attribute or another class's ``forward`` called on ``self``, and ``getattr`` passed around as a
value. A computed ``getattr`` on an allowed module (``getattr(torch, name)``, ``getattr(tl, op)``)
or on ``self`` is allowed: what it could reach is the operating system's sandbox's business
(harness.sandbox), not this filter's.

It is a first line, not the only one: the judge process never trusts the candidate's process
(see harness.worker), and the candidate process runs in an OS sandbox (harness.sandbox). Code
under ``if __name__ == "__main__":`` never runs when a candidate is imported and is not checked.
Honest Triton candidates (``torch``, ``triton``, ``math``, ...) trip none of these rules.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

#: modules whose import alone is a finding (matched on the top-level package)
BANNED_MODULES = {
    "threading": "starts threads", "_thread": "starts threads", "multiprocessing": "starts processes",
    "concurrent": "starts threads or processes", "subprocess": "runs subprocesses",
    "asyncio": "starts threads or subprocesses", "_posixsubprocess": "runs subprocesses",
    "pty": "runs subprocesses", "socket": "opens network connections", "ssl": "opens network connections",
    "socketserver": "opens network connections", "selectors": "waits on file descriptors",
    "urllib": "reads the network", "http": "reads the network", "ftplib": "reads the network",
    "smtplib": "reads the network", "xmlrpc": "reads the network", "requests": "reads the network",
    "httpx": "reads the network", "aiohttp": "reads the network",
    "inspect": "inspects frames", "traceback": "inspects frames", "gc": "inspects the garbage collector",
    "ctypes": "touches raw memory", "_ctypes": "touches raw memory", "cffi": "touches raw memory",
    "mmap": "maps files or raw memory", "pickle": "loads pickled data", "_pickle": "loads pickled data",
    "copyreg": "changes pickling", "dill": "loads pickled data", "cloudpickle": "loads pickled data",
    "joblib": "loads pickled data or starts processes", "marshal": "loads code",
    "shelve": "reads files", "tempfile": "writes files", "shutil": "touches files",
    "pathlib": "touches files", "io": "reads files", "_io": "reads files", "codecs": "reads files",
    "glob": "lists files", "fileinput": "reads files", "linecache": "reads files",
    "zipfile": "reads files", "tarfile": "reads files", "sqlite3": "reads files",
    "signal": "changes signal handlers", "resource": "changes process limits",
    "fcntl": "touches file descriptors", "atexit": "runs code at exit",
    "importlib": "imports dynamically", "pkgutil": "imports dynamically", "zipimport": "imports dynamically",
    "runpy": "runs other code", "code": "compiles code", "codeop": "compiles code",
    "types": "builds functions or code objects", "harness": "imports the EGG harness",
    "sys": "reaches into the interpreter", "os": "touches files or the environment",
    "posix": "touches files or the environment", "time": "reads or patches timers",
    "builtins": "patches builtins", "weakref": "runs code when objects die or at exit",
    "base64": "decodes a payload", "binascii": "decodes a payload", "zlib": "decompresses a payload",
    "bz2": "decompresses a payload", "lzma": "decompresses a payload", "gzip": "decompresses a payload",
    "site": "changes the import path", "sysconfig": "reaches the environment's paths",
    "select": "waits on file descriptors", "operator": "reaches attributes by name",
}
#: modules that are findings when reached as an attribute of anything (``torch.os``,
#: ``triton.runtime.build.subprocess``): the banned modules, less the names that are also torch
#: submodules or ordinary attribute names (signal, random, types, code, operator)
ATTR_MODULES = {m: why for m, why in BANNED_MODULES.items()
                if m not in ("signal", "types", "code", "codeop", "harness", "operator", "select")}
#: functions that are findings by name on any object: shells, processes, exit hooks, payloads,
#: the environment, files, raw memory (none is a name an honest kernel module uses)
DANGEROUS_ATTRS = {
    **{n: "runs a shell command or a program" for n in (
        "system", "popen", "Popen", "getoutput", "getstatusoutput", "check_output", "check_call",
        "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe",
        "execl", "execle", "execlp", "execlpe", "execv", "execve", "execvp", "execvpe",
        "posix_spawn", "posix_spawnp", "startfile")},
    **{n: "starts or signals processes" for n in (
        "fork", "forkpty", "vfork", "kill", "killpg", "setsid", "setpgid", "setpgrp", "daemon",
        "register_at_fork", "pidfd_open")},
    **{n: "runs code at exit" for n in ("finalize", "Finalize", "_register_atexit", "_exithandlers",
                                        "exitfunc", "_exit_function")},
    **{n: "runs generated code" for n in ("exec", "exec_module", "run_code", "run_module",
                                          "run_path", "import_module", "find_spec", "loads")},
    **{n: "decodes a payload" for n in ("b64decode", "b32decode", "b16decode", "a85decode",
                                        "b85decode", "decodebytes", "decompress", "unhexlify",
                                        "a2b_base64", "a2b_hex")},
    **{n: "touches the environment or files" for n in (
        "environ", "getenv", "putenv", "unsetenv", "listdir", "scandir", "unlink", "rmdir",
        "removedirs", "mkdir", "makedirs", "chmod", "chown", "symlink", "write_text", "write_bytes",
        "read_text", "read_bytes", "fdopen", "dup2", "pipe", "mkfifo", "truncate", "chdir")},
    **{n: "touches raw memory or native code" for n in (
        "CDLL", "cdll", "PyDLL", "pydll", "LoadLibrary", "dlopen", "pythonapi", "string_at",
        "memmove", "memset", "addressof", "from_address", "cast_to")},
    **{n: "reaches attributes by name" for n in ("attrgetter", "methodcaller")},
    "modules": "reaches the interpreter's loaded modules (sys.modules)",
}
#: attribute names replaced (assigned on anything but ``self``) only to fool a timer or a comparison
TIMER_ATTRS = {"perf_counter", "perf_counter_ns", "time", "time_ns", "monotonic", "monotonic_ns",
               "process_time", "thread_time", "elapsed_time", "synchronize", "record", "query",
               "do_bench", "do_bench_cudagraph", "allclose", "isclose", "equal", "assert_close",
               "testing", "Event", "sleep"}
#: module roots on which a computed getattr is fine (``getattr(torch, name)``, ``getattr(tl, op)``)
GETATTR_OK = ("torch", "triton", "math", "numpy")
#: dotted names (after resolving import aliases) that are findings wherever they appear
BANNED_DOTTED = {
    "torch.multiprocessing": "starts processes", "torch.distributed": "talks to other processes",
    "torch.hub": "reads the network", "torch.utils.cpp_extension": "compiles and loads native code",
    "torch.ops.load_library": "loads native code", "torch.classes.load_library": "loads native code",
    "torch.load": "reads files", "torch.save": "writes files", "torch.from_file": "reads files",
    "numpy.load": "reads files", "numpy.save": "writes files", "numpy.savez": "writes files",
    "numpy.fromfile": "reads files", "numpy.loadtxt": "reads files", "numpy.savetxt": "writes files",
    "numpy.genfromtxt": "reads files", "numpy.memmap": "maps files",
    "triton.testing": "uses the harness's timers",
}
#: plain names that are findings wherever they are used (called or passed around)
BANNED_NAMES = {
    "open": "opens files", "exec": "executes generated code", "eval": "evaluates generated code",
    "compile": "compiles generated code", "__import__": "imports dynamically",
    "setattr": "sets attributes dynamically", "delattr": "deletes attributes dynamically",
    "globals": "reads module globals", "locals": "reads frame locals", "vars": "reads object namespaces",
    "breakpoint": "enters a debugger", "__builtins__": "reaches the builtins",
    "__loader__": "reaches the module loader", "__spec__": "reaches the module loader",
}
#: attribute names that are findings on any object
BANNED_ATTRS = {
    "_getframe": "inspects frames", "f_back": "inspects frames", "f_locals": "inspects frames",
    "f_globals": "inspects frames", "f_builtins": "inspects frames", "f_code": "inspects frames",
    "tb_frame": "inspects frames", "gi_frame": "inspects frames", "cr_frame": "inspects frames",
    "ag_frame": "inspects frames", "currentframe": "inspects frames", "settrace": "traces execution",
    "setprofile": "traces execution",
    "Stream": "uses another CUDA stream", "ExternalStream": "uses another CUDA stream",
    "stream": "switches CUDA streams", "set_stream": "switches CUDA streams",
    "StreamContext": "switches CUDA streams",
    "__torch_function__": "overrides torch functions", "__torch_dispatch__": "overrides torch dispatch",
    "_make_subclass": "builds a Tensor subclass", "_make_wrapper_subclass": "builds a Tensor subclass",
    "as_subclass": "builds a Tensor subclass",
    "set_flush_denormal": "changes float behaviour", "allow_tf32": "changes matmul precision",
    "set_float32_matmul_precision": "changes matmul precision",
    "allow_fp16_reduced_precision_reduction": "changes matmul precision",
    "allow_bf16_reduced_precision_reduction": "changes matmul precision",
    "set_default_dtype": "changes torch's default dtype", "set_default_device": "changes torch's default device",
    "set_num_threads": "changes torch's thread count", "set_num_interop_threads": "changes torch's thread count",
    "set_per_process_memory_fraction": "changes the memory limit",
    "manual_seed": "seeds the random generator", "manual_seed_all": "seeds the random generator",
    "set_rng_state": "sets the random generator state",
    "set_state": "sets the random generator state", "fork_rng": "sets the random generator state",
    "load_library": "loads native code", "load_inline": "compiles and loads native code",
    "fromfile": "reads files", "tofile": "writes files", "from_file": "reads files",
    # dunders that reach around the language: patching, introspection, pickling tricks
    "__builtins__": "reaches the builtins", "__globals__": "reaches module globals",
    "__code__": "reaches code objects", "__closure__": "reaches closures",
    "__subclasses__": "walks the class hierarchy", "__bases__": "walks the class hierarchy",
    "__base__": "walks the class hierarchy", "__mro__": "walks the class hierarchy",
    "__dict__": "reaches an object's namespace", "__class__": "reaches an object's class",
    "__getattribute__": "reaches attributes dynamically", "__setattr__": "sets attributes dynamically",
    "__delattr__": "deletes attributes dynamically", "__import__": "imports dynamically",
    "__loader__": "reaches the module loader", "__spec__": "reaches the module loader",
    "__reduce__": "changes pickling", "__reduce_ex__": "changes pickling",
    "__self__": "reaches bound objects", "__func__": "reaches bound functions",
    "__defaults__": "changes function defaults", "__kwdefaults__": "changes function defaults",
    "__wrapped__": "reaches wrapped functions",
}
#: methods a candidate may not define (pickling hooks run code in whoever unpickles; finalizers and
#: attribute hooks run code at unpredictable times)
BANNED_DEFS = {
    "__reduce__": "defines a pickling hook", "__reduce_ex__": "defines a pickling hook",
    "__getstate__": "defines a pickling hook", "__setstate__": "defines a pickling hook",
    "__del__": "defines a finalizer", "__getattribute__": "intercepts attribute access",
    "__getattr__": "intercepts attribute access", "__torch_function__": "overrides torch functions",
    "__torch_dispatch__": "overrides torch dispatch", "__init_subclass__": "hooks class creation",
    "__set_name__": "hooks class creation",
}
#: names that are module-like roots even when not imported in the candidate
PATCH_TARGETS = {"torch", "time", "triton", "builtins", "tl", "F", "nn", "math", "numpy", "np",
                 "harness", "sys", "os", "random"}
TENSOR_CLASSES = {"Tensor", "Parameter", "Buffer"}


@dataclass
class Finding:
    line: int
    code: str
    why: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.why}: {self.code.strip()}"


def _root(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    if isinstance(node, ast.Name):
        return node.id
    return None


def _dotted(node: ast.AST) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


def _is_main_guard(node: ast.AST) -> bool:
    """``if __name__ == "__main__":`` (either side)."""
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    t = node.test
    sides = [t.left] + list(t.comparators)
    names = any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides)
    main = any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides)
    return names and main and len(t.ops) == 1 and isinstance(t.ops[0], ast.Eq)


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Names bound to modules (import statements and plain re-bindings) -> dotted module path."""
    al: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    al[a.asname] = a.name
                else:
                    top = a.name.split(".")[0]
                    al[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                al[a.asname or a.name] = f"{node.module}.{a.name}"
    for _ in range(3):  # t = torch; F = t.nn.functional (flow-insensitive, a few rounds)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                d = _dotted(node.value)
                if d and (d[0] in al or d[0] in PATCH_TARGETS) and node.targets[0].id not in al:
                    al[node.targets[0].id] = ".".join([al.get(d[0], d[0])] + d[1:])
    return al


def check_source(source: str, skip_lines: int = 0) -> list[Finding]:
    """Findings in the source; lines up to ``skip_lines`` (the problem's own code) are trusted."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        return [Finding(e.lineno or 0, "", f"does not parse: {e.msg}")]
    lines = source.splitlines()
    out: list[Finding] = []
    seen: set[tuple[int, str]] = set()
    skipped: set[int] = set()
    for node in tree.body:
        if _is_main_guard(node):
            skipped.update(id(n) for n in ast.walk(node))
    al = _aliases(tree)
    roots = set(al) | PATCH_TARGETS
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}

    def _getattr_ok(obj: ast.AST) -> bool:
        d = _dotted(obj)
        if not d:
            return False
        if d == ["self"]:
            return True
        full = resolve(d)
        if any(full == b or full.startswith(b + ".") for b in BANNED_DOTTED):
            return False
        return full.split(".")[0] in GETATTR_OK and (d[0] in al or d[0] in PATCH_TARGETS)

    def add(node: ast.AST, why: str) -> None:
        ln = getattr(node, "lineno", 0)
        if ln > skip_lines and (ln, why) not in seen:
            seen.add((ln, why))
            out.append(Finding(ln, lines[ln - 1] if 0 < ln <= len(lines) else "", why))

    def resolve(d: list[str]) -> str:
        full = ".".join([al.get(d[0], d[0])] + d[1:])
        return "numpy." + full[3:] if full.startswith("np.") else full

    def check_dotted(node: ast.AST) -> None:
        d = _dotted(node)
        if not d:
            return
        full = resolve(d)
        for bad, why in BANNED_DOTTED.items():
            if full == bad or full.startswith(bad + "."):
                add(node, f"uses {bad} ({why})")

    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            for a in node.names:
                top = a.name.split(".")[0]
                if top in BANNED_MODULES:
                    add(node, f"imports {a.name} ({BANNED_MODULES[top]})")
                for bad, why in BANNED_DOTTED.items():
                    if a.name == bad or a.name.startswith(bad + "."):
                        add(node, f"imports {a.name} ({why})")
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            top = mod.split(".")[0]
            if node.level:
                add(node, "imports relative to its location (reaches other files)")
            elif top in BANNED_MODULES:
                add(node, f"imports from {mod} ({BANNED_MODULES[top]})")
            for a in node.names:
                full = f"{mod}.{a.name}"
                if a.name in ATTR_MODULES and top not in BANNED_MODULES:
                    add(node, f"imports module {a.name} from {mod} ({ATTR_MODULES[a.name]})")
                if a.name in DANGEROUS_ATTRS:
                    add(node, f"imports {a.name} ({DANGEROUS_ATTRS[a.name]})")
                for bad, why in BANNED_DOTTED.items():
                    if full == bad or full.startswith(bad + ".") or mod == bad or mod.startswith(bad + "."):
                        add(node, f"imports {full} ({why})")
                if a.name in BANNED_ATTRS:
                    add(node, f"imports {a.name} ({BANNED_ATTRS[a.name]})")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            flat = []
            for t in targets:
                flat.extend(t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])
            for t in flat:
                r = _root(t)
                if isinstance(t, (ast.Attribute, ast.Subscript)) and r in roots:
                    add(node, f"changes an attribute of {al.get(r, r)} (monkey-patching)")
                if isinstance(t, ast.Attribute) and t.attr in ("forward", "__call__") and r != "self":
                    add(node, "replaces a forward or __call__ method")
                if isinstance(t, ast.Attribute) and t.attr in TIMER_ATTRS and r != "self":
                    add(node, f"replaces {t.attr} (a timer or a comparison)")
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id == "getattr" and len(node.args) >= 2:
                a = node.args[1]
                if not (isinstance(a, ast.Constant) and isinstance(a.value, str)):
                    if not _getattr_ok(node.args[0]):
                        add(node, "reads attributes by computed name (getattr)")
                elif a.value in BANNED_ATTRS:
                    add(node, BANNED_ATTRS[a.value])
                elif a.value in ATTR_MODULES:
                    add(node, f"reaches module {a.value} through an attribute ({ATTR_MODULES[a.value]})")
                elif a.value in DANGEROUS_ATTRS:
                    add(node, DANGEROUS_ATTRS[a.value])
                elif a.value == "Model":
                    add(node, "reaches the reference Model")
                elif a.value.startswith("__"):
                    add(node, "reads a dunder attribute by name (getattr)")
            if isinstance(f, ast.Attribute) and f.attr == "forward" and node.args \
                    and isinstance(node.args[0], ast.Name) and node.args[0].id == "self":
                add(node, "calls another class's forward on self")
            if isinstance(f, ast.Name) and f.id == "type" and len(node.args) == 3:
                add(node, "creates a class dynamically")
            if isinstance(f, ast.Name) and f.id == "Model":
                add(node, "builds the reference Model")
            if isinstance(f, ast.Attribute) and f.attr == "forward":
                base = f.value
                if isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super":
                    add(node, "calls the reference forward (super().forward)")
                elif isinstance(base, ast.Name) and base.id == "Model":
                    add(node, "calls the reference Model.forward")
        elif isinstance(node, ast.Name):
            if node.id in BANNED_NAMES and node.id not in al:  # imported names are not the builtins
                add(node, BANNED_NAMES[node.id])
            if node.id == "getattr" and id(node) not in called:
                add(node, "passes getattr around (reads attributes by name)")
        elif isinstance(node, ast.Attribute):
            why = BANNED_ATTRS.get(node.attr)
            if why:
                add(node, why)
            if node.attr in ATTR_MODULES:
                add(node, f"reaches module {node.attr} through an attribute ({ATTR_MODULES[node.attr]})")
            if node.attr in DANGEROUS_ATTRS and not (node.attr == "modules" and id(node) in called):
                add(node, DANGEROUS_ATTRS[node.attr])  # self.modules() is nn.Module's
            if node.attr == "Model":
                add(node, "reaches the reference Model")
            check_dotted(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name in BANNED_DEFS:
                add(node, BANNED_DEFS[node.name])
        elif isinstance(node, ast.ClassDef):
            for b in node.bases:
                d = _dotted(b)
                if d and (d[-1] in TENSOR_CLASSES or resolve(d) in ("torch.Tensor", "torch.nn.Parameter")):
                    add(node, f"subclasses torch.{d[-1]}")
    return sorted(out, key=lambda f: f.line)
