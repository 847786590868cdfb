"""HONEST (variance problem): computes in float64 inside a Triton kernel, more accurately than
eager's fp32. It differs from eager by more than the fp32 tolerance, and passes through the
float64 door (its error against a float64 reference is smaller than eager's). Expected: passed,
output 0 passed_by "fp64"."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def variance_fp64_kernel(x_ptr, out_ptr, n_cols, stride_row, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    s = tl.zeros([BLOCK], dtype=tl.float64)
    s2 = tl.zeros([BLOCK], dtype=tl.float64)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride_row + cols, mask=cols < n_cols, other=0.0).to(tl.float64)
        s += x
        s2 += x * x
    mean = tl.sum(s, axis=0) / n_cols
    var = tl.sum(s2, axis=0) / n_cols - mean * mean
    tl.store(out_ptr + row, var.to(tl.float32))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        lead, cols = x.shape[:-1], x.shape[-1]
        x = x.reshape(-1, cols).contiguous()
        rows = x.shape[0]
        out = torch.empty((rows,), device=x.device, dtype=torch.float32)
        if rows:
            variance_fp64_kernel[(rows,)](x, out, cols, x.stride(0), BLOCK=1024)
        return out.reshape(lead)
