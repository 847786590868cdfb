"""CHEAT (linear_gelu problem): an fp32 matmul on its first call, then bfloat16 (a lower-precision
path only after the first trial, where an old guard ran). Expected: precision on trial 2."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        w = self.linear.weight.t()
        if self.calls > 1:
            y = torch.matmul(x.bfloat16(), w.bfloat16()).float()
        else:
            y = torch.matmul(x, w)
        return torch.nn.functional.gelu(y + self.linear.bias)
