"""HONEST (dict_out problem): the same dict, its softmax computed by a Triton row kernel.
Expected: passed (dict outputs are compared key by key)."""
import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def softmax_rows(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + row * n_cols + cols, e / tl.sum(e, axis=0), mask=cols < n_cols)


class ModelNew(nn.Module):
    def __init__(self, d: int, v: int):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, v, bias=False)

    def forward(self, x):
        logits = self.head(self.norm(x)).contiguous()
        probs = torch.empty_like(logits)
        n = logits.shape[-1]
        softmax_rows[(logits.numel() // n,)](logits, probs, n, BLOCK=triton.next_power_of_2(n))
        return {"logits": logits, "probs": probs}
