"""NOT A DROP-IN (rowsum problem): a correct Triton row reduction, one program per row, that
only takes 2-d inputs: with one more leading dim, which PyTorch's sum accepts, it raises.
Expected: runtime ("too many values to unpack"). honest_triton_reduction.py is the drop-in."""
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
        x = x.contiguous()
        rows, cols = x.shape
        out = torch.empty((rows, 1), device=x.device, dtype=x.dtype)
        row_sumsq_kernel[(rows,)](x, out, cols, x.stride(0), BLOCK=256)
        return out
