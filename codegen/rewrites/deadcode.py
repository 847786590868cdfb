"""Dead code and value copies: pure ops whose result reaches no output (rw-dead-code), and
copies of a value nothing mutates (a canonical form)."""
from __future__ import annotations

from torch import fx

from codegen.ops import classify
from codegen.rewrites.common import _op_name, _replace


def drop_dead_code(gm: fx.GraphModule) -> bool:
    """rw-dead-code: pure ops whose result reaches no output."""
    graph = gm.graph
    changed = False
    for n in reversed(list(graph.nodes)):
        if n.op in ("placeholder", "output") or n.users or n.is_impure() or \
                str(n.target).endswith("_") and not str(n.target).endswith("__"):
            continue  # (an in-place op, a graph break: its effect is its point)
        op = classify(n, gm)
        if op.kind in ("pointwise", "reduction", "softmax", "view", "identity", "getitem", "param"):
            graph.erase_node(n)
            changed = True
    return changed


def _mutates(n: fx.Node, gm: fx.GraphModule) -> bool:
    """Could this node write into a tensor it is given (an in-place op)?"""
    import operator

    if n.op == "call_method":
        return n.target.endswith("_") and not n.target.endswith("__")
    if n.op == "call_function":
        name = getattr(n.target, "__name__", "")
        return (n.target is operator.setitem or (name.endswith("_") and not name.endswith("__"))
                or bool(n.kwargs.get("inplace")) or "out" in n.kwargs)
    if n.op == "call_module":
        return bool(getattr(gm.get_submodule(n.target), "inplace", False))
    return False


def drop_value_copies(gm: fx.GraphModule) -> bool:
    """``x.clone()`` and ``x.detach()`` are x's values: in a forward that writes into no tensor
    (no in-place op anywhere in the graph) their users read x itself, so that
    ``y = conv(x); z = y.clone().detach(); (y + b) * z`` is one kernel reading y once instead
    of a copy of y plus a kernel reading both. A copy that is an output stays (an output must
    not alias an input or another output)."""
    graph = gm.graph
    if any(_mutates(n, gm) for n in graph.nodes):
        return False
    changed = False
    for n in list(graph.nodes):
        op = classify(n, gm) if n.op in ("call_function", "call_method") else None
        if (op is None or op.kind != "identity" or n.kwargs or len(n.args) != 1
                or not isinstance(n.args[0], fx.Node) or any(u.op == "output" for u in n.users)):
            continue
        if _op_name(n) not in ("clone", "detach"):
            continue
        _replace(n, n.args[0])
        changed = True
    return changed
