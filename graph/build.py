"""The EGG state machine: six role nodes, an optional plan review and a reporter over one typed
state."""
from __future__ import annotations

from langgraph.graph import END, START, StateGraph

from graph import routers as R
from nodes import (algorithm_designer, memory_optimizer, planner, profiler, reporter, review,
                   tiler, verifier)
from state import EggInput, EggOutput, EggState, Settings

ROLE_NODES = ("planner", "algorithm_designer", "tiler", "memory_optimizer", "verifier", "profiler")


def build_graph(checkpointer=None, interrupt_before=None, interrupt_after=None):
    """The compiled graph. ``checkpointer``: e.g. graph.checkpoints.sqlite_saver(path)."""
    g = StateGraph(EggState, context_schema=Settings, input_schema=EggInput, output_schema=EggOutput)
    g.add_node("planner", planner)
    g.add_node("review", review)  # a pass-through unless settings.review: then interrupt()
    g.add_node("algorithm_designer", algorithm_designer)
    g.add_node("tiler", tiler)
    g.add_node("memory_optimizer", memory_optimizer)
    g.add_node("verifier", verifier)
    g.add_node("profiler", profiler)
    g.add_node("reporter", reporter)
    g.add_edge(START, "planner")
    g.add_conditional_edges("planner", R.route_after_planner)
    g.add_conditional_edges("review", R.route_after_review)
    g.add_conditional_edges("algorithm_designer", R.route_after_designer)
    g.add_conditional_edges("tiler", R.route_after_tiler)
    g.add_conditional_edges("memory_optimizer", R.route_after_memory)
    g.add_conditional_edges("verifier", R.route_after_verifier)
    g.add_conditional_edges("profiler", R.route_after_profiler)
    g.add_edge("reporter", END)
    return g.compile(checkpointer=checkpointer, interrupt_before=interrupt_before,
                     interrupt_after=interrupt_after, name="egg")


#: compiled without a checkpointer, for langgraph.json / LangGraph Studio
graph = build_graph()
