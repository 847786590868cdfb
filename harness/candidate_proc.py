"""The candidate process: the only process that imports and runs candidate code.

Started by a judge (harness.worker: the verification judge or the timing judge) with
multiprocessing "spawn", so it is a fresh interpreter that never held the judge's memory; it
enters the OS sandbox (harness.sandbox.candidate_process) and reports what held before this
module, torch or the candidate is imported. It
never imports the problem module: the judge sends the constructor arguments, and the candidate
file (a private copy the judge wrote into this process's scratch folder, from the source text the
judge verified) defines ``ModelNew``. The process may start before its candidate exists (a judge
keeps a spare started: torch imported, the CUDA context open); its first request names it:

- ("candidate", {candidate, label, init, init_seed}): load this file, build ``ModelNew`` with
  these constructor arguments (pickled by the judge; a class of the problem file, a config
  dataclass, read back as the candidate's class of that name: read_init) and seed; reply
  ("ready", state).

It then answers the judge's requests on a pipe:

- ("load", state): load these parameters and buffers (``load_state_dict``); reply its state;
- ("inputs", tensors): the buffers the next timed rounds read (new values are written into
  them by the judge between rounds);
- ("run", inputs, mode, grad, expect_raise, seed) / ("again", mode, grad, expect_raise, seed):
  one call of the forward in ``train()`` or ``eval()`` mode, grad on or off, on new buffers
  (shared memory: CUDA IPC on a GPU) or on the same buffers holding new values, torch's
  generators seeded with ``seed`` first (the reference's call started from it: dropout draws
  the same mask); reply its outputs, its state after the call, the Triton launches counted.
  ``expect_raise``: the reference raised on these inputs; an exception is then replied as
  ("raised", text) and the process carries on;
- ("round", calls, flush, seed): a timed round for the timing judge: the generators seeded,
  then ``calls`` back-to-back calls with per-call CUDA events (the L2 flushed before each),
  then a device-wide synchronize; reply the per-call times and the last call's outputs. The
  judge bounds these times with its own wall clock and checks the outputs (harness.worker);
- ("quit",).

Everything it sends is checked by the judge, which trusts nothing of this process: the code here
can be patched by the candidate it loads.
"""
from __future__ import annotations

import io
import os
import pickle
import time
import traceback

import torch

from harness.compare import flatten
from harness.problem import ProblemError, load_module, one_line
from harness.runner import proc_status_kb, says_out_of_memory
from harness.timing import FLUSH_BYTES, run_round

#: device memory filled with NaN before each verification call: at most this much, at most a
#: quarter of what is free (a fresh segment that the candidate's own allocations are carved from)
POISON_BYTES = 1 << 30
#: small-pool poison (allocations under 1 MiB live in 2 MiB segments of their own)
POISON_SMALL = (128, 512 * 1024)
#: the address-space cap on CPU sits this far above the memory limit (thread stacks, malloc
#: arenas and the interpreter's own mappings are address space, not memory)
AS_SLACK_BYTES = 1 << 30
MARK = "__egg_marker__"
#: the module name harness.problem.load_module gives a problem file (``egg_problem_<stem>_<hash>``)
PROBLEM_MODULE_PREFIX = "egg_problem_"


def sendable(o, received: frozenset = frozenset()):
    """An output as it crosses to the judge: plain tensors and plain values; anything else as a
    marker naming its type (a lazy Tensor subclass is never materialized by the judge).
    ``received``: storages of the tensors the judge sent; an output in one of them (a view of
    an input, as Model's own `qkv.split(...)` returns) goes as a copy: CUDA memory opened from
    another process cannot be sent on (torch refuses "Attempted to send CUDA tensor received
    from another process"), and the judge copies every output it receives anyway."""
    if type(o) is torch.Tensor or type(o) is torch.nn.Parameter:
        if o.numel() and o.untyped_storage().data_ptr() in received:
            return o.detach().clone()
        return o.detach()
    if isinstance(o, torch.Tensor):
        return (MARK, "subclass", type(o).__qualname__)
    if o is None or type(o) in (int, float, bool, complex, str):
        return o
    return (MARK, "object", type(o).__qualname__)


def _storages(xs) -> frozenset:
    """The storages of the tensors among ``xs`` (what the judge sent)."""
    return frozenset(t.untyped_storage().data_ptr() for t in xs or ()
                     if isinstance(t, torch.Tensor) and t.numel())


def _limit_memory(creq: dict, dev: torch.device) -> None:
    lim = int(creq.get("memory_limit_bytes") or 0)
    if dev.type == "cpu" and lim > 0:
        import resource

        vm = proc_status_kb("self", "VmSize") * 1024
        if vm > 0:
            cap = vm + lim + AS_SLACK_BYTES
            hard = resource.getrlimit(resource.RLIMIT_AS)[1]
            if hard != resource.RLIM_INFINITY:
                cap = min(cap, hard)
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))  # the candidate cannot raise it
    dlim = int(creq.get("device_memory_limit_bytes") or 0)
    if dev.type == "cuda" and dlim > 0:
        total = torch.cuda.get_device_properties(dev).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, dlim / total), dev)


def _limits(creq: dict) -> str:
    bits = [f"{creq[k] / 2**30:.2f} GiB {w}" for k, w in (("memory_limit_bytes", "host limit"),
                                                           ("device_memory_limit_bytes", "device limit"))
            if creq.get(k)]
    return ", ".join(bits) or "no limit set"


def _describe_exc(e: BaseException, tb: str, candidate: str) -> str:
    """One line: the exception, then where in the candidate it came from (when it did)."""
    where = ""
    try:
        frames = traceback.extract_tb(e.__traceback__)
        mine = [f for f in frames if os.path.abspath(f.filename) == os.path.abspath(candidate)]
        if mine:
            f = mine[-1]
            where = f" (candidate line {f.lineno}: {(f.line or '').strip()})"
    except Exception:  # noqa: BLE001
        pass
    if where:
        return one_line(e) + where
    lines = [ln for ln in tb.strip().splitlines() if ln.strip()]
    return one_line(e) + " | " + " | ".join(lines[-3:])


def _is_memory_error(e: BaseException) -> bool:
    return isinstance(e, (MemoryError, torch.OutOfMemoryError)) or says_out_of_memory(str(e))


def _send_failure(conn, e: BaseException, creq: dict, what_ran: str, category: str) -> None:
    """Report an exception of the candidate's code: out of memory, or the given category."""
    what = _describe_exc(e, traceback.format_exc(), creq.get("candidate") or "?")
    if _is_memory_error(e):
        conn.send(("error", "memory", f"{what_ran} ran out of memory ({_limits(creq)}): {what}"))
    else:
        conn.send(("error", category, f"{what_ran} raised {what}"))


def count_triton_launches():
    """Count Triton kernel launches in this process (installed before the candidate loads):
    ``kernel[grid](...)`` (JITFunction.run, or the interpreter's) and a compiled kernel's own
    runner (``compiled[grid]``: a generated file's launcher, knowledge/templates/_runtime.py
    _egg_Launcher, takes it after a kernel's first launch)."""
    counter = {"n": 0}
    try:
        from triton.runtime.jit import JITFunction

        orig = JITFunction.run

        def run(self, *a, **k):
            counter["n"] += 1
            return orig(self, *a, **k)

        JITFunction.run = run
        try:
            from triton.compiler.compiler import CompiledKernel

            orig_g = CompiledKernel.__getitem__

            def getitem(self, grid):
                counter["n"] += 1
                return orig_g(self, grid)

            CompiledKernel.__getitem__ = getitem
        except Exception:  # noqa: BLE001 - a triton without CompiledKernel.__getitem__
            pass
        try:
            from triton.runtime.interpreter import InterpretedFunction

            orig_i = InterpretedFunction.run

            def run_i(self, *a, **k):
                counter["n"] += 1
                return orig_i(self, *a, **k)

            InterpretedFunction.run = run_i
        except Exception:  # noqa: BLE001 - older/newer triton without the interpreter class
            pass
    except Exception:  # noqa: BLE001
        pass
    return counter


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _poison(dev: torch.device) -> None:
    """Fill the device memory the candidate's next allocations will come from with NaN."""
    torch.cuda.synchronize(dev)
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(dev)
    n = min(POISON_BYTES, free // 4) // 4
    big = torch.empty(n, dtype=torch.float32, device=dev).fill_(float("nan")) if n > 0 else None
    k, size = POISON_SMALL
    small = [torch.empty(size // 4, dtype=torch.float32, device=dev).fill_(float("nan")) for _ in range(k)]
    torch.cuda.synchronize(dev)
    del big, small


def state_of(model: torch.nn.Module) -> dict:
    """Parameters and persistent buffers, as the judge compares them."""
    return {k: v.detach() for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}


class _InitUnpickler(pickle.Unpickler):
    """The constructor's arguments as the judge pickled them: a class of the problem's own
    module (``egg_problem_*``, never imported here) is the candidate's class of that name
    (KernelBench files carry Model's helpers: a config dataclass ModelNew takes too)."""

    def __init__(self, data: bytes, mod):
        super().__init__(io.BytesIO(data))
        self.mod = mod

    def find_class(self, module, name):
        if module.startswith(PROBLEM_MODULE_PREFIX):
            got = getattr(self.mod, name, None)
            if got is None:
                raise ProblemError(f"get_init_inputs() gives a {name}, a class of the problem "
                                   "file that the candidate file does not define")
            return got
        return super().find_class(module, name)


def read_init(data: bytes, mod) -> list:
    """ModelNew's constructor arguments from the judge's bytes (CandidateProcess.give)."""
    return list(_InitUnpickler(data, mod).load())


def _build(cls, init: list, seed: int, dev: torch.device):
    torch.manual_seed(seed)
    with torch.device(dev):
        model = cls(*init)
    return model.to(dev)


#: what the judge's ("candidate", ...) message names: the file and the constructor's arguments
CANDIDATE_KEYS = ("candidate", "label", "init", "init_seed")


def _await_candidate(conn, creq: dict) -> bool:
    """Wait for the judge to name the candidate (the process may have started as a spare); False
    when the judge ends it first."""
    try:
        msg = conn.recv()
    except EOFError:
        return False
    if not (isinstance(msg, tuple) and msg and msg[0] == "candidate"):
        return False
    creq.update({k: msg[1][k] for k in CANDIDATE_KEYS})
    return True


def main(conn, creq: dict) -> None:
    """Load, build, then answer the judge's requests until it says quit."""
    try:
        os.setpgid(0, os.getpgid(os.getppid()))
    except OSError:
        pass
    dev = torch.device(creq["device"])
    if dev.type == "cpu":
        torch.set_num_threads(1)  # the interpreter's own process: steady timings, one core
    launches = count_triton_launches()
    try:
        _limit_memory(creq, dev)
        if dev.type == "cuda":  # the context, opened while the judge does other work
            torch.empty(1, device=dev)
        if not _await_candidate(conn, creq):
            return
        mod = load_module(creq["candidate"], "candidate")
        cls = getattr(mod, "ModelNew", None)
        if not isinstance(cls, type) or not issubclass(cls, torch.nn.Module):
            conn.send(("error", "candidate", f"candidate {creq.get('label') or creq['candidate']}: "
                       "defines no ModelNew(nn.Module) class"))
            return
        model = _build(cls, read_init(creq["init"], mod), creq["init_seed"], dev)
        _sync(dev)  # the state sent is the state built (the judge opens it with our event too)
        conn.send(("ready", state_of(model)))
    except ProblemError as e:
        conn.send(("error", "memory" if "memory" in str(e).lower() else "compile", str(e)))
        return
    except BaseException as e:  # noqa: BLE001
        _send_failure(conn, e, creq, "building ModelNew", "compile")
        return
    held = None
    flush = None
    last_out = None  # noqa: F841 - the last verification call's outputs (see the end of the loop)
    while True:
        try:
            msg = conn.recv()
        except EOFError:  # the judge has gone
            return
        except BaseException as e:  # noqa: BLE001 - e.g. the judge's CUDA tensors cannot be opened here
            _send_failure(conn, e, creq, "receiving the judge's tensors", "runtime")
            return
        kind = msg[0]
        if kind == "quit":
            return
        try:
            if kind == "load":
                model.load_state_dict(msg[1], strict=False)
                _sync(dev)  # the copies into the parameters are done before the judge reads them
                conn.send(("loaded", state_of(model)))
                continue
            if kind == "inputs":  # the timing judge's buffers for the next rounds
                held = msg[1]
                conn.send(("ok",))
                continue
            if kind == "round":
                _, calls, do_flush, seed = msg
                if do_flush and dev.type == "cuda" and flush is None:
                    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device=dev)
                torch.manual_seed(seed)
                times, out = run_round(lambda: model(*held), dev, int(calls), flush if do_flush else None)
                recv = _storages(held)
                conn.send(("round", [sendable(o, recv) for o in flatten(out)], times))
                del out
                conn.recv()  # the judge's ack: it has copied the outputs
                continue
            if kind == "run":
                held = msg[1]
                mode, grad, expect_raise, seed = msg[2], msg[3], msg[4], msg[5]
            else:  # "again": new values in the same buffers
                mode, grad, expect_raise, seed = msg[1], msg[2], msg[3], msg[4]
            model.train(mode == "train")
            if dev.type == "cuda":
                _poison(dev)
            _sync(dev)
            torch.manual_seed(seed)  # the reference's call started from the same seed
            before = launches["n"]
            t0 = time.perf_counter()
            try:
                with torch.set_grad_enabled(bool(grad)):
                    out = model(*held)
                _sync(dev)
            except Exception as e:  # noqa: BLE001 - the reference raises here too: so must we
                if not expect_raise or _is_memory_error(e):
                    raise
                conn.send(("raised", _describe_exc(e, traceback.format_exc(), creq.get("candidate") or "?")))
                continue
            wall = time.perf_counter() - t0
            recv = _storages(held)
            safe = [sendable(o, recv) for o in flatten(out)]
            conn.send(("out", safe, wall, launches["n"] - before, state_of(model)))
        except BaseException as e:  # noqa: BLE001
            _send_failure(conn, e, creq, "forward" if kind != "load" else "load_state_dict", "runtime")
            return
        ack = conn.recv()
        # the outputs stay alive until the next call has returned: the judge checks that this
        # call's outputs, which it still maps, are unchanged then (a candidate that writes into a
        # tensor it returned before); freed here, their memory could be taken by the next call or
        # the NaN poison on a GPU and look changed
        last_out = out  # noqa: F841
        del out, safe
        if ack[0] == "quit":
            return
