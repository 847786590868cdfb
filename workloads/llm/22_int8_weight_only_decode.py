"""A weight-only int8 linear in a decode step, as gpt-fast's WeightOnlyInt8Linear computes it:
the int8 weight converted to the input's dtype, the product, the per-output-channel scales
after it (memory-bound: each step reads the weight once; eager also writes and reads a bf16
copy of it every call)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

# --- shapes (workloads/small_shapes.py writes this file with tiny shapes)
BATCH, HIDDEN, INTERMEDIATE = 4, 4096, 14336  # Llama-3-8B MLP, 4 sequences decoding
# --- end shapes
# roofline (by hand; H200: 4.8 TB/s): the int8 weight 58.7 MB (+ x, scales, out < 0.2 MB),
#   0.47 GFLOP: floor 0.012 ms, memory-bound


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.register_buffer("weight", torch.randint(-128, 127, (out_features, in_features), dtype=torch.int8))
        self.register_buffer("scales", torch.rand(out_features, dtype=torch.bfloat16) * 0.01 + 0.001)

    def forward(self, input):
        return F.linear(input, self.weight.to(dtype=input.dtype)) * self.scales


def get_inputs():
    return [torch.randn(BATCH, HIDDEN, dtype=torch.bfloat16)]


def get_init_inputs():
    return [HIDDEN, INTERMEDIATE]
