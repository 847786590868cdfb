"""HONEST (config_init problem): the file defines the problem's Config too (KernelBench files
carry Model's helpers) and builds from it; the SwiGLU product in a Triton kernel.
Expected: passed (the judge's Config is read back as this file's)."""
from dataclasses import dataclass

import torch
import torch.nn as nn
import triton
import triton.language as tl


@dataclass
class Config:
    hidden_size: int = 32
    intermediate_size: int = 48


@triton.jit
def swiglu_kernel(g_ptr, u_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask)
    u = tl.load(u_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, g * tl.sigmoid(g) * u, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.gate = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        g, u = self.gate(x).contiguous(), self.up(x).contiguous()
        h = torch.empty_like(g)
        swiglu_kernel[(triton.cdiv(g.numel(), 1024),)](g, u, h, g.numel(), BLOCK=1024)
        return self.down(h)
