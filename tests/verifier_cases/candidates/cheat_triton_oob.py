"""BROKEN (rowsum problem): a Triton kernel that reads far out of bounds. In the CPU interpreter
that touches unmapped host memory and kills the process (a signal); on a GPU it is an illegal
memory access (a CUDA error). Expected: crash (CPU) or runtime (GPU), never a crashed harness."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def oob_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK) + 2_000_000_000
    v = tl.load(x_ptr + offs)
    tl.store(out_ptr + tl.arange(0, BLOCK), v)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        out = torch.empty((x.shape[0], 1), device=x.device, dtype=x.dtype)
        oob_kernel[(1,)](x, out, BLOCK=16)
        return out
