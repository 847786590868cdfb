"""tiler (stage 2): parallel mapping and tensor tiling - block sizes, warps, grid."""
from langgraph.runtime import Runtime

from nodes.common import author_step
from state import EggState, Settings


def tiler(state: EggState, runtime: Runtime[Settings]) -> dict:
    return author_step(state, runtime, "tiling", lambda p: p.tile)
