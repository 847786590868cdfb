"""A fused QKV projection's output split into grouped-query heads, RoPE (rotate-half) applied to
q and k with per-position cos/sin given as inputs, heads moved first."""
import torch
import torch.nn as nn

# --- shapes (workloads/small_shapes.py writes this file with tiny shapes)
BATCH, SEQ, Q_HEADS, KV_HEADS, HEAD_DIM = 2, 2048, 32, 8, 128
# --- end shapes
# roofline (harness.roofline; H200: 4.8 TB/s, 989 bf16 TFLOP/s): 103 MB and 0.0734 GFLOP,
#   floor 0.0214 ms, memory-bound


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Model(nn.Module):
    def __init__(self, q_heads: int, kv_heads: int, head_dim: int):
        super().__init__()
        self.q_heads, self.kv_heads, self.head_dim = q_heads, kv_heads, head_dim

    def forward(self, qkv, cos, sin):
        b, s, _ = qkv.shape
        d = self.head_dim
        q, k, v = qkv.split([self.q_heads * d, self.kv_heads * d, self.kv_heads * d], dim=-1)
        q = q.view(b, s, self.q_heads, d).transpose(1, 2)
        k = k.view(b, s, self.kv_heads, d).transpose(1, 2)
        v = v.view(b, s, self.kv_heads, d).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin, v


def get_inputs():
    return [torch.randn(BATCH, SEQ, (Q_HEADS + 2 * KV_HEADS) * HEAD_DIM, dtype=torch.bfloat16),
            torch.randn(BATCH, SEQ, HEAD_DIM, dtype=torch.bfloat16),
            torch.randn(BATCH, SEQ, HEAD_DIM, dtype=torch.bfloat16)]


def get_init_inputs():
    return [Q_HEADS, KV_HEADS, HEAD_DIM]
