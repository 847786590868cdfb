"""Static anti-cheat check of a candidate's source, before anything of it runs.

Flags, with the offending line: threads, processes and subprocesses; assigning attributes of
torch / time / triton / builtins / the harness (monkey-patching timers or comparisons); frame and
garbage-collector inspection; file, environment and network access; Tensor subclasses and
``__torch_function__`` overrides; extra CUDA streams; calling the reference ``forward``.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

BANNED_MODULES = {
    "threading": "starts threads", "_thread": "starts threads", "multiprocessing": "starts processes",
    "concurrent": "starts threads or processes", "subprocess": "runs subprocesses",
    "socket": "opens network connections", "urllib": "reads the network", "http": "reads the network",
    "requests": "reads the network", "httpx": "reads the network", "inspect": "inspects frames",
    "gc": "inspects the garbage collector", "ctypes": "touches raw memory", "pickle": "loads pickled data",
    "shelve": "reads files", "tempfile": "writes files", "shutil": "touches files",
    "pathlib": "touches files", "io": "reads files", "signal": "changes signal handlers",
    "importlib": "imports dynamically", "harness": "imports the EGG harness",
    "sys": "reaches into the interpreter", "os": "touches files or the environment",
    "time": "reads or patches timers", "builtins": "patches builtins", "marshal": "loads code",
}
PATCH_TARGETS = {"torch", "time", "triton", "builtins", "tl", "F", "nn", "math", "numpy", "np",
                 "harness", "sys", "os", "random"}
BANNED_CALLS = {
    "open": "opens files", "exec": "executes generated code", "eval": "evaluates generated code",
    "compile": "compiles generated code", "__import__": "imports dynamically",
    "setattr": "sets attributes dynamically", "globals": "reads module globals",
    "breakpoint": "enters a debugger", "input": "reads stdin",
}
BANNED_ATTRS = {
    "_getframe": "inspects frames", "f_back": "inspects frames", "f_locals": "inspects frames",
    "f_globals": "inspects frames", "Stream": "uses another CUDA stream", "stream": "switches CUDA streams",
    "__torch_function__": "overrides torch functions", "__torch_dispatch__": "overrides torch dispatch",
    "set_flush_denormal": "changes float behaviour",
    "allow_tf32": "changes matmul precision", "set_float32_matmul_precision": "changes matmul precision",
    "manual_seed": "seeds the random generator",
}


@dataclass
class Finding:
    line: int
    code: str
    why: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.why}: {self.code.strip()}"


def _root(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    if isinstance(node, ast.Name):
        return node.id
    return None


def check_source(source: str, skip_lines: int = 0) -> list[Finding]:
    """Findings in the source; lines up to ``skip_lines`` (the problem's own code) are trusted."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        return [Finding(e.lineno or 0, "", f"does not parse: {e.msg}")]
    lines = source.splitlines()
    out: list[Finding] = []

    def add(node: ast.AST, why: str) -> None:
        ln = getattr(node, "lineno", 0)
        if ln > skip_lines:
            out.append(Finding(ln, lines[ln - 1] if 0 < ln <= len(lines) else "", why))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                top = a.name.split(".")[0]
                if top in BANNED_MODULES:
                    add(node, f"imports {a.name} ({BANNED_MODULES[top]})")
        elif isinstance(node, ast.ImportFrom):
            top = (node.module or "").split(".")[0]
            if top in BANNED_MODULES:
                add(node, f"imports from {node.module} ({BANNED_MODULES[top]})")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for t in targets:
                if isinstance(t, ast.Attribute) and _root(t) in PATCH_TARGETS:
                    add(node, f"changes an attribute of {_root(t)} (monkey-patching)")
                if isinstance(t, ast.Attribute) and t.attr in ("forward", "__call__") and _root(t) != "self":
                    add(node, "replaces a forward or __call__ method")
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id in BANNED_CALLS:
                add(node, BANNED_CALLS[f.id])
            if isinstance(f, ast.Attribute) and f.attr == "forward":
                base = f.value
                if isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super":
                    add(node, "calls the reference forward (super().forward)")
                elif isinstance(base, ast.Name) and base.id == "Model":
                    add(node, "calls the reference Model.forward")
        elif isinstance(node, ast.Attribute):
            why = BANNED_ATTRS.get(node.attr)
            if why:
                add(node, why)
        elif isinstance(node, ast.ClassDef):
            for b in node.bases:
                if isinstance(b, ast.Attribute) and b.attr == "Tensor":
                    add(node, "subclasses torch.Tensor")
                if isinstance(b, ast.Name) and b.id == "Tensor":
                    add(node, "subclasses torch.Tensor")
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            add(node, "writes global state (results could be cached across calls)")
    return sorted(out, key=lambda f: f.line)
