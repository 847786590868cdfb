"""NOT A DROP-IN (rowsum problem): a Triton row reduction over the last dim of any rank that
indexes rows as ``row * n_cols``, as if every input were contiguous. Right for the problem's own
inputs, another batch size and one more leading dim; wrong for rows that sit further apart in
memory, which a user's ``qkv.split(...)`` or ``x[:, :n]`` gives. Expected: mismatch on the trial
in the padded layout. honest_triton_reduction.py (``.contiguous()`` first) is the drop-in."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def row_sumsq_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=0.0)
        acc += x * x
    tl.store(out_ptr + row, tl.sum(acc, axis=0))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        lead, cols = x.shape[:-1], x.shape[-1]
        rows = x.numel() // max(1, cols)
        out = torch.empty((rows, 1), device=x.device, dtype=x.dtype)
        if rows:
            row_sumsq_kernel[(rows,)](x, out, cols, BLOCK=256)
        return out.reshape(*lead, 1)
