"""RMSNorm written the long way: the mean as a sum divided by the width, the statistic
unsqueezed instead of keepdim, a divide by sqrt instead of a multiply by rsqrt."""
import torch
import torch.nn as nn

# --- shapes (workloads/small_shapes.py writes this file with tiny shapes)
BATCH, SEQ, HIDDEN = 4, 2048, 4096  # Llama-3-8B: 4 sequences of 2048 tokens
# --- end shapes
# roofline (harness.roofline; H200: 4.8 TB/s, 989 bf16 TFLOP/s): 134 MB and 0.134 GFLOP,
#   floor 0.028 ms, memory-bound
EPS = 1e-5


class Model(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(hidden, dtype=torch.bfloat16))
        self.eps = eps

    def forward(self, x):
        h = x.to(torch.float32)
        ms = (h * h).sum(-1) / h.shape[-1]
        h = h / torch.sqrt(ms.unsqueeze(-1) + self.eps)
        return h.to(x.dtype) * self.weight


def get_inputs():
    return [torch.randn(BATCH, SEQ, HIDDEN, dtype=torch.bfloat16)]


def get_init_inputs():
    return [HIDDEN, EPS]
