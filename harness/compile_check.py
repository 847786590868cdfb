"""Compile check: compile every Triton kernel of a candidate file for a GPU target without a
GPU and without launching anything (principle tile-prune-rules: rules, then the compile check,
then timing).

A child process imports the candidate with Triton's ``JITFunction.run`` replaced by a recorder,
runs ``ModelNew`` on meta tensors of the problem's shapes (or on given example arguments), and
compiles each recorded launch with ``triton.compile(ASTSource(...), target=GPUTarget(...))``,
binding the arguments exactly as a real launch would (same signature, constexprs, alignment
attributes and options, hence the same Triton cache entry: on the GPU machine the check also
pre-compiles the kernels the profiler will load). It then compares the kernel's shared memory
with the device limit and reads registers and local memory (spills) from the cubin with
``cuobjdump -res-usage``.

A failure is one of: ``compile`` (Triton or ptxas rejected the kernel: type errors, dot shapes),
``shared_memory`` (more than the device's per-block limit), ``spills`` (local memory in use,
when asked to reject it), ``run`` (the candidate's own Python failed before a launch),
``timeout``, ``crash``.

Run many candidates at once with :func:`check_files` (one process each, ``jobs`` at a time).
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

#: Hopper's opt-in shared memory per block (H100/H200), the default limit.
SM90_SMEM = 232448


@dataclass
class KernelCheck:
    kernel: str
    ok: bool
    category: str = ""  # "" | compile | shared_memory | spills
    reason: str = ""
    shared: int | None = None  # bytes of dynamic shared memory (Triton's metadata)
    n_regs: int | None = None  # registers per thread (cubin)
    local_bytes: int | None = None  # local memory per thread (cubin): spills or stack arrays
    num_warps: int | None = None
    num_stages: int | None = None
    constexprs: dict = field(default_factory=dict)
    compile_s: float = 0.0
    #: global loads and stores by PTX form ("ld.global.v4.b32": 6, "ld.global.b16": 16, ...):
    #: a 16-bit operand read by scalar ``ld.global.b16`` where the others are ``.v4`` is one
    #: whose index the compiler could not prove contiguous (a memory-bound kernel's smell)
    global_access: dict = field(default_factory=dict)
    #: fp32 divisions and square roots by PTX form ("div.rn.f32": 2, ...): ``div.full.f32`` and
    #: ``sqrt.approx`` are Triton's `/` and tl.sqrt, within 2 ulp of eager's IEEE result
    float_forms: dict = field(default_factory=dict)


@dataclass
class FileCheck:
    path: str
    ok: bool
    kernels: list[KernelCheck] = field(default_factory=list)
    category: str = ""  # the first failure's category
    reason: str = ""
    inputs: str = ""  # meta | cpu | given
    wall_s: float = 0.0

    @property
    def spills(self) -> bool:
        return any((k.local_bytes or 0) > 0 for k in self.kernels)

    def summary(self) -> str:
        if not self.ok:
            return f"[{self.category}] {self.reason}"
        parts = [f"{k.kernel}: smem {k.shared}B, regs {k.n_regs}, local {k.local_bytes}B" for k in self.kernels]
        return "; ".join(parts) or "no kernel launched"

    @classmethod
    def from_dict(cls, d: dict) -> "FileCheck":
        ks = [KernelCheck(**k) for k in d.pop("kernels", [])]
        return cls(kernels=ks, **d)


# ----------------------------------------------------------------------------- EGG side
def target_of(hw) -> dict:
    """Target arguments for a HardwareInfo (or a HardwareProfile): arch number and smem limit."""
    arch = str(getattr(hw, "arch", "") or "")
    m = re.match(r"sm_(\d+)", arch)
    return {"arch": int(m.group(1)) if m else 90,
            "smem_limit": int(getattr(hw, "smem_per_block", 0) or SM90_SMEM)}


def check_file(path: str | os.PathLike, *, args_file: str | None = None, call: str | None = None,
               **kw) -> FileCheck:
    """Compile every kernel a candidate file launches, in a child process, without a GPU.

    Options (also of :func:`check_files`): ``arch`` (90: sm_90), ``warp_size``, ``smem_limit``
    (bytes per block), ``reject_spills``, ``inputs`` (``meta``: the problem's get_inputs() on
    the meta device, falling back to real CPU tensors when the forward cannot run on meta;
    ``cpu``), ``timeout_s`` (per file), ``cache_dir`` (TRITON_CACHE_DIR). ``args_file``: a
    ``torch.save``d list of example arguments, passed to ``call`` (a wrapper such as
    ``_egg_g0``) or, when ``call`` is None, to ``ModelNew.forward``.
    """
    return _run_batch([{"path": str(path), "args_file": args_file, "call": call}], **kw)[0]


def check_files(paths, jobs: int | None = None, **kw) -> list[FileCheck]:
    """check_file for many candidates, results in order: ``jobs`` child processes at a time,
    each compiling a share of the files one after another (torch and Triton are imported once
    per process, not once per file)."""
    items = [{"path": str(p), "args_file": None, "call": None} for p in paths]
    if not items:
        return []
    n = max(1, min(jobs or default_jobs(), len(items)))
    shares = [list(range(i, len(items), n)) for i in range(n)]
    out: list[FileCheck | None] = [None] * len(items)
    with ThreadPoolExecutor(max_workers=n) as ex:
        runs = ex.map(lambda sh: _run_batch([items[i] for i in sh], **kw), shares)
        for share, res in zip(shares, runs):
            for i, r in zip(share, res):
                out[i] = r
    return out  # type: ignore[return-value]


#: seconds a compile-check process may take to start (import torch and Triton) beyond the
#: per-file limit (measured: 4-6 s on an idle 2-core machine, 3 s on the H200 machine's CPUs).
STARTUP_S = 30.0


def _run_batch(items: list[dict], *, arch: int = 90, warp_size: int = 32,
               smem_limit: int = SM90_SMEM, reject_spills: bool = False, inputs: str = "meta",
               timeout_s: float = 300.0, cache_dir: str | None = None,
               startup_s: float = STARTUP_S) -> list[FileCheck]:
    """One child process compiles the files in turn, printing one JSON line per file; a file
    that hangs or kills the process is reported as such and the rest go to a new process."""
    from harness.runner import child_env

    env = child_env("cuda")  # no TRITON_INTERPRET: real JITFunctions
    if cache_dir:
        env["TRITON_CACHE_DIR"] = cache_dir
    opts = {"arch": arch, "warp_size": warp_size, "smem_limit": smem_limit,
            "reject_spills": reject_spills, "inputs": inputs}
    results: list[FileCheck] = []
    todo = list(items)
    while todo:
        req = {**opts, "files": todo}
        t0 = time.time()
        with tempfile.TemporaryFile("w+") as errf:
            proc = subprocess.Popen([sys.executable, "-m", "harness.compile_check", json.dumps(req)],
                                    stdout=subprocess.PIPE, stderr=errf, env=env, text=True,
                                    start_new_session=True)
            got = _read_results(proc, len(todo), timeout_s, startup_s)
            errf.seek(0)
            err = errf.read()
        for d in got:
            fc = FileCheck.from_dict(d)
            results.append(fc)
        todo = todo[len(got):]
        if todo:  # the process died or hung on todo[0]
            timed_out = proc.returncode is None or proc.returncode == -signal.SIGKILL
            tail = " | ".join(err.strip().splitlines()[-4:])
            fc = FileCheck(todo[0]["path"], False, category="timeout" if timed_out else "crash",
                           reason=(f"compiling took more than {timeout_s:.0f} s" if timed_out else
                                   f"compile-check process exited with {proc.returncode}: {tail}")[:600],
                           wall_s=time.time() - t0)
            results.append(fc)
            todo = todo[1:]
    return results


def _read_results(proc: subprocess.Popen, n: int, timeout_s: float, startup_s: float) -> list[dict]:
    """JSON lines from a batch child, each within ``timeout_s`` of the previous one."""
    import selectors

    got: list[dict] = []
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.time() + timeout_s + startup_s  # + the child's imports
    while len(got) < n:
        left = deadline - time.time()
        if left <= 0:
            _kill(proc)
            proc.returncode = None
            return got
        if not sel.select(timeout=min(1.0, left)):
            if proc.poll() is not None:
                break
            continue
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("{"):
            got.append(json.loads(line))
            deadline = time.time() + timeout_s
    if len(got) == n:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            _kill(proc)
    else:
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            _kill(proc)
            proc.returncode = None
    return got


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def default_jobs() -> int:
    """Parallel compile processes: the cores this process may use, at most 16."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        n = os.cpu_count() or 1
    return max(1, min(16, n))


# ----------------------------------------------------------------------------- child side
def _cuobjdump() -> str | None:
    import shutil

    import triton

    cand = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if cand.is_file():
        return str(cand)
    return shutil.which("cuobjdump")


def _resource_usage(cubin: bytes, name: str) -> tuple[int | None, int | None]:
    """(registers per thread, local memory bytes per thread) of a kernel in a cubin."""
    tool = _cuobjdump()
    if tool is None or not cubin:
        return None, None
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None, None
    finally:
        os.unlink(f.name)
    regs = local = None
    seen = False
    for ln in out.splitlines():
        if ln.strip().startswith("Function"):
            seen = name in ln
            continue
        if seen and "REG:" in ln:
            m = re.search(r"REG:(\d+)", ln)
            l2 = re.search(r"LOCAL:(\d+)", ln)
            regs = int(m.group(1)) if m else None
            local = int(l2.group(1)) if l2 else None
            break
    return regs, local


def global_access(ptx: str) -> dict[str, int]:
    """Counts of the global load and store instructions of a PTX text, by form (asynchronous
    copies to shared memory as ``cp.async...global.<bytes>B``)."""
    out: dict[str, int] = {}
    for m in re.finditer(r"\b((?:ld|st)\.global(?:\.[\w:]+)*)", ptx):
        out[m.group(1)] = out.get(m.group(1), 0) + 1
    # asynchronous copies into shared memory (the pipeliner's loads), with their byte count
    for m in re.finditer(r"\b(cp\.async(?:\.[\w:]+)*)\s+\[[^\]]*\],\s*\[[^\]]*\],\s*(0x[0-9a-fA-F]+|\d+)", ptx):
        form = f"{m.group(1)}.{int(m.group(2), 0)}B"
        out[form] = out.get(form, 0) + 1
    return out


def float_forms(ptx: str) -> dict[str, int]:
    """Counts of a PTX text's fp32 division and square-root instructions, by form."""
    out: dict[str, int] = {}
    for m in re.finditer(r"\b((?:div|sqrt|rcp)(?:\.[a-z]+)*\.f32)\b", ptx):
        out[m.group(1)] = out.get(m.group(1), 0) + 1
    return out


class _Launch:
    def __init__(self, fn, args, kwargs):
        self.fn, self.args, self.kwargs = fn, args, kwargs


def _record_launches(req: dict) -> tuple[list[_Launch], str]:
    """Run the candidate with launches recorded instead of executed."""
    import torch
    from triton.runtime.jit import JITFunction

    from harness.problem import load_module

    launches: list[_Launch] = []

    def record(self, *args, grid=None, warmup=False, **kwargs):
        launches.append(_Launch(self, args, dict(kwargs)))
        return None

    JITFunction.run = record
    mod = load_module(req["path"], "candidate")
    if hasattr(mod, "_EGG_ANY_DEVICE"):  # a generated module's dispatch: launches on meta/CPU
        mod._EGG_ANY_DEVICE = True  # tensors reach the (recording) kernels (docs/dropin.md)
    if req.get("args_file"):
        args = torch.load(req["args_file"], weights_only=False)
        with torch.no_grad():
            if req.get("call"):
                getattr(mod, req["call"])(*args)
            else:
                with torch.device(_device_of(args)):
                    model = mod.ModelNew(*mod.get_init_inputs())
                model(*args)
        return launches, "given"
    tried = ["meta", "cpu"] if req.get("inputs", "meta") == "meta" else ["cpu"]
    err = None
    for dev in tried:
        launches.clear()
        try:
            with torch.no_grad(), torch.device(dev):
                model = mod.ModelNew(*mod.get_init_inputs())
                xs = mod.get_inputs()
            xs = [x.to(dev) if isinstance(x, torch.Tensor) else x for x in xs]
            with torch.no_grad():
                model(*xs)
            return launches, dev
        except Exception as e:  # noqa: BLE001 - the next device, or a 'run' failure
            err = e
    raise RuntimeError(f"ModelNew did not run on {'/'.join(tried)} inputs: {type(err).__name__}: {err}")


def _device_of(args) -> str:
    for a in args:
        if hasattr(a, "device"):
            return str(a.device)
    return "cpu"


def _compile(launch: _Launch, target, backend) -> tuple[object, dict]:
    """Compile one recorded launch the way JITFunction.run would for ``target``."""
    import triton
    from triton import knobs
    from triton.compiler import ASTSource
    from triton.runtime.jit import create_function_from_signature

    fn, kw = launch.fn, dict(launch.kwargs)
    kw["debug"] = kw.get("debug", fn.debug) or knobs.runtime.debug
    if hasattr(knobs.compilation, "instrumentation_mode"):
        kw["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, spec, opts = binder(*launch.args, **kw)
    options, signature, constexprs, attrs = fn._pack_args(backend, kw, bound, spec, opts)
    src = ASTSource(fn, signature, constexprs, attrs)
    kernel = triton.compile(src, target=target, options=options.__dict__)
    shown = {fn.arg_names[k[0]] if isinstance(k, tuple) else k: v for k, v in constexprs.items()}
    shown = {k: v for k, v in shown.items() if isinstance(v, (int, float, bool, str))}
    return kernel, shown


def child_main(req: dict) -> dict:
    os.environ.pop("TRITON_INTERPRET", None)
    res = {"path": req["path"], "ok": True, "kernels": [], "category": "", "reason": "", "inputs": ""}
    try:
        launches, res["inputs"] = _record_launches(req)
    except Exception as e:  # noqa: BLE001
        res.update(ok=False, category="run", reason=f"{type(e).__name__}: {e}"[:600])
        return res
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend

    target = GPUTarget("cuda", int(req["arch"]), int(req.get("warp_size", 32)))
    backend = make_backend(target)
    seen = set()
    for ln in launches:
        key = (ln.fn.__name__, repr(sorted((k, repr(v)) for k, v in ln.kwargs.items())),
               tuple(_arg_key(a) for a in ln.args))
        if key in seen:
            continue
        seen.add(key)
        kc = {"kernel": ln.fn.__name__, "ok": True, "category": "", "reason": ""}
        t0 = time.time()
        try:
            kernel, shown = _compile(ln, target, backend)
        except Exception as e:  # noqa: BLE001 - CompilationError, PTXASError, ...
            kc.update(ok=False, category="compile", reason=_error_text(e), compile_s=time.time() - t0)
            res["kernels"].append(kc)
            continue
        md = kernel.metadata
        regs, local = _resource_usage(kernel.asm.get("cubin", b""), md.name)
        kc.update(shared=int(md.shared), num_warps=int(md.num_warps), num_stages=int(md.num_stages),
                  n_regs=regs, local_bytes=local, constexprs=shown, compile_s=time.time() - t0,
                  global_access=global_access(kernel.asm.get("ptx", "")),
                  float_forms=float_forms(kernel.asm.get("ptx", "")))
        if md.shared > int(req["smem_limit"]):
            kc.update(ok=False, category="shared_memory",
                      reason=f"{md.shared} bytes of shared memory, the device allows {req['smem_limit']}")
        elif req.get("reject_spills") and local:
            kc.update(ok=False, category="spills",
                      reason=f"{local} bytes of local memory per thread (register spills) at {regs} registers")
        res["kernels"].append(kc)
    bad = [k for k in res["kernels"] if not k["ok"]]
    if bad:
        res.update(ok=False, category=bad[0]["category"], reason=f"{bad[0]['kernel']}: {bad[0]['reason']}")
    return res


def _error_text(e: BaseException) -> str:
    """One line: where (Triton's "at L:C:") and what (the last line of the message and of its
    cause), without the kernel source Triton's CompilationError quotes."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    where = lines[0] if lines and lines[0].startswith("at ") else ""
    what = lines[-1] if lines else ""
    cause = e.__cause__ or e.__context__
    if cause is not None and str(cause).strip():
        last = str(cause).strip().splitlines()[-1]
        if last not in what:
            what = f"{what} ({type(cause).__name__}: {last})"
    return f"{type(e).__name__}: {where} {what}".replace("  ", " ")[:600]


def _arg_key(a):
    if hasattr(a, "dtype") and hasattr(a, "shape"):
        return ("T", str(a.dtype), tuple(a.shape), tuple(a.stride()) if hasattr(a, "stride") else ())
    return ("V", repr(a))


def main() -> int:
    req = json.loads(sys.argv[1])
    from harness import gpulock

    gpulock.yield_cpu()  # untimed work: a timing beside it gets the CPU first
    chan = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # the candidate's prints (and Triton's) go to stderr
    for item in req.get("files", []):
        t0 = time.time()
        res = child_main({**req, **item})
        res["wall_s"] = time.time() - t0
        chan.write(json.dumps(res, default=str) + "\n")
        chan.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["KernelCheck", "FileCheck", "check_file", "check_files", "target_of", "default_jobs",
           "SM90_SMEM"]
