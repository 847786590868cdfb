"""What runs inside the harness's child processes (see harness.child).

Verification uses two processes so that nothing a candidate does can reach the comparison:

- the judge (``judge``) builds the reference model, draws inputs from unpredictable seeds,
  computes eager (and float64) outputs, compares, and writes the verdict;
- the candidate process (``candidate_main``), spawned by the judge (fresh, never forked from a
  process that holds CUDA), imports the candidate and runs it on request. It receives *copies* of
  the judge's inputs through shared memory (CUDA IPC on GPUs) and returns its outputs the same way.

The judge trusts nothing that comes back: messages are unpickled by an allow-list unpickler (only
tensors, storages, dtypes and plain values can cross, so no code of the candidate runs in the
judge), inputs are compared with the judge's private copy after every call, the reference is
computed on private tensors the candidate never sees, the candidate is called again on new values
in the same buffers, it runs under a time limit and a memory limit (host RSS watched by the judge,
an address-space cap on CPU, a per-process fraction of device memory on GPUs), and on GPUs the
device memory it can allocate is poisoned with NaN before each call. A crash, a signal, a hang or
a CUDA error is a verdict, never a failure of the harness.
"""
from __future__ import annotations

import copy  # noqa: F401 - imported before any candidate runs (see _fp64_model)
import io
import json
import math
import os
import pickle
import secrets
import signal
import time
import traceback

import torch
import torch.multiprocessing as mp

from harness import sandbox
from harness.compare import (Tolerance, compare_output, flatten, fp64_door, structure_error)
from harness.problem import ProblemError, build_model, load_module, load_problem, one_line
from harness.runner import says_out_of_memory

#: device memory filled with NaN before each candidate call: at most this much, at most a quarter
#: of what is free (a fresh segment that the candidate's own allocations are carved from)
POISON_BYTES = 1 << 30
#: small-pool poison (allocations under 1 MiB live in 2 MiB segments of their own)
POISON_SMALL = (128, 512 * 1024)
#: the address-space cap on CPU sits this far above the memory limit (thread stacks, malloc
#: arenas and the interpreter's own mappings are address space, not memory)
AS_SLACK_BYTES = 1 << 30
MARK = "__egg_marker__"


# ----------------------------------------------------------------------------- helpers
def _device(name: str) -> torch.device:
    """The device with an explicit index (several CUDA memory APIs refuse a bare 'cuda')."""
    dev = torch.device(name)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _seeded_inputs(prob, seed: int, dev: torch.device) -> list:
    torch.manual_seed(seed)
    with torch.device(dev):
        xs = prob.inputs()
    return [x.to(dev) if isinstance(x, torch.Tensor) else x for x in xs]


def _build(cls_or_prob, init: list, seed: int, dev: torch.device, cls=None):
    torch.manual_seed(seed)
    if cls is None:
        model = build_model(cls_or_prob, init, dev)
    else:
        with torch.device(dev):
            model = cls(*init)
    return model.to(dev)


def _signal_name(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _tail(tb: str, n: int = 6) -> str:
    lines = [ln for ln in tb.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-n:])


def default_memory_limit_bytes(dev_type: str = "cpu") -> int:
    """Half of the machine's RAM (the host limit when none is given)."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2)
    except (ValueError, OSError, AttributeError):
        return 16 << 30


def memory_limit_bytes(limit_gb: float | None) -> int:
    """Host memory limit in bytes: the given GiB, half the RAM when 0/None, none (0) when < 0."""
    if limit_gb is None or limit_gb == 0:
        return default_memory_limit_bytes()
    if limit_gb < 0:
        return 0
    return int(limit_gb * (1 << 30))


def _proc_kb(pid: int | str, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for ln in f:
                if ln.startswith(field + ":"):
                    return int(ln.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _is_memory_error(e: BaseException) -> bool:
    if isinstance(e, (MemoryError, torch.OutOfMemoryError)):
        return True
    return says_out_of_memory(str(e))


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
    return one_line(e) + where if where else one_line(e) + " | " + _tail(tb, 3)


def _count_triton_launches():
    """Count Triton kernel launches in this process (installed before the candidate loads)."""
    counter = {"n": 0}
    try:
        from triton.runtime.jit import JITFunction

        orig = JITFunction.run

        def run(self, *a, **k):
            counter["n"] += 1
            return orig(self, *a, **k)

        JITFunction.run = run
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


def harden_judge() -> None:
    """Make this process non-dumpable (Linux): other processes of the same user, the candidate
    among them, can no longer read its memory or open its file descriptors through /proc
    (root with CAP_SYS_PTRACE still can: run untrusted candidates in a container)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except Exception:  # noqa: BLE001 - not Linux: nothing to do
        pass


# ----------------------------------------------------------------------------- what may cross
class _Refused(Exception):
    pass


def _allowed_globals() -> set[tuple[str, str]]:
    allowed = {
        ("torch.multiprocessing.reductions", n) for n in (
            "rebuild_tensor", "rebuild_cuda_tensor", "rebuild_storage_fd", "rebuild_storage_empty",
            "rebuild_typed_storage", "rebuild_typed_storage_child", "rebuild_meta_tensor")}
    allowed |= {("multiprocessing.resource_sharer", "DupFd"), ("torch", "Size"), ("torch", "Tensor"),
                ("torch", "device"), ("torch.nn.parameter", "Parameter"), ("torch", "UntypedStorage"),
                ("torch.storage", "UntypedStorage"), ("torch.storage", "TypedStorage"),
                ("torch", "TypedStorage"), ("builtins", "complex"), ("collections", "OrderedDict")}
    allowed |= {("torch", n) for n in dir(torch) if isinstance(getattr(torch, n, None), torch.dtype)}
    allowed |= {("torch", c.__name__) for c in getattr(torch, "_storage_classes", ())
                if getattr(torch, c.__name__, None) is c}
    return allowed


_ALLOWED = _allowed_globals()


class _SafeUnpickler(pickle.Unpickler):
    """Loads only tensors, storages, dtypes and plain values: a candidate cannot make the judge
    run its code (``__reduce__``) or build its classes (Tensor subclasses) by sending them."""

    def find_class(self, module: str, name: str):
        if (module, name) not in _ALLOWED:
            raise _Refused(f"{module}.{name}")
        return super().find_class(module, name)


def safe_loads(buf: bytes):
    return _SafeUnpickler(io.BytesIO(buf)).load()


def _sendable(o):
    """An output as it crosses to the judge: plain tensors and plain values; anything else as a
    marker naming its type (a lazy Tensor subclass is never materialized here)."""
    if type(o) is torch.Tensor or type(o) is torch.nn.Parameter:
        return o.detach()
    if isinstance(o, torch.Tensor):
        return (MARK, "subclass", type(o).__qualname__)
    if o is None or type(o) in (int, float, bool, complex, str):
        return o
    return (MARK, "object", type(o).__qualname__)


# ----------------------------------------------------------------------------- candidate side
def _limit_memory(creq: dict, dev: torch.device) -> None:
    lim = int(creq.get("memory_limit_bytes") or 0)
    if dev.type == "cpu" and lim > 0:
        import resource

        vm = _proc_kb("self", "VmSize") * 1024
        if vm > 0:
            cap = vm + lim + AS_SLACK_BYTES
            hard = resource.getrlimit(resource.RLIMIT_AS)[1]
            if hard != resource.RLIM_INFINITY:
                cap = min(cap, hard)
            resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    dlim = int(creq.get("device_memory_limit_bytes") or 0)
    if dev.type == "cuda" and dlim > 0:
        total = torch.cuda.get_device_properties(dev).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, dlim / total), dev)


def _send_failure(conn, e: BaseException, creq: dict, what_ran: str, category: str) -> None:
    """Report an exception of the candidate's code: out of memory, or the given category."""
    what = _describe_exc(e, traceback.format_exc(), creq["candidate"])
    if _is_memory_error(e):
        conn.send(("error", "memory", f"{what_ran} ran out of memory ({_limits(creq)}): {what}"))
    else:
        conn.send(("error", category, f"{what_ran} raised {what}"))


def _limits(creq: dict) -> str:
    bits = [f"{creq[k] / 2**30:.2f} GiB {w}" for k, w in (("memory_limit_bytes", "host limit"),
                                                           ("device_memory_limit_bytes", "device limit"))
            if creq.get(k)]
    return ", ".join(bits) or "no limit set"


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


def candidate_main(conn, creq: dict) -> None:
    """The candidate process: load, build, then run on request. Never sees reference outputs."""
    try:
        os.setpgid(0, os.getpgid(os.getppid()))
    except OSError:
        pass
    dev = _device(creq["device"])
    launches = _count_triton_launches()
    try:
        _limit_memory(creq, dev)
        prob = load_problem(creq["problem"])
        mod = load_module(creq["candidate"], "candidate")
        cls = getattr(mod, "ModelNew", None)
        if not isinstance(cls, type) or not issubclass(cls, torch.nn.Module):
            conn.send(("error", "candidate", f"candidate {creq['candidate']}: defines no ModelNew(nn.Module) class"))
            return
        init = prob.init_inputs()
        model = _build(None, init, creq["init_seed"], dev, cls=cls)
        state = {k: v.detach() for k, v in model.named_parameters()}
        conn.send(("ready", state))
    except ProblemError as e:
        conn.send(("error", "memory" if "memory" in str(e).lower() else "compile", str(e)))
        return
    except BaseException as e:  # noqa: BLE001
        _send_failure(conn, e, creq, "building ModelNew", "compile")
        return
    held = None
    while True:
        msg = conn.recv()
        if msg[0] == "quit":
            return
        if msg[0] == "run":
            held = msg[1]
        try:
            if dev.type == "cuda":
                _poison(dev)
            _sync(dev)
            before = launches["n"]
            t0 = time.perf_counter()
            with torch.no_grad():
                out = model(*held)
            _sync(dev)
            wall = time.perf_counter() - t0
            safe = [_sendable(o) for o in flatten(out)]
            conn.send(("out", safe, wall, launches["n"] - before))
        except BaseException as e:  # noqa: BLE001
            _send_failure(conn, e, creq, "forward", "runtime")
            return
        ack = conn.recv()
        del out, safe
        if ack[0] == "quit":
            return


# ----------------------------------------------------------------------------- judge side
class _Verdict(Exception):
    def __init__(self, category: str, reason: str):
        super().__init__(reason)
        self.category, self.reason = category, reason


def _eager(model, inputs: list, prob) -> list:
    try:
        with torch.no_grad():
            out = model(*inputs)
    except BaseException as e:  # noqa: BLE001
        if isinstance(e, KeyboardInterrupt):
            raise
        if _is_memory_error(e):
            raise _Verdict("harness", f"the reference ran out of memory: {one_line(e)}") from None
        raise ProblemError(f"problem {prob.path}: Model.forward raised {one_line(e)}") from None
    return [r.detach().clone() if isinstance(r, torch.Tensor) else r for r in flatten(out)]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if torch.equal(a, b):
        return True
    if a.dtype.is_floating_point or a.is_complex():
        return a.shape == b.shape and bool(torch.allclose(a, b, rtol=0, atol=0, equal_nan=True))
    return False


def judge(req: dict, chan) -> None:
    t_start = time.time()
    result = {"passed": False, "reason": "", "category": "", "trials": 0, "checks": [],
              "outputs": [], "flags": [], "launches": 0, "device": req["device"], "sandbox": []}
    proc = conn = plan = None
    try:
        dev = _device(req["device"])
        deadline = t_start + float(req.get("timeout_s", 600))
        tol = Tolerance(**req.get("tolerance", {}))
        mem = memory_limit_bytes(req.get("memory_limit_gb"))
        prob = load_problem(req["problem"])
        init = prob.init_inputs()
        init_seed = secrets.randbits(62)
        model = _build(prob, init, init_seed, dev)
        ctx = mp.get_context("spawn")
        conn, child = ctx.Pipe()
        creq = {k: req[k] for k in ("problem", "candidate", "device")}
        creq.update(init_seed=init_seed, memory_limit_bytes=mem if dev.type == "cpu" else 0,
                    device_memory_limit_bytes=_device_limit(req, dev))
        # --- sandbox wiring (harness/sandbox.py): the candidate process starts in
        # sandbox.candidate_process, which enters the OS sandbox before torch or the candidate is
        # imported, reports what held (first message), then calls candidate_main
        plan = sandbox.prepare(req["device"], paths=(req["problem"], req["candidate"]),
                               memory_limit_bytes=mem)
        creq["sandbox"] = plan
        proc = ctx.Process(target=sandbox.candidate_process, args=(child, creq), daemon=True)
        proc.start()
        child.close()
        watch = _Watch(conn, proc, deadline, mem)
        refused = sandbox.report(watch.recv("entering the sandbox"), result, plan)
        if refused:
            raise _Verdict("harness", refused)
        # --- end of sandbox wiring
        msg = watch.recv("loading the candidate")
        if msg[0] == "error":
            raise _Verdict(_cand_category(msg[1]), msg[2])
        if msg[0] != "ready" or not isinstance(msg[1], dict):
            raise _Verdict("cheat", "the candidate process sent an unexpected message")
        _check_params(model, msg[1], result)
        result["checks"].append("parameters")
        n_trials = int(req.get("trials", 5))
        shared = None
        fp64_model = None
        recalled = False
        for t in range(n_trials):
            priv = _seeded_inputs(prob, secrets.randbits(62), dev)  # never leaves the judge
            ref = _eager(model, priv, prob)
            if t == 0:
                _check_reference_determinism(ref, _eager(model, priv, prob), tol)
                result["checks"].append("reference-determinism")
            if shared is not None and t % 2 == 1:
                # same buffers, new values: defeats caches keyed on pointers or on first results
                for b, f in zip(shared, priv):
                    if isinstance(b, torch.Tensor):
                        b.copy_(f)
                mode, recalled = ("again",), True
            else:
                shared = [x.clone() if isinstance(x, torch.Tensor) else x for x in priv]
                mode = ("run", shared)
            _sync(dev)  # the candidate process reads these buffers on its own stream
            conn.send(mode)
            msg = watch.recv(f"trial {t + 1}")
            if msg[0] == "error":
                raise _Verdict(_cand_category(msg[1]), msg[2])
            if msg[0] != "out" or len(msg) != 4 or not isinstance(msg[1], list):
                raise _Verdict("cheat", "the candidate process sent an unexpected message")
            _, outs, _wall, launches = msg
            _check_structure(ref, outs)  # metadata only: shapes are checked before anything is copied
            try:
                cand = [o.clone() if isinstance(o, torch.Tensor) else o for o in outs]
                _sync(dev)  # our copies are complete before the candidate may free its outputs
            except Exception as e:  # noqa: BLE001 - e.g. CUDA IPC handles that do not open
                raise _Verdict("runtime", f"trial {t + 1}: the candidate's outputs could not be read "
                               f"({one_line(e)}): its channel to the judge was tampered with or its "
                               "memory is gone") from None
            conn.send(("ack",))
            del outs, msg  # releases the candidate's output blocks (CUDA IPC reference counts)
            result["launches"] = max(result["launches"], int(launches) if isinstance(launches, int) else 0)
            for i, (a, b) in enumerate(zip(shared, priv)):
                if isinstance(a, torch.Tensor) and not _same(a, b):
                    raise _Verdict("cheat", f"trial {t + 1}: input {i} was modified by the candidate")
            checks = []
            need64 = t == 0
            for i, (r, c) in enumerate(zip(ref, cand)):
                if not isinstance(r, torch.Tensor):
                    if r != c:
                        raise _Verdict("mismatch", f"trial {t + 1}: output {i}: {c!r} != eager's {r!r}")
                    continue
                chk = compare_output(i, r, c, tol)
                checks.append((chk, r, c))
                need64 |= not chk.ok
            if need64 and any(r.dtype.is_floating_point for _, r, _ in checks):
                if fp64_model is None:
                    fp64_model = _fp64_model(model)
                ref64 = _fp64_outputs(fp64_model, priv) if fp64_model is not None else None
                if ref64 is not None:
                    checks = [(fp64_door(chk, ref64[chk.index], r, c), r, c) for chk, r, c in checks]
                    if "fp64-reference" not in result["checks"]:
                        result["checks"].append("fp64-reference")
            for chk, _, _ in checks:
                _merge_output(result, chk)
            for chk, _, _ in checks:
                if not chk.ok:
                    raise _Verdict(chk.category, f"trial {t + 1}: {chk.reason}")
            result["trials"] = t + 1
        result["checks"] += ["tolerance", "inputs-unchanged", "fresh-seeds"]
        if recalled:
            result["checks"].append("recall-same-buffers")
        result["checks"].append("memory-limit" if mem else "no-memory-limit")
        if dev.type == "cuda":
            result["checks"].append("poisoned-memory")
        result["passed"] = True
    except _Verdict as v:
        result["category"], result["reason"] = v.category, v.reason
    except ProblemError as e:
        result["category"], result["reason"] = "problem", str(e)
    except BaseException:  # noqa: BLE001
        result["category"], result["reason"] = "harness", _tail(traceback.format_exc())
    finally:
        if conn is not None:
            try:
                conn.send(("quit",))
            except Exception:  # noqa: BLE001
                pass
        if proc is not None:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        # --- sandbox wiring: whatever the candidate started dies here (the judge is a subreaper)
        sandbox.cleanup(plan)
    result["wall_s"] = round(time.time() - t_start, 3)
    if req.get("nonce"):
        result["nonce"] = req["nonce"]
    chan.write(json.dumps(result) + "\n")


def _cand_category(c: str) -> str:
    """A failure category reported by the candidate process (which may lie: only these pass)."""
    return c if c in ("candidate", "compile", "runtime", "memory") else "cheat"


def _device_limit(req: dict, dev: torch.device) -> int:
    """Device memory the candidate may allocate: the limit when given, else half the device."""
    if dev.type != "cuda":
        return 0
    lim = req.get("memory_limit_gb")
    if lim is not None and lim < 0:
        return 0
    if lim:
        return int(lim * (1 << 30))
    return torch.cuda.get_device_properties(dev).total_memory // 2


class _Watch:
    """Receives the candidate's messages under the deadline and the memory limit."""

    def __init__(self, conn, proc, deadline: float, mem_limit: int):
        self.conn, self.proc, self.deadline, self.mem = conn, proc, deadline, mem_limit

    def _load(self):
        buf = self.conn.recv_bytes()
        try:
            msg = safe_loads(buf)
        except _Refused as e:
            raise _Verdict("cheat", f"the candidate sent an object the judge refuses to load ({e}): "
                           "only plain tensors and numbers may cross") from None
        except Exception as e:  # noqa: BLE001
            raise _Verdict("cheat", f"the candidate sent a message the judge cannot read ({one_line(e)})") from None
        if not isinstance(msg, tuple) or not msg or not isinstance(msg[0], str):
            raise _Verdict("cheat", "the candidate process sent an unexpected message")
        if msg[0] == "error" and not (len(msg) == 3 and all(isinstance(m, str) for m in msg)):
            raise _Verdict("cheat", "the candidate process sent an unexpected message")
        return msg

    def recv(self, what: str):
        while True:
            left = self.deadline - time.time()
            if left <= 0:
                break
            if self.conn.poll(min(0.1, left)):
                try:
                    return self._load()
                except EOFError:  # the candidate closed its end: it is exiting or dead
                    self.proc.join(5)
                    break
            if self.mem:
                rss = _proc_kb(self.proc.pid, "VmRSS") * 1024
                if rss > self.mem:
                    self.proc.kill()
                    self.proc.join(5)
                    raise _Verdict("memory", f"candidate used {rss / 2**30:.2f} GiB of host memory during "
                                   f"{what}, over the limit of {self.mem / 2**30:.2f} GiB")
            if not self.proc.is_alive():
                if self.conn.poll(0.1):
                    try:
                        return self._load()
                    except EOFError:
                        pass
                break
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
            if self.deadline - time.time() > 0:
                raise _Verdict("crash", f"candidate process closed its channel during {what}")
            raise _Verdict("timeout", f"candidate did not finish {what} within the time limit")
        self.proc.join(1)
        raise _Verdict("crash", f"candidate process {_signal_name(self.proc.exitcode)} during {what}")


def _check_structure(ref: list, cand: list) -> None:
    for i, c in enumerate(cand):
        if isinstance(c, tuple) and len(c) == 3 and c[0] == MARK:
            if c[1] == "subclass":
                raise _Verdict("cheat", f"output {i} is a tensor subclass ({c[2]}), not a plain torch.Tensor")
            if i < len(ref) and isinstance(ref[i], torch.Tensor):
                raise _Verdict("mismatch", f"output {i} is {c[2]}, not a tensor")
            raise _Verdict("mismatch", f"output {i} is {c[2]}, eager's is {type(ref[i]).__name__ if i < len(ref) else 'absent'}")
    err = structure_error(ref, cand)
    if err:
        raise _Verdict("cheat" if "subclass" in err else "mismatch", err)


def _check_params(model, cand_state: dict, result: dict) -> None:
    ref = dict(model.named_parameters())
    if not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in cand_state.items()):
        raise _Verdict("cheat", "the candidate process sent unexpected parameters")
    if set(ref) <= set(cand_state):
        pairs = [(k, k, p, cand_state[k]) for k, p in ref.items()]
    else:
        # an LLM-style ModelNew(nn.Module) may name its parameters differently: match by position
        cands = list(cand_state.items())
        if len(cands) < len(ref):
            missing = [k for k in ref if k not in cand_state]
            raise _Verdict("params", f"ModelNew lacks parameters of Model: {', '.join(missing[:5])}")
        pairs = [(k, ck, p, c) for (k, p), (ck, c) in zip(ref.items(), cands)]
        if pairs:
            result["flags"].append("parameter names differ from Model's (matched by position)")
    for k, ck, p, c in pairs:
        if tuple(c.shape) != tuple(p.shape) or c.dtype != p.dtype:
            raise _Verdict("params", f"parameter {ck} is {tuple(c.shape)} {c.dtype}, Model's {k} is "
                           f"{tuple(p.shape)} {p.dtype}")
        if not torch.equal(c.to(p.device), p.detach()):
            raise _Verdict("params", f"parameter {ck} differs from Model's {k} after the same seeded init")
    used = {ck for _, ck, _, _ in pairs}
    extra = [k for k in cand_state if k not in used]
    if extra:
        result["flags"].append(f"extra parameters: {', '.join(extra[:5])}")


def _check_reference_determinism(a: list, b: list, tol: Tolerance) -> None:
    for i, (x, y) in enumerate(zip(a, b)):
        if isinstance(x, torch.Tensor) and not _same(x, y):
            chk = compare_output(i, x, y, tol)
            if not chk.ok:
                raise _Verdict("reference", f"the reference is not deterministic: two eager runs "
                               f"on the same inputs differ (output {i}, max abs {chk.max_abs:.3g}), "
                               "e.g. dropout in training mode or random ops in forward; it cannot "
                               "judge a candidate")


def _fp64_model(model):
    try:
        return copy.deepcopy(model).double()
    except Exception:  # noqa: BLE001
        return None


def _fp64_outputs(m64, inputs):
    xs = [x.double() if isinstance(x, torch.Tensor) and x.dtype.is_floating_point else x for x in inputs]
    try:
        with torch.no_grad():
            outs = flatten(m64(*xs))
    except Exception:  # noqa: BLE001 - an op without fp64 support: no door, tolerance only
        return None
    return outs


def _merge_output(result: dict, chk) -> None:
    outs = result["outputs"]
    while len(outs) <= chk.index:
        outs.append({"index": len(outs), "max_abs": 0.0, "max_rel": 0.0, "eager_err_fp64": None,
                     "cand_err_fp64": None, "passed_by": "tolerance"})
    o = outs[chk.index]
    o["max_abs"] = max(o["max_abs"], _finite(chk.max_abs))
    o["max_rel"] = max(o["max_rel"], _finite(chk.max_rel))
    if chk.eager_err_fp64 is not None:
        o["eager_err_fp64"] = max(o["eager_err_fp64"] or 0.0, chk.eager_err_fp64)
        o["cand_err_fp64"] = max(o["cand_err_fp64"] or 0.0, chk.cand_err_fp64)
    if not chk.ok:
        o["passed_by"] = "none"
    elif chk.passed_by == "fp64" and o["passed_by"] != "none":
        o["passed_by"] = "fp64"


def _finite(x: float) -> float:
    return x if math.isfinite(x) else 1e308


# ----------------------------------------------------------------------------- profiling server
#: candidate models kept built in the profiling process (the tiler times many variants; older
#: ones are freed so that problems with large parameters still fit)
PROFILE_CACHE = 2


def profile_server(req: dict, chan, stdin) -> None:
    """Times eager, torch.compile and candidates on the same inputs, in this one process."""
    from collections import OrderedDict

    from harness import gpulock
    from harness.timing import bench

    dev = _device(req["device"])
    rep_ms = float(req.get("rep_ms", 200))
    prob = load_problem(req["problem"])
    init = prob.init_inputs()
    seed = secrets.randbits(62)
    ready: dict = {"ready": True}
    if dev.type == "cuda":
        ready["gpu"] = torch.cuda.get_device_properties(dev).name
        try:  # measured once per machine and cached (harness.peaks); seconds the first time
            from harness import peaks

            ready["peaks"] = peaks.ensure()
        except Exception as e:  # noqa: BLE001 - the roofline falls back to the profile's numbers
            ready["peaks_error"] = f"{type(e).__name__}: {e}"[:300]
    with gpulock.hold("shared", dev.type == "cuda"):
        model = _build(prob, init, seed, dev)
        inputs = _seeded_inputs(prob, secrets.randbits(62), dev)
        _sync(dev)
    cache: OrderedDict = OrderedDict()

    def reply(obj: dict) -> None:
        chan.write(json.dumps(obj) + "\n")
        chan.flush()

    reply(ready)
    for line in stdin:
        if not line.strip():
            continue
        r = json.loads(line)
        try:
            if r["op"] == "quit":
                return
            if r["op"] == "baseline":
                out = {"eager": bench(lambda: model(*inputs), dev, rep_ms)}
                if dev.type == "cuda" and r.get("compile", True):
                    out["compile"] = _time_compiled(model, inputs, dev, rep_ms)
                reply({"ok": True, **out})
            elif r["op"] == "time":
                m = cache.pop(r["path"], None)
                if m is None:
                    while len(cache) >= PROFILE_CACHE:
                        cache.popitem(last=False)
                        if dev.type == "cuda":
                            torch.cuda.empty_cache()
                    mod = load_module(r["path"], "candidate")
                    with gpulock.hold("shared", dev.type == "cuda"):
                        m = _build(None, init, seed, dev, cls=mod.ModelNew)
                cache[r["path"]] = m
                reply({"ok": True, "candidate": bench(lambda: m(*inputs), dev, rep_ms)})
            else:
                reply({"ok": False, "error": f"unknown op {r['op']}"})
        except BaseException:  # noqa: BLE001
            reply({"ok": False, "error": _tail(traceback.format_exc())})


def _time_compiled(model, inputs, dev, rep_ms) -> dict:
    """torch.compile (default mode): the first call (compilation and Inductor's autotuning) is
    timed apart as compile_s, never inside the timing; then timed like eager. The compilation
    holds no GPU lock: it is CPU work but for short autotuning bursts (docs/bench.md)."""
    from harness.timing import bench

    try:
        compiled = torch.compile(model)
        with torch.no_grad():
            t0 = time.perf_counter()
            compiled(*inputs)
            _sync(dev)
            compile_s = time.perf_counter() - t0
        res = bench(lambda: compiled(*inputs), dev, rep_ms)
        res["compile_s"] = round(compile_s, 2)
        return res
    except Exception as e:  # noqa: BLE001
        return {"error": f"torch.compile failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
