"""One decoding step through scaled_dot_product_attention with the KV cache repeated per query
head first (repeat_interleave), as code written before enable_gqa existed does."""
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
        group = Q_HEADS // KV_HEADS
        k = k_cache.repeat_interleave(group, dim=1)
        v = v_cache.repeat_interleave(group, dim=1)
        return F.scaled_dot_product_attention(q, k, v)


def get_inputs():
    return [torch.randn(BATCH, Q_HEADS, 1, HEAD_DIM, dtype=torch.bfloat16),
            torch.randn(BATCH, KV_HEADS, CACHE_LEN, HEAD_DIM, dtype=torch.bfloat16),
            torch.randn(BATCH, KV_HEADS, CACHE_LEN, HEAD_DIM, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
