"""CHEAT (pointwise problem): copies its bias at construction and uses the copy, so parameters
loaded later (load_state_dict) are ignored. Expected: mismatch on trial 1."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, features: int, scale: float):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(features) * 0.1)
        self.scale = scale
        self.frozen = self.bias.detach().clone()

    def forward(self, x):
        return torch.nn.functional.gelu(x * self.scale + self.frozen.to(x.device))
