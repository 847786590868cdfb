"""One decoding step of multi-query attention (Falcon-7B: 71 query heads share one key/value
head) written with matmuls that broadcast the one cached head over the query heads, the scale
as q.shape[-1] ** -0.5, the softmax in fp32."""
import torch
import torch.nn as nn
import torch.nn.functional as F

# --- shapes (workloads/small_shapes.py writes this file with tiny shapes)
BATCH, Q_HEADS, HEAD_DIM, CACHE_LEN = 16, 71, 64, 8192
# --- end shapes
# roofline (harness.roofline; H200: 4.8 TB/s, 989 bf16 TFLOP/s): 34 MB and 2.47 GFLOP,
#   floor 0.007 ms, memory-bound


class Model(nn.Module):
    def forward(self, q, k_cache, v_cache):
        # q [B, H, 1, D]; k_cache, v_cache [B, 1, T, D]
        scores = torch.matmul(q, k_cache.transpose(2, 3)) * (q.shape[-1] ** -0.5)
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(probs, v_cache)


def get_inputs():
    return [torch.randn(BATCH, Q_HEADS, 1, HEAD_DIM, dtype=torch.bfloat16),
            torch.randn(BATCH, 1, CACHE_LEN, HEAD_DIM, dtype=torch.bfloat16),
            torch.randn(BATCH, 1, CACHE_LEN, HEAD_DIM, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
