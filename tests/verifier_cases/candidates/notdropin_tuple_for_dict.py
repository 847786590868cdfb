"""NOT A DROP-IN (dict_out problem): the right values as a tuple where Model returns a dict: a
caller's ``out["probs"]`` fails. Expected: mismatch (the output's structure)."""
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, d: int, v: int):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, v, bias=False)

    def forward(self, x):
        logits = self.head(self.norm(x))
        return logits, F.softmax(logits, dim=-1)
