"""A GPTQ-format int4 linear in a decode step, dequantized in forward as GPTQ's PyTorch
fallback writes it: eight 4-bit weights an int32, packed along the input dim ([K / 8, N]),
4-bit zero points packed along the output dim, one bf16 scale per group of GROUP inputs and
output column; the shifts a buffer, expand + shift + mask, the zero points stored minus one."""
import torch
import torch.nn as nn

# --- shapes (workloads/small_shapes.py writes this file with tiny shapes)
BATCH, HIDDEN, INTERMEDIATE, GROUP = 4, 4096, 14336, 128
# --- end shapes
# roofline (harness.roofline; H200: 4.8 TB/s, 989 bf16 TFLOP/s): the int32 weight 29.4 MB, the
#   scales 0.9 MB, zero points 0.1 MB: ~30.4 MB and 0.47 GFLOP, floor ~0.0063 ms, memory-bound


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int, group: int):
        super().__init__()
        self.group = group
        self.register_buffer("qweight", torch.randint(-2**31, 2**31 - 1, (in_features // 8, out_features), dtype=torch.int32))
        self.register_buffer("qzeros", torch.randint(-2**31, 2**31 - 1, (in_features // group, out_features // 8), dtype=torch.int32))
        self.register_buffer("scales", torch.rand(in_features // group, out_features, dtype=torch.bfloat16) * 0.01)
        self.register_buffer("wf", torch.tensor(list(range(0, 32, 4)), dtype=torch.int32).unsqueeze(0))

    def forward(self, x):
        zeros = torch.bitwise_right_shift(torch.unsqueeze(self.qzeros, 2).expand(-1, -1, 8), self.wf.unsqueeze(0)).to(torch.int8)
        zeros = torch.bitwise_and(zeros, 15) + 1
        zeros = zeros.reshape(self.scales.shape)
        weight = torch.bitwise_right_shift(torch.unsqueeze(self.qweight, 1).expand(-1, 8, -1), self.wf.unsqueeze(-1)).to(torch.int8)
        weight = torch.bitwise_and(weight, 15)
        weight = weight.reshape(-1, self.group, weight.shape[2])
        scales = self.scales.reshape(-1, 1, self.scales.shape[-1])
        zeros = zeros.reshape(-1, 1, zeros.shape[-1])
        weight = scales * (weight - zeros)
        weight = weight.reshape(weight.shape[0] * weight.shape[1], weight.shape[2])
        return torch.matmul(x, weight)


def get_inputs():
    return [torch.randn(BATCH, HIDDEN, dtype=torch.bfloat16)]


def get_init_inputs():
    return [HIDDEN, INTERMEDIATE, GROUP]
