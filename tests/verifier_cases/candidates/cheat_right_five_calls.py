"""CHEAT (rowsum problem): right for its first five calls, then garbage (llm.c #852: correct for
N calls, wrong after). Expected: mismatch on trial 6."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        out = (x * x).sum(dim=-1, keepdim=True)
        return out if self.calls <= 5 else torch.zeros_like(out)
