"""Algebraic rewrites on the captured fx graph (stage 1). Each rule is general, has a principle
entry in knowledge/principles (same id), and returns whether it changed the graph.
The rewritten program is verified like any candidate."""
from __future__ import annotations

from torch import fx

from codegen.fusion import norm_dims
from codegen.layout import CONV_FUNCTIONAL, SHAPE_QUERIES
from codegen.ops import FLOAT_DTYPES, classify, node_dtype, node_shape


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


# ---------------------------------------------------------------------------------------------
# Algebraic rules. Each keeps eager's values up to rounding (the verifier checks every rewritten
# program under the precision contract) and NaN/Inf behaviour, and applies only to floating
# tensors with shapes known from the trace.
def _float(n) -> bool:
    return isinstance(n, fx.Node) and node_dtype(n) in FLOAT_DTYPES


def _live(graph: fx.Graph):
    """The graph's nodes, skipping those a rule erased while the walk went on."""
    for n in list(graph.nodes):
        if not getattr(n, "_erased", False):
            yield n


def _ops(gm: fx.GraphModule, kind: str, names: tuple[str, ...]):
    """(node, its NOp) for every live node of this kind whose canonical name is in names."""
    for n in _live(gm.graph):
        op = classify(n, gm)
        if op.kind == kind and op.name in names:
            yield n, op


def _op_name(n: fx.Node) -> str:
    """A call's name: the method's, or the function's ("" for a callable without one)."""
    return n.target if n.op == "call_method" else getattr(n.target, "__name__", "")


def _replace(n: fx.Node, new: fx.Node) -> None:
    n.replace_all_uses_with(new)
    n.graph.erase_node(n)


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


def softmax_size1(gm: fx.GraphModule) -> bool:
    """rw-softmax-size1: softmax over a size-1 dimension is x - x + 1 (1, or NaN where x is not
    finite, as eager gives); log_softmax is x - x."""
    import operator

    graph = gm.graph
    changed = False
    for n, op in _ops(gm, "softmax", ("softmax", "log_softmax")):
        x = op.operands[0]
        shape = node_shape(x)
        dim = op.p.get("dim")
        if not _float(x) or not shape or not isinstance(dim, int) or shape[dim % len(shape)] != 1:
            continue
        with graph.inserting_before(n):
            v = graph.call_function(operator.sub, (x, x))
            if op.name == "softmax":
                v = graph.call_function(operator.add, (v, 1.0))
        _replace(n, v)
        changed = True
    return changed


def _scalar(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


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


def _scalar_step(op) -> tuple | None:
    """(tensor operand, kind, constant) of x*s, s*x, x/s (kind 'mul', constant the factor) or
    x+s, s+x, x-s (kind 'add', constant the addend)."""
    if op.kind != "pointwise" or len(op.operands) != 2 or op.p.get("alpha", 1) != 1:
        return None
    a, b = op.operands
    if op.name == "mul":
        if _float(a) and _scalar(b):
            return a, "mul", float(b)
        if _float(b) and _scalar(a):
            return b, "mul", float(a)
    if op.name == "div" and _float(a) and _scalar(b) and b != 0 and op.p.get("rounding_mode") is None:
        return a, "mul", 1.0 / float(b)
    if op.name == "add":
        if _float(a) and _scalar(b):
            return a, "add", float(b)
        if _float(b) and _scalar(a):
            return b, "add", float(a)
    if op.name == "sub" and _float(a) and _scalar(b):
        return a, "add", -float(b)
    return None


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


def rms_norm_pattern(gm: fx.GraphModule) -> bool:
    """rw-rms-norm: h * rsqrt(mean(h^2, -1, keepdim=True) + eps) (or h / sqrt(...)) over the last
    dimension is rms_norm(h, (H,), eps=eps): one norm-template kernel per row instead of a
    square, a reduction and an elementwise pass that each read the rows again."""
    import torch.nn.functional as F

    graph = gm.graph
    changed = False
    for n, op in _ops(gm, "pointwise", ("mul", "div")):
        if len(op.operands) != 2:
            continue
        a, b = op.operands
        for h, scale in ((a, b), (b, a)) if op.name == "mul" else ((a, b),):
            if not _float(h) or not isinstance(scale, fx.Node) or len(scale.users) != 1:
                continue
            sop = classify(scale, gm)
            want = "rsqrt" if op.name == "mul" else "sqrt"
            if sop.kind != "pointwise" or sop.name != want:
                continue
            pe = _plus_scalar(gm, sop.operands[0])
            if pe is None or len(sop.operands[0].users) != 1:
                continue
            mean, eps = pe
            mop = classify(mean, gm) if isinstance(mean, fx.Node) else None
            shape = node_shape(h)
            if (mop is None or mop.kind != "reduction" or mop.name != "mean" or len(mean.users) != 1
                    or not mop.p.get("keepdim") or not shape
                    or norm_dims(mop.p.get("dim"), len(shape)) != [len(shape) - 1]):
                continue
            sq = mop.operands[0]
            if _square_of(gm, sq) is not h or len(sq.users) != 1 or node_shape(n) != shape:
                continue
            with graph.inserting_before(n):
                v = graph.call_function(F.rms_norm, (h, (shape[-1],), None, float(eps)))
            dead = [scale, sop.operands[0], mean, sq]
            _replace(n, v)
            for d in dead:
                graph.erase_node(d)
            changed = True
            break
    return changed


#: consumer kinds whose Triton group can take an elementwise prologue (the bias add)
BIAS_FUSABLE = {"pointwise", "reduction", "norm", "softmax", "pool"}


def conv_bias_epilogue(gm: fx.GraphModule) -> bool:
    """rw-conv-bias-epilogue: a convolution module with bias whose every consumer is a fused
    kernel becomes the bias-free convolution plus a broadcast add of the bias. PyTorch adds a
    cuDNN convolution's bias in a separate pass over the whole result (output.add_(bias)); as an
    elementwise op the add joins the consumer's kernel: one read and one write of the result
    less, the same fp32 addition."""
    import operator

    import torch.nn as nn

    graph = gm.graph
    changed = False
    for n in _live(graph):
        if n.op != "call_module" or len(n.args) != 1 or n.kwargs:
            continue
        mod = gm.get_submodule(n.target)
        fn = CONV_FUNCTIONAL.get(type(mod))
        shape = node_shape(n)
        if (fn is None or mod.bias is None or mod.padding_mode != "zeros" or not _float(n)
                or not shape or not n.users
                or not all(classify(u, gm).kind in BIAS_FUSABLE for u in n.users)):
            continue
        with graph.inserting_before(n):
            w = _attr_node(gm, graph, f"{n.target}.weight")
            b = _attr_node(gm, graph, f"{n.target}.bias")
            if isinstance(mod, nn.modules.conv._ConvTransposeNd):
                args = (n.args[0], w, None, mod.stride, mod.padding, mod.output_padding, mod.groups,
                        mod.dilation)
            else:
                args = (n.args[0], w, None, mod.stride, mod.padding, mod.dilation, mod.groups)
            conv = graph.create_node("call_function", fn, args, name=f"{n.name}_nobias")
            view = graph.call_method("view", (b, *([1, shape[1]] + [1] * (len(shape) - 2))))
            v = graph.call_function(operator.add, (conv, view))
        _replace(n, v)
        changed = True
    return changed


def _static_int(v) -> int | None:
    """An int, or an fx value computed from traced shapes (x.shape[i], x.size(i), // and *)."""
    import operator

    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if not isinstance(v, fx.Node):
        return None
    if v.op == "call_function" and v.target in (operator.floordiv, operator.mul) and len(v.args) == 2:
        a, b = (_static_int(x) for x in v.args)
        if a is None or b is None or (v.target is operator.floordiv and b == 0):
            return None
        return a // b if v.target is operator.floordiv else a * b
    if v.op == "call_function" and v.target is operator.getitem and isinstance(v.args[1], int):
        src = v.args[0]
        if (isinstance(src, fx.Node) and src.op == "call_function" and src.target is getattr
                and src.args[1] == "shape" and node_shape(src.args[0]) is not None):
            return int(node_shape(src.args[0])[v.args[1]])
    if v.op == "call_method" and v.target == "size" and len(v.args) == 2 and isinstance(v.args[1], int):
        sh = node_shape(v.args[0])
        return int(sh[v.args[1]]) if sh is not None else None
    return None


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


def loss_decompose(gm: fx.GraphModule) -> bool:
    """rw-loss-decompose: a loss function (functional or module) with constant arguments the
    decomposition accepts -> its definition in elementwise ops and reductions
    (codegen.losses), which the pointwise and reduction templates fuse into one or two passes."""
    from codegen import losses as LS

    graph = gm.graph
    changed = False
    for n in _live(graph):
        call = LS.call_of(n, gm)
        if call is None:
            continue
        name, tensors, kw = call
        kw = LS.normalized(kw)
        shapes = [node_shape(t) for t in tensors]
        if kw is None or any(s is None for s in shapes):
            continue
        fn, _torch_fn, accepts = LS.LOSSES[name]
        if not accepts([tuple(s) for s in shapes], [node_dtype(t) for t in tensors], kw):
            continue

        try:
            sub = _trace_loss(fn, kw, len(tensors))
        except Exception:  # noqa: BLE001 - an argument the decomposition cannot take: keep the call
            continue
        val_map = dict(zip([p for p in sub.graph.nodes if p.op == "placeholder"], tensors))
        with graph.inserting_before(n):
            out = graph.graph_copy(sub.graph, val_map)
        _replace(n, out)
        changed = True
    return changed


def _trace_loss(fn, kw: dict, n_tensors: int) -> fx.GraphModule:
    """fx graph of fn(tensors..., **kw) with kw baked in as constants."""
    import torch.nn as nn

    if n_tensors == 2:
        class Two(nn.Module):
            def forward(self, a, b):
                return fn(a, b, **kw)

        return fx.symbolic_trace(Two())

    class Three(nn.Module):
        def forward(self, a, b, c):
            return fn(a, b, c, **kw)

    return fx.symbolic_trace(Three())


# ---------------------------------------------------------------------------------------------
# Attention written out (rw-attention): q @ k^T * scale, an optional causal mask, softmax, @ v.
#: a finite mask fill at or below this is -inf for a softmax: exp(fill - row max) is exactly 0
#: in fp32 for any row max above fill + 104 (a causal row always keeps its finite diagonal)
MASK_FILL_MAX = -1e9


def _through(gm: fx.GraphModule, n):
    """Follow single-user casts (and identities) from n: (the first other node, casts passed)."""
    casts = []
    while isinstance(n, fx.Node):
        op = classify(n, gm)
        if not ((op.kind == "pointwise" and op.name == "cast") or op.kind == "identity") or len(n.users) > 1:
            break
        if op.kind == "pointwise":
            casts.append(op.p["dtype"])
        n = op.operands[0]
    return n, casts


def _transposed_last(n) -> fx.Node | None:
    """x when n is x with its last two dims swapped (transpose(-2, -1), .mT, permute, .t())."""
    if not isinstance(n, fx.Node) or n.op not in ("call_method", "call_function"):
        return None
    x = n.args[0] if n.args else None
    shape = node_shape(x) if isinstance(x, fx.Node) else None
    if shape is None or len(shape) < 2:
        return None
    nd = len(shape)
    name = _op_name(n)
    if name in ("transpose", "swapaxes", "swapdims") and len(n.args) == 3 and not n.kwargs:
        return x if {n.args[1] % nd, n.args[2] % nd} == {nd - 2, nd - 1} else None
    if name == "permute":
        dims = list(n.args[1:]) if len(n.args) > 2 else list(n.args[1]) if len(n.args) == 2 else []
        want = list(range(nd - 2)) + [nd - 1, nd - 2]
        return x if [d % nd for d in dims if isinstance(d, int)] == want and len(dims) == nd else None
    if name == "t" and nd == 2:
        return x
    if n.op == "call_function" and n.target is getattr and n.args[1] == "mT":
        return x
    return None


#: tensor methods that make a new tensor from their receiver's dtype and device alone
NEW_FACTORIES = ("new_ones", "new_zeros", "new_full", "new_empty", "new_tensor")
#: torch functions that make a new tensor from their first argument's shape, dtype and device
LIKE_FACTORIES = ("ones_like", "zeros_like", "full_like", "empty_like")


def _constant_value(gm: fx.GraphModule, n: fx.Node, bump: int = 0):
    """The value of n when it depends on no tensor's values, only on traced constants and on
    shape or device queries of the graph's inputs: evaluated on the CPU with every input dim
    grown by ``bump`` (inputs as meta tensors, their device read as the CPU's). None when n reads
    a value it cannot know (an input's or a parameter's data, a buffer), or evaluating fails.
    Returns (value, whether it read an input's shape)."""
    import re

    import torch

    order, seen, todo = [], set(), [n]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        order.append(m)
        todo.extend(m.all_input_nodes)
    pos = {m: i for i, m in enumerate(gm.graph.nodes)}
    env, shaped = {}, False
    try:
        for m in sorted(order, key=pos.__getitem__):
            if m.op == "placeholder":
                sh = node_shape(m)
                if sh is None:
                    return None
                env[m] = torch.empty([d + bump for d in sh], dtype=node_dtype(m), device="meta")
                continue
            if m.op == "get_attr":
                if not re.fullmatch(r"_tensor_constant\d+", str(m.target)):
                    return None  # a parameter or buffer: its values may change (load_state_dict)
                env[m] = getattr(gm, m.target)
                continue
            args = fx.node.map_arg(m.args, env.__getitem__)
            kwargs = fx.node.map_arg(m.kwargs, env.__getitem__)
            if m.op == "call_function" and m.target is getattr and args[1] == "device":
                env[m] = torch.device("cpu")
                continue
            if m.op == "call_function" and m.target is getattr and args[1] in ("shape", "ndim"):
                shaped = True
            if m.op == "call_method" and m.target in ("size", "dim"):
                shaped = True
            if m.op == "call_function" and getattr(m.target, "__name__", "") in LIKE_FACTORIES \
                    and isinstance(args[0], torch.Tensor) and args[0].device.type == "meta":
                # torch.ones_like(x) reads only x's shape, dtype and device
                args = (torch.empty(args[0].shape, dtype=args[0].dtype),) + tuple(args[1:])
                val = m.target(*args, **kwargs)
            elif m.op == "call_function":
                val = m.target(*args, **kwargs)
            elif m.op == "call_method" and m.target in NEW_FACTORIES:
                # x.new_ones(...) reads only x's dtype and device: made from a CPU stand-in
                val = getattr(torch.empty(0, dtype=args[0].dtype), m.target)(*args[1:], **kwargs)
            elif m.op == "call_method":
                val = getattr(args[0], m.target)(*args[1:], **kwargs)
            else:
                return None
            env[m] = val  # meta tensors only for shape queries: a value read stays meta
    except Exception:  # noqa: BLE001 - a form the evaluation cannot run: not a known constant
        return None
    out = env[n]
    if isinstance(out, torch.Tensor) and out.device.type == "meta":
        return None  # it depends on an input's or a parameter's values
    return out, shaped


def _causal_2d(rows: int, cols: int):
    """Keep-mask of torch's is_causal (top-left aligned): key j visible to query i when j <= i."""
    import torch

    return torch.ones(rows, cols, dtype=torch.bool).tril()


def _is_causal_mask(val, kind: str) -> bool:
    """Is val (broadcast over leading dims) the causal mask of its own last two dims, as the
    ``kind`` of use reads it: 'drop' (True where masked: masked_fill), 'keep' (True where kept:
    where), 'add' (0 where kept, -inf or <= MASK_FILL_MAX where masked: an additive mask)."""
    import torch

    if not isinstance(val, torch.Tensor) or val.dim() < 2 or val.numel() != val.shape[-2] * val.shape[-1]:
        return False
    m = val.reshape(val.shape[-2], val.shape[-1])
    keep = _causal_2d(*m.shape)
    if kind == "add":
        if not m.is_floating_point():
            return False
        return bool((m[keep] == 0).all()) and bool((m[~keep] <= MASK_FILL_MAX).all())
    if m.dtype != torch.bool:
        if m.is_floating_point() or not bool(((m == 0) | (m == 1)).all()):
            return False
        m = m.bool()
    return bool((m == (keep if kind == "keep" else ~keep)).all())


def _mask_step(gm: fx.GraphModule, n: fx.Node):
    """(scores, mask node, kind) when n masks scores: masked_fill(s, mask, fill), where(mask, s,
    fill), where(mask, fill, s) or s + mask, with a fill at or below MASK_FILL_MAX; else None."""
    import operator

    import torch

    name = _op_name(n)
    args = list(n.args)
    if name == "masked_fill" and len(args) + len(n.kwargs) == 3:
        s, mask = args[0], args[1] if len(args) > 1 else n.kwargs.get("mask")
        fill = args[2] if len(args) > 2 else n.kwargs.get("value")
        if isinstance(fill, (int, float)) and fill <= MASK_FILL_MAX:
            return s, mask, "drop"
        return None
    if n.op == "call_function" and n.target is torch.where and len(args) == 3 and not n.kwargs:
        cond, a, b = args
        if isinstance(b, (int, float)) and b <= MASK_FILL_MAX:
            return a, cond, "keep"
        if isinstance(a, (int, float)) and a <= MASK_FILL_MAX:
            return b, cond, "drop"
        return None
    if n.op == "call_function" and n.target in (operator.add, torch.add) and len(args) == 2 and not n.kwargs:
        a, b = args
        for s, mask in ((a, b), (b, a)):
            if isinstance(mask, fx.Node) and isinstance(s, fx.Node) and node_shape(s) is not None \
                    and node_shape(mask) is not None and len(node_shape(mask)) <= len(node_shape(s)):
                return s, mask, "add"
    return None


def _mask_is_causal(gm: fx.GraphModule, mask, kind: str, scores_shape) -> bool:
    """The mask is causal at the traced size (and of the scores' size there) and, when it is
    built from the inputs' shapes, also at another size (every input dim grown by one)."""
    if not isinstance(mask, fx.Node):
        return False
    got = _constant_value(gm, mask)
    if got is None:
        return False
    val, shaped = got
    if tuple(val.shape[-2:]) != tuple(scores_shape[-2:]) or not _is_causal_mask(val, kind):
        return False
    if not shaped:
        return True
    again = _constant_value(gm, mask, bump=1)
    return again is not None and _is_causal_mask(again[0], kind)


def _number(gm: fx.GraphModule, v):
    """A Python number v, or an fx value computed from constants and input shapes (math.sqrt of
    a head dim): (value at the traced size, value at the grown size or None if it does not
    depend on shapes); None for anything else."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v), None
    if not isinstance(v, fx.Node) or node_shape(v) is not None:
        return None
    got = _constant_value(gm, v)
    if got is None or not isinstance(got[0], (int, float)) or isinstance(got[0], bool):
        return None
    if not got[1]:
        return float(got[0]), None
    again = _constant_value(gm, v, bump=1)
    if again is None or not isinstance(again[0], (int, float)):
        return None
    return float(got[0]), float(again[0])


def _scale_step(gm: fx.GraphModule, n, head_dim: int | None = None):
    """(x, factor) when n is x * c, c * x or x / c for a number c; factor "head" when c is
    1/sqrt(head dim) (a divide: sqrt(head dim)) computed from the inputs' shapes, as sdpa's
    default scale is, at the traced and at the grown size; else None."""
    import math

    if not isinstance(n, fx.Node) or n.op not in ("call_function", "call_method"):
        return None
    op = classify(n, gm)
    if op.kind not in ("pointwise", "library") or _op_name(n) not in ("mul", "truediv", "div") \
            or len(n.args) != 2 or n.kwargs:
        return None
    a, b = n.args
    pairs = [(a, b), (b, a)] if _op_name(n) == "mul" else [(a, b)]
    for x, c in pairs:
        if not _float(x):
            continue
        num = _number(gm, c)
        if num is None or num[0] == 0:
            return None
        inv = _op_name(n) != "mul"
        if num[1] is None:
            return x, (1.0 / num[0] if inv else num[0])
        if head_dim is None:
            return None
        want = [math.sqrt(d) if inv else 1.0 / math.sqrt(d) for d in (head_dim, head_dim + 1)]
        if all(abs(g - w) <= 1e-9 * w for g, w in zip(num, want)):
            return x, "head"
        return None
    return None


def _plain_product(op) -> bool:
    """Is op a matmul / bmm of two tensors (no bias)?"""
    return (op is not None and op.kind == "matmul" and op.name in ("matmul", "bmm")
            and op.operands[2] is None)


def _qk_head_dim(gm: fx.GraphModule, s: fx.Node) -> int | None:
    """The head dim of the q @ k^T below s (through scale steps), for a shape-derived scale."""
    while isinstance(s, fx.Node):
        op = classify(s, gm) if s.op in ("call_function", "call_method") else None
        if op is not None and op.kind == "matmul" and node_shape(op.operands[0]):
            return int(node_shape(op.operands[0])[-1])
        if op is None or not s.args or not isinstance(s.args[0], fx.Node):
            return None
        s = s.args[0] if _float(s.args[0]) else (s.args[1] if len(s.args) > 1 else None)
    return None


def attention_pattern(gm: fx.GraphModule) -> bool:
    """rw-attention: softmax(q @ k^T * scale [masked causally], -1) @ v, written out, is
    scaled_dot_product_attention(q, k, v, is_causal=..., scale=scale): one flash kernel that
    never writes the scores. The scale may be a multiply or a divide by a number (none: 1.0);
    the softmax may run in fp32 between casts; the mask may be a masked_fill, a where or an
    additive mask, and is only taken when it depends on no tensor values and equals torch's
    top-left causal mask (evaluated at the traced size and, if built from the inputs' shapes,
    at a second size). The kernel's scores are fp32 where eager rounds them to the operands'
    dtype: the rewritten program is verified like any candidate."""
    import torch
    import torch.nn.functional as F

    graph = gm.graph
    changed = False
    for n in _live(graph):
        op = classify(n, gm) if n.op in ("call_function", "call_method") else None
        if not _plain_product(op):
            continue
        p, v = op.operands[:2]
        shape = node_shape(n)
        if not _float(v) or shape is None or node_shape(v) is None or len(shape) not in (3, 4):
            continue
        sm, _casts = _through(gm, p)
        sop = classify(sm, gm) if isinstance(sm, fx.Node) else None
        if sop is None or sop.kind not in ("softmax", "library") or _op_name(sm) not in ("softmax",) \
                or len(sm.users) != 1:
            continue
        x = sm.args[0]
        dim = sm.args[1] if len(sm.args) > 1 else sm.kwargs.get("dim")
        if not isinstance(x, fx.Node) or node_shape(x) is None or not isinstance(dim, int) \
                or dim % len(node_shape(x)) != len(node_shape(x)) - 1 \
                or set(sm.kwargs) - {"dim", "dtype", "_stacklevel"}:
            continue
        if sm.kwargs.get("dtype") not in (None, torch.float32):
            continue
        # scores -> [scale and one causal mask, in either order] -> casts -> softmax
        s, _ = _through(gm, x)
        causal, scale, head, ok = False, 1.0, 0, True
        while ok and isinstance(s, fx.Node) and len(s.users) == 1:
            up, _ = _through(gm, s)
            if up is not s:  # casts between the steps (scores.float() / c)
                s = up
                continue
            sc = _scale_step(gm, s, head_dim=_qk_head_dim(gm, s))
            if sc is not None:
                s, c = sc
                if c == "head":
                    head += 1
                else:
                    scale *= c
                continue
            step = _mask_step(gm, s) if not causal else None
            if step is None:
                break
            inner, mask, kind = step
            # the factors seen so far scale the masked scores: -inf times a negative is +inf
            ok = (isinstance(inner, fx.Node) and scale > 0
                  and _mask_is_causal(gm, mask, kind, node_shape(inner)))
            s, causal = inner, True
        if not ok or head > 1 or (head and scale != 1.0):
            continue  # sdpa's default scale, or a number: not 1/sqrt(D) times another number
        if not isinstance(s, fx.Node) or len(s.users) != 1:
            continue
        qk = classify(s, gm) if s.op in ("call_function", "call_method") else None
        if not _plain_product(qk):
            continue
        q, kt = qk.operands[:2]
        k = _transposed_last(kt)
        if k is None or not all(_float(t) for t in (q, k)):
            continue
        sq, sk, sv = node_shape(q), node_shape(k), node_shape(v)
        if (len({node_dtype(q), node_dtype(k), node_dtype(v), node_dtype(n)}) != 1
                or not (len(sq) == len(sk) == len(sv) == len(shape)) or sq[:-2] != sk[:-2]
                or sk[:-2] != sv[:-2] or sq[-1] != sk[-1] or sk[-2] != sv[-2]):
            continue
        with graph.inserting_before(n):
            new = graph.call_function(F.scaled_dot_product_attention, (q, k, v),
                                      {"is_causal": causal, "scale": None if head else float(scale)})
        new.meta = dict(n.meta)
        n.replace_all_uses_with(new)
        dead = [n, p, kt]
        graph.erase_node(n)
        _erase_unused_above(dead[1:], stop=None)
        changed = True
    return changed


# ---------------------------------------------------------------------------------------------
# LM head + cross-entropy (rw-linear-cross-entropy)
def _feeds_only(n: fx.Node, inside: set) -> bool:
    """Do all of n's (transitive) uses end in nodes of ``inside``?"""
    todo, seen = list(n.users), set()
    while todo:
        u = todo.pop()
        if u in inside or u in seen:
            continue
        seen.add(u)
        if u.op == "output" or not u.users:
            return False
        todo.extend(u.users)
    return True


def _chain_to_linear(gm: fx.GraphModule, n, consumer: fx.Node):
    """Follow n (read by consumer) up through casts and reshapes (``logits.view(-1,
    logits.shape[-1]).float()``), each used only by the next and by shape queries that feed the
    chain: (the node reached or None, the chain's nodes)."""
    chain = []
    while isinstance(n, fx.Node) and n.op in ("call_function", "call_method"):
        op = classify(n, gm)
        if not ((op.kind == "pointwise" and op.name == "cast") or op.kind == "identity"
                or (op.kind == "view" and op.name in ("view", "reshape", "flatten"))):
            break
        chain.append(n)
        n = n.args[0]
    inside = set(chain) | {consumer}
    for m in chain + ([n] if isinstance(n, fx.Node) else []):
        for u in m.users:
            if u not in inside and not (_is_shape_query(u) and _feeds_only(u, inside)):
                return None, chain
    return n, chain


def linear_cross_entropy_pattern(gm: fx.GraphModule) -> bool:
    """rw-linear-cross-entropy: cross_entropy(linear(x, W, b).float(), t) (class indices, mean,
    sum or none, an ignore_index; the logits maybe flattened from [B, S, V] and the targets from
    [B, S]) is one LM-head-and-loss op (codegen.ops linear_cross_entropy) whose template reduces
    each tile of logits where it is made: the [T, V] logits and their fp32 copy are never
    written. The logits used anywhere else, fp32 logits of a 16-bit product kept 16-bit for the
    loss (no upcast) or a weight / label smoothing keep the library calls."""
    import torch

    from codegen import losses as LS
    from codegen import ops as O

    graph = gm.graph
    changed = False
    for n in _live(graph):
        call = LS.call_of(n, gm)
        if call is None or call[0] != "cross_entropy":
            continue
        (logits, target), kw = call[1], LS.normalized(call[2])
        if kw is None or set(kw) - {"reduction", "ignore_index"} or not isinstance(logits, fx.Node):
            continue
        if kw.get("reduction", "mean") not in ("mean", "sum", "none") or node_dtype(logits) != torch.float32:
            continue
        ls = node_shape(logits)
        if len(logits.users) != 1:
            continue
        lin, _chain = _chain_to_linear(gm, logits, n)
        lop = classify(lin, gm) if isinstance(lin, fx.Node) and lin.op == "call_function" else None
        if lop is None or lop.kind != "matmul" or lop.name != "linear":
            continue
        x, w, b = lop.operands[:3]
        xs, ws = node_shape(x), node_shape(w)
        if (ls is None or len(ls) != 2 or xs is None or ws is None or len(ws) != 2
                or ls != (_prod(xs[:-1]), ws[0]) or node_dtype(target) != torch.int64
                or node_shape(target) != (ls[0],)):
            continue
        with graph.inserting_before(n):
            xf = x if len(xs) == 2 else graph.call_method("reshape", (x, -1, xs[-1]))
            new = graph.call_function(O.linear_cross_entropy, (xf, w, target, b),
                                      {"ignore_index": int(kw.get("ignore_index", -100)),
                                       "reduction": kw.get("reduction", "mean")})
        new.meta = dict(n.meta)
        n.replace_all_uses_with(new)
        graph.erase_node(n)
        _erase_unused_above([logits], stop=x)
        changed = True
    return changed


def _prod(xs) -> int:
    """The product of a shape's sizes."""
    out = 1
    for v in xs:
        out *= int(v)
    return out


RULES = [("rw-attention", attention_pattern),
         ("rw-linear-cross-entropy", linear_cross_entropy_pattern),
         ("rw-loss-decompose", loss_decompose), ("rw-rotate-half", rotate_half_pattern),
         ("rw-rotate-half", rotate_pairs_pattern),
         ("rw-conv-bias-epilogue", conv_bias_epilogue), ("rw-rms-norm", rms_norm_pattern),
         ("rw-linear-reduce", linear_reduce), ("rw-size1-reduction", size1_reductions),
         ("rw-nest-reduction", nest_uneven_reductions),
         ("rw-softmax-size1", softmax_size1), ("rw-merge-clamps", merge_clamps),
         ("rw-fold-scalar-chain", fold_scalar_chains), ("rw-dead-code", drop_dead_code)]


def apply_all(gm: fx.GraphModule, inputs: list | None = None) -> list[str]:
    """Apply every rule until none changes the graph (one rule's result can enable another:
    a sum over features leaves size-1 dims behind); re-propagate shapes on meta inputs."""
    applied: list[str] = []
    for _round in range(8):
        changed = False
        for rid, fn in RULES:
            if fn(gm):
                gm.graph.lint()
                changed = True
                if rid not in applied:
                    applied.append(rid)
                _propagate(gm, inputs)
        if not changed:
            break
    return applied


def _propagate(gm: fx.GraphModule, inputs: list | None) -> None:
    if inputs is None:
        return
    from harness.capture import propagate  # meta shapes; graph breaks, recurrent layers

    gm.recompile()
    propagate(gm, inputs)


# ---------------------------------------------------------------------------------------------
# Canonicalization (not algebra): normalization and linear modules become their functional form,
# with get_attr nodes for weight and bias, so the fusion planner sees one op with tensor operands.
def _attr_node(gm: fx.GraphModule, graph: fx.Graph, target: str):
    from torch.fx.passes.shape_prop import _extract_tensor_metadata

    node = graph.get_attr(target)
    try:
        t = gm.get_parameter(target)
    except AttributeError:
        t = gm.get_buffer(target)
    node.meta["tensor_meta"] = _extract_tensor_metadata(t)
    return node


def _module_calls(gm: fx.GraphModule):
    """(node, module) for every call of a submodule on one positional argument."""
    for n in list(gm.graph.nodes):
        if n.op == "call_module" and len(n.args) == 1 and not n.kwargs:
            yield n, gm.get_submodule(n.target)


def modules_to_functionals(gm: fx.GraphModule) -> bool:
    """Norm and linear module calls as their functional forms over get_attr parameters, so
    that one op-table entry (and one template) covers both spellings."""
    import torch.nn as nn
    import torch.nn.functional as F

    graph = gm.graph
    changed = False
    for n, mod in _module_calls(gm):
        with graph.inserting_before(n):
            def wb():
                w = _attr_node(gm, graph, f"{n.target}.weight") if getattr(mod, "weight", None) is not None else None
                b = _attr_node(gm, graph, f"{n.target}.bias") if getattr(mod, "bias", None) is not None else None
                return w, b

            if isinstance(mod, nn.LayerNorm):
                w, b = wb()
                new = graph.call_function(F.layer_norm, (n.args[0], tuple(mod.normalized_shape), w, b, mod.eps))
            elif isinstance(mod, nn.GroupNorm):
                w, b = wb()
                new = graph.call_function(F.group_norm, (n.args[0], mod.num_groups, w, b, mod.eps))
            elif isinstance(mod, (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)):
                if mod.track_running_stats:
                    continue
                w, b = wb()
                new = graph.call_function(F.instance_norm, (n.args[0],),
                                          {"weight": w, "bias": b, "eps": mod.eps})
            elif hasattr(nn, "RMSNorm") and isinstance(mod, nn.RMSNorm):
                w, _ = wb()
                new = graph.call_function(F.rms_norm, (n.args[0], tuple(mod.normalized_shape), w, mod.eps))
            elif type(mod) is nn.Linear:
                w, b = wb()
                new = graph.call_function(F.linear, (n.args[0], w, b))
            else:
                continue
        new.meta = dict(n.meta)
        n.replace_all_uses_with(new)
        graph.erase_node(n)
        changed = True
    return changed


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


def _erase_unused_above(nodes: list[fx.Node], stop: fx.Node) -> None:
    """Erase these nodes and what they were computed from, up to ``stop``, once unused (views,
    sizes, constants: the pieces of a pattern just replaced)."""
    todo = list(nodes)
    while todo:
        n = todo.pop(0)
        if (n is stop or n.users or n.op not in ("call_function", "call_method")
                or getattr(n, "_erased", False)):
            continue
        ins = list(n.all_input_nodes)
        n.graph.erase_node(n)
        todo += ins


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


def fold_dtype_queries(gm: fx.GraphModule) -> bool:
    """``x.dtype`` of a traced tensor is a constant: written in place of the query, so that
    ``h.to(x.dtype)`` does not make x's producer wait for a metadata read (a query is a user the
    fusion planner must order before the kernel that produces x)."""
    changed = False
    for n in list(gm.graph.nodes):
        if (n.op == "call_function" and n.target is getattr and len(n.args) == 2
                and n.args[1] == "dtype" and isinstance(n.args[0], fx.Node)
                and node_dtype(n.args[0]) is not None):
            n.replace_all_uses_with(node_dtype(n.args[0]))
            gm.graph.erase_node(n)
            changed = True
    return changed


#: calls that may move a tensor to another device (a device query does not look past them)
MOVES = {"to", "cuda", "cpu", "type"}


def _device_source(x: fx.Node) -> fx.Node | None:
    """A graph input or parameter that x was computed from on the same device: None when a
    move (.to(), .cuda(), .cpu()) or a call with a device argument lies on the way."""
    seen, todo = set(), [x]
    found = None
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op in ("placeholder", "get_attr"):
            if found is None and node_shape(n) is not None:
                found = n
            continue
        if (n.op == "call_method" and n.target in MOVES) or "device" in n.kwargs:
            return None
        todo.extend(n.all_input_nodes)
    return found


def device_queries_from_inputs(gm: fx.GraphModule) -> bool:
    """``x.device`` of an intermediate tensor is the device of the inputs it was computed from:
    the query reads it from one of them, so that ``torch.min(x, torch.tensor(c,
    device=x.device))`` does not make the kernel producing x end before the query (a metadata
    read is a user the fusion planner must order after x's kernel: the chain was cut in two)."""
    changed = False
    for n in list(gm.graph.nodes):
        if not (n.op == "call_function" and n.target is getattr and len(n.args) == 2
                and n.args[1] == "device" and isinstance(n.args[0], fx.Node)
                and n.args[0].op not in ("placeholder", "get_attr")):
            continue
        src = _device_source(n.args[0])
        if src is not None:
            n.replace_input_with(n.args[0], src)
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


def _is_shape_query(n: fx.Node) -> bool:
    if n.op == "call_function" and n.target is getattr:
        return len(n.args) == 2 and n.args[1] == "shape"
    return n.op == "call_method" and n.target in SHAPE_QUERIES


def _same_shape_source(gm: fx.GraphModule, x: fx.Node) -> fx.Node | None:
    """A graph input or parameter of x's traced shape that x was computed from through
    elementwise ops only (an elementwise result has its operands' broadcast shape), or None.
    Not another op's result: a query there would be one more consumer of that op (the
    convolution-bias rule counts them)."""
    while x.op in ("call_function", "call_method"):
        shape = node_shape(x)
        op = classify(x, gm)
        if shape is None or op.kind != "pointwise":
            return None
        same = [a for a in op.operands if isinstance(a, fx.Node) and node_shape(a) == shape]
        if not same:
            return None
        x = same[0]
    return x if x.op in ("placeholder", "get_attr") else None


def shape_queries_from_sources(gm: fx.GraphModule) -> bool:
    """``x.shape`` / ``x.size()`` / ``x.dim()`` / ``x.numel()`` of an elementwise result reads
    the input of the same shape it was computed from, so that kl_div's ``batchmean`` (the loss
    divided by ``input.size(0)``, input = log(p)) does not make log(p) a kernel output of its
    own: a metadata read is a user the fusion planner must order after the kernel producing x
    (the chain was cut in two)."""
    changed = False
    for n in list(gm.graph.nodes):
        if not _is_shape_query(n) or not n.args or not isinstance(n.args[0], fx.Node):
            continue
        src = _same_shape_source(gm, n.args[0])
        if src is not None and src is not n.args[0]:
            n.replace_input_with(n.args[0], src)
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


# ---- the same math written differently: one form for the planner ---------------------------
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
            if iop.kind == "pointwise" and iop.name == "sqrt" and len(inner.users) == 1:
                v = iop.operands[0]
        elif op.name == "reciprocal" and isinstance(op.operands[0], fx.Node):
            inner = op.operands[0]
            iop = classify(inner, gm)
            if iop.kind == "pointwise" and iop.name == "sqrt" and len(inner.users) == 1:
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


#: elementwise ops whose result is fp32 for an fp32 operand and an upcast 16-bit one
UPCAST_NEUTRAL = ("add", "sub", "mul", "div", "maximum", "minimum")


def redundant_upcasts(gm: fx.GraphModule) -> bool:
    """``h * w.float()`` with h an fp32 tensor and w a 16-bit one is ``h * w``: type promotion
    upcasts w exactly (both have dims, so the fp32 operand decides the result type), so the cast
    is no op of its own. Written that way (RMSNorm multiplying its weight in fp32 before the
    downcast) the cast of the weight was a kernel of its own that cut the norm's epilogue off."""
    import torch

    graph = gm.graph
    changed = False
    for n in _live(graph):
        if n.op not in ("call_function", "call_method"):
            continue
        op = classify(n, gm)
        x = op.operands[0] if op.operands else None
        if (op.kind != "pointwise" or op.name != "cast" or op.p.get("dtype") != torch.float32
                or not _float(x) or node_dtype(x) not in (torch.float16, torch.bfloat16)
                or not node_shape(x) or not n.users):
            continue
        ok = True
        for u in n.users:
            uop = classify(u, gm) if u.op in ("call_function", "call_method") else None
            others = [o for o in (uop.operands if uop else []) if o is not n]
            if (uop is None or uop.kind != "pointwise" or uop.name not in UPCAST_NEUTRAL
                    or len(uop.operands) != 2 or len(others) != 1 or uop.p.get("alpha", 1) != 1
                    or uop.p.get("rounding_mode") is not None
                    or not (isinstance(others[0], fx.Node) and node_dtype(others[0]) == torch.float32
                            and node_shape(others[0]))
                    or node_dtype(u) != torch.float32):
                ok = False
                break
        if not ok:
            continue
        n.replace_all_uses_with(x)
        graph.erase_node(n)
        changed = True
    return changed


def _getitem_unsqueeze2(n: fx.Node) -> fx.Node | None:
    """x when n is x with a size-1 dim inserted at position 2: x.unsqueeze(2), torch.unsqueeze(x,
    2) or x[:, :, None] (any trailing full slices or an Ellipsis)."""
    import operator

    import torch

    if not isinstance(n, fx.Node):
        return None
    x = n.args[0] if n.args else None
    xs, ns = (node_shape(x) if isinstance(x, fx.Node) else None), node_shape(n)
    if xs is None or ns is None or len(ns) != len(xs) + 1 or ns[2] != 1 or ns[:2] + ns[3:] != xs:
        return None
    if (n.op == "call_method" and n.target == "unsqueeze") or (
            n.op == "call_function" and n.target is torch.unsqueeze):
        d = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
        return x if isinstance(d, int) and d % (len(xs) + 1) == 2 else None
    if n.op == "call_function" and n.target is operator.getitem and isinstance(n.args[1], tuple):
        idx = n.args[1]
        full = slice(None, None, None)
        if len(idx) >= 3 and idx[0] == full and idx[1] == full and idx[2] is None and all(
                i == full or i is Ellipsis for i in idx[3:]):
            return x
    return None


def _repeated_heads(gm: fx.GraphModule, n) -> tuple[fx.Node, int] | None:
    """(x, g) when n repeats each head of x (B, H_kv, S, D) g times in place (head h of n is head
    h // g of x), as grouped-query attention reads it: x.repeat_interleave(g, dim=1) or
    x[:, :, None].expand(B, H_kv, g, S, D).reshape(B, H_kv * g, S, D) (Hugging Face's
    repeat_kv); None otherwise (x.repeat(1, g, 1, 1) tiles the heads: another mapping)."""
    import torch

    if not isinstance(n, fx.Node) or n.op not in ("call_function", "call_method"):
        return None
    ns = node_shape(n)
    if ns is None or len(ns) != 4:
        return None
    name = _op_name(n)
    if name == "repeat_interleave":
        x = n.args[0] if n.args else n.kwargs.get("input")
        names = ("repeats", "dim", "output_size")
        b = dict(zip(names, n.args[1:]))
        b.update({k: v for k, v in n.kwargs.items() if k in names})
        xs = node_shape(x) if isinstance(x, fx.Node) else None
        g, dim = _static_int(b.get("repeats")), b.get("dim")
        if (xs is None or len(xs) != 4 or g is None or g < 1
                or not isinstance(dim, int) or dim % 4 != 1 or set(n.kwargs) - set(names) - {"input"}):
            return None
        return (x, g) if tuple(ns) == (xs[0], xs[1] * g, xs[2], xs[3]) else None
    if name in ("reshape", "view") or (n.op == "call_function" and n.target is torch.reshape):
        e = n.args[0] if n.args else None
        if not isinstance(e, fx.Node) or _op_name(e) != "expand" or len(e.users) != 1:
            return None
        es = node_shape(e)
        u = e.args[0] if e.args else None
        x = _getitem_unsqueeze2(u) if isinstance(u, fx.Node) and len(u.users) == 1 else None
        xs = node_shape(x) if x is not None else None
        if xs is None or es is None or len(xs) != 4 or len(es) != 5:
            return None
        g = es[2]
        if (es[:2], es[3:]) != (tuple(xs[:2]), tuple(xs[2:])) \
                or tuple(ns) != (xs[0], xs[1] * g, xs[2], xs[3]):
            return None
        return x, int(g)
    return None


def gqa_repeats(gm: fx.GraphModule) -> bool:
    """scaled_dot_product_attention(q, R(k), R(v)) with R repeating each key/value head g times
    in place (repeat_interleave along the heads, or expand + reshape as Hugging Face's repeat_kv)
    is scaled_dot_product_attention(q, k, v, enable_gqa=True): the same values, and the kernel
    reads the shared head through its index instead of a copy of the cache per query head."""
    import torch.nn.functional as F

    graph = gm.graph
    changed = False
    for n in _live(graph):
        if not (n.op == "call_function" and n.target is F.scaled_dot_product_attention):
            continue
        names = ["query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"]
        b = dict(zip(names, n.args))
        b.update(n.kwargs)
        rk, rv = _repeated_heads(gm, b.get("key")), _repeated_heads(gm, b.get("value"))
        qs = node_shape(b["query"]) if isinstance(b.get("query"), fx.Node) else None
        if rk is None or rv is None or rk[1] != rv[1] or qs is None or len(qs) != 4:
            continue
        if qs[1] != node_shape(rk[0])[1] * rk[1]:
            continue
        old_k, old_v = b["key"], b["value"]
        b["key"], b["value"], b["enable_gqa"] = rk[0], rv[0], True
        n.args = (b.pop("query"), b.pop("key"), b.pop("value"))
        n.kwargs = b
        _erase_unused_above([old_k, old_v], stop=None)
        changed = True
    return changed


CANONICAL = [modules_to_functionals, flipped_scans, exclusive_scans, batchnorm_decompose,
             vector_norms, fold_dtype_queries, device_queries_from_inputs, scalar_constants,
             shape_queries_from_sources,
             drop_value_copies, mean_from_sum, keepdim_reductions, rsqrt_forms, redundant_upcasts,
             gqa_repeats]


def canonicalize(gm: fx.GraphModule, inputs: list | None = None) -> None:
    """Apply the canonical forms; re-propagate shapes (on meta inputs) if anything changed."""
    changed = False
    for fn in CANONICAL:
        changed |= bool(fn(gm))
    gm.graph.lint()
    if changed and inputs is not None:
        from harness.capture import propagate  # meta shapes; graph breaks, recurrent layers

        gm.recompile()
        propagate(gm, inputs)
