"""Nucleus (top-p) filtering of next-token logits, as Hugging Face's TopPLogitsWarper writes it:
sort, cumulative softmax, mask the tail past p, scatter back to vocabulary order."""
import torch
import torch.nn as nn

# --- shapes (workloads/small_shapes.py writes this file with tiny shapes)
BATCH, VOCAB = 32, 128256
# --- end shapes
# roofline (harness.roofline; H200: 4.8 TB/s, 989 bf16 TFLOP/s): 16.4 MB and 0.0451 GFLOP,
#   floor 0.00342 ms, memory-bound


class Model(nn.Module):
    def __init__(self, top_p: float):
        super().__init__()
        self.top_p = top_p

    def forward(self, scores):
        sorted_logits, sorted_indices = torch.sort(scores, descending=False)
        cumulative_probs = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        sorted_indices_to_remove = cumulative_probs <= (1 - self.top_p)
        sorted_indices_to_remove[..., -1:] = 0
        indices_to_remove = sorted_indices_to_remove.scatter(1, sorted_indices, sorted_indices_to_remove)
        return scores.masked_fill(indices_to_remove, -float("inf"))


def get_inputs():
    return [torch.randn(BATCH, VOCAB, dtype=torch.bfloat16)]


def get_init_inputs():
    return [0.9]
