"""Indexed reads written one way (rw-take): ``torch.gather``, ``F.embedding`` (and
``nn.Embedding``), ``index_select`` and ``x[ids]`` with an integer tensor are all a read of a
source at the rows an integer tensor names. Each becomes ``_egg_take(src, idx, dim)`` (src and
idx broadcast against each other except along dim, where the result has idx's size), which a
pointwise kernel computes as a load of the source at the named row: an embedding scaled by
sqrt(hidden), a gathered score transformed, a row of a cos/sin table read by position ids are
one pass, with no gathered copy written and read back."""
from __future__ import annotations

import operator

from torch import fx

from codegen.ops import INDEX_DTYPES, node_dtype, node_shape
from codegen.rewrites.common import _annotate, _bound, _float, _live, _replace
from codegen.rewrites.losses import _gather


def _embedding(n: fx.Node):
    """(weight, ids) of ``F.embedding(ids, weight)`` with no max_norm (which rewrites the
    weight's rows in place), else None."""
    import torch.nn.functional as F

    if n.op != "call_function" or n.target is not F.embedding:
        return None
    b = _bound(n, ["input", "weight", ("padding_idx", None), ("max_norm", None), ("norm_type", 2.0),
                   ("scale_grad_by_freq", False), ("sparse", False)])
    if b is None or b["max_norm"] is not None:
        return None
    return b["weight"], b["input"]


def _index_select(n: fx.Node):
    """(source, dim, index) of ``torch.index_select(x, dim, index)`` / ``x.index_select(dim,
    index)``, else None."""
    import torch

    if not ((n.op == "call_method" and n.target == "index_select")
            or (n.op == "call_function" and n.target is torch.index_select)):
        return None
    b = _bound(n, ["input", "dim", "index"])
    if b is None:
        return None
    return b["input"], b["dim"], b["index"]


def _indexed(n: fx.Node):
    """(source, index) of ``x[ids]``: one integer tensor indexing x's first dim, else None."""
    if not ((n.op == "call_function" and n.target is operator.getitem)
            or (n.op == "call_method" and n.target == "__getitem__")) or len(n.args) != 2:
        return None
    src, idx = n.args
    if isinstance(idx, tuple) and len(idx) == 1:
        idx = idx[0]
    return (src, idx) if isinstance(idx, fx.Node) else None


def _take_form(n: fx.Node):
    """(src, idx, dim, trailing, wrap) for an indexed read: take(src, idx[(..., *[None] *
    trailing)], dim, wrap) computes it (wrap: a negative index counts from the end, as x[ids]);
    None for anything else (a non-floating source, an index not int32/int64,
    a gather whose index is smaller than its source off the gathered dim, a traced dim)."""
    form = None
    if (e := _embedding(n)) is not None:
        w, ids = e
        form = (w, ids, -2, 1, False) if isinstance(w, fx.Node) and len(node_shape(w) or ()) == 2 else None
    elif (g := _gather(n)) is not None:
        src, dim, idx = g
        ss, si = node_shape(src), node_shape(idx)
        if ss is not None and si is not None and len(ss) == len(si) and isinstance(dim, int) \
                and -len(ss) <= dim < len(ss) \
                and all(a == b for k, (a, b) in enumerate(zip(ss, si)) if k != dim % len(ss)):
            form = (src, idx, dim, 0, False)  # the dim as written: it means the same at any rank
    elif (s := _index_select(n)) is not None:
        src, dim, idx = s
        ss = node_shape(src) if isinstance(src, fx.Node) else None
        if ss and isinstance(dim, int) and not isinstance(dim, bool) and -len(ss) <= dim < len(ss) \
                and isinstance(idx, fx.Node) and len(node_shape(idx) or (0, 0)) == 1:
            d = dim % len(ss) - len(ss)  # from the end: the 1-d index is widened to it
            form = (src, idx, d, -d - 1, False)
    elif (x := _indexed(n)) is not None:
        src, idx = x
        ss = node_shape(src) if isinstance(src, fx.Node) else None
        if ss:
            form = (src, idx, -len(ss), len(ss) - 1, True)
    if form is None:
        return None
    src, idx = form[:2]
    if not (isinstance(src, fx.Node) and isinstance(idx, fx.Node) and _float(src)
            and node_dtype(idx) in INDEX_DTYPES and node_shape(idx) is not None):
        return None
    return form


def take_pattern(gm: fx.GraphModule) -> bool:
    """rw-take: gather / embedding / index_select / ``x[ids]`` -> ``_egg_take(src, idx, dim)``,
    the index widened with trailing size-1 dims where the form reads whole rows (an embedding's
    ids as ``ids[..., None]``). The same values: every element is copied from the same place."""
    from codegen.ops import take

    graph = gm.graph
    changed = False
    for n in _live(graph):
        form = _take_form(n) if n.op in ("call_function", "call_method") else None
        if form is None:
            continue
        src, idx, dim, trailing, wrap = form
        with graph.inserting_before(n):
            made = []
            if trailing:
                idx = graph.call_function(operator.getitem, (idx, (Ellipsis,) + (None,) * trailing))
                made.append(idx)
            made.append(graph.call_function(take, (src, idx, dim, wrap) if wrap else (src, idx, dim)))
        if not _annotate(made) or node_shape(made[-1]) != node_shape(n) \
                or node_dtype(made[-1]) != node_dtype(n):
            for m in reversed(made):
                graph.erase_node(m)
            continue
        _replace(n, made[-1])
        changed = True
    return _views_into_takes(gm) or changed


def _unsqueezed(u: fx.Node):
    """k of ``t.unsqueeze(k)`` / ``torch.unsqueeze(t, k)`` with an int k, else None."""
    import torch

    if not ((u.op == "call_method" and u.target == "unsqueeze")
            or (u.op == "call_function" and u.target is torch.unsqueeze)) or u.kwargs or len(u.args) != 2:
        return None
    k = u.args[1]
    return k if isinstance(k, int) and not isinstance(k, bool) else None


def _views_into_takes(gm: fx.GraphModule) -> bool:
    """``take(src, idx, dim).unsqueeze(k)`` (HF's ``cos[position_ids].unsqueeze(1)``) as a take
    of the unsqueezed operands: a view of a kernel's result starts another kernel, a view of its
    inputs is free. The index is unsqueezed as the result was (it has the result's rank: the
    dim means the same at another rank), the source padded to that rank first."""
    from codegen.ops import take

    graph = gm.graph
    changed = False
    for t in _live(graph):
        if t.op != "call_function" or t.target is not take or len(t.users) != 1:
            continue
        u = next(iter(t.users))
        k = _unsqueezed(u)
        src, idx, dim = t.args[:3]
        r = len(node_shape(t) or ())
        if k is None or not r or len(node_shape(idx) or ()) != r or not -r - 1 <= k <= r:
            continue
        kn = k % (r + 1)
        d = dim % r
        with graph.inserting_before(u):
            made = []
            pad = r - len(node_shape(src))
            if pad:
                src = graph.call_function(operator.getitem, (src, (None,) * pad))
                made.append(src)
            made.append(graph.call_method("unsqueeze", (src, kn)))
            made.append(graph.call_method("unsqueeze", (idx, k)))
            made.append(graph.call_function(take, (made[-2], made[-1], d + (d >= kn) - (r + 1), *t.args[3:])))
        if not _annotate(made) or node_shape(made[-1]) != node_shape(u):
            for m in reversed(made):
                graph.erase_node(m)
            continue
        _replace(u, made[-1])
        graph.erase_node(t)
        changed = True
    return changed
