"""A sampler's first step: next-token logits divided by the temperature, softmax in fp32, and
the greedy token (argmax), for a batch of decoding sequences over a Llama-3 vocabulary."""
import torch
import torch.nn as nn

# --- shapes (workloads/small_shapes.py writes this file with tiny shapes)
BATCH, VOCAB = 64, 128256
# --- end shapes
# roofline (harness.roofline; H200: 4.8 TB/s, 989 bf16 TFLOP/s): 49.3 MB and 0.0821 GFLOP,
#   floor 0.0103 ms, memory-bound


class Model(nn.Module):
    def __init__(self, temperature: float):
        super().__init__()
        self.temperature = temperature

    def forward(self, logits):
        probs = torch.softmax(logits.float() / self.temperature, dim=-1)
        return probs, torch.argmax(probs, dim=-1)


def get_inputs():
    return [torch.randn(BATCH, VOCAB, dtype=torch.bfloat16)]


def get_init_inputs():
    return [0.7]
