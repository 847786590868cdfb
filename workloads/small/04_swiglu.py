"""SwiGLU activation of Llama's MLP: silu(gate) * up on the fused gate/up projection output."""
import torch
import torch.nn as nn
import torch.nn.functional as F

# --- shapes (workloads/small/ holds this file with tiny shapes; the rest is identical)
TOKENS, INTERMEDIATE = 16, 48  # tiny: CPU tests
# --- end shapes


class Model(nn.Module):
    def forward(self, gate_up):
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


def get_inputs():
    return [torch.randn(TOKENS, 2 * INTERMEDIATE, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
