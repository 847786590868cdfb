"""CHEAT (batchnorm problem): always normalizes with the batch's statistics, as in train(); in
eval() PyTorch uses the running statistics. Expected: mismatch on the first eval() trial."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x):
        bn = self.bn
        if self.training:
            with torch.no_grad():
                bn.num_batches_tracked.add_(1)
            y = F.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias, True, bn.momentum, bn.eps)
        else:
            y = F.batch_norm(x, None, None, bn.weight, bn.bias, True, 0.0, bn.eps)
        return torch.relu(y)
