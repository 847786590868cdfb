"""Causal prefill attention with a sliding window (Mistral-style: each query sees the WINDOW
keys up to itself), written out: the mask built from position indices, scores, fp32 softmax."""
import math

import torch
import torch.nn as nn

# --- shapes (workloads/small_shapes.py writes this file with tiny shapes)
BATCH, HEADS, SEQ, HEAD_DIM, WINDOW = 1, 32, 4096, 128, 1024
# --- end shapes
# roofline (harness.roofline; H200: 4.8 TB/s, 989 bf16 TFLOP/s): 134 MB and 280 GFLOP,
#   floor 0.351 ms, compute-bound
#   (the count is the full causal product's; the window's share is about a quarter)


class Model(nn.Module):
    def __init__(self, window: int):
        super().__init__()
        self.window = window

    def forward(self, q, k, v):
        n = q.shape[-2]
        i = torch.arange(n, device=q.device)
        allowed = (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < self.window)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        return torch.matmul(probs, v)


def get_inputs():
    return [torch.randn(BATCH, HEADS, SEQ, HEAD_DIM, dtype=torch.bfloat16) for _ in range(3)]


def get_init_inputs():
    return [WINDOW]
