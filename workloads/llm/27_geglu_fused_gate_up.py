"""GeGLU over a fused gate/up projection output (Gemma's MLP activation; vLLM's GeluAndMul):
the last dim split in halves, tanh-GELU of the first times the second."""
import torch
import torch.nn as nn
import torch.nn.functional as F

# --- shapes (workloads/small_shapes.py writes this file with tiny shapes)
TOKENS, INTERMEDIATE = 4096, 14336
# --- end shapes
# roofline (harness.roofline; H200: 4.8 TB/s, 989 bf16 TFLOP/s): 352 MB and 0.294 GFLOP,
#   floor 0.0734 ms, memory-bound


class Model(nn.Module):
    def forward(self, gate_up):
        d = gate_up.shape[-1] // 2
        return F.gelu(gate_up[..., :d], approximate="tanh") * gate_up[..., d:]


def get_inputs():
    return [torch.randn(TOKENS, 2 * INTERMEDIATE, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
