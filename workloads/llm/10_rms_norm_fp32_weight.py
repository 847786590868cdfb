"""RMSNorm that multiplies its weight in fp32 before the downcast (as several model codebases
write it), instead of after it as 01_rms_norm does: one rounding to bf16 instead of two."""
import torch
import torch.nn as nn

# --- shapes (workloads/small_shapes.py writes this file with tiny shapes)
BATCH, SEQ, HIDDEN = 4, 2048, 4096  # Llama-3-8B: 4 sequences of 2048 tokens
# --- end shapes
# roofline (harness.roofline; H200: 4.8 TB/s, 989 bf16 TFLOP/s): 134 MB and 0.235 GFLOP,
#   floor 0.028 ms, memory-bound
EPS = 1e-5


class Model(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(hidden, dtype=torch.bfloat16))
        self.eps = eps

    def forward(self, x):
        h = x.float()
        variance = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(variance + self.eps)
        return (h * self.weight.float()).to(x.dtype)


def get_inputs():
    return [torch.randn(BATCH, SEQ, HIDDEN, dtype=torch.bfloat16)]


def get_init_inputs():
    return [HIDDEN, EPS]
