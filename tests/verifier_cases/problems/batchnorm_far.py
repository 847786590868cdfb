"""Verifier test problem: two batch norms of data far from zero (offset 20000, unit spread), a
deep net's running statistics in small: eager's fp32 running mean is off from the exact one by
~1e-3, and an eval() call reads it back, so whichever statistics a model carries into eval()
decide its output there.
"""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.bn1 = nn.BatchNorm1d(c)
        self.bn2 = nn.BatchNorm1d(c)

    def forward(self, x):
        return self.bn2(self.bn1(x + 20000.0) + 20000.0)


def get_inputs():
    return [torch.randn(512, 64)]


def get_init_inputs():
    return [64]
