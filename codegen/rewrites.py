"""Algebraic rewrites on the captured fx graph (stage 1). Each rule is general, has a principle
entry in knowledge/principles (same id), and returns whether it changed the graph.
The rewritten program is verified like any candidate."""
from __future__ import annotations

from torch import fx

from codegen.ops import classify


def drop_dead_code(gm: fx.GraphModule) -> bool:
    """rw-dead-code: pure ops whose result reaches no output."""
    graph = gm.graph
    changed = False
    for n in reversed(list(graph.nodes)):
        if n.op in ("placeholder", "output") or n.users:
            continue
        op = classify(n, gm)
        if op.kind in ("pointwise", "reduction", "softmax", "view", "identity", "getitem", "param"):
            graph.erase_node(n)
            changed = True
    return changed


RULES = [("rw-dead-code", drop_dead_code)]


def apply_all(gm: fx.GraphModule) -> list[str]:
    applied = []
    for rid, fn in RULES:
        if fn(gm):
            applied.append(rid)
    if applied:
        gm.graph.lint()
    return applied
