"""WRONG (rowsum problem): a NaN where eager has a finite value. Expected: mismatch, NaN."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        out = (x * x).sum(dim=-1, keepdim=True)
        out[0, 0] = float("nan")
        return out
