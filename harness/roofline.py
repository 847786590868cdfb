"""Roofline floor of a problem: max(FLOPs / peak rate, compulsory bytes / bandwidth).

FLOPs come from ``torch.utils.flop_counter`` run on meta tensors (matmuls, convolutions,
attention). Ops it does not count (elementwise, reductions, norms) are estimated as one FLOP per
output element per op: negligible next to their bytes, which is what bounds them. Compulsory
bytes are the inputs, the parameters and buffers, and the outputs, each once.
"""
from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from harness.problem import LoadedProblem, meta_inputs, meta_model


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def count(prob: LoadedProblem, gm=None) -> tuple[float, float, str]:
    """(FLOPs, compulsory bytes, dominant floating dtype) of one forward call."""
    init = prob.init_inputs()
    inputs = meta_inputs(prob)
    model = meta_model(prob, init)
    flops = 0.0
    outs = []
    try:
        with FlopCounterMode(display=False) as fc, torch.no_grad():
            out = model(*inputs)
        flops = float(fc.get_total_flops())
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
    except Exception:  # noqa: BLE001 - an op without a meta kernel: bytes only
        outs = []
    if flops == 0 and gm is not None:  # no matmul/conv: 1 FLOP per output element per op
        for n in gm.graph.nodes:
            tm = n.meta.get("tensor_meta")
            if n.op in ("call_function", "call_method", "call_module") and hasattr(tm, "shape"):
                numel = 1
                for s in tm.shape:
                    numel *= s
                flops += numel
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    tensors += list(model.parameters()) + list(model.buffers())
    tensors += [o for o in outs if isinstance(o, torch.Tensor)]
    nbytes = float(sum(_nbytes(t) for t in tensors))
    dtypes = [t.dtype for t in tensors if t.dtype.is_floating_point]
    dt = max(set(dtypes), key=dtypes.count) if dtypes else torch.float32
    return flops, nbytes, str(dt).replace("torch.", "")


PEAK_KEY = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64"}


def floor_ms(flops: float, nbytes: float, dtype: str, peak_tflops: dict, bw_gbs: float) -> tuple[float | None, str]:
    """Roofline floor in ms and the bound ('memory' / 'compute'), or (None, 'unknown')."""
    peak = peak_tflops.get(PEAK_KEY.get(dtype, "fp32"))
    if not bw_gbs or not peak:
        return None, "unknown"
    t_mem = nbytes / (bw_gbs * 1e9) * 1e3
    t_cmp = flops / (peak * 1e12) * 1e3
    return max(t_mem, t_cmp), ("memory" if t_mem >= t_cmp else "compute")
