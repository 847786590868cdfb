"""Verifier test problem: a naive variance, E[x^2] - E[x]^2, of data far from zero.

Eager's fp32 result is off from the exact one by ~2e-3 (cancellation), more than the fp32
tolerance: a candidate that computes in float64 differs from eager beyond tolerance yet is more
accurate than eager, and passes through the float64 door.
"""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        m = x.mean(dim=-1)
        return (x * x).mean(dim=-1) - m * m


def get_inputs():
    return [torch.randn(16, 4096) + 100.0]


def get_init_inputs():
    return []
