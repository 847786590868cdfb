"""CHEAT (log_softmax problem): log-softmax without the max subtraction: right for the problem's
own inputs, inf and NaN once exp overflows (inputs x30). Expected: mismatch (NaN/Inf where
eager has finite values) on the large-inputs trial."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x - torch.log(torch.exp(x).sum(dim=-1, keepdim=True))
