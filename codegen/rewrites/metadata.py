"""Canonical forms for what the trace already knows: dtype, device and shape queries answered from
their sources, and upcasts that change no result."""
from __future__ import annotations

from torch import fx

from codegen.ops import classify, node_dtype, node_shape
from codegen.rewrites.common import _float, _is_shape_query, _live, _op_name, _shape_query_kind, _upcast_source


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


#: Python operators on numbers that fold_type_info evaluates once their operands are numbers
_NUMBER_OPS = {"neg", "pos", "abs", "mul", "truediv", "floordiv", "add", "sub", "pow"}


#: ops whose result is a (values, indices) named tuple
_NAMED_PAIRS = ("max", "min", "topk", "sort", "kthvalue", "median", "nanmedian", "mode", "cummax",
                "cummin")


def named_fields(gm: fx.GraphModule) -> bool:
    """``r.values`` and ``r.indices`` of a (values, indices) result (``x.max(d)``, ``topk``,
    ``sort``...) are ``r[0]`` and ``r[1]``: one spelling, so that a rule reading ``max(x, d)[0]``
    (rw-softmax's max subtracted) reads ``x.max(d).values`` too."""
    import operator

    import torch

    changed = False
    for n in list(gm.graph.nodes):
        if not (n.op == "call_function" and n.target is getattr and len(n.args) == 2
                and n.args[1] in ("values", "indices") and isinstance(n.args[0], fx.Node)):
            continue
        src = n.args[0]
        if src.op not in ("call_method", "call_function") or _op_name(src) not in _NAMED_PAIRS:
            continue
        if src.op == "call_function" and getattr(torch, _op_name(src)) is not src.target:
            continue  # (a function of another module named so)
        with gm.graph.inserting_before(n):
            v = gm.graph.call_function(operator.getitem, (src, 0 if n.args[1] == "values" else 1))
        v.meta = dict(n.meta)
        n.replace_all_uses_with(v)
        gm.graph.erase_node(n)
        changed = True
    return changed


def fold_type_info(gm: fx.GraphModule) -> bool:
    """``torch.finfo(dtype).max`` (``iinfo``, ``.min``, ``.eps``, ...) of a dtype the trace
    knows (after fold_dtype_queries) is a number: written in place, and arithmetic on it
    (``-torch.finfo(s.dtype).max``) folded, so that a mask's fill is the number the attention
    pattern reads."""
    import operator

    import torch

    graph = gm.graph
    changed = False
    for n in _live(graph):
        if (n.op != "call_function" or n.target not in (torch.finfo, torch.iinfo)
                or any(isinstance(a, fx.Node) for a in (*n.args, *n.kwargs.values()))):
            continue
        try:
            info = n.target(*n.args, **n.kwargs)
        except (TypeError, ValueError):
            continue
        todo = []
        for u in list(n.users):
            if (u.op == "call_function" and u.target is getattr and len(u.args) == 2
                    and isinstance(getattr(info, u.args[1], None), (int, float))):
                todo.append((u, getattr(info, u.args[1])))
        while todo:
            u, value = todo.pop()
            for w in list(u.users):
                name = getattr(w.target, "__name__", "") if w.op == "call_function" else ""
                if name in _NUMBER_OPS and getattr(operator, name, None) is w.target and not w.kwargs:
                    args = [value if a is u else a for a in w.args]
                    if not any(isinstance(a, fx.Node) for a in args):
                        todo.append((w, w.target(*args)))
            u.replace_all_uses_with(value)
            graph.erase_node(u)
            changed = True
        if not n.users:
            graph.erase_node(n)
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


def _elementwise_root(gm: fx.GraphModule, x: fx.Node) -> fx.Node | None:
    """Where x was computed from through elementwise ops of x's traced shape (x itself when it is
    no elementwise op), or None when a step's shape is not known."""
    while x.op in ("call_function", "call_method"):
        shape = node_shape(x)
        op = classify(x, gm)
        if shape is None:
            return None
        if op.kind != "pointwise":
            return x
        same = [a for a in op.operands if isinstance(a, fx.Node) and node_shape(a) == shape]
        if not same:
            return None
        x = same[0]
    return x


def _product_operands(gm: fx.GraphModule, x: fx.Node) -> tuple | None:
    """(a, b) when x = a @ b (matmul, bmm, ``@``; no bias) of operands of x's rank whose leading
    dims are x's: x's shape is a's without its last dim, then b's last dim."""
    if x.op not in ("call_function", "call_method"):
        return None
    op = classify(x, gm)
    if op.kind != "matmul" or op.name not in ("matmul", "bmm", "mm") or any(
            o is not None for o in op.operands[2:]):
        return None
    a, b = op.operands[:2]
    sx, sa, sb = node_shape(x), node_shape(a), node_shape(b)
    if (sx is None or sa is None or sb is None or not (len(sx) == len(sa) == len(sb) >= 2)
            or tuple(sa[:-1]) != tuple(sx[:-1]) or sb[-1] != sx[-1]):
        return None
    return a, b


def _product_shape_query(gm: fx.GraphModule, q: fx.Node, a: fx.Node, b: fx.Node) -> bool:
    """Answer the shape query q of a @ b from a's and b's shapes (``s.shape`` ->
    ``torch.Size(a.shape[:-1] + (b.shape[-1],))``, ``s.size(d)`` -> ``a.size(d)`` or
    ``b.size(-1)``, ``s.dim()`` -> ``a.dim()``)."""
    import operator

    import torch

    graph = gm.graph
    rank = len(node_shape(a))
    kind = _shape_query_kind(q, rank)
    if kind == "shape":
        with graph.inserting_before(q):
            lead = graph.call_function(operator.getitem, (graph.call_function(getattr, (a, "shape")),
                                                          slice(None, -1)))
            last = graph.call_function(operator.getitem, (graph.call_function(getattr, (b, "shape")), -1))
            new = graph.call_function(torch.Size, (graph.call_function(operator.add, (lead, (last,))),))
        q.replace_all_uses_with(new)
        graph.erase_node(q)
        return True
    if kind == "dim":
        q.replace_input_with(q.args[0], a)
        return True
    if isinstance(kind, int):
        q.args = (b, -1) if kind == rank - 1 else (a, kind)
        return True
    return False


def _same_shape_source(gm: fx.GraphModule, x: fx.Node) -> fx.Node | None:
    """A graph input or parameter of x's traced shape that x was computed from through
    elementwise ops only (an elementwise result has its operands' broadcast shape), or None.
    Not another op's result: a query there would be one more consumer of that op (the
    convolution-bias rule counts them)."""
    x = _elementwise_root(gm, x)
    return x if x is not None and x.op in ("placeholder", "get_attr") else None


def shape_queries_from_sources(gm: fx.GraphModule) -> bool:
    """``x.shape`` / ``x.size()`` / ``x.dim()`` / ``x.numel()`` of an elementwise result reads
    the input of the same shape it was computed from (of a matrix product's result: its
    operands' shapes), so that kl_div's ``batchmean`` (the loss
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
        root = _elementwise_root(gm, n.args[0]) if src is None else None
        if root is not None and _product_operands(gm, root) is not None:
            # attention scores' ``i, j = s.shape[-2:]`` (a causal mask of their size) read from
            # q and k: the scores keep the softmax as their one reader, so rw-attention sees them
            changed |= _product_shape_query(gm, n, *_product_operands(gm, root))
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
        x = _upcast_source(gm, n)
        if x is None or not node_shape(x) or not n.users:
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
