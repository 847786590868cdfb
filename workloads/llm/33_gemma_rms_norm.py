"""Gemma's RMSNorm: the weight stored as an offset from one (scale 1 + w), everything in fp32,
one cast back to the input's dtype at the end."""
import torch
import torch.nn as nn

# --- shapes (workloads/small_shapes.py writes this file with tiny shapes)
BATCH, SEQ, HIDDEN = 4, 2048, 3584  # Gemma-2-9B
# --- end shapes
# roofline (harness.roofline; H200: 4.8 TB/s, 989 bf16 TFLOP/s): 117 MB and 0.206 GFLOP,
#   floor 0.0245 ms, memory-bound


class Model(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(hidden, dtype=torch.bfloat16))

    def forward(self, x):
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        out = out * (1.0 + self.weight.float())
        return out.type_as(x)


def get_inputs():
    return [torch.randn(BATCH, SEQ, HIDDEN, dtype=torch.bfloat16)]


def get_init_inputs():
    return [HIDDEN]
