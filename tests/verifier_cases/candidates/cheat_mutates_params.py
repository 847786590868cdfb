"""CHEAT (pointwise problem): computes the right result, then changes its own bias (on every
call), so the next call (and the user's model) is wrong. Expected: params on trial 1."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, features: int, scale: float):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(features) * 0.1)
        self.scale = scale

    def forward(self, x):
        out = torch.nn.functional.gelu(x * self.scale + self.bias)
        with torch.no_grad():
            self.bias.mul_(0.5)
        return out
