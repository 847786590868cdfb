"""profiler: time the verified candidate against eager and torch.compile in one process,
roofline fraction, and the noise-aware verdict the routers read."""
from __future__ import annotations

import time

from langgraph.runtime import Runtime

from harness import peaks as PK
from harness import profile as P
from harness import roofline
from harness.timing import noise_verdict, relative_spread
from nodes.common import call_budget, candidate_path, mark_attempt, run_dir, settings_of
from state import EggState, Settings, TimingRecord


def _record(cid: str, t: dict, base: dict, floor_ms: float | None, interpreter: bool,
            eager: dict | None = None) -> TimingRecord:
    """``eager``: eager's timing measured interleaved with this candidate's (else the baseline's)."""
    eager = eager or base.get("eager", {})
    comp = base.get("compile", {})
    ms = t["median_ms"]
    rec = TimingRecord(
        candidate_id=cid, device="cpu" if interpreter else "cuda", interpreter=interpreter,
        candidate_ms=ms, p20_ms=t.get("p20_ms"), p80_ms=t.get("p80_ms"),
        eager_ms=eager.get("median_ms"), eager_p20_ms=eager.get("p20_ms"),
        eager_p80_ms=eager.get("p80_ms"), compile_ms=comp.get("median_ms"),
        compile_s=comp.get("compile_s"), compile_error=comp.get("error"),
        compile_contract=comp.get("contract"), flags=list(t.get("flags", [])))
    if interpreter:
        rec.note = "Triton CPU interpreter timing: not a GPU timing, no speedup claimed"
        return rec
    rec.speedup_eager = rec.eager_ms / ms if rec.eager_ms and ms else None
    rec.speedup_compile = rec.compile_ms / ms if rec.compile_ms and ms else None
    rec.roofline_pct = roofline.percent(floor_ms, ms)
    if rec.speedup_eager and rec.speedup_eager > 10:
        rec.flags.append("speedup over 10x: flagged for a second look")
    return rec


#: a timing whose 20-80% range is wider than this fraction of its median was disturbed (seen on
#: the H200 with two problems on one GPU: a 0.72 ms kernel whose p80 passed eager's 1.38 ms
#: p20, judged "noise" against a 1.9x gain); it is taken again, up to RETIMES times
UNSTABLE_SPREAD = 0.25
RETIMES = 2
#: a timing whose median is this much below the best's but whose verdict is "noise" (its spread
#: or the best's covers the gain) is unresolved, not a measured tie: it is taken again too, up to
#: RETIMES times (level 3 on the H200 with 4 problems sharing 16 cores: DenseNet-121's c1 at
#: 6.90 ms and a dense block's at 5.66 ms, 10-12% under eager's 7.70 and 6.44 ms, both "noise"
#: and so the reference stayed). The narrowest timing is kept whatever its median, and the
#: verdict is taken on it as on any other: a second look, not a second chance to pick a minimum.
UNRESOLVED_GAIN = 0.05


def _unresolved(t: dict, best: dict) -> bool:
    """``t`` is UNRESOLVED_GAIN or more under ``best`` by its median, yet called noise."""
    return t["median_ms"] <= best["median_ms"] * (1 - UNRESOLVED_GAIN) and noise_verdict(t, best) == "noise"


def _steady(sess, path: str, sha256: str | None = None, best: dict | None = None,
            end: float | None = None) -> tuple[dict, dict | None, float]:
    """The candidate's timing (and eager's, interleaved with it), taken again while its spread
    says it was disturbed or, against ``best`` (the stage's best timing), it is unresolved by its
    own spread (see UNRESOLVED_GAIN); the narrowest one is kept, with a flag saying so. ``end``
    (a time.time()): the run's budget ends then; each call is held to it, and no timing is taken
    again with less than twice the last one's duration left. Returns the timing, eager's next to
    it and the last timing call's duration in seconds."""
    def unsettled(t: dict) -> bool:
        if relative_spread(t) > UNSTABLE_SPREAD:
            return True
        # unresolved by its own spread (a wider best is timed again instead: _best_again)
        return best is not None and _unresolved(t, best) and relative_spread(t) >= relative_spread(best)

    def timed() -> tuple[dict, float]:
        if end is not None:
            sess.timeout_s = max(1.0, end - time.time())
        t0 = time.time()
        return sess.time_candidate(path, sha256), time.time() - t0

    t, took = timed()
    eager = sess.last_eager
    first, taken, cut = relative_spread(t), 1, False
    for _ in range(RETIMES):
        if not unsettled(t):
            break
        if end is not None and end - time.time() < 2 * took:
            cut = True
            break
        again, took = timed()
        taken += 1
        if relative_spread(again) < relative_spread(t):
            t, eager = again, sess.last_eager
    if taken > 1 or cut:
        t = {**t, "flags": list(t.get("flags", [])) + [
            f"re-timed ({taken} timings): 20-80% spread {first:.0%} of the median at first, kept the "
            f"timing with {relative_spread(t):.0%}" if taken > 1 else
            "not re-timed: too little of the run's time budget left"]}
    return t, eager, took


def _best_again(sess, settings, state: EggState, t: dict, prior: TimingRecord | None,
                against: dict, eager_now: dict | None, end: float | None = None, took: float = 0.0):
    """The stage's best timed again when it is what leaves ``t`` unresolved: a gain of
    UNRESOLVED_GAIN or more called noise while the best's own timing (``against``) is the wider of
    the two (the H200, level 1's LayerNorm with four problems on the GPU: the tiler's c2 at 0.595
    ms against c1's 0.827 ms was "noise", the search had timed them 0.385 and 0.934 ms). A best
    candidate is timed again; the reference's new timing is eager's taken next to ``t``
    (``eager_now``: a first kernel is held against it anyway). Not with less than twice the last
    timing's duration (``took``) left before ``end``. Returns the best's narrower timing and
    eager's next to it, or None."""
    if not (_unresolved(t, against) and relative_spread(against) > relative_spread(t)):
        return None
    if prior is None or prior.candidate_id == "c0":
        if eager_now and eager_now.get("median_ms") and relative_spread(eager_now) < relative_spread(against):
            return eager_now, eager_now
        return None
    best = state.candidate(prior.candidate_id)
    if best is None or (end is not None and end - time.time() < 2 * took):
        return None
    ver = state.verification(best.id)
    tb, eb, _ = _steady(sess, str(candidate_path(settings, state, best)),
                        (ver.candidate_sha256 if ver else "") or None, end=end)
    return (tb, eb) if relative_spread(tb) < relative_spread(against) else None


def _as_bench(rec: TimingRecord) -> dict:
    return {"median_ms": rec.candidate_ms, "p20_ms": rec.p20_ms or rec.candidate_ms,
            "p80_ms": rec.p80_ms or rec.candidate_ms}


def _floor(state: EggState, sess: P.ProfileSession) -> float | None:
    """The planner's roofline floor; recomputed with this machine's measured peaks when the
    profiling process measured them after the planner ran (the first run on a machine)."""
    a, hw = state.analysis, state.hardware
    if a is None:
        return None
    measured = sess.peaks
    if not measured or hw.peaks_source.startswith("measured here") or (not a.flops_by_peak and not a.bytes):
        return a.floor_ms
    pk, bw = PK.as_profile(measured)
    cnt = roofline.Count(flops=a.flops, nbytes=a.bytes, flops_by_peak=dict(a.flops_by_peak))
    return roofline.floor(cnt, {**hw.peak_tflops, **pk}, bw or hw.mem_bandwidth_gbs).ms


def profiler(state: EggState, runtime: Runtime[Settings]) -> dict:
    settings = settings_of(runtime)
    cand = state.candidate(state.current_id)
    if cand is None:
        return {}
    dev = state.hardware.device
    interp = state.hardware.interpreter
    key = P.session_key(settings.run_dir, state.problem.sha256, dev)
    out: dict = {"timings": []}
    budget = call_budget(settings, state, settings.profile_timeout_s)
    if budget is None:
        rec = TimingRecord(candidate_id=cand.id, device=dev, interpreter=interp, verdict="failed",
                           note=f"not timed: the run's time budget ({settings.time_limit_s:g} s) "
                                "is spent; the best verified candidate so far is kept")
        return {"timings": [rec], "stage_context": mark_attempt(state, cand.id, "failed", rec.note)}
    end = time.time() + budget  # the run's budget: every timing call below is held to it
    ver = state.verification(cand.id)
    tol = {"atol_fp32": settings.atol_fp32, "rtol_fp32": settings.rtol_fp32,
           "atol_lowp": settings.atol_lowp, "rtol_lowp": settings.rtol_lowp}
    try:
        sess = P.session(key, state.problem.path, dev, settings.timing_rep_ms,
                         budget, str(run_dir(settings, state) / "logs"),
                         tol, settings.memory_limit_gb)
        sess.timeout_s = budget  # each call ends inside the run's budget
        base = sess.baselines()
        floor = _floor(state, sess)
        prior = state.timing(state.best_id) or state.timing("c0")
        # the interpreter's timings decide nothing (verdict "unmeasured"): no second look there
        against = None if interp else (_as_bench(prior) if prior is not None else base["eager"])
        t, eager_now, took = _steady(sess, str(candidate_path(settings, state, cand)),
                                     (ver.candidate_sha256 if ver else "") or None, against, end)
        best_again = (None if interp else
                      _best_again(sess, settings, state, t, prior, against, eager_now, end, took))
    except P.ProfileRejected as e:
        rec = TimingRecord(candidate_id=cand.id, device=dev, interpreter=interp, verdict="failed",
                           note=f"rejected by the timing judge [{e.category}]: {e}")
        return {"timings": [rec], "stage_context": mark_attempt(state, cand.id, "failed", rec.note)}
    except P.ProfileError as e:
        rec = TimingRecord(candidate_id=cand.id, device=dev, interpreter=interp, verdict="failed",
                           note=f"profiling failed: {e}")
        return {"timings": [rec], "stage_context": mark_attempt(state, cand.id, "failed", rec.note)}
    if state.timing("c0") is None:  # the reference's own record: eager time, verdict baseline
        ref = _record("c0", base["eager"], base, floor, interp)
        ref.verdict = "baseline"
        out["timings"].append(ref)
        best_rec = ref
    else:
        best_rec = state.timing(state.best_id) or state.timing("c0")
    if best_again is not None:  # the best's narrower timing is its record from now on
        was = best_rec
        best_rec = _record(was.candidate_id, best_again[0], base, floor, interp, best_again[1])
        best_rec.verdict, best_rec.compared_to = was.verdict, was.compared_to
        how = ("eager timed next to" if was.candidate_id == "c0" else "re-timed as the best when")
        best_rec.flags.append(f"{how} {cand.id}, whose gain was unresolved against it: "
                              f"{was.candidate_ms:.4f} ms (20-80% spread {relative_spread(_as_bench(was)):.0%}) "
                              f"-> {best_rec.candidate_ms:.4f} ms ({relative_spread(_as_bench(best_rec)):.0%})")
        out["timings"].append(best_rec)
    rec = _record(cand.id, t, base, floor, interp, eager_now)
    rec.compared_to = state.best_id
    if interp:
        rec.verdict = "unmeasured"
    else:
        rec.verdict = noise_verdict(_as_bench(rec), _as_bench(best_rec))
        if rec.verdict == "improved" and best_rec.candidate_id == "c0" and (eager_now or {}).get("median_ms"):
            # the reference's record is eager timed once, at the session's start; eager timed
            # again next to this candidate may differ (the H200: 3.28 then 3.04 ms for one 6 GiB
            # elementwise problem, and a kernel at 3.15 ms replaced the reference). A first kernel
            # must also beat the eager time measured next to it.
            again = noise_verdict(_as_bench(rec), eager_now)
            if again != "improved":
                rec.verdict = again
                rec.note = (f"faster than the reference's first timing ({best_rec.candidate_ms:.4f} ms) but "
                            f"not than eager timed next to it ({eager_now['median_ms']:.4f} ms): {again}")
    out["timings"].append(rec)
    # On the GPU a candidate must beat the best beyond noise; on the CPU nothing is measured, so a
    # verified kernel candidate replaces the reference (the report claims no speedup there).
    if rec.verdict == "improved" or (interp and not cand.fallback):
        out["best_id"] = cand.id
    summary = (f"{rec.candidate_ms:.4f} ms vs best {best_rec.candidate_ms:.4f} ms: {rec.verdict}"
               if not interp else "verified (interpreter: not timed for speed)")
    ctx = mark_attempt(state, cand.id, rec.verdict, summary)
    ctx[state.stage].best_id = out.get("best_id", state.best_id)
    out["stage_context"] = ctx
    return out
