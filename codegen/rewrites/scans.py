"""Scans in one form for the planner: a flipped cumulative op, an exclusive scan written as a
shifted inclusive one (canonical forms)."""
from __future__ import annotations

from torch import fx

from codegen.ops import node_dtype, node_shape
from codegen.rewrites.common import _erase_unused_above, _live, _op_name


def _flip_dims(n: fx.Node) -> list[int] | None:
    if n.op == "call_method" and n.target == "flip":
        dims = list(n.args[1:]) or list(n.kwargs.values())
    elif n.op == "call_function" and getattr(n.target, "__name__", "") == "flip":
        dims = list(n.args[1:]) or [n.kwargs.get("dims")]
    else:
        return None
    if len(dims) == 1 and isinstance(dims[0], (list, tuple)):
        dims = list(dims[0])
    return dims if all(isinstance(d, int) for d in dims) else None


def flipped_scans(gm: fx.GraphModule) -> bool:
    """x.flip(d).cumsum(d).flip(d) -> a reverse scan (no flip copies)."""
    from codegen import ops as O

    graph = gm.graph
    changed = False
    for n in _live(graph):
        f1 = _flip_dims(n)
        if f1 is None or len(f1) != 1 or len(n.users) != 1:
            continue
        scan = next(iter(n.users))
        kind = _op_name(scan)
        if kind not in ("cumsum", "cumprod") or len(scan.users) != 1:
            continue
        sdim = scan.args[1] if len(scan.args) > 1 else scan.kwargs.get("dim")
        f2 = next(iter(scan.users))
        shape = O.node_shape(n)
        if shape is None or not isinstance(sdim, int) or _flip_dims(f2) is None:
            continue
        nd = len(shape)
        if not (f1[0] % nd == sdim % nd == _flip_dims(f2)[0] % nd) or len(_flip_dims(f2)) != 1:
            continue
        fn = O.reverse_cumsum if kind == "cumsum" else O.reverse_cumprod
        with graph.inserting_before(f2):
            new = graph.create_node("call_function", fn, (n.args[0], sdim), name=f"{kind}_reverse")
        new.meta = dict(f2.meta)
        f2.replace_all_uses_with(new)
        for dead in (f2, scan, n):
            graph.erase_node(dead)
        changed = True
    return changed


#: tensors of one constant value: what an exclusive scan's first slice holds
_FILLS = {"zeros_like": 0.0, "zeros": 0.0, "new_zeros": 0.0, "ones_like": 1.0, "ones": 1.0, "new_ones": 1.0}


def _leading_slice(n: fx.Node, d: int) -> fx.Node | None:
    """x if n is x.narrow(d, 0, size(d) - 1) or x[:, ..., :-1] along d (by the traced shapes),
    else None."""
    import operator

    if n.op == "call_function" and n.target is operator.getitem and isinstance(n.args[0], fx.Node):
        x, idx = n.args
        idx = idx if isinstance(idx, tuple) else (idx,)
        xs, ns = node_shape(x), node_shape(n)
        full = slice(None, None, None)
        if (xs and ns and len(idx) == d + 1 and all(i == full for i in idx[:d])
                and isinstance(idx[d], slice) and idx[d].start in (None, 0) and idx[d].step is None
                and len(ns) == len(xs) and ns[d] == xs[d] - 1
                and ns[:d] == xs[:d] and ns[d + 1:] == xs[d + 1:]):
            return x
        return None
    if n.op == "call_method" and n.target == "narrow" or (
            n.op == "call_function" and getattr(n.target, "__name__", "") == "narrow"):
        args = list(n.args) + [n.kwargs.get(k) for k in ("dim", "start", "length")[len(n.args) - 1:]]
        x, dim, start = args[0], args[1], args[2]
        xs, ns = node_shape(x) if isinstance(x, fx.Node) else None, node_shape(n)
        if (xs and ns and isinstance(dim, int) and dim % len(xs) == d and start == 0
                and ns[d] == xs[d] - 1 and ns[:d] == xs[:d] and ns[d + 1:] == xs[d + 1:]):
            return x
    return None


def exclusive_scans(gm: fx.GraphModule) -> bool:
    """cat((zeros, x.narrow(d, 0, n - 1).cumsum(d)), d) -> an exclusive cumsum of x along d (ones
    and cumprod alike): one scan kernel reading x and writing the result, instead of a scan
    writing n - 1 slices and a concatenation copying them again."""
    from codegen import ops as O

    graph = gm.graph
    changed = False
    for n in _live(graph):
        if not (n.op == "call_function" and getattr(n.target, "__name__", "") == "cat"):
            continue
        parts = n.args[0] if n.args else n.kwargs.get("tensors")
        dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)
        shape = node_shape(n)
        if not (isinstance(parts, (list, tuple)) and len(parts) == 2 and isinstance(dim, int)
                and shape and all(isinstance(p, fx.Node) for p in parts)):
            continue
        d = dim % len(shape)
        head, scan = parts
        kind = _op_name(scan)
        if kind not in ("cumsum", "cumprod") or len(scan.users) != 1 or scan.kwargs.get("dtype"):
            continue
        sdim = scan.args[1] if len(scan.args) > 1 else scan.kwargs.get("dim")
        x = _leading_slice(scan.args[0], d) if isinstance(sdim, int) and sdim % len(shape) == d else None
        fill = _FILLS.get(_op_name(head))
        hs = node_shape(head)
        if (x is None or fill != (0.0 if kind == "cumsum" else 1.0) or hs is None
                or hs != shape[:d] + (1,) + shape[d + 1:] or node_dtype(head) != node_dtype(scan)
                or node_dtype(x) != node_dtype(scan) or node_shape(x) != shape):
            continue
        fn = O.exclusive_cumsum if kind == "cumsum" else O.exclusive_cumprod
        with graph.inserting_before(n):
            new = graph.create_node("call_function", fn, (x, d), name=f"{kind}_exclusive")
        new.meta = dict(n.meta)
        n.replace_all_uses_with(new)
        graph.erase_node(n)
        _erase_unused_above([scan, head], stop=x)  # the scan, the slice, the constant head
        changed = True
    return changed
