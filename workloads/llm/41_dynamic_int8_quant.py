"""Dynamic per-token symmetric int8 quantization of activations (SmoothQuant's W8A8, vLLM's
reference scaled_int8_quant): each token's absolute maximum sets its scale; the int8 values,
the scales and the dequantized activations are returned."""
import torch
import torch.nn as nn

# --- shapes (workloads/small_shapes.py writes this file with tiny shapes)
TOKENS, HIDDEN = 8192, 4096
# --- end shapes
# roofline (harness.roofline; H200: 4.8 TB/s, 989 bf16 TFLOP/s): 168 MB and 0.201 GFLOP,
#   floor 0.035 ms, memory-bound


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x_f = x.float()
        amax = x_f.abs().amax(dim=-1, keepdim=True).clamp(min=1e-5)
        scale = amax / 127.0
        q = torch.round(x_f / scale).clamp(-128, 127).to(torch.int8)
        deq = (q.to(torch.float32) * scale).to(x.dtype)
        return q, scale, deq


def get_inputs():
    return [torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
