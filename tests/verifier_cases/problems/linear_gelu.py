"""Verifier test problem: a linear layer followed by GELU (library matmul + fused epilogue)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x))


def get_inputs():
    return [torch.randn(32, 256)]


def get_init_inputs():
    return [256, 48]
