"""LayerNorm without a bias (OLMo / StableLM-2 style), computed in fp32 and cast back to bf16."""
import torch
import torch.nn as nn
import torch.nn.functional as F

# --- shapes (workloads/small_shapes.py writes this file with tiny shapes)
TOKENS, HIDDEN = 8192, 4096
# --- end shapes
# roofline (harness.roofline; H200: 4.8 TB/s, 989 bf16 TFLOP/s): 134 MB and 0.268 GFLOP,
#   floor 0.028 ms, memory-bound


class Model(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden, dtype=torch.bfloat16))

    def forward(self, x):
        out = F.layer_norm(x.float(), (x.shape[-1],), self.weight.float(), None, 1e-5)
        return out.to(x.dtype)


def get_inputs():
    return [torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16)]


def get_init_inputs():
    return [HIDDEN]
