"""Weight-only quantized products: rw-dequant-linear."""
from __future__ import annotations

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

    Left to PyTorch: a cast read elsewhere too, a weight of another dtype, a cast to a dtype
    other than the input's (a mixed-dtype product), an input that is not 16-bit."""
    import torch

    from codegen.ops import dequant_linear as helper

    changed = False
    for n, op in _ops(gm, "matmul", ("linear",)):
        x, w, bias = op.operands[:3]
        if not isinstance(w, fx.Node) or len(w.users) != 1 or w.op not in ("call_function", "call_method"):
            continue
        cast = classify(w, gm)
        if cast.name != "cast" or not cast.operands or not isinstance(cast.operands[0], fx.Node):
            continue
        src = cast.operands[0]
        if str(node_dtype(src)).replace("torch.", "") not in QUANT_DTYPES:
            continue
        if node_dtype(w) != node_dtype(x) or node_dtype(x) not in (torch.float16, torch.bfloat16):
            continue
        if node_shape(src) is None or len(node_shape(src)) != 2:
            continue
        with gm.graph.inserting_before(n):
            new = gm.graph.create_node("call_function", helper, (x, src, bias), {}, name="dequant_linear")
        if not _annotate([new]):
            gm.graph.erase_node(new)
            continue
        _replace(n, new)
        _erase_unused_above([w], stop=None)
        changed = True
    return changed
