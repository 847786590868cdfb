"""Verifier test problem: nucleus (top-p) filtering of bf16 logits, as Hugging Face's
TopPLogitsWarper writes it. The cumulative sum is stored in bf16, so eager's -inf begin where
its rounding puts the cut, a few elements off float64's in most rows (the decision regime)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, top_p: float):
        super().__init__()
        self.top_p = top_p

    def forward(self, scores):
        sorted_logits, sorted_indices = torch.sort(scores, descending=False)
        cumulative_probs = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative_probs <= (1 - self.top_p)
        remove[..., -1:] = 0
        remove = remove.scatter(1, sorted_indices, remove)
        return scores.masked_fill(remove, -float("inf"))


def get_inputs():
    return [torch.randn(8, 8192, dtype=torch.bfloat16)]


def get_init_inputs():
    return [0.9]
