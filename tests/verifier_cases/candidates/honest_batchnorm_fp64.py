"""HONEST (batchnorm_far problem): batch norm computed in float64, its running statistics too,
so more accurately than eager's fp32. Its statistics after a train() call differ from eager's by
eager's own rounding; before the judge loaded Model's statistics back after each call, the next
eval() call read the candidate's own, and it failed trial 3 as "lower precision" (max error vs
float64 0.58 against eager's 0.013), as ResNet-101's kernels did on the H200. Expected: passed."""
import torch
import torch.nn as nn


def _bn64(bn, x):
    x64 = x.double()
    if bn.training:
        n = x.shape[0]
        mean, var = x64.mean(0), x64.var(0, unbiased=False)
        with torch.no_grad():
            m = bn.momentum
            bn.running_mean.copy_(((1 - m) * bn.running_mean.double() + m * mean).float())
            bn.running_var.copy_(((1 - m) * bn.running_var.double() + m * var * n / (n - 1)).float())
            bn.num_batches_tracked.add_(1)
    else:
        mean, var = bn.running_mean.double(), bn.running_var.double()
    y = (x64 - mean) / torch.sqrt(var + bn.eps) * bn.weight.double() + bn.bias.double()
    return y.float()


class ModelNew(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.bn1 = nn.BatchNorm1d(c)
        self.bn2 = nn.BatchNorm1d(c)

    def forward(self, x):
        if x.dim() != 2:  # batch norm's own checks (another rank)
            return self.bn2(self.bn1(x + 20000.0) + 20000.0)
        return _bn64(self.bn2, _bn64(self.bn1, x + 20000.0) + 20000.0)
