"""reporter: the end of a run - the best candidate as best.py, report.json and report.md.

Not an optimization role: it only reads the records the roles wrote.
"""
from __future__ import annotations

import json

from langgraph.runtime import Runtime

from harness import profile as P
from nodes.common import run_dir, settings_of
from state import EggState, Settings, STAGES, VerificationRecord, trial_variant


def verification_evidence(v: VerificationRecord) -> dict:
    """What a verification checked and found, as plain data: trials (mode, grad, inputs, shapes,
    calls, outcome), per-output errors and the door each passed by (tolerance or fp64), the
    checks run and the OS protections of the candidate process. Empty lists where the verifier
    recorded nothing of a kind."""
    return {"candidate_id": v.candidate_id, "passed": v.passed, "category": v.category,
            "reason": v.reason, "trials": v.trials, "device": v.device, "wall_s": v.wall_s,
            "checks": list(v.checks), "sandbox": list(v.sandbox), "flags": list(v.flags),
            "outputs": [o.model_dump() for o in v.outputs],
            "trial_log": [t.model_dump() for t in v.trial_log], "phases": dict(v.phases)}


def stage_outcome(state: EggState, stage: str) -> str:
    """How a stage ended when the run ended, in words (report.json's stages[s].outcome,
    report.md's Stages): a stage is marked finished only when it stopped by itself (a cap, a
    time limit, nothing to do); one that moved on after an improvement says so."""
    ctx = state.context(stage)
    if ctx.finished:
        return f"finished: {ctx.finish_reason}" if ctx.finish_reason else "finished"
    made = [a.candidate_id for a in ctx.attempts]
    if not made:
        return "not reached"
    best = ctx.best_id
    return (f"moved on after {len(made)} candidate(s) ({', '.join(made)})"
            + (f"; best {best}" if best else ""))


def build_report(state: EggState, settings: Settings) -> dict:
    if state.error:
        return {"status": "error", "error": state.error, "problem": state.problem_path}
    best = state.candidate(state.best_id)
    t = state.timing(state.best_id)
    ref_t = state.timing("c0")
    interp = state.hardware.interpreter
    timing = {"interpreter": interp}
    src = t or ref_t
    if src is not None:
        timing.update(eager_ms=src.eager_ms, compile_ms=src.compile_ms, compile_s=src.compile_s,
                      compile_error=src.compile_error, compile_contract=src.compile_contract,
                      best_ms=src.candidate_ms if t is not None else src.eager_ms)
    if interp:
        timing["note"] = "CPU: Triton interpreter timings are not GPU timings; no speedup claimed"
    elif t is not None:
        timing.update(speedup_eager=t.speedup_eager if not best.fallback else 1.0,
                      speedup_compile=t.speedup_compile if not best.fallback else
                      (t.compile_ms / t.eager_ms if t.compile_ms and t.eager_ms else None),
                      roofline_pct=t.roofline_pct, flags=t.flags)
    stage1 = [x for x in state.timings if (c := state.candidate(x.candidate_id)) is not None
              and c.stage == "algorithm" and x.candidate_ms and state.verification(c.id)
              and state.verification(c.id).passed]
    stage1_best = min((x.candidate_ms for x in stage1), default=None)
    cands = []
    for c in state.candidates:
        v, tm = state.verification(c.id), state.timing(c.id)
        cands.append({"id": c.id, "stage": c.stage, "author": c.author, "parent": c.parent_id,
                      "kernels": c.kernels, "fallback": c.fallback,
                      "verified": None if v is None else v.passed,
                      "failure": None if v is None or v.passed else f"[{v.category}] {v.reason}"[:500],
                      "ms": tm.candidate_ms if tm else None, "verdict": tm.verdict if tm else None,
                      "verification": None if v is None else verification_evidence(v)})
    stages = {}
    for s in STAGES:
        stages[s] = state.context(s).model_dump()
        stages[s]["outcome"] = stage_outcome(state, s)
    a = state.analysis
    return {
        "status": "ok", "problem": state.problem.name, "path": state.problem.path,
        "sha256": state.problem.sha256, "device": state.hardware.device,
        "hardware": state.hardware.name, "policy": settings.policy,
        "best_id": state.best_id, "fallback": bool(best.fallback), "kernels": best.kernels,
        "best_stage": best.stage, "timing": timing, "stage1_best_ms": stage1_best,
        "analysis": {"flops": a.flops, "bytes": a.bytes, "floor_ms": a.floor_ms, "bound": a.bound,
                     "capture": a.capture, "capture_error": a.capture_error,
                     "capture_s": a.capture_s, "breaks": a.breaks, "attr_buffers": a.attr_buffers,
                     "folds": a.folds, "regions": [r.model_dump() for r in a.regions]} if a else None,
        "plan": {"groups": [g.model_dump() for g in state.plan.groups],
                 "rewrites": state.plan.rewrites} if state.plan else None,
        "stages": stages,
        "candidates": cands,
        "tuning": tuning_summary(state),
        "llm_usage": {k: v.model_dump() for k, v in state.llm_usage.items()},
        "llm": _llm_summary(state, settings),
    }


def _llm_summary(state: EggState, settings: Settings) -> dict | None:
    """Who the model was and what the run spent, per role and in total (LLM policies only)."""
    if settings.policy == "expert" and not state.llm_usage:
        return None
    roles = {k: u for k, u in state.llm_usage.items() if k != "total"}  # "total": the whole run
    total = {k: sum(getattr(u, k) for u in roles.values())
             for k in ("calls", "prompt_tokens", "completion_tokens", "cost_usd")}
    total["cost_usd"] = round(total["cost_usd"], 6)
    priced = bool(settings.llm_price_per_1k_prompt or settings.llm_price_per_1k_completion)
    return {"model": settings.llm_model, "base_url": settings.llm_base_url or "(client default)",
            "replayed_from": settings.llm_replay_dir or None, "total": total, "priced": priced,
            "token_budget": settings.llm_token_budget}


def tuning_summary(state: EggState) -> dict:
    """What the tiler's search cost: kernels served by the tuning cache, kernels searched, the
    variants pruned, compiled and timed, and the timings' seconds (from the tiling stage
    context's stats)."""
    st = state.context("tiling").stats
    out = {k: int(st.get(k, 0)) for k in ("cache_hits", "searched", "pruned", "compiled",
                                           "compile_rejected", "timed")}
    # the timings' wall seconds, of which starting candidate processes and waiting for the GPU lock
    out.update({k: round(float(st.get(k, 0.0)), 1) for k in ("timing_s", "start_s", "lock_wait_s")})
    return out


#: the verification's steps (worker.judge), in order, as VerificationRecord.phases names their ends
_PHASES = ("judge_started", "model", "candidate_ready", "state_loaded", "trials")


def _verification_seconds(ver: dict) -> str:
    """'62.3 s = 4.1 + 2.0 + 9.1 + 0.8 + 45.9 (trial 8.1)': a verification's seconds per step."""
    ph = ver.get("phases") or {}
    if "done" not in ph:
        return ""
    ends = [ph[k] for k in _PHASES if k in ph]
    steps = [b - a for a, b in zip([0.0] + ends, ends)]
    slow = max((t.get("s", 0.0) for t in ver.get("trial_log", [])), default=0.0)
    return (f"{ph['done']:.1f} s = " + " + ".join(f"{x:.1f}" for x in steps)
            + (f" (trial {slow:.1f})" if slow else ""))


def report_markdown(rep: dict) -> str:
    if rep.get("status") == "error":
        return f"# EGG run: error\n\n{rep['error']}\n"
    t = rep["timing"]
    lines = [f"# EGG run: {rep['problem']}", "",
             f"- device: {rep['device']} ({rep['hardware']}), policy: {rep['policy']}",
             f"- best candidate: {rep['best_id']} (stage {rep['best_stage']})"
             + (" - the reference itself (fallback)" if rep["fallback"] else
                f", kernels: {', '.join(rep['kernels'])}"), ""]
    fmt = lambda v, f="{:.4f}": "-" if v is None else f.format(v)  # noqa: E731
    if t.get("interpreter"):
        lines += [f"Timings are Triton CPU interpreter timings: {t.get('note')}.", "",
                  f"| eager ms (CPU) | best ms (interpreter) |", "|---|---|",
                  f"| {fmt(t.get('eager_ms'))} | {fmt(t.get('best_ms'))} |"]
    else:
        lines += ["| eager ms | torch.compile ms | EGG ms | vs eager | vs compile | roofline % |",
                  "|---|---|---|---|---|---|",
                  f"| {fmt(t.get('eager_ms'))} | {fmt(t.get('compile_ms'))} | {fmt(t.get('best_ms'))} "
                  f"| {fmt(t.get('speedup_eager'), '{:.2f}x')} | {fmt(t.get('speedup_compile'), '{:.2f}x')} "
                  f"| {fmt(t.get('roofline_pct'), '{:.1f}')} |"]
        if t.get("compile_contract"):
            lines += ["", "torch.compile's own output under the precision contract: "
                      + ("passes" if t["compile_contract"] == "passes" else f"fails ({_cell(t['compile_contract'])[:200]})")
                      + "."]
    lines += ["", "## Candidates", "", "| id | stage | verified | ms | verdict | note |", "|---|---|---|---|---|---|"]
    for c in rep["candidates"]:
        verified = {True: "yes", False: "no"}.get(c["verified"], "reference" if c.get("fallback") else "-")
        lines.append(f"| {c['id']} | {c['stage']} | {verified} | {fmt(c['ms'])} | {c['verdict'] or '-'} "
                     f"| {_cell(c['failure'] or '')[:120]} |")
    best = next((c for c in rep["candidates"] if c["id"] == rep["best_id"]), None)
    if best is not None and best.get("verification"):
        lines += ["", f"## Verification of {best['id']} (the answer)", ""] + evidence_markdown(best["verification"])
    tu = rep.get("tuning") or {}
    if any(tu.values()):
        lines += ["", f"Tuning: {tu.get('cache_hits', 0)} kernel(s) from the tuning cache, "
                  f"{tu.get('searched', 0)} searched ({tu.get('pruned', 0)} configs pruned by rules, "
                  f"{tu.get('compiled', 0)} compile-checked, {tu.get('compile_rejected', 0)} rejected, "
                  f"{tu.get('timed', 0)} timings"
                  + (f" in {tu['timing_s']:g} s: {tu.get('start_s', 0):g} s starting candidate processes, "
                     f"{tu.get('lock_wait_s', 0):g} s waiting for the GPU lock" if tu.get("timing_s") else "")
                  + ")."]
    spent = [(c["id"], _verification_seconds(c["verification"])) for c in rep["candidates"]
             if c.get("verification")]
    if any(v for _, v in spent):
        lines += ["", "Verification seconds (judge process start, Model built, candidate process and "
                  "ModelNew, random state loaded, trials; slowest trial): "
                  + "; ".join(f"{cid} {v}" for cid, v in spent if v) + "."]
    lines += ["", "## Stages", ""]
    for s, ctx in rep["stages"].items():
        decisions = "; ".join(d for d in ctx.get("decisions", [])[:4])
        lines.append(f"- {s}: {ctx.get('outcome') or ctx.get('finish_reason') or '-'}"
                     + (f" (decisions: {decisions})" if decisions else ""))
    llm = rep.get("llm")
    if llm:
        lines += ["", "## LLM usage", "",
                  f"model {llm['model']} at {llm['base_url']}"
                  + (f", replayed from {llm['replayed_from']}" if llm.get("replayed_from") else "")
                  + (f"; token budget {llm['token_budget']}" if llm.get("token_budget") else ""), "",
                  "| role | calls | prompt tokens | completion tokens | total tokens | cost USD |",
                  "|---|---|---|---|---|---|"]
        rows = sorted((k, u) for k, u in rep.get("llm_usage", {}).items() if k != "total")
        rows.append(("total", llm["total"]))
        for role, u in rows:
            cost = f"{u['cost_usd']:.4f}" if llm.get("priced") else "-"
            lines.append(f"| {role} | {u['calls']} | {u['prompt_tokens']} | {u['completion_tokens']} "
                         f"| {u['prompt_tokens'] + u['completion_tokens']} | {cost} |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return str(text).replace("|", "/").replace("\n", " ")


def evidence_markdown(ev: dict) -> list[str]:
    """A verification's evidence (verification_evidence) as markdown lines."""
    f = lambda v: "-" if v is None else f"{v:.3g}"  # noqa: E731
    verdict = "passed" if ev["passed"] else f"rejected [{ev['category']}] {ev['reason']}"
    lines = [f"{_cell(verdict)}: {ev['trials']} trial(s) on {ev['device']}, {ev['wall_s']:.1f} s."]
    if ev["checks"]:
        lines += ["", "Checks: " + _cell(", ".join(ev["checks"])) + "."]
    if ev["sandbox"]:
        lines += ["", "Candidate process: " + _cell(", ".join(ev["sandbox"])) + "."]
    if ev["trial_log"]:
        lines += ["", "| trial | mode | grad | inputs | shapes | shape variant | calls | passed | max abs err | note |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for t in ev["trial_log"]:
            shapes = " ".join("x".join(map(str, sh)) for sh in t["shapes"]) or "-"
            lines.append(f"| {t['index']} | {t['mode']} | {'on' if t['grad'] else 'off'} | {_cell(t['inputs'])} "
                         f"| {shapes} | {_cell(trial_variant(t))} | {t['calls']} "
                         f"| {'yes' if t['passed'] else 'no'} | {f(t['max_abs'])} | {_cell(t['note']) or '-'} |")
    if ev["outputs"]:
        lines += ["", "| output | max abs err | max rel err | eager err vs fp64 | candidate err vs fp64 | passed by |",
                  "|---|---|---|---|---|---|"]
        for o in ev["outputs"]:
            lines.append(f"| {o['index']} | {f(o['max_abs'])} | {f(o['max_rel'])} | {f(o['eager_err_fp64'])} "
                         f"| {f(o['cand_err_fp64'])} | {o['passed_by']} |")
    for flag in ev["flags"]:
        lines += ["", f"Flag: {_cell(flag)}"]
    return lines


def reporter(state: EggState, runtime: Runtime[Settings]) -> dict:
    settings = settings_of(runtime)
    rep = build_report(state, settings)
    if settings.run_dir:
        d = run_dir(settings, state)
        best = state.candidate(state.best_id)
        if best is not None:
            (d / "best.py").write_text(best.source)
        (d / "report.json").write_text(json.dumps(rep, indent=2, default=str))
        (d / "report.md").write_text(report_markdown(rep))
    if state.problem and state.hardware:
        P.close_session(P.session_key(settings.run_dir, state.problem.sha256, state.hardware.device))
    return {"report": rep, "stage": "done"}
