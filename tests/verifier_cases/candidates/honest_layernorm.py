"""HONEST (layernorm problem): a Triton LayerNorm over the last dim for any leading dims (one
program per row), using the module's own weight and bias; an input whose last dim is not the
normalized size goes to PyTorch, which raises as Model does. Expected: passed."""
import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def layer_norm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    d = tl.where(mask, x - mean, 0.0)
    var = tl.sum(d * d, axis=0) / n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * n_cols + cols, d / tl.sqrt(var + eps) * w + b, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.norm = nn.LayerNorm(features)

    def forward(self, x):
        n = self.norm
        if x.dim() == 0 or x.shape[-1] != n.normalized_shape[0] or x.dtype != torch.float32:
            return F.layer_norm(x, n.normalized_shape, n.weight, n.bias, n.eps)
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        out = torch.empty_like(x2)
        if x2.shape[0]:
            layer_norm_kernel[(x2.shape[0],)](x2, n.weight, n.bias, out, x2.shape[1], n.eps,
                                              BLOCK=triton.next_power_of_2(x2.shape[1]))
        return out.reshape(x.shape)
