"""Canonical forms for what the trace already knows: dtype, device and shape queries answered from
their sources, and upcasts that change no result."""
from __future__ import annotations

from torch import fx

from codegen.ops import classify, node_dtype, node_shape
from codegen.rewrites.common import _float, _is_shape_query, _live


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
