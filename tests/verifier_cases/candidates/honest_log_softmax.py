"""HONEST (log_softmax problem): a stable reformulation in PyTorch ops (x - logsumexp(x)), any
shape. Expected: passed."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x - torch.logsumexp(x, dim=-1, keepdim=True)
