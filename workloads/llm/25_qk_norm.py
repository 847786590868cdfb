"""Per-head RMSNorm of queries and keys before attention (QK-norm, as Qwen3 and Gemma-3 do): the
projections viewed as heads, each head normalized over its dim with a weight of its own, then
moved heads-first."""
import torch
import torch.nn as nn

# --- shapes (workloads/small_shapes.py writes this file with tiny shapes)
BATCH, SEQ, Q_HEADS, KV_HEADS, HEAD_DIM = 2, 2048, 32, 8, 128  # Qwen3-8B
# --- end shapes
# roofline (harness.roofline; H200: 4.8 TB/s, 989 bf16 TFLOP/s): 83.9 MB and 0.148 GFLOP,
#   floor 0.0175 ms, memory-bound
EPS = 1e-6


class HeadRMSNorm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, dtype=torch.bfloat16))

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)
        return self.weight * x.to(dtype)


class Model(nn.Module):
    def __init__(self, head_dim: int):
        super().__init__()
        self.head_dim = head_dim
        self.q_norm = HeadRMSNorm(head_dim)
        self.k_norm = HeadRMSNorm(head_dim)

    def forward(self, q, k):
        q = q.view(*q.shape[:-1], -1, self.head_dim)
        k = k.view(*k.shape[:-1], -1, self.head_dim)
        return self.q_norm(q).transpose(1, 2), self.k_norm(k).transpose(1, 2)


def get_inputs():
    return [torch.randn(BATCH, SEQ, Q_HEADS * HEAD_DIM, dtype=torch.bfloat16),
            torch.randn(BATCH, SEQ, KV_HEADS * HEAD_DIM, dtype=torch.bfloat16)]


def get_init_inputs():
    return [HEAD_DIM]
