"""Timing: do_bench on the GPU (events, L2 flushed between repetitions, warm-up outside the
timed region, median and p20/p80), plus a synchronized wall-clock check that catches work the
events do not see (side streams). On the CPU the interpreter's wall time, labelled as such.
"""
from __future__ import annotations

import statistics
import time

import torch

#: a synchronized single call may exceed the event median by host overhead; beyond this much
#: (and beyond the event time itself) the timer is missing work: flagged for a second look.
WALL_SLACK_MS = 0.2


def bench(fn, dev: torch.device, rep_ms: float = 200.0) -> dict:
    with torch.no_grad():
        if dev.type != "cuda":
            return _bench_cpu(fn)
        return _bench_gpu(fn, dev, rep_ms)


def _bench_cpu(fn, reps: int = 3) -> dict:
    fn()  # warm-up (interpreter kernels trace on first call)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    ts.sort()
    return {"median_ms": statistics.median(ts), "p20_ms": ts[0], "p80_ms": ts[-1], "n": reps,
            "interpreter": True}


def _bench_gpu(fn, dev: torch.device, rep_ms: float) -> dict:
    import triton.testing

    fn()
    torch.cuda.synchronize(dev)
    med, p20, p80 = triton.testing.do_bench(fn, warmup=25, rep=rep_ms, quantiles=[0.5, 0.2, 0.8])
    walls = []
    for _ in range(5):
        torch.cuda.synchronize()  # device-wide: every stream
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t0) * 1e3)
    wall = statistics.median(walls)
    out = {"median_ms": med, "p20_ms": p20, "p80_ms": p80, "wall_ms": wall, "interpreter": False,
           "flags": []}
    if wall - med > max(WALL_SLACK_MS, med):
        out["flags"].append(
            f"synchronized wall time {wall:.3f} ms far above event time {med:.3f} ms: "
            "work outside the timed stream?")
    return out


def noise_verdict(new: dict, best: dict, min_rel: float = 0.02) -> str:
    """improved / regressed / noise of a new timing against the stage's best timing.

    A difference inside the measured spread of either (p20..p80), or under ``min_rel``, is noise.
    """
    m_new, m_best = new["median_ms"], best["median_ms"]
    spread = max((new["p80_ms"] - new["p20_ms"]) / max(m_new, 1e-12),
                 (best["p80_ms"] - best["p20_ms"]) / max(m_best, 1e-12), min_rel)
    if m_new < m_best * (1 - spread):
        return "improved"
    if m_new > m_best * (1 + spread):
        return "regressed"
    return "noise"
