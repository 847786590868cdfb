"""Hugging Face transformers' own LlamaDecoderLayer at Llama-3-8B sizes (hidden 4096, 32 query /
8 key-value heads of 128, MLP width 14336, RMSNorm eps 1e-5, rope theta 500000), random init, no
download, in bf16: the prefill of one 2048-token prompt with **eager attention and an explicit
causal mask**, the configuration issue 21's criterion names (`attn_implementation="eager"`: Hugging
Face's `eager_attention_forward`, repeat_kv, scores + mask, fp32 softmax). The mask is built as
transformers builds it for eager attention: 0 where a key is visible, the dtype's lowest value
where it is not, shape [1, 1, T, T]. The SDPA configuration is `llama3_8b_decoder_layer.py`.
Needs `transformers` (the GPU image has it).
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
                          attn_implementation="eager")
        self.layer = LlamaDecoderLayer(cfg, layer_idx=0).to(torch.bfloat16)
        self.rotary = LlamaRotaryEmbedding(cfg)

    def forward(self, x):
        T = x.shape[1]
        pos = torch.arange(T, device=x.device).unsqueeze(0)
        lowest = torch.finfo(x.dtype).min
        mask = torch.full((T, T), lowest, device=x.device, dtype=x.dtype).triu(1)[None, None]
        pe = self.rotary(x, pos)
        out = self.layer(x, attention_mask=mask, position_ids=pos, position_embeddings=pe)
        return out[0] if isinstance(out, tuple) else out


def get_inputs():
    return [torch.randn(BATCH, TOKENS, HIDDEN, dtype=torch.bfloat16)]


def get_init_inputs():
    return [HIDDEN, HEADS, KV_HEADS, INTER]
