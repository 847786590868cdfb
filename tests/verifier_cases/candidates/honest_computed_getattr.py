"""HONEST (pointwise problem): picks its functions by computed name from allowed modules
(``getattr(torch, name)``, ``getattr(F, name)``, ``getattr(tl, op)`` inside a Triton kernel's
helper choice) and its Triton kernel by name from a table. Expected: passed (a computed getattr
on torch, triton or math is allowed: the OS sandbox, not the static check, bounds what it reaches)."""
import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def affine_kernel(x_ptr, b_ptr, out_ptr, n_elements, n_cols, scale, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    b = tl.load(b_ptr + offs % n_cols, mask=mask, other=0.0)
    tl.store(out_ptr + offs, x * scale + b, mask=mask)


ACTIVATIONS = {"gelu": "exact"}


class ModelNew(nn.Module):
    def __init__(self, features: int, scale: float):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(features) * 0.1)
        self.scale = scale
        self.act = "".join(["ge", "lu"])
        self.alloc = "empty" + "_like"

    def forward(self, x):
        torch.broadcast_shapes(x.shape, self.bias.shape)  # raises where PyTorch's add raises
        if x.shape[-1] != self.bias.shape[0]:
            return getattr(F, self.act)(x * self.scale + self.bias)
        x = x.contiguous()
        out = getattr(torch, self.alloc)(x)
        n = x.numel()
        affine_kernel[(triton.cdiv(n, 1024),)](x, self.bias, out, n, x.shape[-1], self.scale, BLOCK=1024)
        assert callable(getattr(tl, "ex" + "p"))
        return getattr(F, self.act)(out)
