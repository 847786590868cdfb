"""CHEAT (rowsum problem): computes on the first call and returns that result forever after.
Expected: mismatch on trial 2."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.saved = None

    def forward(self, x):
        if self.saved is None:
            self.saved = (x * x).sum(dim=-1, keepdim=True)
        return self.saved
