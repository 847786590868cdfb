"""NOT A DROP-IN (pointwise problem): a right Triton kernel that writes every call's result into
one output tensor allocated once and kept (a "preallocated buffer" optimization). Every call
returns the right values, but a caller who keeps a result, ``a = m(x1); b = m(x2)``, finds ``a``
overwritten with ``b``'s values: Model returns new memory every call. Expected: mismatch, "changed
during this call". honest_triton_pointwise.py (a new output per call) is the drop-in."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def scale_bias_gelu_kernel(x_ptr, b_ptr, out_ptr, n_elements, n_cols, scale, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    b = tl.load(b_ptr + offs % n_cols, mask=mask, other=0.0)
    v = x * scale + b
    y = 0.5 * v * (1.0 + tl.math.erf(v * 0.7071067811865476))
    tl.store(out_ptr + offs, y, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, features: int, scale: float):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(features) * 0.1)
        self.scale = scale
        self.out = {}

    def forward(self, x):
        torch.broadcast_shapes(x.shape, self.bias.shape)
        if x.shape[-1] != self.bias.shape[0]:
            return torch.nn.functional.gelu(x * self.scale + self.bias)
        x = x.contiguous()
        key = (tuple(x.shape), x.dtype, x.device)
        if key not in self.out:  # one output per shape, allocated on first use and reused
            self.out[key] = torch.empty_like(x)
        out = self.out[key]
        n = x.numel()
        BLOCK = 1024
        scale_bias_gelu_kernel[(triton.cdiv(n, BLOCK),)](x, self.bias, out, n, x.shape[-1], self.scale,
                                                         BLOCK=BLOCK)
        return out
