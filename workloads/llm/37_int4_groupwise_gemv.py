"""A weight-only int4 linear in a decode step (GPTQ/AWQ-style storage: two 4-bit weights a byte,
one bf16 scale per group of GROUP inputs), dequantized in forward then multiplied."""
import torch
import torch.nn as nn

# --- shapes (workloads/small_shapes.py writes this file with tiny shapes)
BATCH, HIDDEN, INTERMEDIATE, GROUP = 4, 4096, 14336, 128
# --- end shapes
# roofline (harness.roofline; H200: 4.8 TB/s, 989 bf16 TFLOP/s): 30.4 MB and 0.646 GFLOP,
#   floor 0.00634 ms, memory-bound


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int, group: int):
        super().__init__()
        self.group = group
        self.register_buffer("qweight", torch.randint(0, 256, (out_features, in_features // 2), dtype=torch.uint8))
        self.register_buffer("scales", torch.rand(out_features, in_features // group, dtype=torch.bfloat16) * 0.01)

    def forward(self, x):
        n, half = self.qweight.shape
        low = (self.qweight & 0xF).to(torch.int8) - 8
        high = (self.qweight >> 4).to(torch.int8) - 8
        w = torch.stack((low, high), dim=-1).reshape(n, 2 * half).to(x.dtype)
        w = (w.view(n, -1, self.group) * self.scales[..., None]).reshape(n, 2 * half)
        return x @ w.t()


def get_inputs():
    return [torch.randn(BATCH, HIDDEN, dtype=torch.bfloat16)]


def get_init_inputs():
    return [HIDDEN, INTERMEDIATE, GROUP]
