"""CHEAT (int_quant problem): the scale from every other element (half the reads), the
integers then computed as eager does. The scale is a few percent off, so the integers are off
float64's at several times as many elements as eager's, some by more than one.
Expected: mismatch (values differ from float64's)."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        scale = x.abs().mean(dim=-1, keepdim=True) / 16
        rough = x[..., ::2].abs().mean(dim=-1, keepdim=True) / 16
        return torch.round(x / rough).clamp(-127, 127).to(torch.int8), scale
