"""Small helpers every role node uses: settings, policy, run folder, filing candidates."""
from __future__ import annotations

import pathlib

from langgraph.runtime import Runtime

from policies import get_policy
from policies.base import Decline, Draft
from state import Attempt, Candidate, EggState, Settings, STAGE_NODE, run_folder


def settings_of(runtime: Runtime | None) -> Settings:
    """The run's settings: the runtime context (a Settings, or a dict as the LangGraph server
    passes it), else the settings fields of ``config["configurable"]`` (older clients), else
    defaults and the environment (EGG_<FIELD>)."""
    ctx = getattr(runtime, "context", None) if runtime is not None else None
    if isinstance(ctx, Settings):
        return ctx
    if not ctx:
        ctx = _configurable()
    if isinstance(ctx, dict):
        return Settings(**{k: v for k, v in ctx.items() if k in Settings.model_fields})
    return Settings()


def _configurable() -> dict:
    try:
        from langgraph.config import get_config

        return dict(get_config().get("configurable") or {})
    except RuntimeError:  # called outside a run
        return {}


def run_dir(settings: Settings, state: EggState) -> pathlib.Path:
    """The run's folder (state.run_folder), created."""
    d = run_folder(settings, state)
    d.mkdir(parents=True, exist_ok=True)
    return d


def candidate_path(settings: Settings, state: EggState, cand: Candidate) -> pathlib.Path:
    """The candidate's file, (re)written from the state if missing (e.g. after a resume)."""
    p = run_dir(settings, state) / "candidates" / f"{cand.id}.py"
    if not p.exists() or p.read_text() != cand.source:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(cand.source)
    return p


def call_budget(settings: Settings, state: EggState, limit: float) -> float | None:
    """The time limit of a verification or timing call (Settings.call_limit): None when too
    little is left to start one (the run ends inside its budget with its best verified candidate)."""
    return settings.call_limit(state.started_at, limit)


def author_step(state: EggState, runtime: Runtime, stage: str, ask) -> dict:
    """What the three authoring roles share: ask the policy, file its draft or end the stage."""
    settings = settings_of(runtime)
    ctx = state.context(stage).model_copy(deep=True)
    n = state.attempts.get(stage, 0)
    base = {"stage": stage, "current_id": None}
    if n >= settings.max_attempts(stage):
        ctx.finished, ctx.finish_reason = True, f"attempt cap ({n}) reached"
        return {**base, "stage_context": {stage: ctx}}
    left = settings.time_left(state.started_at)
    if left is not None and left <= 0:
        ctx.finished = True
        ctx.finish_reason = (f"time limit ({settings.time_limit_s:g} s) reached: the best verified "
                             "candidate so far is kept")
        ctx.best_id = state.best_id
        return {**base, "stage_context": {stage: ctx}}
    policy = get_policy(settings.policy)
    try:
        res = ask(policy)(state, settings)
    except Exception as e:  # noqa: BLE001 - a policy bug ends the stage, never the run
        from policies.llm_io import LLMError

        if isinstance(e, LLMError):
            raise  # an unreachable endpoint ends the run with its own message (resumable)
        import traceback

        where = traceback.extract_tb(e.__traceback__)[-1]
        res = Decline(f"the {settings.policy} policy failed: {type(e).__name__}: {e} "
                      f"({pathlib.Path(where.filename).name}:{where.lineno}); "
                      "the best verified candidate so far is kept")
    _add_stats(ctx, getattr(res, "stats", None))
    if isinstance(res, Decline):
        ctx.finished, ctx.finish_reason = True, res.reason
        ctx.decisions += res.decisions
        ctx.best_id = state.best_id
        return {**base, "stage_context": {stage: ctx}, **_usage(policy)}
    assert isinstance(res, Draft)
    cid = state.new_candidate_id()
    cand = Candidate(
        id=cid, parent_id=state.best_id, stage=stage, author=STAGE_NODE[stage], source=res.source,
        configs=res.configs, disabled_groups=res.disabled_groups, kernels=res.kernels,
        fallback=res.fallback, rationale=res.rationale, principle_ids=res.principle_ids)
    cand.path = str(candidate_path(settings, state, cand))
    ctx.attempts.append(Attempt(candidate_id=cid, outcome="pending", summary=res.rationale[:300]))
    ctx.decisions += res.decisions
    return {**base, "candidates": [cand], "current_id": cid, "attempts": {stage: n + 1},
            "stage_context": {stage: ctx}, **_usage(policy)}


def _add_stats(ctx, stats: dict | None) -> None:
    """Sum a policy step's counts into the stage context."""
    for k, v in (stats or {}).items():
        ctx.stats[k] = ctx.stats.get(k, 0) + v


def _usage(policy) -> dict:
    """LLM usage a policy accumulated during this step (empty for the expert policy)."""
    take = getattr(policy, "take_usage", None)
    usage = take() if take else None
    return {"llm_usage": usage} if usage else {}


def mark_attempt(state: EggState, cid: str, outcome: str, summary: str = "") -> dict:
    """Update the current stage context's record of an attempt."""
    stage = state.stage
    ctx = state.context(stage).model_copy(deep=True)
    for a in ctx.attempts:
        if a.candidate_id == cid:
            a.outcome = outcome
            if summary:
                a.summary = summary[:300]
    if outcome == "failed" and summary:
        ctx.failures.append(f"{cid}: {summary[:400]}")
    return {stage: ctx}
