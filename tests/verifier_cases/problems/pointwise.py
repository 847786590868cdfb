"""Verifier test problem: scale, broadcast bias, GELU (one pointwise kernel's worth of work)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features: int, scale: float):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(features) * 0.1)
        self.scale = scale

    def forward(self, x):
        return torch.nn.functional.gelu(x * self.scale + self.bias)


def get_inputs():
    return [torch.randn(8, 300)]


def get_init_inputs():
    return [300, 1.3]
