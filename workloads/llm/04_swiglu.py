"""SwiGLU activation of Llama's MLP: silu(gate) * up on the fused gate/up projection output."""
import torch
import torch.nn as nn
import torch.nn.functional as F

# --- shapes (workloads/small_shapes.py writes this file with tiny shapes)
TOKENS, INTERMEDIATE = 8192, 14336  # Llama-3-8B: 4 x 2048 tokens, MLP width 14336
# --- end shapes
# roofline (harness.roofline; H200: 4.8 TB/s, 989 bf16 TFLOP/s): 705 MB and 0.587 GFLOP,
#   floor 0.147 ms, memory-bound


class Model(nn.Module):
    def forward(self, gate_up):
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


def get_inputs():
    return [torch.randn(TOKENS, 2 * INTERMEDIATE, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
