"""CHEAT (dropout problem): a dropout of its own, right in distribution (keep with probability
1 - p, scale by 1 / (1 - p)) but not Model's draws: a caller who seeds torch gets another mask
than Model gives. Expected: mismatch in train()."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x):
        if not self.training:
            return x * 2.0
        keep = torch.rand_like(x) >= self.p
        return torch.where(keep, x / (1.0 - self.p), torch.zeros_like(x)) * 2.0
