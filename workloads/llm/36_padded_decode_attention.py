"""One decoding step of multi-head attention over a padded batch of KV caches: each sequence's
length given, an additive mask (-inf past it) built from positions, SDPA with that mask."""
import torch
import torch.nn as nn
import torch.nn.functional as F

# --- shapes (workloads/small_shapes.py writes this file with tiny shapes)
BATCH, HEADS, CACHE_LEN, HEAD_DIM = 8, 32, 4096, 128
# --- end shapes
# roofline (harness.roofline; H200: 4.8 TB/s, 989 bf16 TFLOP/s): 537 MB and 0.537 GFLOP,
#   floor 0.112 ms, memory-bound


class Model(nn.Module):
    def forward(self, q, k_cache, v_cache, lengths):
        pos = torch.arange(k_cache.shape[-2], device=q.device)
        valid = pos[None, :] < lengths[:, None]
        mask = torch.zeros(valid.shape, dtype=q.dtype, device=q.device).masked_fill(~valid, float("-inf"))
        return F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask[:, None, None, :])


def get_inputs():
    return [torch.randn(BATCH, HEADS, 1, HEAD_DIM, dtype=torch.bfloat16),
            torch.randn(BATCH, HEADS, CACHE_LEN, HEAD_DIM, dtype=torch.bfloat16),
            torch.randn(BATCH, HEADS, CACHE_LEN, HEAD_DIM, dtype=torch.bfloat16),
            torch.randint(1, CACHE_LEN + 1, (BATCH,))]


def get_init_inputs():
    return []
