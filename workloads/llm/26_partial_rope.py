"""Rotary embedding on part of each head (GPT-NeoX / Phi style: the first ROTARY_DIM dims are
rotated, the rest pass through), cos/sin tables as buffers built at init."""
import torch
import torch.nn as nn

# --- shapes (workloads/small_shapes.py writes this file with tiny shapes)
BATCH, HEADS, SEQ, HEAD_DIM, ROTARY_DIM = 2, 32, 2048, 128, 64
# --- end shapes
# roofline (harness.roofline; H200: 4.8 TB/s, 989 bf16 TFLOP/s): 68.2 MB and 0.0294 GFLOP,
#   floor 0.0142 ms, memory-bound


class Model(nn.Module):
    def __init__(self, seq: int, rotary_dim: int, base: float = 10000.0):
        super().__init__()
        self.rotary_dim = rotary_dim
        inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
        freqs = torch.outer(torch.arange(seq).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos_cached", emb.cos(), persistent=False)
        self.register_buffer("sin_cached", emb.sin(), persistent=False)

    def forward(self, x):
        rd = self.rotary_dim
        x_rot, x_pass = x[..., :rd], x[..., rd:]
        x1, x2 = x_rot[..., : rd // 2], x_rot[..., rd // 2:]
        rotated = torch.cat((-x2, x1), dim=-1)
        cos = self.cos_cached[: x.shape[-2]].to(x.dtype)
        sin = self.sin_cached[: x.shape[-2]].to(x.dtype)
        x_rot = x_rot * cos + rotated * sin
        return torch.cat((x_rot, x_pass), dim=-1)


def get_inputs():
    return [torch.randn(BATCH, HEADS, SEQ, HEAD_DIM, dtype=torch.bfloat16)]


def get_init_inputs():
    return [SEQ, ROTARY_DIM]
