"""CHEAT (pointwise problem): a result cache keyed by the input's data pointer. Fresh buffers get
fresh results, so only a second call on new values in the same buffer catches it.
Expected: mismatch on trial 2."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, features: int, scale: float):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(features) * 0.1)
        self.scale = scale
        self.cache = {}

    def forward(self, x):
        key = (x.data_ptr(), tuple(x.shape))
        if key not in self.cache:
            self.cache[key] = torch.nn.functional.gelu(x * self.scale + self.bias)
        return self.cache[key]
