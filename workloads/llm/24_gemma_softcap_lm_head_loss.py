"""Gemma-2's LM head and loss: the final logits soft-capped (cap * tanh(logits / cap), in bf16 as
Hugging Face's Gemma-2 computes them) before the mean token loss in fp32, over a 256k vocabulary."""
import torch
import torch.nn as nn
import torch.nn.functional as F

# --- shapes (workloads/small_shapes.py writes this file with tiny shapes)
TOKENS, HIDDEN, VOCAB = 2048, 2304, 256000  # Gemma-2-2B, one 2048-token sequence
# --- end shapes
# roofline (harness.roofline; H200: 4.8 TB/s, 989 bf16 TFLOP/s): 1189 MB and 2.42e+03 GFLOP,
#   floor 2.560 ms, compute-bound;
#   eager writes the [2048, 256000] logits four times in bf16 (the product, /, tanh, *) and once
#   in fp32 (about 4 GB, estimated)
FINAL_LOGIT_SOFTCAP = 30.0


class Model(nn.Module):
    def __init__(self, hidden: int, vocab: int, cap: float):
        super().__init__()
        self.lm_head = nn.Linear(hidden, vocab, bias=False, dtype=torch.bfloat16)
        self.cap = cap

    def forward(self, hidden_states, targets):
        logits = self.lm_head(hidden_states)
        logits = logits / self.cap
        logits = torch.tanh(logits)
        logits = logits * self.cap
        return F.cross_entropy(logits.float(), targets)


def get_inputs():
    return [torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16),
            torch.randint(0, VOCAB, (TOKENS,))]


def get_init_inputs():
    return [HIDDEN, VOCAB, FINAL_LOGIT_SOFTCAP]
