"""memory_optimizer (stage 2): memory traffic - pipelining depth, cache hints, layouts."""
from langgraph.runtime import Runtime

from nodes.common import author_step
from state import EggState, Settings


def memory_optimizer(state: EggState, runtime: Runtime[Settings]) -> dict:
    return author_step(state, runtime, "memory", lambda p: p.optimize_memory)
