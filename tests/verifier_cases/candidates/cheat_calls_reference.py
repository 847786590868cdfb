"""CHEAT (rowsum problem): subclasses the reference and calls its forward for the work, with a
decoy Triton kernel. Expected: static check, calls the reference forward."""
import torch
import torch.nn as nn
import triton
import triton.language as tl

Model = nn.Module  # (stands in for the problem's Model in a file that does not include it)


@triton.jit
def decoy_kernel(x_ptr, BLOCK: tl.constexpr):
    tl.load(x_ptr + tl.arange(0, BLOCK))


class ModelNew(Model):
    def forward(self, x):
        decoy_kernel[(1,)](x, BLOCK=16)
        return super().forward(x)
