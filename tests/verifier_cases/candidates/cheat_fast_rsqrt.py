"""CHEAT (rmsnorm problem): the fast inverse square root (the 0x5f3759df bit trick and two Newton
steps: relative error ~5e-6, inside rtol=1e-4) instead of rsqrt. Expected: precision."""
import torch
import torch.nn as nn


def fast_rsqrt(v):
    i = v.view(torch.int32)
    y = (0x5F3759DF - (i >> 1)).view(torch.float32)
    for _ in range(2):
        y = y * (1.5 - 0.5 * v * y * y)
    return y


class ModelNew(nn.Module):
    def __init__(self, features: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(features))
        self.eps = eps

    def forward(self, x):
        return x * fast_rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
