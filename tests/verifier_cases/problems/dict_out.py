"""Verifier test problem returning a dict (as Hugging Face modules return a ModelOutput): a
LayerNorm, the logits of a small head, and their softmax."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, d: int, v: int):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, v, bias=False)

    def forward(self, x):
        logits = self.head(self.norm(x))
        return {"logits": logits, "probs": F.softmax(logits, dim=-1)}


def get_inputs():
    return [torch.randn(4, 6, 32)]


def get_init_inputs():
    return [32, 40]
