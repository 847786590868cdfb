"""An AWQ-format int4 linear in a decode step, dequantized in forward as AutoAWQ's PyTorch
path writes it (unpack_awq, reverse_awq_order, dequantize_gemm): eight 4-bit weights an int32
packed along the output dim ([K, N / 8]) in AWQ's interleaved order (0, 2, 4, 6, 1, 3, 5, 7),
4-bit zero points packed the same way, one bf16 scale per group of GROUP inputs and output
column; the shifts and the order built in forward with torch.arange."""
import torch
import torch.nn as nn

# --- shapes (workloads/small_shapes.py writes this file with tiny shapes)
BATCH, HIDDEN, INTERMEDIATE, GROUP = 4, 4096, 14336, 128
# --- end shapes
# roofline (harness.roofline; H200: 4.8 TB/s, 989 bf16 TFLOP/s): the int32 weight 29.4 MB, the
#   scales 0.9 MB, zero points 0.1 MB: ~30.4 MB and 0.47 GFLOP, floor ~0.0063 ms, memory-bound

AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]


def unpack_awq(qweight, qzeros, bits):
    shifts = torch.arange(0, 32, bits, device=qzeros.device)
    iweights = torch.bitwise_right_shift(qweight[:, :, None], shifts[None, None, :]).to(torch.int8)
    iweights = iweights.view(iweights.shape[0], -1)
    izeros = torch.bitwise_right_shift(qzeros[:, :, None], shifts[None, None, :]).to(torch.int8)
    izeros = izeros.view(izeros.shape[0], -1)
    return iweights, izeros


def reverse_awq_order(iweights, izeros, bits):
    reverse_order_tensor = torch.arange(iweights.shape[-1], dtype=torch.int32, device=izeros.device)
    reverse_order_tensor = reverse_order_tensor.view(-1, 32 // bits)
    reverse_order_tensor = reverse_order_tensor[:, AWQ_REVERSE_ORDER]
    reverse_order_tensor = reverse_order_tensor.view(-1)
    izeros = izeros[:, reverse_order_tensor]
    iweights = iweights[:, reverse_order_tensor]
    return iweights, izeros


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int, group: int):
        super().__init__()
        self.group = group
        self.register_buffer("qweight", torch.randint(-2**31, 2**31 - 1, (in_features, out_features // 8), dtype=torch.int32))
        self.register_buffer("qzeros", torch.randint(-2**31, 2**31 - 1, (in_features // group, out_features // 8), dtype=torch.int32))
        self.register_buffer("scales", torch.rand(in_features // group, out_features, dtype=torch.bfloat16) * 0.01)

    def forward(self, x):
        iweight, izeros = unpack_awq(self.qweight, self.qzeros, 4)
        iweight, izeros = reverse_awq_order(iweight, izeros, 4)
        iweight = torch.bitwise_and(iweight, 15)
        izeros = torch.bitwise_and(izeros, 15)
        scales = self.scales.repeat_interleave(self.group, dim=0)
        izeros = izeros.repeat_interleave(self.group, dim=0)
        weight = (iweight - izeros) * scales
        return torch.matmul(x, weight)


def get_inputs():
    return [torch.randn(BATCH, HIDDEN, dtype=torch.bfloat16)]


def get_init_inputs():
    return [HIDDEN, INTERMEDIATE, GROUP]
