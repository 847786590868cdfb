"""HONEST (dropout problem): PyTorch's own dropout (in train(), the draws of torch's generator,
as Model's), then the scaling in a Triton kernel. Expected: passed (both calls of a trial start
from one seed)."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, p: float):
        super().__init__()
        self.drop = nn.Dropout(p)

    def forward(self, x):
        h = self.drop(x).contiguous()
        out = torch.empty_like(h)
        n = h.numel()
        scale_kernel[(triton.cdiv(n, 1024),)](h, out, n, BLOCK=1024)
        return out
