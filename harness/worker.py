"""What runs inside the harness's child processes (see harness.child).

Verification uses two processes so that nothing a candidate does can reach the comparison:
the judge builds the reference model, draws inputs, computes eager (and float64) outputs and
compares; the candidate process (spawned by the judge, fresh, never forked from a process that
holds CUDA) only imports the candidate and runs it on inputs it receives through shared memory
(CUDA IPC on GPUs), returning its outputs the same way. The judge checks parameters, output
structure, values under the precision contract, that inputs are unchanged, and calls the
candidate again on new values in the same buffers.
"""
from __future__ import annotations

import json
import math
import os
import secrets
import signal
import time
import traceback

import torch
import torch.multiprocessing as mp

from harness.compare import (Tolerance, compare_output, flatten, fp64_door, structure_error)
from harness.problem import ProblemError, build_model, load_module, load_problem

POISON_BYTES = 1 << 30  # device memory filled with NaN before each candidate call (1 GiB)


# ----------------------------------------------------------------------------- helpers
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
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def _tail(tb: str, n: int = 6) -> str:
    lines = [ln for ln in tb.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-n:])


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


# ----------------------------------------------------------------------------- candidate side
def candidate_main(conn, creq: dict) -> None:
    """The candidate process: load, build, then run on request. Never sees reference outputs."""
    try:
        os.setpgid(0, os.getpgid(os.getppid()))
    except OSError:
        pass
    if creq.get("memory_limit_gb") and creq["device"] == "cpu":
        import resource

        lim = int(creq["memory_limit_gb"] * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    dev = torch.device(creq["device"])
    if dev.type == "cuda" and creq.get("memory_limit_gb"):
        total = torch.cuda.get_device_properties(dev).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, creq["memory_limit_gb"] * (1 << 30) / total), dev)
    launches = _count_triton_launches()
    try:
        prob = load_problem(creq["problem"])
        mod = load_module(creq["candidate"], "candidate")
        cls = getattr(mod, "ModelNew", None)
        if not isinstance(cls, type) or not issubclass(cls, torch.nn.Module):
            conn.send(("error", "load", f"candidate {creq['candidate']}: defines no ModelNew(nn.Module)"))
            return
        init = prob.init_inputs()
        model = _build(None, init, creq["init_seed"], dev, cls=cls)
        state = {k: v.detach() for k, v in model.named_parameters()}
        conn.send(("ready", state))
    except ProblemError as e:
        conn.send(("error", "load", str(e)))
        return
    except BaseException:  # noqa: BLE001
        conn.send(("error", "init", _tail(traceback.format_exc())))
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
                p = torch.empty(POISON_BYTES // 4, device=dev)
                p.fill_(float("nan"))
                del p
            _sync(dev)
            before = launches["n"]
            t0 = time.perf_counter()
            with torch.no_grad():
                out = model(*held)
            _sync(dev)
            wall = time.perf_counter() - t0
            outs = flatten(out)
            safe = [o.detach() if isinstance(o, torch.Tensor) else o for o in outs]
            conn.send(("out", safe, wall, launches["n"] - before,
                       [type(o).__name__ for o in outs]))
        except BaseException:  # noqa: BLE001
            conn.send(("error", "runtime", _tail(traceback.format_exc())))
            return
        ack = conn.recv()
        del out, outs, safe
        if ack[0] == "quit":
            return


# ----------------------------------------------------------------------------- judge side
class _Verdict(Exception):
    def __init__(self, category: str, reason: str):
        super().__init__(reason)
        self.category, self.reason = category, reason


def judge(req: dict, chan) -> None:
    t_start = time.time()
    result = {"passed": False, "reason": "", "category": "", "trials": 0, "checks": [],
              "outputs": [], "flags": [], "launches": 0, "device": req["device"]}
    proc = conn = None
    try:
        dev = torch.device(req["device"])
        tol = Tolerance(**req.get("tolerance", {}))
        prob = load_problem(req["problem"])
        init = prob.init_inputs()
        init_seed = secrets.randbits(62)
        model = _build(prob, init, init_seed, dev)
        ctx = mp.get_context("spawn")
        conn, child = ctx.Pipe()
        creq = {k: req[k] for k in ("problem", "candidate", "device")}
        creq.update(init_seed=init_seed, memory_limit_gb=req.get("memory_limit_gb", 0))
        proc = ctx.Process(target=candidate_main, args=(child, creq), daemon=True)
        proc.start()
        child.close()
        call_timeout = float(req.get("call_timeout_s", 300))
        msg = _recv(conn, proc, call_timeout, "loading the candidate")
        if msg[0] == "error":
            raise _Verdict("compile" if msg[1] in ("load", "init") else msg[1], msg[2])
        _check_params(model, msg[1], result)
        result["checks"].append("parameters")
        n_trials = int(req.get("trials", 5))
        buffers = None
        fp64_model = None
        for t in range(n_trials):
            seed = secrets.randbits(62)
            fresh = _seeded_inputs(prob, seed, dev)
            if buffers is not None and t % 2 == 1:
                # same buffers, new values: defeats caches keyed on pointers or on first results
                for b, f in zip(buffers, fresh):
                    if isinstance(b, torch.Tensor):
                        b.copy_(f)
                inputs, mode = buffers, ("again",)
            else:
                inputs = fresh
                buffers = inputs
                mode = ("run", inputs)
            saved = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
            with torch.no_grad():
                ref = [r.detach().clone() if isinstance(r, torch.Tensor) else r
                       for r in flatten(model(*inputs))]
                if t == 0:
                    ref2 = flatten(model(*inputs))
                    _check_reference_determinism(ref, ref2, tol)
                    result["checks"].append("reference-determinism")
            _sync(dev)  # the candidate process reads these buffers on its own stream
            conn.send(mode)
            msg = _recv(conn, proc, call_timeout, f"trial {t + 1}")
            if msg[0] == "error":
                raise _Verdict(msg[1], msg[2])
            _, outs, wall, launches, types_ = msg
            cand = [o.clone() if isinstance(o, torch.Tensor) else o for o in outs]
            _sync(dev)  # our copies are complete before the candidate may free its outputs
            conn.send(("ack",))
            del outs
            result["launches"] = max(result["launches"], launches)
            err = structure_error(ref, cand)
            if err is None and any(tn not in ("Tensor", "Parameter") for tn, r in zip(types_, ref)
                                   if isinstance(r, torch.Tensor)):
                err = f"returns a tensor subclass ({', '.join(types_)})"
            if err:
                raise _Verdict("mismatch", err)
            checks = []
            need64 = t == 0
            for i, (r, c) in enumerate(zip(ref, cand)):
                if not isinstance(r, torch.Tensor):
                    if r != c:
                        raise _Verdict("mismatch", f"output {i}: {c!r} != eager's {r!r}")
                    continue
                chk = compare_output(i, r, c, tol)
                checks.append((chk, r, c))
                need64 |= not chk.ok
            if need64 and any(r.dtype.is_floating_point for _, r, _ in checks):
                if fp64_model is None:
                    fp64_model = _fp64_model(model)
                ref64 = _fp64_outputs(fp64_model, inputs) if fp64_model is not None else None
                if ref64 is not None:
                    checks = [(fp64_door(chk, ref64[chk.index], r, c), r, c) for chk, r, c in checks]
                    if "fp64-door" not in result["checks"]:
                        result["checks"] += ["fp64-door", "precision-probe"]
            for chk, _, _ in checks:
                _merge_output(result, chk)
                if not chk.ok:
                    raise _Verdict("precision" if "lower precision" in chk.reason else "mismatch",
                                   f"trial {t + 1}: {chk.reason}")
            for i, (a, b) in enumerate(zip(inputs, saved)):
                if isinstance(a, torch.Tensor) and not torch.equal(a, b):
                    raise _Verdict("cheat", f"trial {t + 1}: input {i} was modified by the candidate")
            result["trials"] = t + 1
        result["checks"] += ["tolerance", "inputs-unchanged", "recall-same-buffers"]
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
    result["wall_s"] = round(time.time() - t_start, 3)
    chan.write(json.dumps(result) + "\n")


def _recv(conn, proc, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if conn.poll(0.2):
            try:
                return conn.recv()
            except EOFError:
                break
        if not proc.is_alive():
            if conn.poll(0.1):
                return conn.recv()
            break
    if proc.is_alive():
        proc.kill()
        proc.join(5)
        raise _Verdict("timeout", f"candidate did not finish {what} within {timeout:g} s")
    proc.join(1)
    raise _Verdict("crash", f"candidate process {_signal_name(proc.exitcode)} during {what}")


def _check_params(model, cand_state: dict, result: dict) -> None:
    ref = dict(model.named_parameters())
    missing = [k for k in ref if k not in cand_state]
    if missing:
        raise _Verdict("params", f"ModelNew lacks parameters of Model: {', '.join(missing[:5])}")
    for k, p in ref.items():
        c = cand_state[k]
        if tuple(c.shape) != tuple(p.shape) or c.dtype != p.dtype:
            raise _Verdict("params", f"parameter {k} is {tuple(c.shape)} {c.dtype}, Model's {tuple(p.shape)} {p.dtype}")
        if not torch.equal(c.to(p.device), p.detach()):
            raise _Verdict("params", f"parameter {k} differs from Model's after the same seeded init")
    extra = [k for k in cand_state if k not in ref]
    if extra:
        result["flags"].append(f"extra parameters: {', '.join(extra[:5])}")


def _check_reference_determinism(a: list, b: list, tol: Tolerance) -> None:
    for i, (x, y) in enumerate(zip(a, b)):
        if isinstance(x, torch.Tensor) and not torch.equal(x, y):
            chk = compare_output(i, x, y, tol)
            if not chk.ok:
                raise _Verdict("reference", f"the reference is not deterministic: two eager runs "
                               f"on the same inputs differ (output {i}, max abs {chk.max_abs:.3g}); "
                               "e.g. dropout in training mode")


def _fp64_model(model):
    import copy

    try:
        return copy.deepcopy(model).double()
    except Exception:  # noqa: BLE001
        return None


def _fp64_outputs(m64, inputs):
    xs = [x.double() if isinstance(x, torch.Tensor) and x.dtype.is_floating_point else x for x in inputs]
    try:
        with torch.no_grad():
            return [o if isinstance(o, torch.Tensor) else o for o in flatten(m64(*xs))]
    except Exception:  # noqa: BLE001 - an op without fp64 support: no door, tolerance only
        return None


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
    if chk.passed_by == "fp64":
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

    dev = torch.device(req["device"])
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
