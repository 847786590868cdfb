"""Normalizations: RMS norm written out (rw-rms-norm); canonical forms for batch norm, vector
norms and rsqrt."""
from __future__ import annotations

from torch import fx

from codegen.fusion import norm_dims
from codegen.ops import classify, node_dtype, node_shape
from codegen.rewrites.common import (_attr_node, _float, _live, _module_calls, _ops, _replace,
                                     _scalar_step, _sub_operands, _upcast_source)


def _square_of(gm: fx.GraphModule, n) -> fx.Node | None:
    """h when n is h*h, h**2, h.pow(2) or h.square() on a floating h."""
    if not isinstance(n, fx.Node):
        return None
    op = classify(n, gm)
    if op.kind != "pointwise":
        return None
    a = op.operands
    if op.name == "square" and _float(a[0]):
        return a[0]
    if op.name == "pow" and _float(a[0]) and len(a) > 1 and a[1] == 2:
        return a[0]
    if op.name == "mul" and len(a) == 2 and a[0] is a[1] and _float(a[0]):
        return a[0]
    return None


def _plus_scalar(gm: fx.GraphModule, n) -> tuple | None:
    """(v, eps) when n is v + eps or eps + v with a scalar eps."""
    step = _scalar_step(classify(n, gm)) if isinstance(n, fx.Node) else None
    if step is None or step[1] != "add" or classify(n, gm).name != "add":
        return None
    return step[0], step[2]


def _inverse_root_scalings(gm: fx.GraphModule):
    """(n, v, root, arg, how) for each n = v * rsqrt(arg) (either order; how "mul") or
    v / sqrt(arg) (how "div") whose root nothing else reads: a normalization's last step."""
    for n, op in _ops(gm, "pointwise", ("mul", "div")):
        if len(op.operands) != 2:
            continue
        a, b = op.operands
        for v, root in ((a, b), (b, a)) if op.name == "mul" else ((a, b),):
            if getattr(n, "_erased", False):  # the consumer rewrote it
                break
            if not isinstance(root, fx.Node) or len(root.users) != 1:
                continue
            rop = classify(root, gm)
            if rop.kind == "pointwise" and rop.name == ("rsqrt" if op.name == "mul" else "sqrt"):
                yield n, v, root, rop.operands[0], op.name


def _weighted(gm: fx.GraphModule, v, how: str, match) -> tuple | None:
    """(u, w): (v, None) when match(v); for a product scaling (how "mul"), v = u * w or w * u
    read by nothing else with match(u) (the weight multiplied in first: ``w * h * rsqrt(...)``,
    parsed ``(w * h) * rsqrt(...)``); else None."""
    if match(v):
        return v, None
    if how != "mul" or not isinstance(v, fx.Node) or len(v.users) != 1:
        return None
    vop = classify(v, gm)
    if vop.kind != "pointwise" or vop.name != "mul" or len(vop.operands) != 2:
        return None
    for u, w in (vop.operands, vop.operands[::-1]):
        if match(u):
            return u, w
    return None


def rms_norm_pattern(gm: fx.GraphModule) -> bool:
    """rw-rms-norm: h * rsqrt(mean(h^2, -1, keepdim=True) + eps) (or h / sqrt(...)) over the last
    dimension is rms_norm(h, (H,), eps=eps): one norm-template kernel per row instead of a
    square, a reduction and an elementwise pass that each read the rows again. A weight
    multiplied in first (``w * h * rsqrt(...)``) is multiplied after the norm."""
    import operator

    import torch.nn.functional as F

    graph = gm.graph
    changed = False
    for n, v, root, arg, how in _inverse_root_scalings(gm):
        if not _float(v):
            continue
        pe = _plus_scalar(gm, arg)
        if pe is None or len(arg.users) != 1:
            continue
        mean, eps = pe
        mop = classify(mean, gm) if isinstance(mean, fx.Node) else None
        if mop is None or mop.kind != "reduction" or mop.name != "mean":
            continue
        sq = mop.operands[0]
        s = _square_of(gm, sq)
        up = _upcast_source(gm, s)
        hw = _weighted(gm, v, how, lambda u: u is s or (up is not None and u is up))
        if hw is None:
            continue
        h, other = hw
        if h is up:  # T5's x * rsqrt(mean(x.float()^2) + eps): x is promoted to the upcast's values
            if node_dtype(n) != node_dtype(s):
                continue
            h = s
        shape = node_shape(h)
        if (len(mean.users) != 1 or not mop.p.get("keepdim") or not shape
                or norm_dims(mop.p.get("dim"), len(shape)) != [len(shape) - 1]
                or len(sq.users) != 1 or node_shape(n) != shape):
            continue
        with graph.inserting_before(n):
            new = graph.call_function(F.rms_norm, (h, (shape[-1],), None, float(eps)))
            if other is not None:  # w * h * rsqrt(...): the weight after the norm
                new = graph.call_function(operator.mul, (new, other))
        _replace(n, new)
        for d in (root, arg, mean, sq):
            graph.erase_node(d)
        changed = True
    return changed


def batchnorm_decompose(gm: fx.GraphModule) -> bool:
    """nn.BatchNorm{1,2,3}d as primitives (alg-batchnorm-decompose): channel statistics (one
    kernel), the module's running-statistics bookkeeping (torch, on C values), and elementwise
    normalization that the pointwise fusion merges with its neighbours. Eval mode (or
    track_running_stats with training off) normalizes with the running statistics."""
    import operator

    import torch
    import torch.nn as nn

    from codegen import ops as O

    graph = gm.graph
    changed = False
    for n, mod in _module_calls(gm):
        if not isinstance(mod, (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)):
            continue
        x = n.args[0]
        shape = O.node_shape(x)
        if shape is None or len(shape) < 2:
            continue
        C = shape[1]
        view = [1, C] + [1] * (len(shape) - 2)
        use_batch = mod.training or mod.running_mean is None
        with graph.inserting_before(n):
            if use_batch:
                st = graph.create_node("call_function", O.chanstats, (x,), name="chan_stats")
                mean = graph.call_function(operator.getitem, (st, 0))
                var = graph.call_function(operator.getitem, (st, 1))
                if mod.training and mod.track_running_stats:
                    rm = _attr_node(gm, graph, f"{n.target}.running_mean")
                    rv = _attr_node(gm, graph, f"{n.target}.running_var")
                    nbt = _attr_node(gm, graph, f"{n.target}.num_batches_tracked")
                    # the values per channel of this call, from the statistics (not a query of
                    # x: a use of x would make its producer chain write x out)
                    count = graph.call_function(operator.getitem, (st, 2))
                    mean = graph.create_node("call_function", O.bn_update,
                                             (mean, var, count, rm, rv, nbt, mod.momentum),
                                             name="bn_mean")
            else:
                mean = graph.call_method("view", (_attr_node(gm, graph, f"{n.target}.running_mean"), *view))
                var = graph.call_method("view", (_attr_node(gm, graph, f"{n.target}.running_var"), *view))
            y = graph.call_function(operator.sub, (x, mean))
            y = graph.call_function(operator.mul, (y, graph.call_function(
                torch.rsqrt, (graph.call_function(operator.add, (var, mod.eps)),))))
            if mod.weight is not None:
                w = graph.call_method("view", (_attr_node(gm, graph, f"{n.target}.weight"), *view))
                y = graph.call_function(operator.mul, (y, w))
            if mod.bias is not None:
                b = graph.call_method("view", (_attr_node(gm, graph, f"{n.target}.bias"), *view))
                y = graph.call_function(operator.add, (y, b))
        n.replace_all_uses_with(y)
        graph.erase_node(n)
        changed = True
    return changed


def _norm_call(n: fx.Node):
    """(x, p, dim, keepdim, eps) of a vector norm call (torch.norm, Tensor.norm,
    torch.linalg.vector_norm; eps None) or of F.normalize (x divided by its norm clamped to at
    least eps) without a dtype or out argument, else None."""
    import torch

    if n.op == "call_method" and n.target == "norm":
        names, p_default = ("input", "p", "dim", "keepdim", "dtype"), "fro"
    elif n.op == "call_function" and n.target is torch.norm:
        names, p_default = ("input", "p", "dim", "keepdim", "out", "dtype"), "fro"
    elif n.op == "call_function" and n.target is torch.linalg.vector_norm:
        names, p_default = ("input", "ord", "dim", "keepdim"), 2
    elif n.op == "call_function" and n.target is torch.nn.functional.normalize:
        names, p_default = ("input", "p", "dim", "eps", "out"), 2.0
    else:
        return None
    b = dict(zip(names, n.args))
    for k, v in n.kwargs.items():
        b["p" if k == "ord" else k] = v
    b.setdefault("p", b.pop("ord", p_default))
    if b.get("dtype") is not None or b.get("out") is not None or not isinstance(b.get("input"), fx.Node):
        return None
    dim = b.get("dim")
    if not (dim is None or isinstance(dim, int)
            or (isinstance(dim, (list, tuple)) and all(isinstance(d, int) for d in dim))):
        return None
    if n.target is torch.nn.functional.normalize:  # x / max(||x||, eps) along dim (default 1)
        dim = 1 if "dim" not in b else dim
        if dim is None:
            return None
        return b["input"], b["p"], dim, True, float(b.get("eps", 1e-12))
    return b["input"], b["p"], dim, bool(b.get("keepdim", False)), None


def vector_norms(gm: fx.GraphModule) -> bool:
    """Vector norms as the reductions they are: the 2-norm (p=2 or 'fro' over the given dims)
    sqrt(sum(x * x)), the 1-norm sum(abs(x)), the inf-norm amax(abs(x)), so the reduction and
    the ops around it fuse (x / ||x|| in one kernel, principle alg-reduce-broadcast); F.normalize
    as x / clamp(norm, min=eps). Only float inputs; torch.linalg.norm (matrix norms over two
    dims) stays."""
    import math

    import torch

    graph = gm.graph
    changed = False
    for n in _live(graph):
        call = _norm_call(n)
        if call is None or not _float(call[0]):
            continue
        x, p, dim, keepdim, eps = call
        if dim is None and node_shape(x) is None:
            continue
        kw = {"dim": list(range(len(node_shape(x)))) if dim is None else dim, "keepdim": keepdim}
        with graph.inserting_before(n):
            if p in (2, 2.0, "fro"):
                sq = graph.call_function(torch.mul, (x, x))
                new = graph.call_function(torch.sqrt, (graph.call_function(torch.sum, (sq,), kw),))
            elif p in (1, 1.0):
                new = graph.call_function(torch.sum, (graph.call_function(torch.abs, (x,)),), kw)
            elif p == math.inf:
                new = graph.call_function(torch.amax, (graph.call_function(torch.abs, (x,)),), kw)
            else:
                continue
            if eps is not None:
                new = graph.call_function(torch.div, (x, graph.call_function(
                    torch.clamp, (new,), {"min": eps})))
        new.meta = dict(n.meta)
        n.replace_all_uses_with(new)
        graph.erase_node(n)
        changed = True
    return changed


def rsqrt_forms(gm: fx.GraphModule) -> bool:
    """``1 / sqrt(v)``, ``sqrt(v).reciprocal()``, ``v ** -0.5`` and ``torch.pow(v, -0.5)`` are
    ``rsqrt(v)``: the form the RMS-norm pattern matches (the values differ by one rounding)."""
    import torch

    graph = gm.graph
    changed = False
    for n in _live(graph):
        if n.op not in ("call_function", "call_method"):
            continue
        op = classify(n, gm)
        if op.kind != "pointwise":
            continue
        v = None
        if op.name == "div" and isinstance(op.operands[0], (int, float)) and op.operands[0] == 1 \
                and isinstance(op.operands[1], fx.Node) and op.p.get("rounding_mode") is None:
            inner = op.operands[1]
            iop = classify(inner, gm)
            if iop.kind == "pointwise" and iop.name == "sqrt":  # (a sqrt read elsewhere too stays)
                v = iop.operands[0]
        elif op.name == "reciprocal" and isinstance(op.operands[0], fx.Node):
            inner = op.operands[0]
            iop = classify(inner, gm)
            if iop.kind == "pointwise" and iop.name == "sqrt":
                v = iop.operands[0]
        elif op.name == "pow" and isinstance(op.operands[1], (int, float)) and op.operands[1] == -0.5:
            v, inner = op.operands[0], None
        if not _float(v):
            continue
        with graph.inserting_before(n):
            new = graph.call_function(torch.rsqrt, (v,))
        new.meta = dict(n.meta)
        n.replace_all_uses_with(new)
        graph.erase_node(n)
        if inner is not None and not inner.users:
            graph.erase_node(inner)
        changed = True
    return changed


def _mean_last(gm: fx.GraphModule, n, of=None) -> fx.Node | None:
    """x when n is mean(x, dim=-1 (the last dim alone), keepdim=True) (and x is ``of``, if given)."""
    if not isinstance(n, fx.Node):
        return None
    op = classify(n, gm)
    if op.kind != "reduction" or op.name != "mean" or not op.p.get("keepdim") or op.p.get("dtype") is not None:
        return None
    x = op.operands[0]
    shape = node_shape(x) if isinstance(x, fx.Node) else None
    if not shape or norm_dims(op.p.get("dim"), len(shape)) != [len(shape) - 1] or (of is not None and x is not of):
        return None
    return x


def _centered(gm: fx.GraphModule, n) -> tuple | None:
    """(x, mu) when n is x - mu with mu = mean(x, -1, keepdim=True)."""
    xm = _sub_operands(gm, n)
    if xm is None:
        return None
    x, mu = xm
    return (x, mu) if _float(x) and _mean_last(gm, mu, of=x) is not None else None


def _biased_var_last(gm: fx.GraphModule, v, x, mu) -> bool:
    """Is v the biased variance of x over its last dim (keepdim): mean((x - mu)^2, -1, keepdim)
    (the square of a centered value of the same x and mu), or x.var(-1, keepdim=True,
    unbiased=False / correction=0)?"""
    import torch

    if not isinstance(v, fx.Node):
        return False
    sq = _mean_last(gm, v)
    if sq is not None:
        c = _square_of(gm, sq)
        return c is not None and _centered(gm, c) == (x, mu)
    if not ((v.op == "call_method" and v.target == "var") or (v.op == "call_function" and v.target is torch.var)):
        return False
    args = list(v.args[1:])
    kw = dict(v.kwargs)
    if v.args[0] is not x or len(args) > 1:
        return False
    dim = kw.pop("dim", args[0] if args else None)
    keep = kw.pop("keepdim", False)
    unbiased = kw.pop("unbiased", None)
    correction = kw.pop("correction", None)
    biased = (unbiased is False and correction is None) or (unbiased is None and correction in (0, 0.0))
    shape = node_shape(x)
    return (not kw and keep is True and biased and shape is not None
            and norm_dims(dim, len(shape)) == [len(shape) - 1])


def layer_norm_pattern(gm: fx.GraphModule) -> bool:
    """rw-layer-norm: (x - mean(x)) * rsqrt(var(x) + eps) (or / sqrt(var + eps)) over the last dim,
    the variance biased (mean((x - mean)^2), x.var(unbiased=False)), is layer_norm(x, (D,),
    eps=eps): one norm-template kernel per row instead of two reductions and an elementwise
    pass (a weight and bias after it join the kernel as its epilogue; a weight multiplied in
    first, ``w * (x - mu) * rsqrt(...)``, is multiplied after it)."""
    import operator

    import torch.nn.functional as F

    graph = gm.graph
    changed = False
    for n, v, _root, arg, how in _inverse_root_scalings(gm):
        cw = _weighted(gm, v, how, lambda u: _centered(gm, u) is not None)
        if cw is None:
            continue
        c, other = cw
        x, mu = _centered(gm, c)
        pe = _plus_scalar(gm, arg)
        if pe is None or len(arg.users) != 1 or not _biased_var_last(gm, pe[0], x, mu):
            continue
        shape = node_shape(x)
        if node_shape(n) != shape:
            continue
        with graph.inserting_before(n):
            new = graph.call_function(F.layer_norm, (x, (shape[-1],), None, None, float(pe[1])))
            if other is not None:
                new = graph.call_function(operator.mul, (new, other))
        _replace(n, new)  # what fed it (the statistics) goes with rw-dead-code when unused
        changed = True
    return changed
