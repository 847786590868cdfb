"""Causal self-attention over a prompt (prefill) with grouped-query heads (Llama-3-8B)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

# --- shapes (workloads/small_shapes.py writes this file with tiny shapes)
BATCH, Q_HEADS, KV_HEADS, HEAD_DIM, SEQ = 2, 32, 8, 128, 2048
# --- end shapes
# roofline (harness.roofline; H200: 4.8 TB/s, 989 bf16 TFLOP/s): 84 MB and 68.8 GFLOP,
#   floor 0.070 ms, compute-bound;
#   causal: half of 4 B H S^2 D


class Model(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def get_inputs():
    return [torch.randn(BATCH, Q_HEADS, SEQ, HEAD_DIM, dtype=torch.bfloat16),
            torch.randn(BATCH, KV_HEADS, SEQ, HEAD_DIM, dtype=torch.bfloat16),
            torch.randn(BATCH, KV_HEADS, SEQ, HEAD_DIM, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
