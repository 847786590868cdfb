"""Sampling softmax over the vocabulary: temperature-scaled logits to fp32 probabilities."""
import torch
import torch.nn as nn

# --- shapes (workloads/small_shapes.py writes this file with tiny shapes)
BATCH, VOCAB = 64, 128256  # 64 decoding sequences, Llama-3 vocabulary
# --- end shapes
# roofline (harness.roofline; H200: 4.8 TB/s, 989 bf16 TFLOP/s): 49 MB and 0.0739 GFLOP,
#   floor 0.010 ms, memory-bound
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
