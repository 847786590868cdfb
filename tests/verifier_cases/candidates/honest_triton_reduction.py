"""HONEST (rowsum problem): a Triton row reduction, one program per row, over the last dim of
an input of any rank. Expected: passed."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def row_sumsq_kernel(x_ptr, out_ptr, n_cols, stride_row, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride_row + cols, mask=cols < n_cols, other=0.0)
        acc += x * x
    tl.store(out_ptr + row, tl.sum(acc, axis=0))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        lead, cols = x.shape[:-1], x.shape[-1]
        x = x.reshape(-1, cols).contiguous()
        rows = x.shape[0]
        out = torch.empty((rows, 1), device=x.device, dtype=x.dtype)
        if rows:
            row_sumsq_kernel[(rows,)](x, out, cols, x.stride(0), BLOCK=256)
        return out.reshape(*lead, 1)
