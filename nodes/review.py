"""review: the optional pause after the planner, where a person approves, edits or aborts the
plan (setting ``review``). Not an optimization role: with review off it passes through.

With review on it calls LangGraph's ``interrupt()`` with the plan, and the run continues with
``Command(resume=decision)``, where decision is one of

- ``"approve"`` (or ``{"action": "approve"}``)
- ``{"action": "edit", "disable": ["g1"], "goals": {"algorithm": "..."}}``: turn fused groups
  off (their ops stay in PyTorch) and/or replace stage goals
- ``{"action": "edit", "plan": {...}}``: the plan as JSON, edited (a group's ``"enabled":
  false`` or a group left out turns it off; ``goals`` and ``notes`` are taken as written)
- ``"abort"`` (or ``{"action": "abort", "reason": "..."}``): the run ends without kernels

An unusable decision pauses again, with the problem in the payload's ``error``. The node does
nothing before ``interrupt()``, so LangGraph re-running it on resume is safe; the planner before
it has already been checkpointed and is not re-run.
"""
from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime
from langgraph.types import interrupt

from nodes.common import settings_of
from state import EggState, Plan, Settings, STAGES

ABORTED = "aborted at plan review"


def review_request(state: EggState, error: str | None = None) -> dict:
    """The interrupt payload: what a person needs to decide."""
    plan = state.plan
    return {
        "kind": "plan_review",
        "problem": state.problem.name if state.problem else state.problem_path,
        "plan": plan.model_dump(mode="json"),
        "groups": [f"{g.id} [{g.kind}{'' if g.enabled else ', off'}] {' '.join(g.nodes)}"
                   for g in plan.groups],
        "how": 'resume with "approve", "abort", {"action": "edit", "disable": [group ids], '
               '"goals": {stage: text}} or {"action": "edit", "plan": <the plan, edited>}',
        "error": error,
    }


def apply_decision(decision: Any, plan: Plan) -> tuple[str, Plan | None, str]:
    """(action, plan after the decision, text for the record); ValueError when unusable."""
    if decision is True:
        decision = "approve"
    if isinstance(decision, str):
        decision = {"action": decision.strip().lower()}
    if not isinstance(decision, dict):
        raise ValueError(f"a decision is a string or an object, not {type(decision).__name__}")
    action = str(decision.get("action") or ("edit" if ({"plan", "disable", "goals"} & decision.keys())
                                             else "")).lower()
    if action in ("approve", "approved", "a", "yes", "y"):
        return "approved", plan, "plan approved at review"
    if action in ("abort", "b", "no", "n"):
        return "aborted", None, f"{ABORTED}: {decision.get('reason') or 'no reason given'}"
    if action not in ("edit", "e"):
        raise ValueError(f"unknown action {decision.get('action')!r} (approve, edit or abort)")
    new = plan.model_copy(deep=True)
    by_id = {g.id: g for g in new.groups}
    off: set[str] = set(decision.get("disable") or [])
    if decision.get("plan") is not None:
        try:
            edited = Plan.model_validate(decision["plan"])
        except Exception as e:  # noqa: BLE001 - pydantic's message, first line
            raise ValueError(f"the edited plan is not a plan: {str(e).splitlines()[0]}") from None
        kept = {g.id: g for g in edited.groups}
        unknown = sorted(kept.keys() - by_id.keys())
        if unknown:
            raise ValueError(f"the edited plan names unknown group(s) {unknown}: groups can be "
                             "turned off, not added")
        off |= {gid for gid in by_id if gid not in kept or not kept[gid].enabled}
        new.goals = {**new.goals, **edited.goals}
        new.notes = list(edited.notes)
    unknown = sorted(off - by_id.keys())
    if unknown:
        raise ValueError(f"no group(s) {unknown} in the plan (groups: {sorted(by_id)})")
    lib = sorted(g for g in off if by_id[g].kind == "library")
    if lib:
        raise ValueError(f"{lib}: library calls stay library calls; only fused groups can be off")
    goals = decision.get("goals") or {}
    if not isinstance(goals, dict) or set(goals) - set(STAGES):
        raise ValueError(f"goals must map stages {list(STAGES)} to text")
    new.goals.update({k: str(v) for k, v in goals.items()})
    for g in new.groups:
        g.enabled = g.id not in off
    what = [f"turned off {', '.join(sorted(off))}"] if off else []
    what += [f"goal of {k} edited" for k in sorted(k for k in new.goals
                                                  if new.goals[k] != plan.goals.get(k))]
    return "edited", new, "plan edited at review: " + ("; ".join(what) or "no change")


def review(state: EggState, runtime: Runtime[Settings]) -> dict:
    if not settings_of(runtime).review or state.plan is None or state.error:
        return {}
    error = None
    while True:  # each bad decision pauses again (LangGraph matches resumes to interrupts in order)
        decision = interrupt(review_request(state, error))
        try:
            action, plan, text = apply_decision(decision, state.plan)
            break
        except ValueError as e:
            error = str(e)
    if action == "aborted":
        return {"error": text, "stage": "done"}
    plan.reviewed = action
    contexts = {"plan": state.context("plan").model_copy(deep=True)}
    contexts["plan"].decisions.append(text)
    for st in STAGES:
        if plan.goals.get(st, "") != state.context(st).goal:
            contexts[st] = state.context(st).model_copy(update={"goal": plan.goals.get(st, "")})
    return {"plan": plan, "stage_context": contexts}
