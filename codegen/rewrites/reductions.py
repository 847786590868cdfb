"""Reductions: size-1 reductions (rw-size1-reduction), uneven nested ones (rw-nest-reduction), a
linear layer reduced over its features (rw-linear-reduce); canonical forms for keepdim and for a
mean written as a sum over a size."""
from __future__ import annotations

from torch import fx

from codegen.fusion import norm_dims
from codegen.ops import classify, node_shape
from codegen.rewrites.common import (_annotate, _attr_node, _erase_unused_above, _float, _live,
                                     _op_name, _ops, _replace, _sub_operands)


SIZE1_REDUCTIONS = ("sum", "mean", "amax", "amin", "logsumexp", "max_dim", "min_dim")


def size1_reductions(gm: fx.GraphModule) -> bool:
    """rw-size1-reduction: sum, mean, amax, amin, logsumexp and max/min values over dimensions
    that all have size 1 are the input itself, squeezed (then multiplied by 1.0: a new tensor, as
    eager returns, and one elementwise op the fusion merges with its neighbours)."""
    import operator

    graph = gm.graph
    changed = False
    for n, op in _ops(gm, "reduction", SIZE1_REDUCTIONS):
        x = op.operands[0]
        shape = node_shape(x)
        if not _float(x) or not shape:
            continue
        dims = norm_dims(op.p.get("dim"), len(shape))
        if dims is None or any(shape[d] != 1 for d in dims):
            continue
        pair = op.name in ("max_dim", "min_dim")  # (values, indices): only values may be used
        if pair and not all(u.op == "call_function" and u.target is operator.getitem
                            and u.args[1] == 0 for u in n.users):
            continue
        keep = bool(op.p.get("keepdim", False))
        with graph.inserting_before(n):
            # squeeze, not a reshape to the traced shape: a dim that is not 1 at run time stays
            # and the result's shape shows it
            v = x if keep else graph.call_method("squeeze", (x, tuple(dims)))
            v = graph.call_function(operator.mul, (v, 1.0))
        if pair:
            for u in list(n.users):
                _replace(u, v)
            graph.erase_node(n)
        else:
            _replace(n, v)
        changed = True
    return changed


NESTABLE = ("sum", "mean", "amax", "amin")


def _pointwise_leaves(gm: fx.GraphModule, x: fx.Node, limit: int = 64) -> list[fx.Node] | None:
    """The tensors an elementwise chain ending at x reads (what a fused prologue would load);
    None if the chain is longer than limit."""
    leaves, seen, todo = [], set(), [x]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if len(seen) > limit:
            return None
        if n.op == "call_function" or n.op == "call_method":
            op = classify(n, gm)
            if op.kind == "pointwise":
                todo += [a for a in op.operands if isinstance(a, fx.Node)]
                continue
        leaves.append(n)
    return leaves


def _broadcast_pattern(leaf_shape: tuple, shape: tuple, dims: list[int]) -> tuple[bool, ...]:
    """Per dim of dims: is the leaf broadcast along it (missing or size 1) in the domain?"""
    off = len(shape) - len(leaf_shape)
    return tuple(d < off or leaf_shape[d - off] == 1 for d in dims)


def nest_uneven_reductions(gm: fx.GraphModule) -> bool:
    """rw-nest-reduction: a sum/mean/amax/amin over several dims whose elementwise inputs are
    broadcast along some of those dims and not others (mean(clamp(1 - p * t)) with p [N, M] and
    t [M]) is the same reduction over the innermost dims that every input covers evenly, kept
    as size 1, then over the rest: one reduced index with one stride per input, as the
    reduction template needs, and the small second pass reads the first's partial results."""
    import torch

    graph = gm.graph
    changed = False
    for n, op in _ops(gm, "reduction", NESTABLE):
        x = op.operands[0]
        shape = node_shape(x)
        if not _float(x) or not shape or set(op.p) - {"dim", "keepdim", "dtype"} or op.p.get("dtype"):
            continue
        dims = norm_dims(op.p.get("dim"), len(shape))
        if dims is None or dims != list(range(dims[0], dims[-1] + 1)):
            continue
        big = [d for d in dims if shape[d] > 1]
        leaves = _pointwise_leaves(gm, x)
        if len(big) < 2 or leaves is None:
            continue
        pats = [_broadcast_pattern(node_shape(lf), shape, big) for lf in leaves
                if isinstance(lf, fx.Node) and node_shape(lf) is not None]
        if all(len(set(p)) == 1 for p in pats):
            continue
        k = len(big) - 1  # the longest run of innermost reduced dims even for every input
        while k > 0 and all(len(set(p[k - 1:])) == 1 for p in pats):
            k -= 1
        inner = [d for d in dims if d >= big[k]]
        fn = getattr(torch, op.name)
        with graph.inserting_before(n):
            v = graph.call_function(fn, (x,), {"dim": tuple(inner), "keepdim": True})
            v = graph.call_function(fn, (v,), {"dim": tuple(dims),
                                               "keepdim": bool(op.p.get("keepdim", False))})
        _replace(n, v)
        changed = True
    return changed


def _linear_parts(gm: fx.GraphModule, n: fx.Node):
    """(x, weight node or attr name, bias node or attr name or None) of a linear layer call."""
    import torch.nn as nn
    import torch.nn.functional as F

    if n.op == "call_module":
        mod = gm.get_submodule(n.target)
        if type(mod) is nn.Linear and len(n.args) == 1 and not n.kwargs:
            return n.args[0], f"{n.target}.weight", (f"{n.target}.bias" if mod.bias is not None else None)
        return None
    if n.op == "call_function" and n.target is F.linear:
        args = list(n.args) + [n.kwargs.get(k) for k in ("weight", "bias")][len(n.args) - 1:]
        x, w = args[0], args[1] if len(args) > 1 else None
        b = args[2] if len(args) > 2 else None
        if isinstance(w, fx.Node) and w.op == "get_attr" and (b is None or (
                isinstance(b, fx.Node) and b.op == "get_attr")):
            return x, str(w.target), (str(b.target) if b is not None else None)
    return None


def linear_reduce(gm: fx.GraphModule) -> bool:
    """rw-linear-reduce: sum (or mean) over a linear layer's output features, the layer used only
    there, is x @ W.sum(0) (+ b.sum()) (divided by N for the mean): a matrix-vector product
    instead of a GEMM. The column sums are taken in forward, so trained weights stay exact."""
    import operator

    import torch

    graph = gm.graph
    changed = False
    for n, op in _ops(gm, "reduction", ("sum", "mean")):
        lin = op.operands[0]
        if not isinstance(lin, fx.Node) or len(lin.users) != 1 or not _float(lin):
            continue
        parts = _linear_parts(gm, lin)
        shape = node_shape(lin)
        if parts is None or not shape or norm_dims(op.p.get("dim"), len(shape)) != [len(shape) - 1]:
            continue
        x, w, b = parts
        nfeat = shape[-1]
        with graph.inserting_before(n):
            wn = _attr_node(gm, graph, w)
            v = graph.call_function(torch.matmul, (x, graph.call_function(torch.sum, (wn, 0))))
            if b is not None:
                v = graph.call_function(operator.add, (v, graph.call_function(
                    torch.sum, (_attr_node(gm, graph, b),))))
            if op.name == "mean":
                v = graph.call_function(operator.truediv, (v, float(nfeat)))
            if op.p.get("keepdim", False):
                v = graph.call_method("unsqueeze", (v, -1))
        _replace(n, v)
        graph.erase_node(lin)
        changed = True
    return changed


#: reductions whose keepdim form the canonical pass writes
KEEPDIM_REDUCTIONS = ("sum", "mean", "amax", "amin", "prod", "logsumexp")


def _reduced_dims(op, nd: int) -> list[int] | None:
    return norm_dims(op.p.get("dim"), nd) if op.p.get("dim") is not None else None


def _unsqueezed_at(n: fx.Node) -> int | None:
    """The (non-negative) position where n inserts one size-1 dim into its operand:
    x.unsqueeze(d), torch.unsqueeze(x, d), x[..., None] (index None at one position)."""
    import operator

    import torch

    x = n.args[0] if n.args else None
    xs = node_shape(x) if isinstance(x, fx.Node) else None
    if xs is None:
        return None
    nd = len(xs) + 1
    if (n.op == "call_method" and n.target == "unsqueeze") or (
            n.op == "call_function" and n.target is torch.unsqueeze):
        d = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
        return d % nd if isinstance(d, int) and -nd <= d < nd else None
    if n.op == "call_function" and n.target is operator.getitem:
        idx = n.args[1] if isinstance(n.args[1], tuple) else (n.args[1],)
        if sum(i is None for i in idx) != 1 or not all(
                i is None or i is Ellipsis or i == slice(None) for i in idx):
            return None
        pos = idx.index(None)
        if Ellipsis in idx:
            e = idx.index(Ellipsis)
            if pos > e:  # counted from the end
                return nd - (len(idx) - pos)
        return pos
    return None


def keepdim_reductions(gm: fx.GraphModule) -> bool:
    """``x.mean(d).unsqueeze(d)`` (or ``[..., None]`` at the reduced position) is
    ``x.mean(d, keepdim=True)``: the same values, and the one form the broadcast-reduction and
    RMS-norm patterns match."""
    import torch

    graph = gm.graph
    changed = False
    for n, op in _ops(gm, "reduction", KEEPDIM_REDUCTIONS):
        x = op.operands[0]
        shape = node_shape(x)
        if not _float(x) or not shape or op.p.get("keepdim") or len(n.users) != 1 \
                or set(op.p) - {"dim", "keepdim"}:
            continue
        dims = _reduced_dims(op, len(shape))
        u = next(iter(n.users))
        if dims is None or len(dims) != 1 or u.op not in ("call_function", "call_method") \
                or _unsqueezed_at(u) != dims[0]:
            continue
        with graph.inserting_before(u):
            new = graph.call_function(getattr(torch, op.name), (x,), {"dim": dims[0], "keepdim": True})
        new.meta = dict(u.meta)
        u.replace_all_uses_with(new)
        graph.erase_node(u)
        graph.erase_node(n)
        changed = True
    return changed


def _size_query(n, x_shape, d: int) -> bool:
    """Is n the size of dim d of a tensor of x's shape (t.shape[d], t.size(d), t.size()[d])?"""
    import operator

    if not isinstance(n, fx.Node):
        return False
    nd = len(x_shape)

    def same(t):
        return isinstance(t, fx.Node) and node_shape(t) == tuple(x_shape)

    if n.op == "call_method" and n.target == "size" and len(n.args) == 2 and isinstance(n.args[1], int):
        return same(n.args[0]) and n.args[1] % nd == d
    if n.op == "call_function" and n.target is operator.getitem and isinstance(n.args[1], int):
        src = n.args[0]
        if isinstance(src, fx.Node) and ((src.op == "call_function" and src.target is getattr
                                          and src.args[1] == "shape")
                                         or (src.op == "call_method" and src.target == "size"
                                             and len(src.args) == 1)):
            return same(src.args[0]) and n.args[1] % nd == d
    return False


#: ops whose ``dtype=`` casts the input before the op (PyTorch's documented semantics)
DTYPE_FIRST = ("sum", "mean", "prod", "softmax", "log_softmax", "cumsum", "cumprod")


def reduction_dtypes(gm: fx.GraphModule) -> bool:
    """``softmax(s, dim=-1, dtype=torch.float32)`` (Hugging Face's eager attention, MoE routers)
    and ``sum`` / ``mean`` / ``prod`` / ``log_softmax`` / ``cumsum`` / ``cumprod`` with ``dtype=D``
    are the op on ``x.to(D)``: PyTorch casts the input to D before the op, so the cast is written
    out as one (which fuses as a prologue) and the op loses its ``dtype=``, a form the templates
    take. A dtype given by position (``torch.softmax(x, -1, torch.float32)``) counts too."""
    import torch

    from codegen.ops import FUNCTIONS, METHODS

    graph = gm.graph
    changed = False
    for n in _live(graph):
        name = (FUNCTIONS.get(n.target) if n.op == "call_function"
                else METHODS.get(n.target) if n.op == "call_method" else None)
        if name not in DTYPE_FIRST or not n.args or not isinstance(n.args[0], fx.Node):
            continue
        pos = [i for i, a in enumerate(n.args) if i >= 1 and isinstance(a, torch.dtype)]
        dt = n.kwargs.get("dtype")
        if (dt is None and not pos) or (dt is not None and pos) or len(pos) > 1:
            continue
        dt = dt if dt is not None else n.args[pos[0]]
        if not isinstance(dt, torch.dtype):
            continue
        with graph.inserting_before(n):
            cast = graph.call_method("to", (n.args[0], dt))
        _annotate([cast])  # its shape for the forms after this one (cross_entropy_spellings)
        n.args = (cast,) + tuple(a for i, a in enumerate(n.args) if i >= 1 and i not in pos)
        n.kwargs = {k: v for k, v in n.kwargs.items() if k != "dtype"}
        changed = True
    return changed


def mean_from_sum(gm: fx.GraphModule) -> bool:
    """``x.sum(d) / n`` and ``x.sum(d) * (1 / n)``, n the number of elements summed (a number,
    or ``x.shape[d]`` / ``x.size(d)`` of a tensor of x's shape), are ``x.mean(d)``: one
    reduction for the planner (mean divides the fp32 sum by n as the written form does)."""
    import torch

    graph = gm.graph
    changed = False
    for n, op in _ops(gm, "reduction", ("sum",)):
        x = op.operands[0]
        shape = node_shape(x)
        if not _float(x) or not shape or len(n.users) != 1 or set(op.p) - {"dim", "keepdim"}:
            continue
        dims = norm_dims(op.p.get("dim"), len(shape))
        if dims is None:
            continue
        count = 1
        for d in dims:
            count *= shape[d]
        u = next(iter(n.users))
        if u.op not in ("call_function", "call_method") or len(u.args) != 2 or u.kwargs or u.args[0] is not n:
            continue
        name, c = _op_name(u), u.args[1]
        if name in ("truediv", "div"):
            ok = (isinstance(c, (int, float)) and not isinstance(c, bool) and c == count) or (
                len(dims) == 1 and _size_query(c, shape, dims[0]))
        elif name == "mul":
            ok = isinstance(c, float) and count > 0 and abs(c * count - 1.0) <= 1e-12
        else:
            ok = False
        if not ok:
            continue
        with graph.inserting_before(u):
            new = graph.call_function(torch.mean, (x,), {"dim": dims if len(dims) > 1 else dims[0],
                                                         "keepdim": bool(op.p.get("keepdim", False))})
        new.meta = dict(u.meta)
        u.replace_all_uses_with(new)
        graph.erase_node(u)
        _erase_unused_above([n], stop=x)
        changed = True
    return changed


def _reduced_keep(gm: fx.GraphModule, n, names: tuple[str, ...]) -> tuple | None:
    """(x, dim) when n is one of these reductions of x over one dim with keepdim (max(x, d,
    keepdim=True)[0] counts as amax)."""
    import operator

    if not isinstance(n, fx.Node):
        return None
    if (n.op == "call_function" and n.target is operator.getitem and n.args[1] == 0
            and isinstance(n.args[0], fx.Node) and "amax" in names):
        inner = classify(n.args[0], gm)
        if inner.kind == "reduction" and inner.name == "max_dim" and inner.p.get("keepdim"):
            x = inner.operands[0]
            shape = node_shape(x) if isinstance(x, fx.Node) else None
            dims = norm_dims(inner.p.get("dim"), len(shape)) if shape else None
            return (x, dims[0]) if dims and len(dims) == 1 else None
        return None
    op = classify(n, gm)
    if op.kind != "reduction" or op.name not in names or not op.p.get("keepdim") or op.p.get("dtype") is not None:
        return None
    x = op.operands[0]
    shape = node_shape(x) if isinstance(x, fx.Node) else None
    dims = norm_dims(op.p.get("dim"), len(shape)) if shape else None
    return (x, dims[0]) if dims and len(dims) == 1 and shape[dims[0]] > 1 else None


def _shifted(gm: fx.GraphModule, z) -> tuple | None:
    """(x, dim) when z is x - amax(x, dim, keepdim=True) (the max subtracted, as softmax does)."""
    xm = _sub_operands(gm, z)
    if xm is None:
        return None
    x, m = xm
    got = _reduced_keep(gm, m, ("amax",))
    return got if got is not None and got[0] is x and _float(x) else None


def softmax_pattern(gm: fx.GraphModule) -> bool:
    """rw-softmax: softmax and log-softmax written out with the max subtracted,
    ``e = exp(x - amax(x, d)); e / sum(e, d)`` and ``z = x - amax(x, d); z - log(sum(exp(z), d))``
    (``max(x, d, keepdim=True)[0]`` for amax; ``x - logsumexp(x, d, keepdim=True)`` too), are
    softmax(x, d) and log_softmax(x, d): one softmax-template kernel per row instead of two
    reductions and two elementwise passes. Only the stable forms: exp(x) / sum(exp(x)) overflows
    where softmax does not, and that is eager's behaviour to keep."""
    import torch

    graph = gm.graph
    changed = False
    for n, op in _ops(gm, "pointwise", ("div", "sub")):
        if len(op.operands) != 2 or op.p.get("alpha", 1) != 1:
            continue
        a, b = op.operands
        new = None
        if op.name == "div":  # e / sum(e, d, keepdim) with e = exp(x - amax(x, d))
            s = _reduced_keep(gm, b, ("sum",))
            eop = classify(a, gm) if isinstance(a, fx.Node) else None
            if s is None or s[0] is not a or eop is None or eop.kind != "pointwise" or eop.name != "exp":
                continue
            xd = _shifted(gm, eop.operands[0])
            if xd is None or xd[1] != s[1]:
                continue
            new = (torch.softmax, xd)
        else:  # z - log(sum(exp(z), d, keepdim)) with z = x - amax(x, d); x - logsumexp(x, d, keepdim)
            lse = _reduced_keep(gm, b, ("logsumexp",))
            if lse is not None and lse[0] is a and _float(a):
                new = (torch.log_softmax, lse)
            else:
                xd = _shifted(gm, a)
                lop = classify(b, gm) if isinstance(b, fx.Node) else None
                if xd is None or lop is None or lop.kind != "pointwise" or lop.name != "log":
                    continue
                s = _reduced_keep(gm, lop.operands[0], ("sum",))
                if s is None or s[1] != xd[1] or not isinstance(s[0], fx.Node):
                    continue
                eop = classify(s[0], gm)
                if eop.kind != "pointwise" or eop.name != "exp" or eop.operands[0] is not a:
                    continue
                new = (torch.log_softmax, xd)
        fn, (x, d) = new
        if node_shape(n) != node_shape(x):
            continue
        with graph.inserting_before(n):
            v = graph.call_function(fn, (x, d))
        _replace(n, v)  # the pieces go with rw-dead-code when nothing else reads them
        changed = True
    return changed
