"""HONEST (rowsum problem): a standard ``@triton.autotune`` row reduction (three configs keyed on
the row length). On the CPU the interpreter has no benchmarker: the candidate process installs
harness.interpreter.install_autotune_shim(), which picks the config that launches the fewest programs.
Expected: passed."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.autotune(
    configs=[triton.Config({"BLOCK": 128, "ROWS": 1}, num_warps=2),
             triton.Config({"BLOCK": 256, "ROWS": 2}, num_warps=4),
             triton.Config({"BLOCK": 512, "ROWS": 4}, num_warps=8)],
    key=["n_cols"])
@triton.jit
def row_sumsq_kernel(x_ptr, out_ptr, n_rows, n_cols, stride_row, BLOCK: tl.constexpr, ROWS: tl.constexpr):
    for r in range(ROWS):
        row = tl.program_id(0) * ROWS + r
        if row < n_rows:
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
            row_sumsq_kernel[lambda meta: (triton.cdiv(rows, meta["ROWS"]),)](x, out, rows, cols, x.stride(0))
        return out.reshape(*lead, 1)
