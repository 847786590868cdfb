"""A forward with a data-dependent branch (on a value computed from the input): fx cannot trace
it whole; the code before and after the branch is still a fusable region each."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(n))

    def forward(self, x):
        y = torch.relu(x * self.scale) + 1.0
        if y.mean() > 1.5:
            y = y * 0.5
        z = torch.sigmoid(y) * 2.0 - 1.0
        return z.sum(dim=-1)


def get_inputs():
    return [torch.randn(6, 40)]


def get_init_inputs():
    return [40]
