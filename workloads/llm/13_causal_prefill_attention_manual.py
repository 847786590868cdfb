"""Causal grouped-query attention over a prompt written out as Hugging Face's eager attention
does: repeat_kv (expand + reshape), scores scaled by head_dim ** -0.5, an additive causal mask
built from the sequence length, softmax in fp32, @ v."""
import torch
import torch.nn as nn

# --- shapes (workloads/small_shapes.py writes this file with tiny shapes)
BATCH, Q_HEADS, KV_HEADS, HEAD_DIM, SEQ = 2, 32, 8, 128, 2048
# --- end shapes
# roofline (harness.roofline; H200: 4.8 TB/s, 989 bf16 TFLOP/s): 84 MB and 140 GFLOP,
#   floor 0.179 ms, compute-bound; the written-out products are counted whole, a causal
#   kernel does half: 69 GFLOP, 0.070 ms


def repeat_kv(x, n_rep):
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.scaling = HEAD_DIM ** -0.5

    def forward(self, q, k, v):
        n_rep = q.shape[1] // k.shape[1]
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
        seq = q.shape[2]
        scores = torch.matmul(q, k.transpose(2, 3)) * self.scaling
        mask = torch.full((seq, seq), float("-inf"), device=q.device).triu(1)
        probs = torch.softmax((scores + mask).float(), dim=-1).to(q.dtype)
        return torch.matmul(probs, v)


def get_inputs():
    return [torch.randn(BATCH, Q_HEADS, SEQ, HEAD_DIM, dtype=torch.bfloat16),
            torch.randn(BATCH, KV_HEADS, SEQ, HEAD_DIM, dtype=torch.bfloat16),
            torch.randn(BATCH, KV_HEADS, SEQ, HEAD_DIM, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
