"""Weight-only quantized products: rw-dequant-linear."""
from __future__ import annotations

import operator

from torch import fx

from codegen.ops import classify, node_dtype, node_shape
from codegen.rewrites.common import _annotate, _erase_unused_above, _ops, _replace

#: integer weight dtypes a product's tiles load and convert in registers
QUANT_DTYPES = ("int8", "uint8")


def dequant_linear(gm: fx.GraphModule) -> bool:
    """rw-dequant-linear: ``F.linear(x, w.to(x.dtype)[, bias])`` with an 8-bit integer weight
    (gpt-fast's and torchao's weight-only int8 linears: the per-channel scales multiply the
    result after it) is ``_egg_dequant_linear(x, w, bias)``: the matmul template loads the int8
    tiles and converts them in registers, so each call reads the weight's 1 byte per element
    instead of writing and reading a 16-bit copy of it (3 bytes per element beside the read
    of the int8 weight itself; a decode step is bound by those bytes). The same values: the
    conversion is exact, the product the same fp32-accumulated one.

    A weight scaled per output channel before the product (``w.to(dt) * scales[:, None]``) is
    the product of the integer weight times the scales after it (the bias added after them).

    Left to PyTorch: a cast read elsewhere too, scales of another shape (per group of K), a weight of another dtype, a cast to a dtype
    other than the input's (a mixed-dtype product), an input that is not 16-bit."""
    import torch

    from codegen.ops import dequant_linear as helper

    changed = False
    for n, op in _ops(gm, "matmul", ("linear",)):
        x, w, bias = op.operands[:3]
        if node_dtype(x) not in (torch.float16, torch.bfloat16):
            continue
        w, scales = _row_scaled(gm, w)
        src = _int_cast(gm, w, node_dtype(x))
        if src is None:
            continue
        with gm.graph.inserting_before(n):
            new = gm.graph.create_node("call_function", helper, (x, src, None if scales else bias), {},
                                       name="dequant_linear")
            made = [new]
            if scales is not None:  # x (w s)^T = (x w^T) s per output column, then the bias
                col = gm.graph.call_function(torch.reshape, (scales, (-1,)))
                made += [col, gm.graph.call_function(operator.mul, (new, col))]
                if bias is not None:
                    made.append(gm.graph.call_function(operator.add, (made[-1], bias)))
        if not _annotate(made) or node_dtype(made[-1]) != node_dtype(n):
            for m in reversed(made):
                gm.graph.erase_node(m)
            continue
        _replace(n, made[-1])
        _erase_unused_above([op.operands[1]], stop=None)
        changed = True
    return changed


def _int_cast(gm: fx.GraphModule, w, dtype) -> fx.Node | None:
    """The 8-bit integer 2-d tensor w converts from to ``dtype`` (``w.to(dtype)``, read here
    only), else None."""
    if not isinstance(w, fx.Node) or len(w.users) != 1 or w.op not in ("call_function", "call_method"):
        return None
    cast = classify(w, gm)
    if cast.name != "cast" or not cast.operands or not isinstance(cast.operands[0], fx.Node):
        return None
    src = cast.operands[0]
    if str(node_dtype(src)).replace("torch.", "") not in QUANT_DTYPES or node_dtype(w) != dtype:
        return None
    return src if node_shape(src) is not None and len(node_shape(src)) == 2 else None


def _row_scaled(gm: fx.GraphModule, w):
    """(the weight, its per-row scales) when w = weight * scales with scales of shape [N, 1] for
    an [N, K] weight (``w.to(dt) * self.scales[:, None]``: each output channel's scale), read
    here only; else (w, None)."""
    import torch

    if not isinstance(w, fx.Node) or len(w.users) != 1 or w.op not in ("call_function", "call_method") \
            or w.target not in (operator.mul, torch.mul, "mul") or len(w.args) != 2 or w.kwargs:
        return w, None
    sw = node_shape(w)
    for a, b in (w.args, w.args[::-1]):
        sb = node_shape(b) if isinstance(b, fx.Node) else None
        if sw is not None and len(sw) == 2 and sb is not None and tuple(sb) == (sw[0], 1) \
                and node_dtype(b) == node_dtype(w) and node_dtype(a) == node_dtype(w):
            return a, b
    return w, None
