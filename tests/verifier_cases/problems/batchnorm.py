"""Verifier test problem: BatchNorm2d then ReLU (batch statistics in train(), running
statistics in eval(), running statistics updated in train())."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x):
        return torch.relu(self.bn(x))


def get_inputs():
    return [torch.randn(6, 4, 5, 7)]


def get_init_inputs():
    return [4]
