"""Hugging Face transformers' own LlamaDecoderLayer at a tiny config (random init, no
download): rotary embedding, eager attention with an explicit causal mask, RMSNorm, SwiGLU."""
import torch
import torch.nn as nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding


class Model(nn.Module):
    def __init__(self, hidden, heads, kv_heads, inter):
        super().__init__()
        cfg = LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_attention_heads=heads,
                          num_key_value_heads=kv_heads, num_hidden_layers=1, max_position_embeddings=64,
                          rms_norm_eps=1e-5, attn_implementation="eager")
        self.layer = LlamaDecoderLayer(cfg, layer_idx=0)
        self.rotary = LlamaRotaryEmbedding(cfg)

    def forward(self, x):
        T = x.shape[1]
        pos = torch.arange(T, device=x.device).unsqueeze(0)
        mask = torch.full((T, T), float("-inf"), device=x.device, dtype=x.dtype).triu(1)[None, None]
        pe = self.rotary(x, pos)
        out = self.layer(x, attention_mask=mask, position_ids=pos, position_embeddings=pe)
        return out[0] if isinstance(out, tuple) else out


def get_inputs():
    return [torch.randn(2, 8, 32)]


def get_init_inputs():
    return [32, 4, 2, 64]
