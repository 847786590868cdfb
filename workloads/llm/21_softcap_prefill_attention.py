"""Causal grouped-query attention with soft-capped scores over a prompt, as Hugging Face's Gemma-2
eager attention computes it: repeat_kv, scores scaled by query_pre_attn_scalar ** -0.5, then
``cap * tanh(scores / cap)``, the additive causal mask (the dtype's lowest value above the
diagonal), softmax in fp32, @ v. SDPA has no soft cap, so eager writes the scores."""
import torch
import torch.nn as nn

# --- shapes (workloads/small_shapes.py writes this file with tiny shapes)
BATCH, Q_HEADS, KV_HEADS, HEAD_DIM, SEQ = 2, 16, 8, 256, 2048  # Gemma-2-9B, a 2K prompt
# --- end shapes
# roofline (by hand, as harness.roofline counts; H200: 4.8 TB/s, 989 bf16 TFLOP/s): 101 MB and
#   137 GFLOP, floor 0.139 ms, compute-bound; the written-out products are counted whole, a
#   causal kernel does half: 69 GFLOP, 0.070 ms


def repeat_kv(x, n_rep):
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)


class Model(nn.Module):
    def __init__(self, query_pre_attn_scalar: float = 256.0, softcap: float = 50.0):
        super().__init__()
        self.scaling = query_pre_attn_scalar ** -0.5
        self.softcap = softcap

    def forward(self, q, k, v):
        n_rep = q.shape[1] // k.shape[1]
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
        seq = q.shape[2]
        scores = torch.matmul(q, k.transpose(2, 3)) * self.scaling
        scores = torch.tanh(scores / self.softcap) * self.softcap
        mask = torch.full((seq, seq), torch.finfo(q.dtype).min, dtype=q.dtype, device=q.device).triu(1)
        probs = nn.functional.softmax(scores + mask, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(probs, v)


def get_inputs():
    return [torch.randn(BATCH, Q_HEADS, SEQ, HEAD_DIM, dtype=torch.bfloat16),
            torch.randn(BATCH, KV_HEADS, SEQ, HEAD_DIM, dtype=torch.bfloat16),
            torch.randn(BATCH, KV_HEADS, SEQ, HEAD_DIM, dtype=torch.bfloat16)]


def get_init_inputs():
    return [256.0, 50.0]
