"""algorithm_designer (stage 1): algorithmic structure - rewrites, fusion groups, kernels."""
from langgraph.runtime import Runtime

from nodes.common import author_step
from state import EggState, Settings


def algorithm_designer(state: EggState, runtime: Runtime[Settings]) -> dict:
    return author_step(state, runtime, "algorithm", lambda p: p.design)
