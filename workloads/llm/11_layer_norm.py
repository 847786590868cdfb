"""LayerNorm with weight and bias in bf16 over the hidden states (GPT-style blocks)."""
import torch
import torch.nn as nn

# --- shapes (workloads/small_shapes.py writes this file with tiny shapes)
TOKENS, HIDDEN = 8192, 4096  # 4 sequences of 2048 tokens, hidden 4096
# --- end shapes
# roofline (harness.roofline; H200: 4.8 TB/s, 989 bf16 TFLOP/s): 134 MB and 0.268 GFLOP,
#   floor 0.028 ms, memory-bound
EPS = 1e-5


class Model(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.norm = nn.LayerNorm(hidden, eps=eps, dtype=torch.bfloat16)
        with torch.no_grad():  # perturbed: a kernel that drops the weight or the bias is seen
            self.norm.weight.add_(0.1 * torch.randn(hidden, dtype=torch.bfloat16))
            self.norm.bias.add_(0.1 * torch.randn(hidden, dtype=torch.bfloat16))

    def forward(self, x):
        return self.norm(x)


def get_inputs():
    return [torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16)]


def get_init_inputs():
    return [HIDDEN, EPS]
