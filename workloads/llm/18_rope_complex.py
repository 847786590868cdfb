"""Rotary position embedding by complex numbers, as Meta's Llama reference code writes it:
freqs_cis = polar(1, t * inv_freq) as a complex64 buffer, each (even, odd) pair of a head viewed
as one complex number (view_as_complex), multiplied by freqs_cis broadcast over batch and heads
(reshape_for_broadcast), viewed back as pairs (view_as_real) and flattened; q and k in Meta's
[batch, seq, heads, head_dim] layout."""
import torch
import torch.nn as nn

# --- shapes (workloads/small_shapes.py writes this file with tiny shapes)
BATCH, SEQ, Q_HEADS, KV_HEADS, HEAD_DIM = 4, 2048, 32, 8, 128  # Llama-3-8B
# --- end shapes
# roofline (harness.roofline; H200: 4.8 TB/s, 989 bf16 TFLOP/s): 169 MB and 0.021 GFLOP,
#   floor 0.035 ms, memory-bound
THETA = 500000.0


def precompute_freqs_cis(dim: int, end: int, theta: float):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device, dtype=torch.float32)
    freqs = torch.outer(t, freqs)
    return torch.polar(torch.ones_like(freqs), freqs)  # complex64


def reshape_for_broadcast(freqs_cis, x):
    ndim = x.ndim
    shape = [d if i == 1 or i == ndim - 1 else 1 for i, d in enumerate(x.shape)]
    return freqs_cis.view(*shape)


class Model(nn.Module):
    def __init__(self, seq: int, head_dim: int, theta: float):
        super().__init__()
        self.register_buffer("freqs_cis", precompute_freqs_cis(head_dim, seq, theta), persistent=False)

    def forward(self, xq, xk):
        xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
        xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
        freqs_cis = reshape_for_broadcast(self.freqs_cis[: xq.shape[1]], xq_)
        xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
        xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
        return xq_out.type_as(xq), xk_out.type_as(xk)


def get_inputs():
    return [torch.randn(BATCH, SEQ, Q_HEADS, HEAD_DIM, dtype=torch.bfloat16),
            torch.randn(BATCH, SEQ, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16)]


def get_init_inputs():
    return [SEQ, HEAD_DIM, THETA]
