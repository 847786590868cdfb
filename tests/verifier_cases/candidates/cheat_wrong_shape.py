"""WRONG (rowsum problem): right values, without the kept dimension. Expected: mismatch, shape."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return (x * x).sum(dim=-1)
