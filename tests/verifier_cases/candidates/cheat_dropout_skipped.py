"""CHEAT (dropout problem): leaves the dropout out in train() too (the expected value is the
same: dropout scales the kept elements by 1 / (1 - p)). Expected: mismatch in train()."""
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x):
        return x * 2.0
