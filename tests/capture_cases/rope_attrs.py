"""Rotary position embedding with the cos/sin tables kept as plain tensor attributes (not
registered buffers: ``.to()`` would not move them), sliced to the sequence length."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, max_seq, head_dim, theta):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        freqs = torch.outer(torch.arange(max_seq, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos_cached = emb.cos()
        self.sin_cached = emb.sin()

    def forward(self, q, k):
        T = q.shape[-2]
        cos = self.cos_cached[:T].to(q.dtype)
        sin = self.sin_cached[:T].to(q.dtype)
        h = q.shape[-1] // 2
        q_rot = torch.cat((-q[..., h:], q[..., :h]), dim=-1)
        k_rot = torch.cat((-k[..., h:], k[..., :h]), dim=-1)
        return q * cos + q_rot * sin, k * cos + k_rot * sin


def get_inputs():
    return [torch.randn(2, 4, 24, 32), torch.randn(2, 2, 24, 32)]


def get_init_inputs():
    return [64, 32, 10000.0]
