"""Hugging Face transformers' own LlamaDecoderLayer at Llama-3-8B sizes (hidden 4096, 32 query /
8 key-value heads of 128, MLP width 14336, RMSNorm eps 1e-5, rope theta 500000), random init, no
download, in bf16: the prefill of one 2048-token prompt (causal SDPA attention, transformers'
default). A whole real layer as users run it: capture must split it where fx cannot trace it
(issue 21). Needs `transformers` (the GPU image has it).
"""
import torch
import torch.nn as nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

# --- shapes
BATCH, TOKENS = 1, 2048
HIDDEN, HEADS, KV_HEADS, INTER = 4096, 32, 8, 14336
# --- end shapes


class Model(nn.Module):
    def __init__(self, hidden, heads, kv_heads, inter):
        super().__init__()
        cfg = LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_attention_heads=heads,
                          num_key_value_heads=kv_heads, num_hidden_layers=1,
                          max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0,
                          attn_implementation="sdpa")
        self.layer = LlamaDecoderLayer(cfg, layer_idx=0).to(torch.bfloat16)
        self.rotary = LlamaRotaryEmbedding(cfg)

    def forward(self, x):
        pos = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
        pe = self.rotary(x, pos)
        out = self.layer(x, attention_mask=None, position_ids=pos, position_embeddings=pe)
        return out[0] if isinstance(out, tuple) else out


def get_inputs():
    return [torch.randn(BATCH, TOKENS, HIDDEN, dtype=torch.bfloat16)]


def get_init_inputs():
    return [HIDDEN, HEADS, KV_HEADS, INTER]
