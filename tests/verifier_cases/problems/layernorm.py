"""Verifier test problem: LayerNorm over the last dim (weight and bias), a 2-d input."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.norm = nn.LayerNorm(features)

    def forward(self, x):
        return self.norm(x)


def get_inputs():
    return [torch.randn(12, 257)]


def get_init_inputs():
    return [257]
