"""BROKEN (rowsum problem): raises in forward. Expected: runtime, with the exception's line."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        raise ValueError("kernel not implemented for this shape")
