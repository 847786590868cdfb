"""WRONG (rowsum problem): right values, returned as float64. Expected: mismatch, dtype."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return (x.double() * x.double()).sum(dim=-1, keepdim=True)
