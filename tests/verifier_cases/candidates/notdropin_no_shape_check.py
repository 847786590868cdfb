"""NOT A DROP-IN (pointwise problem): a correct Triton kernel for scale + bias + GELU at the
problem's shapes that never checks them: for an input whose last dim is not the bias's length,
where PyTorch raises, it reads the bias modulo its own length and returns a result. Expected:
mismatch ("returned a result where Model raises"). honest_triton_pointwise.py is the drop-in."""
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

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        BLOCK = 1024
        grid = (triton.cdiv(n, BLOCK),)
        scale_bias_gelu_kernel[grid](x, self.bias, out, n, x.shape[-1], self.scale, BLOCK=BLOCK)
        return out
