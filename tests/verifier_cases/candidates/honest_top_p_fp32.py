"""HONEST (top_p problem): the cumulative sum kept in fp32 (eager stores it in bf16 and
compares the rounded value). Its -inf begin a few elements from eager's, closer to float64's
cut: the pattern passes by the decision regime. Expected: passed."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, top_p: float):
        super().__init__()
        self.top_p = top_p

    def forward(self, scores):
        sorted_logits, sorted_indices = torch.sort(scores, descending=False)
        cumulative = sorted_logits.float().softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= (1 - self.top_p)
        remove[..., -1:] = False
        remove = remove.scatter(1, sorted_indices, remove)
        return scores.masked_fill(remove, -float("inf"))
