"""Helpers the rule families share (codegen.rewrites): node predicates, walks, replacement."""
from __future__ import annotations

from torch import fx

from codegen.layout import SHAPE_QUERIES
from codegen.ops import FLOAT_DTYPES, classify, node_dtype, node_shape


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


def _upcast_source(gm: fx.GraphModule, s) -> fx.Node | None:
    """x when s is x.float() / x.to(torch.float32) of a 16-bit x (its values exactly): the
    T5 form of rw-rms-norm, the redundant-upcast form."""
    import torch

    if not isinstance(s, fx.Node) or s.op not in ("call_function", "call_method"):
        return None
    op = classify(s, gm)
    x = op.operands[0] if op.operands else None
    if (op.kind == "pointwise" and op.name == "cast" and op.p.get("dtype") == torch.float32
            and isinstance(x, fx.Node) and node_dtype(x) in (torch.float16, torch.bfloat16)):
        return x
    return None


def _bound(n: fx.Node, params: list) -> dict | None:
    """A call's arguments by parameter name, as the op table binds them (codegen.ops._bind:
    ``params`` names, ``(name, default)`` for optional ones), or None where that binding
    refuses them (too many, an unknown keyword, one given twice, a required one missing)."""
    from codegen import ops as O

    try:
        return O._bind(O._d("call", "x", params), tuple(n.args), dict(n.kwargs))
    except TypeError:
        return None


def _replace(n: fx.Node, new: fx.Node) -> None:
    n.replace_all_uses_with(new)
    n.graph.erase_node(n)


def _sub_operands(gm: fx.GraphModule, n) -> tuple | None:
    """(a, b) when n is the plain difference a - b of two operands (no alpha)."""
    if not isinstance(n, fx.Node):
        return None
    op = classify(n, gm)
    if op.kind != "pointwise" or op.name != "sub" or len(op.operands) != 2 or op.p.get("alpha", 1) != 1:
        return None
    return op.operands[0], op.operands[1]


def _scalar(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


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


def _is_shape_query(n: fx.Node) -> bool:
    if n.op == "call_function" and n.target is getattr:
        return len(n.args) == 2 and n.args[1] == "shape"
    return n.op == "call_method" and n.target in SHAPE_QUERIES


def _einsum_parts(n: fx.Node):
    """(operand specs, output spec, operands, their shapes) of ``torch.einsum(eq, *ops)`` with an
    explicit ``->``, no ``...``, no letter twice in an operand, tensor operands of shapes known
    from the trace; else None."""
    import torch

    if n.op != "call_function" or n.target is not torch.einsum or n.kwargs:
        return None
    eq = n.args[0] if n.args and isinstance(n.args[0], str) else None
    ops = list(n.args[1:])
    if len(ops) == 1 and isinstance(ops[0], (list, tuple)):
        ops = list(ops[0])
    if eq is None or "->" not in eq or "." in eq or not ops:
        return None
    lhs, out = eq.replace(" ", "").split("->")
    specs = lhs.split(",")
    if len(specs) != len(ops) or not all(isinstance(o, fx.Node) for o in ops):
        return None
    shapes = [node_shape(o) for o in ops]
    if any(s is None or len(s) != len(sp) or len(set(sp)) != len(sp) for s, sp in zip(shapes, specs)):
        return None
    return specs, out, ops, [tuple(s) for s in shapes]


def _annotate(nodes: list) -> bool:
    """Record shape and dtype metadata on nodes a rule just made (in order), by running each on
    meta tensors of its inputs' recorded metadata, so that the forms after it read their shapes
    before the next propagation. False (and nothing recorded past that node) where an input has
    no metadata or the op fails on meta tensors."""
    import torch
    from torch.fx.passes.shape_prop import _extract_tensor_metadata

    def value(a):
        if not isinstance(a, fx.Node):
            return a
        tm = a.meta.get("tensor_meta")
        if tm is None or not hasattr(tm, "shape"):
            raise LookupError(a.name)
        return torch.empty_strided(tuple(tm.shape), tuple(tm.stride), dtype=tm.dtype, device="meta")

    for n in nodes:
        try:
            args = fx.node.map_aggregate(n.args, value)
            kwargs = fx.node.map_aggregate(n.kwargs, value)
            if n.op == "call_method":
                out = getattr(args[0], n.target)(*args[1:], **kwargs)
            else:
                out = n.target(*args, **kwargs)
        except Exception:  # noqa: BLE001 - no metadata: the next propagation records it
            return False
        if not isinstance(out, torch.Tensor):
            return False
        n.meta["tensor_meta"] = _extract_tensor_metadata(out)
    return True


def _shape_query_kind(q: fx.Node, rank: int):
    """What the shape query q of a tensor of this rank asks: "shape" (``x.shape``, ``x.size()``),
    "dim" (``x.dim()``), the dim d >= 0 of ``x.size(d)``, or None for another form."""
    if q.op == "call_function" and q.target is getattr and len(q.args) == 2 and q.args[1] == "shape":
        return "shape"
    if q.op != "call_method" or q.kwargs:
        return None
    if q.target == "size" and len(q.args) == 1:
        return "shape"
    if q.target == "dim" and len(q.args) == 1:
        return "dim"
    if q.target == "size" and len(q.args) == 2 and isinstance(q.args[1], int) and -rank <= q.args[1] < rank:
        return q.args[1] % rank
    return None
