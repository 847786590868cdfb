"""Rotary embeddings: rotate_half written out, by halves or by pairs (rw-rotate-half)."""
from __future__ import annotations

from torch import fx

from codegen.ops import classify, node_shape
from codegen.rewrites.common import (_erase_unused_above, _float, _is_shape_query, _live, _replace,
                                     _shape_query_kind, _static_int)


def _half_of(v):
    """(x, "first" | "second") when v is the first or second half of x's last dim: x[..., :h],
    x[..., h:] (h = D/2, also with explicit full slices) or x.chunk(2, -1)[i]; else None."""
    import operator

    import torch

    if not isinstance(v, fx.Node) or v.op != "call_function" or v.target is not operator.getitem:
        return None
    src, idx = v.args
    if not isinstance(src, fx.Node):
        return None
    if isinstance(idx, int) and idx in (0, 1):  # chunk(2, dim=-1)[i]
        is_chunk = ((src.op == "call_method" and src.target == "chunk")
                    or (src.op == "call_function" and src.target is torch.chunk))
        if not is_chunk:
            return None
        x = src.args[0]
        rest = list(src.args[1:]) + [src.kwargs.get(k) for k in ("chunks", "dim") if k in src.kwargs]
        shape = node_shape(x) if isinstance(x, fx.Node) else None
        if shape is None or len(rest) != 2 or rest[0] != 2 or rest[1] not in (-1, len(shape) - 1):
            return None
        return (x, "first" if idx == 0 else "second") if shape[-1] % 2 == 0 else None
    shape = node_shape(src)
    if not isinstance(idx, tuple) or shape is None or not shape:
        return None
    if len(idx) == 2 and idx[0] is Ellipsis:
        sl = idx[1]
    elif len(idx) == len(shape) and all(i == slice(None) for i in idx[:-1]):
        sl = idx[-1]
    else:
        return None
    if not isinstance(sl, slice) or sl.step not in (None, 1):
        return None
    d = int(shape[-1])
    start = 0 if sl.start is None else _static_int(sl.start)
    stop = d if sl.stop is None else _static_int(sl.stop)
    if d % 2 or start is None or stop is None:
        return None
    if (start, stop) == (0, d // 2):
        return src, "first"
    if (start, stop) == (d // 2, d):
        return src, "second"
    return None


def rotate_half_pattern(gm: fx.GraphModule) -> bool:
    """rw-rotate-half: cat((-x2, x1), dim=-1) with x1, x2 the halves of x's last dim (RoPE's
    rotate-half) -> rotate_half(x), which a pointwise kernel computes as one load of x at the
    rolled column: the slices, the negation and the cat are no pass of their own."""
    import torch

    from codegen import ops as O

    graph = gm.graph
    changed = False
    for n in _live(graph):
        if n.op != "call_function" or n.target is not torch.cat:
            continue
        parts = n.args[0] if n.args else n.kwargs.get("tensors")
        dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)
        shape = node_shape(n)
        if (shape is None or not isinstance(parts, (list, tuple)) or len(parts) != 2
                or dim not in (-1, len(shape) - 1) or not isinstance(parts[0], fx.Node)):
            continue
        second, first = _half_of(_negated(gm, parts[0])), _half_of(parts[1])
        if (second is None or first is None or second[0] is not first[0]
                or (second[1], first[1]) != ("second", "first") or not _float(first[0])):
            continue
        with graph.inserting_before(n):
            new = graph.call_function(O.rotate_half, (first[0],))
        _replace(n, new)
        changed = True
    return changed


def _pair_half(v):
    """(x, "even" | "odd") when v is x[..., ::2] or x[..., 1::2] (also with explicit full
    slices before the last dim, start 0 written out) over an even last dim; else None."""
    import operator

    if not isinstance(v, fx.Node) or v.op != "call_function" or v.target is not operator.getitem:
        return None
    src, idx = v.args
    shape = node_shape(src) if isinstance(src, fx.Node) else None
    if shape is None or not shape or shape[-1] % 2 or not isinstance(idx, tuple):
        return None
    if len(idx) == 2 and idx[0] is Ellipsis:
        sl = idx[1]
    elif len(idx) == len(shape) and all(i == slice(None) for i in idx[:-1]):
        sl = idx[-1]
    else:
        return None
    if not isinstance(sl, slice) or sl.step != 2 or sl.stop not in (None, shape[-1]):
        return None
    if sl.start in (None, 0):
        return src, "even"
    return (src, "odd") if sl.start == 1 else None


def _negated(gm: fx.GraphModule, n):
    """x when n is -x, x.neg(), torch.neg(x) or x * -1 (-1 * x)."""
    if not isinstance(n, fx.Node) or n.op not in ("call_function", "call_method"):
        return None
    op = classify(n, gm)
    if op.kind != "pointwise":
        return None
    if op.name == "neg":
        return op.operands[0]
    if op.name == "mul" and len(op.operands) == 2:
        a, b = op.operands
        if isinstance(b, (int, float)) and b == -1 and isinstance(a, fx.Node):
            return a
        if isinstance(a, (int, float)) and a == -1 and isinstance(b, fx.Node):
            return b
    return None


def rotate_pairs_pattern(gm: fx.GraphModule) -> bool:
    """rw-rotate-half, interleaved form (GPT-J's rotate_every_two): stack((-x[..., 1::2],
    x[..., ::2]), dim=-1) flattened back to x's shape -> rotate_pairs(x), which a pointwise
    kernel computes as one load of x at the other column of each (even, odd) pair."""
    import torch

    from codegen import ops as O

    graph = gm.graph
    changed = False
    for n in _live(graph):
        if n.op != "call_function" or n.target is not torch.stack or len(n.users) != 1:
            continue
        parts = n.args[0] if n.args else n.kwargs.get("tensors")
        dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)
        shape = node_shape(n)
        if shape is None or not isinstance(parts, (list, tuple)) or len(parts) != 2 \
                or dim not in (-1, len(shape) - 1):
            continue
        odd, even = _pair_half(_negated(gm, parts[0])), _pair_half(parts[1])
        if (odd is None or even is None or odd[0] is not even[0] or (odd[1], even[1]) != ("odd", "even")
                or not _float(even[0])):
            continue
        flat = next(iter(n.users))
        fop = classify(flat, gm) if flat.op in ("call_function", "call_method") else None
        if fop is None or fop.kind != "view" or fop.name not in ("flatten", "reshape", "view") \
                or node_shape(flat) != node_shape(even[0]):
            continue
        with graph.inserting_before(flat):
            new = graph.call_function(O.rotate_pairs, (even[0],))
        new.meta = dict(flat.meta)
        flat.replace_all_uses_with(new)
        graph.erase_node(flat)
        _erase_unused_above([n], stop=even[0])
        changed = True
    return changed


def _is_call(n, name: str) -> bool:
    import torch

    return isinstance(n, fx.Node) and n.op == "call_function" and n.target is getattr(torch, name)


def _merges_last_two(gm: fx.GraphModule, n: fx.Node, src: fx.Node) -> bool:
    """Is n a view of src ([..., n, 2]) with the last two dims merged ([..., 2n])?"""
    if n.op not in ("call_function", "call_method"):
        return False
    op = classify(n, gm)
    s, t = node_shape(src), node_shape(n)
    return (op.kind == "view" and op.name in ("flatten", "reshape", "view") and s is not None
            and t is not None and len(t) == len(s) - 1 and tuple(t[:-1]) == tuple(s[:-2])
            and t[-1] == s[-2] * s[-1])


def _complex_shape_queries(graph: fx.Graph, queries: list, x: fx.Node) -> bool:
    """Answer shape queries of view_as_complex(x.reshape(..., -1, 2)) from x (its shape with the
    last dim halved): ``reshape_for_broadcast(freqs_cis, xq_)`` reads ``xq_.shape``. False (and
    nothing changed) when a query is of another form."""
    import operator

    import torch

    rank = len(node_shape(x))
    plan = []
    for q in queries:
        kind = _shape_query_kind(q, rank)
        if kind is None:
            return False
        plan.append((q, kind))
    for q, what in plan:
        with graph.inserting_before(q):
            if what == "dim":
                new = graph.call_method("dim", (x,))
            elif what == "shape":
                sx = graph.call_function(getattr, (x, "shape"))
                for g in list(q.users):  # shape[i]: x's size i, the last one halved
                    if g.op == "call_function" and g.target is operator.getitem and isinstance(
                            g.args[1], int) and -rank <= g.args[1] < rank:
                        i = g.args[1] % rank
                        with graph.inserting_before(g):
                            size = graph.call_function(operator.getitem, (sx, i))
                            if i == rank - 1:
                                size = graph.call_function(operator.floordiv, (size, 2))
                        g.replace_all_uses_with(size)
                        graph.erase_node(g)
                if not q.users:
                    graph.erase_node(q)
                    continue
                lead = graph.call_function(operator.getitem, (sx, slice(None, -1)))
                half = graph.call_function(operator.floordiv, (graph.call_function(operator.getitem, (sx, -1)), 2))
                new = graph.call_function(torch.Size, (graph.call_function(operator.add, (lead, (half,))),))
            elif what == rank - 1:
                new = graph.call_function(operator.floordiv, (graph.call_method("size", (x, -1)), 2))
            else:
                new = graph.call_method("size", (x, what))
        q.replace_all_uses_with(new)
        graph.erase_node(q)
    return True


def complex_rotations(gm: fx.GraphModule) -> bool:
    """RoPE by complex numbers (Meta's Llama reference): ``view_as_real(view_as_complex(
    x.reshape(..., -1, 2)) * c).flatten(-2)``, c complex (freqs_cis, a buffer or an input) ->
    ``x * cos + rotate_pairs(x) * sin`` with ``cos``/``sin`` the real and imaginary parts of c,
    each repeated for the two columns of a pair: the product of complex numbers (a0 + i a1)(c0 +
    i c1) is the rotation of the pair, and rotate_pairs loads x at the pair's other column
    (one pointwise kernel; the tables depend on c alone, so they are folded when c is a
    buffer). Only where the complex values have no other reader and the pairs are merged back
    into the last dim."""
    import operator

    import torch

    from codegen import ops as O

    graph = gm.graph
    changed = False
    for vr in _live(graph):
        if not _is_call(vr, "view_as_real") or len(vr.users) != 1 or not isinstance(vr.args[0], fx.Node):
            continue
        prod = vr.args[0]
        flat = next(iter(vr.users))
        if (prod.op != "call_function" or prod.target not in (operator.mul, torch.mul) or prod.kwargs
                or len(prod.args) != 2 or len(prod.users) != 1 or not _merges_last_two(gm, flat, vr)):
            continue
        for vc, c in (prod.args, prod.args[::-1]):
            if _is_call(vc, "view_as_complex") and isinstance(c, fx.Node) and all(
                    u is prod or _is_shape_query(u) for u in vc.users):
                break
        else:
            continue
        pairs = vc.args[0]
        ps, cs, out = node_shape(pairs), node_shape(c), node_shape(prod)
        if (not _float(pairs) or ps is None or cs is None or out is None or ps[-1] != 2
                or tuple(out) != tuple(ps[:-1]) or len(cs) > len(out)):
            continue
        flat_shape = tuple(ps[:-2]) + (ps[-2] * 2,)
        # the pairs split from x's last dim by x.reshape(...) / x.view(...) (Meta's Llama code)
        src = pairs.args[0] if pairs.op == "call_method" and pairs.target in ("reshape", "view") else None
        if not (isinstance(src, fx.Node) and node_shape(src) is not None
                and tuple(node_shape(src)) == flat_shape and not pairs.kwargs):
            continue
        sop = classify(src, gm) if src.op in ("call_function", "call_method") else None
        cast = sop is not None and sop.kind == "pointwise" and sop.name == "cast"
        y = sop.operands[0] if cast else src
        if not (isinstance(y, fx.Node) and _float(y)):
            continue
        queries = [u for u in vc.users if u is not prod]
        if queries and not _complex_shape_queries(graph, queries, y):
            continue
        with graph.inserting_before(flat):
            x = src
            # where view_as_complex would raise (a layout whose pairs are not adjacent), so
            # must the file: the check replays the view on x's layout
            # (named apart: fx names a node after its target, and the emitted forward calls
            # the runtime helper by its plain name)
            graph.create_node("call_function", O.complex_fits, (
                y, sop.p.get("dtype") if cast else None, pairs.target, *pairs.args[1:]), {},
                name="complex_ok")
            parts = graph.call_function(torch.view_as_real, (c,))
            cos, sin = (graph.call_method("repeat_interleave", (
                graph.call_function(operator.getitem, (parts, (Ellipsis, i))), 2), {"dim": -1}) for i in (0, 1))
            if cast:
                # the pairs of a cast (x = h.float()): the cast of h's pairs, so that one
                # kernel loads h at both columns (a rolled load of the cast's result would
                # make the cast a kernel of its own)
                rot = graph.node_copy(x, lambda a: graph.call_function(O.rotate_pairs, (y,)) if a is y else a)
            else:
                rot = graph.call_function(O.rotate_pairs, (x,))
            new = graph.call_function(operator.add, (graph.call_function(operator.mul, (x, cos)),
                                                    graph.call_function(operator.mul, (rot, sin))))
        new.meta = dict(flat.meta)
        flat.replace_all_uses_with(new)
        graph.erase_node(flat)
        _erase_unused_above([vr], stop=pairs)
        changed = True
    return changed
