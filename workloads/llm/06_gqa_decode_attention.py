"""Grouped-query attention for one decoding step over a long KV cache (Llama-3-8B heads:
32 query heads share 8 key/value heads)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

# --- shapes (workloads/small_shapes.py writes this file with tiny shapes)
BATCH, Q_HEADS, KV_HEADS, HEAD_DIM, CACHE_LEN = 8, 32, 8, 128, 8192
# --- end shapes
# roofline (harness.roofline; H200: 4.8 TB/s, 989 bf16 TFLOP/s): 269 MB and 1.07 GFLOP,
#   floor 0.056 ms, memory-bound


class Model(nn.Module):
    def forward(self, q, k_cache, v_cache):
        return F.scaled_dot_product_attention(q, k_cache, v_cache, enable_gqa=True)


def get_inputs():
    return [torch.randn(BATCH, Q_HEADS, 1, HEAD_DIM, dtype=torch.bfloat16),
            torch.randn(BATCH, KV_HEADS, CACHE_LEN, HEAD_DIM, dtype=torch.bfloat16),
            torch.randn(BATCH, KV_HEADS, CACHE_LEN, HEAD_DIM, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
