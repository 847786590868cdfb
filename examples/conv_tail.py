"""Example: a library convolution followed by a fused elementwise tail."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, cin: int, cout: int, k: int):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k)
        self.shift = nn.Parameter(torch.randn(cout, 1, 1) * 0.1)

    def forward(self, x):
        x = self.conv(x)
        x = torch.relu(x) + self.shift
        return torch.tanh(x) * 0.5


def get_inputs():
    return [torch.randn(2, 3, 20, 20)]


def get_init_inputs():
    return [3, 8, 3]
