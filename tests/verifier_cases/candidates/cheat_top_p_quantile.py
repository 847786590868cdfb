"""CHEAT (top_p problem): no sort and no cumulative sum: masks the logits below each row's
35% quantile, about where top-p 0.9 cuts standard normal logits, at a fraction of the work.
Close in count, elsewhere by hundreds of elements a row. Expected: mismatch (its infinities
are far further from float64's than eager's)."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, top_p: float):
        super().__init__()
        self.top_p = top_p

    def forward(self, scores):
        k = max(1, int(scores.shape[-1] * 0.35))
        cut = scores.float().kthvalue(k, dim=-1, keepdim=True).values
        return scores.masked_fill(scores.float() <= cut, -float("inf"))
