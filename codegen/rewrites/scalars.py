"""Scalar algebra: clamps merged (rw-merge-clamps), chains of scalar steps folded
(rw-fold-scalar-chain), 0-d constant tensors read as Python numbers (a canonical form)."""
from __future__ import annotations

from torch import fx

from codegen.ops import classify
from codegen.rewrites.common import _float, _live, _op_name, _replace, _scalar, _scalar_step


def _clamp_bounds(op) -> tuple | None:
    """(input, lo, hi) of a clamp-like op with scalar (or absent) bounds."""
    if op.kind != "pointwise" or not op.operands or not _float(op.operands[0]):
        return None
    if op.name == "clamp":
        lo, hi = op.operands[1], op.operands[2]
    elif op.name == "relu":
        lo, hi = 0.0, None
    elif op.name == "relu6":
        lo, hi = 0.0, 6.0
    elif op.name == "hardtanh":
        lo, hi = op.p.get("min_val", -1.0), op.p.get("max_val", 1.0)
    else:
        return None
    if not all(b is None or _scalar(b) for b in (lo, hi)):
        return None
    return op.operands[0], lo, hi


def merge_clamps(gm: fx.GraphModule) -> bool:
    """rw-merge-clamps: clamp(clamp(x, a, b), c, d) = clamp(x, max(a, c), min(b, d)) for scalar
    bounds (relu, relu6 and hardtanh are clamps), when the merged bounds do not cross (crossing
    bounds make every value one bound, which one clamp cannot express the same way)."""
    import torch

    graph = gm.graph
    changed = False
    for n in _live(graph):
        second = _clamp_bounds(classify(n, gm)) if n.op != "placeholder" else None
        if second is None or not isinstance(second[0], fx.Node) or len(second[0].users) != 1:
            continue
        first = _clamp_bounds(classify(second[0], gm))
        if first is None:
            continue
        los = [b for b in (first[1], second[1]) if b is not None]
        his = [b for b in (first[2], second[2]) if b is not None]
        lo, hi = (max(los) if los else None), (min(his) if his else None)
        if lo is not None and hi is not None and lo > hi:
            continue
        inner = second[0]
        with graph.inserting_before(n):
            v = graph.call_function(torch.clamp, (first[0],), {"min": lo, "max": hi})
        _replace(n, v)
        if not inner.users:
            graph.erase_node(inner)
        changed = True
    return changed


def fold_scalar_chains(gm: fx.GraphModule) -> bool:
    """rw-fold-scalar-chain: consecutive scalar multiplies/divides on one value become one
    multiply, consecutive scalar adds/subtracts one add (each folded intermediate used once)."""
    import operator

    graph = gm.graph
    changed = False
    for n in _live(graph):
        if n.op not in ("call_function", "call_method", "call_module"):
            continue
        step = _scalar_step(classify(n, gm))
        if step is None or len(step[0].users) != 1:
            continue
        prev = _scalar_step(classify(step[0], gm))
        if prev is None or prev[1] != step[1]:
            continue
        c = prev[2] * step[2] if step[1] == "mul" else prev[2] + step[2]
        fn = operator.mul if step[1] == "mul" else operator.add
        inner = step[0]
        with graph.inserting_before(n):
            v = graph.call_function(fn, (prev[0], c))
        _replace(n, v)
        if not inner.users:
            graph.erase_node(inner)
        changed = True
    return changed


#: binary ops that read a 0-d constant tensor operand the same as the Python number
_SCALAR_ARITH = {"add", "sub", "mul", "truediv", "div"}


#: elementwise min / max against a constant: clamp's bound (NaN in x stays NaN either way)
_CLAMP_SIDE = {"min": "max", "minimum": "max", "max": "min", "maximum": "min"}


def scalar_constants(gm: fx.GraphModule) -> bool:
    """``torch.tensor(c, device=...)`` (c a Python number, no dtype) read by elementwise ops of
    a floating tensor is the number itself: ``torch.min(x, t)`` becomes ``clamp(x, max=c)``,
    ``x + t`` becomes ``x + c``. Creating the tensor on the GPU is a pageable host-to-device copy
    in every call that stalls the host until the GPU has finished the work before it, and the
    kernels after it then wait for their launches. A 0-d tensor does not promote a floating
    tensor's dtype, so the results are the same."""
    import operator

    import torch

    graph = gm.graph
    changed = False
    for n in _live(graph):
        if not (n.op == "call_function" and n.target is torch.tensor and len(n.args) == 1
                and type(n.args[0]) in (int, float) and set(n.kwargs) <= {"device"}):
            continue
        c = n.args[0]
        for u in list(n.users):
            name = _op_name(u)
            others = [a for a in u.args if a is not n]
            if len(u.args) != 2 or u.kwargs or len(others) != 1 or not _float(others[0]):
                continue
            x = others[0]
            if name in _CLAMP_SIDE:
                with graph.inserting_before(u):
                    new = graph.call_function(torch.clamp, (x,), {_CLAMP_SIDE[name]: float(c)})
                new.meta = dict(u.meta)
                u.replace_all_uses_with(new)
                graph.erase_node(u)
            elif name in _SCALAR_ARITH and (
                    (u.op == "call_function" and u.target is getattr(operator, name, None))
                    or (u.args[1] is n and (u.op == "call_method"
                                            or u.target is getattr(torch, name, None)))):
                # (torch.sub(c, x) and a method of the constant need a tensor first operand)
                u.args = tuple(c if a is n else a for a in u.args)
            else:
                continue
            changed = True
        if not n.users:
            dev = n.kwargs.get("device")
            graph.erase_node(n)
            if isinstance(dev, fx.Node) and not dev.users and dev.target is getattr:
                graph.erase_node(dev)  # the device query made only for the constant
    return changed


def where_scalar_fills(gm: fx.GraphModule) -> bool:
    """``torch.where(c, torch.full_like(s, v), s)`` (either order) is ``torch.where(c, v, s)``:
    the fill tensor has s's shape and dtype, so the number gives the same values and shape; the
    planner then sees one elementwise op on s (and a causal mask so written is one attention
    kernel: the scores no longer have a second reader)."""
    import torch

    graph = gm.graph
    changed = False
    for n in _live(graph):
        if n.op != "call_function" or n.target is not torch.where or len(n.args) != 3 or n.kwargs:
            continue
        cond, a, b = n.args
        for i, (fill, other) in ((1, (a, b)), (2, (b, a))):
            if not (isinstance(fill, fx.Node) and _op_name(fill) == "full_like" and fill.args
                    and fill.args[0] is other and len(fill.args) == 2 and _scalar(fill.args[1])
                    and not fill.kwargs and len(fill.users) == 1):
                continue
            args = list(n.args)
            args[i] = float(fill.args[1])
            n.args = tuple(args)
            graph.erase_node(fill)
            changed = True
            break
    return changed
