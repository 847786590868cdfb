"""One decoding step of grouped-query attention written with einsum, as research code does: a
3-d query (one token per head, the sequence dim squeezed), the KV cache repeated per query head
(repeat_interleave), einsum scores times the scale, softmax in fp32, einsum with v."""
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
        k = k_cache.repeat_interleave(group, dim=1)
        v = v_cache.repeat_interleave(group, dim=1)
        scale = q.shape[-1] ** -0.5
        scores = torch.einsum("bhd,bhsd->bhs", q, k) * scale
        probs = scores.float().softmax(dim=-1).to(q.dtype)
        return torch.einsum("bhs,bhsd->bhd", probs, v)


def get_inputs():
    return [torch.randn(BATCH, Q_HEADS, HEAD_DIM, dtype=torch.bfloat16),
            torch.randn(BATCH, KV_HEADS, CACHE_LEN, HEAD_DIM, dtype=torch.bfloat16),
            torch.randn(BATCH, KV_HEADS, CACHE_LEN, HEAD_DIM, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
