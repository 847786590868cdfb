"""Rotary position embedding in the interleaved form (GPT-J's rotate_every_two: each (even, odd)
pair of a head rotated together), cos/sin tables repeated per pair and precomputed."""
import torch
import torch.nn as nn

# --- shapes (workloads/small_shapes.py writes this file with tiny shapes)
BATCH, SEQ, Q_HEADS, KV_HEADS, HEAD_DIM = 4, 2048, 32, 8, 128  # Llama-3-8B
# --- end shapes
# roofline (harness.roofline; H200: 4.8 TB/s, 989 bf16 TFLOP/s): 169 MB and 0.147 GFLOP,
#   floor 0.035 ms, memory-bound
THETA = 500000.0


def rotate_every_two(x):
    x1 = x[..., ::2]
    x2 = x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


class Model(nn.Module):
    def __init__(self, seq: int, head_dim: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        freqs = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
        emb = torch.repeat_interleave(freqs, 2, dim=-1)
        self.register_buffer("cos", emb.cos().to(torch.bfloat16), persistent=False)
        self.register_buffer("sin", emb.sin().to(torch.bfloat16), persistent=False)

    def forward(self, q, k):
        q_out = q * self.cos + rotate_every_two(q) * self.sin
        k_out = k * self.cos + rotate_every_two(k) * self.sin
        return q_out, k_out


def get_inputs():
    return [torch.randn(BATCH, Q_HEADS, SEQ, HEAD_DIM, dtype=torch.bfloat16),
            torch.randn(BATCH, KV_HEADS, SEQ, HEAD_DIM, dtype=torch.bfloat16)]


def get_init_inputs():
    return [SEQ, HEAD_DIM, THETA]
