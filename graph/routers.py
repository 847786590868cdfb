"""Routers: small pure functions of the state, typed with Literal so Studio draws real edges."""
from __future__ import annotations

from typing import Literal

from state import EggState, NEXT_STAGE, STAGE_NODE

Author = Literal["algorithm_designer", "tiler", "memory_optimizer"]


def next_stage_node(stage: str) -> Literal["tiler", "memory_optimizer", "reporter"]:
    nxt = NEXT_STAGE.get(stage, "done")
    return STAGE_NODE.get(nxt, "reporter")  # type: ignore[return-value]


def _may_retry(state: EggState) -> bool:
    cap = state.caps.get(state.stage, 1)
    return state.attempts.get(state.stage, 0) < cap


def route_after_planner(state: EggState) -> Literal["review", "reporter"]:
    """A plan goes to the (optional) review step; an unusable problem ends the run."""
    return "reporter" if state.error else "review"


def route_after_review(state: EggState) -> Literal["algorithm_designer", "reporter"]:
    """Approved or edited: stage 1 starts; aborted: the run ends."""
    return "reporter" if state.error else "algorithm_designer"


def _after_author(state: EggState) -> str:
    """A new candidate goes to the verifier; a stage with nothing (more) to try moves on."""
    if state.current_id is not None and state.verification(state.current_id) is None:
        return "verifier"
    return next_stage_node(state.stage)


def route_after_designer(state: EggState) -> Literal["verifier", "tiler"]:
    return _after_author(state)  # type: ignore[return-value]


def route_after_tiler(state: EggState) -> Literal["verifier", "memory_optimizer"]:
    return _after_author(state)  # type: ignore[return-value]


def route_after_memory(state: EggState) -> Literal["verifier", "reporter"]:
    return _after_author(state)  # type: ignore[return-value]


def route_after_verifier(state: EggState) -> Literal[
        "profiler", "algorithm_designer", "tiler", "memory_optimizer", "reporter"]:
    """Passed: time it. Failed: back to the stage's author while under its cap, else move on.
    A reference that cannot judge (``reference``: not deterministic even from one seed;
    ``problem``: Model's forward raises on the problem's own inputs) fails every candidate the
    same way: the run ends with the reference."""
    v = state.verification(state.current_id)
    if v is not None and v.passed:
        return "profiler"
    if v is not None and v.category in ("reference", "problem"):
        return "reporter"
    if _may_retry(state):
        return STAGE_NODE[state.stage]  # type: ignore[return-value]
    return next_stage_node(state.stage)


def route_after_profiler(state: EggState) -> Literal[
        "algorithm_designer", "tiler", "memory_optimizer", "reporter"]:
    """Regressed (beyond noise) or unmeasurable: another variant while under the cap; an
    improvement, noise or a finished stage moves on, except a stage-1 candidate with Triton
    matrix products within noise, or GEMM-bound in a win (EggState.products_to_try_on_library):
    stage 1 tries it once more with those products as cuBLAS calls. The memory optimizer's variants are
    independent (pipelining depth, layout): after any measured verdict it offers the next one
    while under the cap, and declines when none is left (a layout variant after a pipelining one
    that made no difference was never tried before)."""
    t = state.timing(state.current_id)
    if t is not None and t.verdict in ("regressed", "failed") and _may_retry(state):
        return STAGE_NODE[state.stage]  # type: ignore[return-value]
    if state.products_to_try_on_library() and _may_retry(state):
        return "algorithm_designer"  # the same groups with cuBLAS products, once
    if (state.stage == "memory" and t is not None and t.verdict in ("improved", "noise")
            and _may_retry(state)):
        return "memory_optimizer"
    return next_stage_node(state.stage)
