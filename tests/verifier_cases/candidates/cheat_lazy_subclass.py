"""CHEAT (rowsum problem): returns a Tensor subclass that would compute its values only when
someone reads them (deferred computation). Static check: subclasses torch.Tensor. With the
static check off: cheat, a tensor subclass."""
import torch
import torch.nn as nn


class LazyResult(torch.Tensor):
    pass


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        out = torch.empty((x.shape[0], 1), device=x.device, dtype=x.dtype)
        return out.as_subclass(LazyResult)
