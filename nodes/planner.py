"""planner: read the problem, detect the machine, capture and count, plan fusion and goals."""
from __future__ import annotations

import time

from langgraph.runtime import Runtime

from codegen.pipeline import fallback_source
from harness.hardware import detect
from harness.problem import ProblemError, describe_problem, problem_from_source
from nodes.common import candidate_path, run_dir, settings_of
from policies import get_policy
from state import Candidate, EggState, Settings, StageContext, STAGES


def planner(state: EggState, runtime: Runtime[Settings]) -> dict:
    settings = settings_of(runtime)
    started = state.started_at or time.time()
    path = state.problem_path
    if not path and state.problem_source:
        path = str(problem_from_source(state.problem_source, run_dir(settings, state) / "problem"))
    if not path:
        return {"error": "no problem given: set problem_path or problem_source", "stage": "done"}
    try:
        _prob, spec = describe_problem(path)
    except ProblemError as e:
        return {"error": str(e), "stage": "done"}
    hw = detect(settings.resolved_device())
    ready = state.model_copy(update={"problem": spec, "hardware": hw, "problem_path": path})
    policy = get_policy(settings.policy)
    analysis, plan = policy.plan(ready, settings)
    ref = Candidate(id="c0", stage="plan", author="planner", source=fallback_source(spec.source),
                    fallback=True, rationale="the reference wrapped as ModelNew: always valid")
    ref.path = str(candidate_path(settings, ready, ref))
    contexts = {"plan": StageContext(stage="plan", goal="analysis and fusion plan",
                                     decisions=plan.notes + [f"rewrite {r}" for r in plan.rewrites],
                                     finished=True, best_id="c0")}
    for st in STAGES:
        contexts[st] = StageContext(stage=st, goal=plan.goals.get(st, ""))
    update = {"problem": spec, "problem_path": path, "hardware": hw, "analysis": analysis,
              "plan": plan, "candidates": [ref], "best_id": "c0", "current_id": None,
              "stage": "algorithm", "stage_context": contexts, "started_at": started,
              "caps": {st: settings.max_attempts(st) for st in STAGES}}
    take = getattr(policy, "take_usage", None)
    if take and (u := take()):
        update["llm_usage"] = u
    return update
