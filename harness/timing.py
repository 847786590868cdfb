"""Timing: CUDA events around each repetition with the L2 flushed in between (the method of
``triton.testing.do_bench``), warm-up outside the timed region, median and p20/p80 over many
repetitions; plus a synchronized wall-clock check that catches work the events do not see (side
streams). On the CPU the interpreter's wall time, labelled as such (never a GPU timing).

Everything runs under ``torch.no_grad()``. The first call of the function (Triton JIT
compilation, cuDNN/cuBLAS handle creation, torch.compile's lazy work) is never timed: it runs
before the estimate, under the shared GPU lock; warm-up and timed repetitions hold the GPU lock
exclusively (harness.gpulock), so parallel EGG processes never time at the same moment.
"""
from __future__ import annotations

import math
import statistics
import time

import torch

from harness import gpulock

#: a synchronized single call may exceed the event median by host overhead; beyond this much
#: (and beyond the event time itself) the timer is missing work: flagged for a second look.
WALL_SLACK_MS = 0.2
#: bytes written between repetitions to evict the L2 (Triton's do_bench uses 256 MB too): more
#: than twice the largest L2 among knowledge/hardware (96 MB, L40S)
FLUSH_BYTES = 256 * 1024 * 1024
#: repetitions: as many as fit in rep_ms, but at least MIN_REPS (so p20/p80 mean something for
#: slow functions) and at most MAX_REPS (so a microsecond kernel does not take seconds of host
#: time per variant)
MIN_REPS = 10
MAX_REPS = 2000
#: warm-up calls after the first call and the 3 estimate calls (which warm up too): as many as
#: fit in warmup_ms, at least MIN_WARMUP
MIN_WARMUP = 1
#: synchronized wall-clock calls after the timed repetitions (the side-stream check)
WALL_CALLS = 3
#: two timings differing by less than this fraction are noise, whatever the spread
MIN_REL_DIFF = 0.02

_FLUSH: dict = {}


def bench(fn, dev: torch.device, rep_ms: float = 200.0, warmup_ms: float = 25.0) -> dict:
    """Time ``fn()`` on ``dev``: {median_ms, p20_ms, p80_ms, n, interpreter, ...}."""
    dev = torch.device(dev)
    with torch.no_grad():
        if dev.type != "cuda":
            return _bench_cpu(fn)
        return _bench_gpu(fn, dev, rep_ms, warmup_ms)


def quantile(sorted_xs: list[float], q: float) -> float:
    """Linear-interpolated quantile of sorted values (numpy's default method)."""
    if not sorted_xs:
        return float("nan")
    pos = q * (len(sorted_xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def summarize(times_ms: list[float]) -> dict:
    xs = sorted(times_ms)
    return {"median_ms": quantile(xs, 0.5), "p20_ms": quantile(xs, 0.2),
            "p80_ms": quantile(xs, 0.8), "min_ms": xs[0] if xs else float("nan"), "n": len(xs)}


def _bench_cpu(fn, reps: int = 3) -> dict:
    fn()  # warm-up (interpreter kernels trace on first call)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return {**summarize(ts), "interpreter": True, "flags": []}


def _flush_buffer(dev: torch.device) -> torch.Tensor:
    key = (dev.type, dev.index if dev.index is not None else torch.cuda.current_device())
    buf = _FLUSH.get(key)
    if buf is None:
        buf = _FLUSH[key] = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device=dev)
    return buf


def _bench_gpu(fn, dev: torch.device, rep_ms: float, warmup_ms: float) -> dict:
    with gpulock.hold("shared"):
        fn()  # first call: JIT compilation and lazy initialization, never timed
        torch.cuda.synchronize(dev)
    waited0 = gpulock.waited_s()
    with gpulock.hold("exclusive"):
        flush = _flush_buffer(dev)
        # estimate (one call with a flush each, like do_bench), then warm up
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        for _ in range(3):
            flush.zero_()
            fn()
        t1.record()
        torch.cuda.synchronize(dev)
        est = max(t0.elapsed_time(t1) / 3, 1e-4)
        n_warm = max(MIN_WARMUP, min(1000, int(warmup_ms / est)))
        n_rep = max(MIN_REPS, min(MAX_REPS, int(rep_ms / est)))
        for _ in range(n_warm):
            fn()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
        for i in range(n_rep):
            flush.zero_()  # the L2 holds none of the inputs at the start of each repetition
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize(dev)
        times = [s.elapsed_time(e) for s, e in zip(starts, ends)]
        walls = []
        for _ in range(WALL_CALLS):
            torch.cuda.synchronize()  # device-wide: every stream
            w0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            walls.append((time.perf_counter() - w0) * 1e3)
    out = {**summarize(times), "wall_ms": statistics.median(walls), "interpreter": False,
           "warmup": n_warm, "flush_bytes": FLUSH_BYTES,
           "lock_wait_s": round(gpulock.waited_s() - waited0, 3), "flags": []}
    med, wall = out["median_ms"], out["wall_ms"]
    if wall - med > max(WALL_SLACK_MS, med):
        out["flags"].append(
            f"synchronized wall time {wall:.3f} ms far above event time {med:.3f} ms: "
            "work outside the timed stream?")
    return out


def relative_spread(t: dict) -> float:
    """(p80 - p20) / median of a timing; 0.0 when it has no percentiles."""
    p20, p80 = t.get("p20_ms"), t.get("p80_ms")
    if p20 is None or p80 is None:
        return 0.0
    return (p80 - p20) / max(t["median_ms"], 1e-12)


def noise_verdict(new: dict, best: dict, min_rel: float = MIN_REL_DIFF) -> str:
    """improved / regressed / noise of a new timing against the stage's best timing.

    The relative spread of a timing is (p80 - p20) / median. A difference of medians within the
    larger spread of the two, or under ``min_rel`` (2%), is noise: never a win, never a
    regression; unless the two distributions do not overlap between their 20th and 80th
    percentiles (the new p80 below the best's p20, or its p20 above the best's p80): one wide
    timing (a sub-0.1 ms kernel on a busy host) does not hide a clear difference. Routers and
    the tiler's search act on this verdict only.
    """
    m_new, m_best = new["median_ms"], best["median_ms"]
    n20, n80, b20, b80 = (t.get(k) for t in (new, best) for k in ("p20_ms", "p80_ms"))
    if None not in (n20, n80, b20, b80) and abs(m_new - m_best) >= min_rel * m_best:
        if n80 < b20 and m_new < m_best:
            return "improved"
        if n20 > b80 and m_new > m_best:
            return "regressed"

    spread = max(relative_spread(new), relative_spread(best), min_rel)
    if m_new < m_best * (1 - spread):
        return "improved"
    if m_new > m_best * (1 + spread):
        return "regressed"
    return "noise"
