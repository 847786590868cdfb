"""Rotary embeddings: rotate_half written out, by halves or by pairs (rw-rotate-half)."""
from __future__ import annotations

from torch import fx

from codegen.ops import classify, node_shape
from codegen.rewrites.common import _erase_unused_above, _float, _live, _replace, _static_int


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
