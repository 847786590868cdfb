"""A ResNet-style stem pool written for a template probe (not a benchmark problem): max pool 3x3,
stride 2, padding 1, then ReLU. docs/results/workloads_h200.md (twenty-fourth session)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.p = nn.MaxPool2d(3, 2, 1)

    def forward(self, x):
        return torch.relu(self.p(x))


def get_inputs():
    return [torch.randn(32, 64, 112, 112)]


def get_init_inputs():
    return []
