"""The graph's picture, drawn by LangGraph from the compiled graph itself (what Studio shows):
``egg graph`` prints it, ``egg graph --write docs/graph.md`` refreshes the committed copy, and a
test keeps that copy equal to the live graph."""
from __future__ import annotations

DOC_HEAD = """# The EGG graph

Drawn by LangGraph from the compiled graph (`graph/build.py`); dotted edges are the routers'
`Literal[...]` return values (`graph/routers.py`). Regenerate with
`egg graph --write docs/graph.md`; `tests/test_graph_doc.py` fails when this copy is stale.

- `planner` reads the problem and plans; `review` passes through unless the run's `review`
  setting is on, then it pauses for a person to approve, edit or abort the plan.
- Stage 1 `algorithm_designer`, stage 2 `tiler` then `memory_optimizer`: each new candidate
  goes to the `verifier`; a verified one to the `profiler`. Failures and regressions loop back to
  the candidate's author within the stage's attempt cap; a finished stage moves on.
- `reporter` writes `best.py` and the report.

"""


def mermaid() -> str:
    from graph.build import graph

    return graph.get_graph().draw_mermaid()


def graph_markdown() -> str:
    return DOC_HEAD + "```mermaid\n" + mermaid().rstrip("\n") + "\n```\n"
