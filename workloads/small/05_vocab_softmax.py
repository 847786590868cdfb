"""Sampling softmax over the vocabulary: temperature-scaled logits to fp32 probabilities."""
import torch
import torch.nn as nn

# --- shapes (workloads/small/ holds this file with tiny shapes; the rest is identical)
BATCH, VOCAB = 4, 500  # tiny: CPU tests
# --- end shapes
TEMPERATURE = 0.7


class Model(nn.Module):
    def __init__(self, temperature: float):
        super().__init__()
        self.temperature = temperature

    def forward(self, logits):
        return torch.softmax(logits.float() / self.temperature, dim=-1)


def get_inputs():
    return [torch.randn(BATCH, VOCAB, dtype=torch.bfloat16)]


def get_init_inputs():
    return [TEMPERATURE]
