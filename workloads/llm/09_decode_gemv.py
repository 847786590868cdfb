"""Small-batch decode GEMV: the MLP up projection for a handful of decoding sequences
(memory-bound: the weight is read once per step)."""
import torch
import torch.nn as nn

# --- shapes (workloads/small_shapes.py writes this file with tiny shapes)
BATCH, HIDDEN, INTERMEDIATE = 4, 4096, 14336  # Llama-3-8B MLP, 4 sequences decoding
# --- end shapes
# roofline (harness.roofline; H200: 4.8 TB/s, 989 bf16 TFLOP/s): 118 MB and 0.47 GFLOP,
#   floor 0.024 ms, memory-bound


class Model(nn.Module):
    def __init__(self, hidden: int, out: int):
        super().__init__()
        self.up_proj = nn.Linear(hidden, out, bias=False, dtype=torch.bfloat16)

    def forward(self, x):
        return self.up_proj(x)


def get_inputs():
    return [torch.randn(BATCH, HIDDEN, dtype=torch.bfloat16)]


def get_init_inputs():
    return [HIDDEN, INTERMEDIATE]
