"""HONEST (rmsnorm problem): a Triton RMSNorm over the last dim, any leading dims, one program per
row, with the module's weight. Expected: passed."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def rms_norm_kernel(x_ptr, w_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    tl.store(out_ptr + row * n_cols + cols, x * inv * tl.load(w_ptr + cols, mask=mask, other=0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, features: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(features))
        self.eps = eps

    def forward(self, x):
        if x.dim() == 0 or x.shape[-1] != self.weight.shape[0] or x.dtype != torch.float32:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        out = torch.empty_like(x2)
        if x2.shape[0]:
            rms_norm_kernel[(x2.shape[0],)](x2, self.weight, out, x2.shape[1], self.eps,
                                            BLOCK=triton.next_power_of_2(x2.shape[1]))
        return out.reshape(x.shape)
