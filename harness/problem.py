"""Loading KernelBench-format problem files (and candidate files) with one-line errors.

A problem file defines ``Model(nn.Module)``, ``get_inputs()`` and ``get_init_inputs()``. Every
way a file can be unusable becomes a ``ProblemError`` whose message is one line naming the file;
the CLI prints it and exits with code 2.
"""
from __future__ import annotations

import hashlib
import importlib.util
import pathlib
import sys
import types
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn


class ProblemError(Exception):
    """A problem or candidate file that cannot be used."""


def one_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}".rstrip(": ")


_one_line = one_line


def _read_source(p: pathlib.Path, what: str) -> str:
    if p.is_dir():
        hint = " (for a folder of problems: egg bench FOLDER)" if what == "problem" else ""
        raise ProblemError(f"{what} {p}: is a directory, not a Python file{hint}")
    if not p.is_file():
        raise ProblemError(f"{what} {p}: no such file")
    try:
        return p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ProblemError(f"{what} {p}: cannot be read ({one_line(e)})") from None


def _parse_error(p: pathlib.Path, what: str, e: SyntaxError) -> ProblemError:
    return ProblemError(f"{what} {p}: does not parse: line {e.lineno}: {e.msg}")


def load_module(path: str | pathlib.Path, what: str = "problem") -> types.ModuleType:
    """Import a Python file as a fresh module (a new name each time it changes)."""
    p = pathlib.Path(path)
    src = _read_source(p, what)
    try:
        code = compile(src, str(p), "exec")
    except SyntaxError as e:
        raise _parse_error(p, what, e) from None
    digest = hashlib.sha256(src.encode()).hexdigest()[:12]
    name = f"egg_{what}_{p.stem.replace('-', '_').replace('.', '_')}_{digest}"
    mod = types.ModuleType(name)
    mod.__file__ = str(p)
    sys.modules[name] = mod
    try:
        exec(code, mod.__dict__)
    except BaseException as e:  # noqa: BLE001 - any failure of user code is reported, not raised
        sys.modules.pop(name, None)
        if isinstance(e, KeyboardInterrupt):
            raise
        raise ProblemError(f"{what} {p}: importing it raised {_one_line(e)}") from None
    return mod


@dataclass
class LoadedProblem:
    path: str
    name: str
    source: str
    sha256: str
    module: types.ModuleType

    @property
    def Model(self) -> type:
        return self.module.Model

    def init_inputs(self) -> list:
        return call_checked(self, "get_init_inputs", tensors_required=False)

    def inputs(self) -> list:
        return call_checked(self, "get_inputs", tensors_required=True)


def load_problem(path: str | pathlib.Path) -> LoadedProblem:
    p = pathlib.Path(path)
    mod = load_module(p, "problem")
    missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if not hasattr(mod, n)]
    if missing:
        raise ProblemError(f"problem {p}: lacks {', '.join(missing)}")
    if not (isinstance(mod.Model, type) and issubclass(mod.Model, nn.Module)):
        raise ProblemError(f"problem {p}: Model is not an nn.Module class")
    for fn in ("get_inputs", "get_init_inputs"):
        if not callable(getattr(mod, fn)):
            raise ProblemError(f"problem {p}: {fn} is not a function")
    src = p.read_text()
    return LoadedProblem(str(p), p.stem, src, hashlib.sha256(src.encode()).hexdigest(), mod)


def call_checked(prob: LoadedProblem, fn: str, tensors_required: bool) -> list:
    try:
        out = getattr(prob.module, fn)()
    except BaseException as e:  # noqa: BLE001
        if isinstance(e, KeyboardInterrupt):
            raise
        raise ProblemError(f"problem {prob.path}: {fn}() raised {_one_line(e)}") from None
    if not isinstance(out, (list, tuple)):
        raise ProblemError(f"problem {prob.path}: {fn}() returned {type(out).__name__}, not a list")
    out = list(out)
    if tensors_required:
        bad = [type(x).__name__ for x in out
               if not isinstance(x, (torch.Tensor, int, float, bool))]
        if bad:
            raise ProblemError(f"problem {prob.path}: get_inputs() returned non-tensors ({', '.join(bad)})")
        if not any(isinstance(x, torch.Tensor) for x in out):
            raise ProblemError(f"problem {prob.path}: get_inputs() returned no tensor")
    return out


def build_model(prob: LoadedProblem, init: list, device: str | torch.device | None = None) -> nn.Module:
    try:
        if device is None:
            return prob.Model(*init)
        with torch.device(device):
            return prob.Model(*init)
    except BaseException as e:  # noqa: BLE001
        if isinstance(e, KeyboardInterrupt):
            raise
        raise ProblemError(f"problem {prob.path}: Model(*get_init_inputs()) raised {_one_line(e)}") from None


def meta_inputs(prob: LoadedProblem) -> list:
    """The problem's inputs as meta tensors (shapes and dtypes, no data)."""
    try:
        with torch.device("meta"):
            out = call_checked(prob, "get_inputs", True)
    except ProblemError:
        out = prob.inputs()  # some get_inputs do not run on meta; the real call reports errors
    return [x.to("meta") if isinstance(x, torch.Tensor) else x for x in out]


def meta_model(prob: LoadedProblem, init: list) -> nn.Module:
    try:
        return build_model(prob, init, "meta")
    except ProblemError:
        return build_model(prob, init).to("meta")


def tensor_spec(x: Any):
    from state.records import TensorSpec  # lazy: the harness's child processes need no pydantic

    if isinstance(x, torch.Tensor):
        return TensorSpec(shape=list(x.shape), dtype=str(x.dtype).replace("torch.", ""))
    return repr(x)


#: when the forward does not run on meta tensors, it is run once for real on the CPU to find a
#: problem whose forward raises, if its inputs and parameters hold at most this many elements
REAL_CHECK_MAX_ELEMENTS = 1 << 24


def _numel(xs) -> int:
    return sum(x.numel() for x in xs if isinstance(x, torch.Tensor))


def describe_problem(path: str | pathlib.Path):
    """Load and check a problem without computing anything heavy (meta tensors).

    Returns (LoadedProblem, ProblemSpec). Every way the problem is unusable (does not parse, lacks
    Model/get_inputs/get_init_inputs, raises in them or in the forward, returns non-tensors) is a
    one-line ``ProblemError``.
    """
    from state.records import ProblemSpec

    prob = load_problem(path)
    init = prob.init_inputs()
    inputs = meta_inputs(prob)
    model = meta_model(prob, init)
    outputs = []
    from harness.metarun import FastMeta  # recurrent layers by their shapes on meta tensors

    try:
        with torch.no_grad(), FastMeta():
            out = model(*inputs)
        flat = out if isinstance(out, (list, tuple)) else [out]
        outputs = [tensor_spec(o) for o in flat if isinstance(o, torch.Tensor)]
    except Exception:  # noqa: BLE001 - ops without meta kernels: try it for real when small
        size = _numel(inputs) + sum(p.numel() for p in model.parameters())
        if size <= REAL_CHECK_MAX_ELEMENTS:
            outputs = _real_forward(prob, init)
    spec = ProblemSpec(
        path=str(pathlib.Path(path).resolve()), name=prob.name, source=prob.source,
        sha256=prob.sha256, inputs=[tensor_spec(x) for x in inputs],
        init_args=[repr(a) for a in init], outputs=outputs,
        n_params=sum(p.numel() for p in model.parameters()),
    )
    return prob, spec


def _real_forward(prob: LoadedProblem, init: list) -> list:
    real = build_model(prob, init)
    xs = prob.inputs()
    try:
        with torch.no_grad():
            out = real(*xs)
    except BaseException as e:  # noqa: BLE001
        if isinstance(e, KeyboardInterrupt):
            raise
        raise ProblemError(f"problem {prob.path}: Model.forward raised {one_line(e)}") from None
    flat = out if isinstance(out, (list, tuple)) else [out]
    return [tensor_spec(o) for o in flat if isinstance(o, torch.Tensor)]


#: seconds the problem probe may take by default (importing the file, get_init_inputs(),
#: get_inputs() and Model.forward on meta tensors, or once for real when small): generous, since
#: a loaded machine can take seconds to import torch; Settings.probe_timeout_s, --probe-timeout
PROBE_TIMEOUT_S = 120.0


def probe_problem(path: str | pathlib.Path, timeout_s: float = PROBE_TIMEOUT_S):
    """``describe_problem`` in a child process with a time limit: the problem's own code
    (its import, get_inputs, the forward) never runs unbounded in the EGG process.

    Returns the ``ProblemSpec``. A problem that does not finish within ``timeout_s`` seconds, or
    whose process dies, is a one-line ``ProblemError`` like every other unusable problem. The
    child is forked where the platform allows it (no second torch import: tens of
    milliseconds), in its own session, and killed with everything it started on a timeout.
    """
    import multiprocessing as mp
    import os
    import signal

    from state.records import ProblemSpec

    p = pathlib.Path(path)
    _read_source(p, "problem")  # a missing file or a folder: said here, without a process
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    if method == "fork":
        _warm_meta()  # torch's meta kernels load lazily (seconds): once, here, not in every child
    ctx = mp.get_context(method)
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_probe_child, args=(str(p), send), daemon=True)
    proc.start()
    send.close()
    try:
        ready = recv.poll(timeout_s if timeout_s and timeout_s > 0 else None)
        msg = recv.recv() if ready else None
    except EOFError:
        msg = ("died", None)
    except BaseException:
        _kill_probe(proc, os, signal)
        raise
    if msg is None:
        _kill_probe(proc, os, signal)
        raise ProblemError(
            f"problem {p}: did not finish within {timeout_s:g} s (importing it, get_init_inputs(), "
            "get_inputs() and Model.forward on meta tensors); a forward that never returns cannot be "
            "optimized (the limit: --probe-timeout S or EGG_PROBE_TIMEOUT_S)")
    proc.join(5)
    if proc.is_alive():
        _kill_probe(proc, os, signal)
    kind, payload = msg
    if kind == "ok":
        return ProblemSpec.model_validate(payload)
    if kind == "error":
        raise ProblemError(payload)
    code = proc.exitcode
    why = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
    raise ProblemError(f"problem {p}: the process checking it died ({why}) while importing it, "
                       "making its inputs or running its forward")


def _warm_meta() -> None:
    with torch.no_grad():
        x = torch.empty(2, 3, device="meta")
        (torch.relu(x) * 2.0 + x.sum(-1, keepdim=True)).float()


def _kill_probe(proc, os, signal) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, AttributeError):
        proc.kill()
    proc.join(5)


def _probe_child(path: str, send) -> None:
    """The probe process: its own session (killed as a group), one torch thread (a forked
    OpenMP pool is unusable, as in DataLoader workers), fresh stdout/stderr objects (the
    parent's may have been locked by another thread at the fork)."""
    import os

    if hasattr(os, "setsid"):
        try:
            os.setsid()
        except OSError:
            pass
    sys.stdout = open(os.dup(1), "w", buffering=1, closefd=True)
    sys.stderr = open(os.dup(2), "w", buffering=1, closefd=True)
    try:
        torch.set_num_threads(1)
        _prob, spec = describe_problem(path)
        msg = ("ok", spec.model_dump())
    except ProblemError as e:
        msg = ("error", str(e))
    except BaseException as e:  # noqa: BLE001 - reported as the problem's, one line
        msg = ("error", f"problem {path}: checking it raised {one_line(e)}")
    try:
        send.send(msg)
    finally:
        send.close()
        sys.stdout.flush()
        sys.stderr.flush()


def check_candidate_file(path: str | pathlib.Path) -> str:
    """A candidate file that can be used at all: exists, reads, parses, binds ``ModelNew``.

    Nothing of it runs here (its code runs only in the verifier's candidate process). Returns the
    source; raises a one-line ``ProblemError`` naming the file otherwise.
    """
    import ast

    p = pathlib.Path(path)
    src = _read_source(p, "candidate")
    try:
        tree = ast.parse(src, str(p))
    except SyntaxError as e:
        raise _parse_error(p, "candidate", e) from None
    bound = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                bound.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
            if any(a.name == "*" for a in node.names):
                bound.add("ModelNew")  # cannot tell: the candidate process will say
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            bound.update(n.name for n in ast.walk(node) if isinstance(n, ast.ClassDef))
            bound.update(n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))
    if "ModelNew" not in bound:
        raise ProblemError(f"candidate {p}: defines no ModelNew")
    return src


def problem_from_source(source: str, folder: str | pathlib.Path, name: str = "problem") -> pathlib.Path:
    """Write a problem given as source text to a file (Studio inputs), content-addressed."""
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(source.encode()).hexdigest()[:12]
    path = folder / f"{name}_{digest}.py"
    if not path.exists():
        path.write_text(source)
    return path
