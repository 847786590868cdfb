"""CHEAT (linear_gelu problem): runs the fp32 matmul in bfloat16 (faster on tensor cores, much
less accurate). Expected: precision (less accurate than eager)."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        y = torch.matmul(x.bfloat16(), self.linear.weight.t().bfloat16()).float() + self.linear.bias
        return torch.nn.functional.gelu(y)
