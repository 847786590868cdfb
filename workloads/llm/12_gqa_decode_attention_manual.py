"""One decoding step of grouped-query attention written out by hand, as many inference
codebases do: the KV cache repeated per query head (repeat_interleave), q @ k^T / sqrt(d),
softmax in fp32, @ v."""
import math

import torch
import torch.nn as nn

# --- shapes (workloads/small_shapes.py writes this file with tiny shapes)
BATCH, Q_HEADS, KV_HEADS, HEAD_DIM, CACHE_LEN = 8, 32, 8, 128, 8192
# --- end shapes
# roofline (harness.roofline; H200: 4.8 TB/s, 989 bf16 TFLOP/s): 269 MB and 1.09 GFLOP,
#   floor 0.056 ms, memory-bound


class Model(nn.Module):
    def forward(self, q, k_cache, v_cache):
        group = q.shape[1] // k_cache.shape[1]
        k = torch.repeat_interleave(k_cache, group, dim=1)
        v = torch.repeat_interleave(v_cache, group, dim=1)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(HEAD_DIM)
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        return torch.matmul(probs, v)


def get_inputs():
    return [torch.randn(BATCH, Q_HEADS, 1, HEAD_DIM, dtype=torch.bfloat16),
            torch.randn(BATCH, KV_HEADS, CACHE_LEN, HEAD_DIM, dtype=torch.bfloat16),
            torch.randn(BATCH, KV_HEADS, CACHE_LEN, HEAD_DIM, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
