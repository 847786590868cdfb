"""Hugging Face transformers' own LlamaDecoderLayer at a tiny config, with transformers' default
attention (SDPA, causal without a mask): the attention function is chosen at run time
(``attention_interface``, a plain function the graph cannot carry), so both its choice and its
call are graph breaks, and everything around them (projections, RoPE, RMSNorm, SwiGLU) is traced."""
import torch
import torch.nn as nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding


class Model(nn.Module):
    def __init__(self, hidden, heads, kv_heads, inter):
        super().__init__()
        cfg = LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_attention_heads=heads,
                          num_key_value_heads=kv_heads, num_hidden_layers=1, max_position_embeddings=64,
                          rms_norm_eps=1e-5, rope_theta=500000.0, attn_implementation="sdpa")
        self.layer = LlamaDecoderLayer(cfg, layer_idx=0)
        self.rotary = LlamaRotaryEmbedding(cfg)

    def forward(self, x):
        pos = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
        out = self.layer(x, attention_mask=None, position_ids=pos, position_embeddings=self.rotary(x, pos))
        return out[0] if isinstance(out, tuple) else out


def get_inputs():
    return [torch.randn(2, 8, 32)]


def get_init_inputs():
    return [32, 4, 2, 64]
