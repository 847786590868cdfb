"""Rotary position embedding with the cos/sin tables built in forward from the sequence length
(they depend only on the input's shape and a constant frequency buffer)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, head_dim, theta):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, q, k):
        T = q.shape[-2]
        t = torch.arange(T, device=q.device, dtype=torch.float32)
        freqs = torch.outer(t, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        h = q.shape[-1] // 2
        q_rot = torch.cat((-q[..., h:], q[..., :h]), dim=-1)
        k_rot = torch.cat((-k[..., h:], k[..., :h]), dim=-1)
        return q * cos + q_rot * sin, k * cos + k_rot * sin


def get_inputs():
    return [torch.randn(2, 4, 24, 32), torch.randn(2, 2, 24, 32)]


def get_init_inputs():
    return [32, 10000.0]
