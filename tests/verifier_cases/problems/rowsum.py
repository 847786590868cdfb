"""Verifier test problem: a row reduction (sum of squares over the last dim, kept 2-D)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return (x * x).sum(dim=-1, keepdim=True)


def get_inputs():
    return [torch.randn(16, 500)]


def get_init_inputs():
    return []
