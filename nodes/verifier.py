"""verifier: compile and run the current candidate in isolated processes under the precision
contract and the anti-cheat checks (harness.verify)."""
from __future__ import annotations

from langgraph.runtime import Runtime

from harness.compare import Tolerance
from harness.verify import verify
from nodes.common import call_budget, candidate_path, mark_attempt, run_dir, settings_of
from state import EggState, OutputError, Settings, TrialRecord, VerificationRecord


def verifier(state: EggState, runtime: Runtime[Settings]) -> dict:
    settings = settings_of(runtime)
    cand = state.candidate(state.current_id)
    if cand is None:
        return {}
    path = candidate_path(settings, state, cand)
    budget = call_budget(settings, state, settings.verify_timeout_s)
    if budget is None:
        rec = VerificationRecord(
            candidate_id=cand.id, passed=False, category="timeout", device=state.hardware.device,
            reason=f"not verified: the run's time budget ({settings.time_limit_s:g} s) is spent; "
                   "the best verified candidate so far is kept")
        return {"verifications": [rec],
                "stage_context": mark_attempt(state, cand.id, "failed", rec.reason)}
    tol = Tolerance(settings.atol_fp32, settings.rtol_fp32, settings.atol_lowp, settings.rtol_lowp)
    # egg bench --verify-lock: the judge holds the GPU lock shared for each trial's GPU work
    res = verify(state.problem.path, str(path), device=state.hardware.device, trials=settings.trials,
                 tol=tol, timeout_s=budget, memory_limit_gb=settings.memory_limit_gb,
                 problem_source=state.problem.source, log_dir=str(run_dir(settings, state) / "logs"))
    flags = list(res.get("flags", []))
    if res.get("passed") and cand.kernels and res.get("launches", 0) == 0:
        flags.append("declares Triton kernels but launched none")
    rec = VerificationRecord(
        candidate_id=cand.id, passed=bool(res.get("passed")), reason=res.get("reason", ""),
        category=res.get("category", ""), trials=res.get("trials", 0), device=res.get("device", ""),
        checks=res.get("checks", []), outputs=[OutputError(**o) for o in res.get("outputs", [])],
        wall_s=float(res.get("wall_s", 0.0)), flags=flags,
        trial_log=[TrialRecord(**t) for t in res.get("trial_log", [])],
        phases={k: float(v) for k, v in (res.get("phases") or {}).items()},
        sandbox=list(res.get("sandbox", [])), candidate_sha256=res.get("candidate_sha256", ""))
    update = {"verifications": [rec]}
    if not rec.passed:
        update["stage_context"] = mark_attempt(state, cand.id, "failed",
                                               f"[{rec.category}] {rec.reason}")
    return update
