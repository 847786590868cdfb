"""CHEAT (layernorm problem): normalizes but drops LayerNorm's weight and bias. With the seeded
init (weight 1, bias 0) it is exact; the judge loads random parameters into both models through
load_state_dict first. Expected: mismatch on trial 1."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.norm = nn.LayerNorm(features)

    def forward(self, x):
        return F.layer_norm(x, self.norm.normalized_shape, eps=self.norm.eps)
