"""CHEAT (rowsum problem): right with grad off, wrong when grad mode is on (a training loop's
call). Expected: mismatch on the first trial with grad on."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        out = (x * x).sum(dim=-1, keepdim=True)
        return out * 1.01 if torch.is_grad_enabled() else out
