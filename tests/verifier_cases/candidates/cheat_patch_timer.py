"""CHEAT (rowsum problem): makes timers run slow so that it looks fast (patches time.perf_counter
and Triton's do_bench through an alias). Expected: static check, imports time / changes an
attribute of triton.testing."""
import time

import torch
import torch.nn as nn
import triton.testing as tt

_real = time.perf_counter
time.perf_counter = lambda: _real() * 0.1
tt.do_bench = lambda fn, *a, **k: 1e-3


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return (x * x).sum(dim=-1, keepdim=True)
