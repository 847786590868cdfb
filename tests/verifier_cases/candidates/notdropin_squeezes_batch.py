"""NOT A DROP-IN (rowsum problem): right at every batch but one. It computes per-row sums of
squares and returns them as ``sums.squeeze()[..., None]``: squeeze() drops the batch dim too when
the batch is one, so a single request gets a [1] result where Model returns [1, 1].
Expected: mismatch in the batch-of-one trial."""
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        sums = (x * x).sum(dim=-1, keepdim=True)
        return sums.squeeze()[..., None] if x.dim() == 2 else sums
