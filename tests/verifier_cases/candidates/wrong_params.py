"""WRONG (pointwise problem): initializes its bias differently from Model (zeros), so with the
same seed its parameters differ. Expected: params."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, features: int, scale: float):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(features))
        self.scale = scale

    def forward(self, x):
        return torch.nn.functional.gelu(x * self.scale + self.bias)
