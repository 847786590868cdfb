"""HONEST (pointwise problem): an LLM-style ModelNew(nn.Module) with its own __init__ and one
Triton kernel for scale + bias + GELU, for any leading dims; an input that does not broadcast
with the bias raises as PyTorch does. Expected: passed."""
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
        torch.broadcast_shapes(x.shape, self.bias.shape)  # raises where PyTorch's add raises
        if x.shape[-1] != self.bias.shape[0]:  # the bias broadcasts along the last dim: torch
            return torch.nn.functional.gelu(x * self.scale + self.bias)
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        BLOCK = 1024
        grid = (triton.cdiv(n, BLOCK),)
        scale_bias_gelu_kernel[grid](x, self.bias, out, n, x.shape[-1], self.scale, BLOCK=BLOCK)
        return out
