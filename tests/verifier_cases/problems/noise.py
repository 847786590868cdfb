"""Verifier test problem that adds uniform noise in forward (both modes): a float64 reference
draws other numbers than eager (another dtype), so eager looks 1e-3 away from "float64"."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x * 2.0 + torch.rand_like(x) * 1e-3


def get_inputs():
    return [torch.randn(8, 64)]


def get_init_inputs():
    return []
