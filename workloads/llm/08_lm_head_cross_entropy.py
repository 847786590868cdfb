"""LM head + cross-entropy loss of a training step: logits over the vocabulary from the last
hidden states, mean token loss in fp32."""
import torch
import torch.nn as nn
import torch.nn.functional as F

# --- shapes (workloads/small_shapes.py writes this file with tiny shapes)
TOKENS, HIDDEN, VOCAB = 2048, 4096, 128256  # Llama-3-8B, one 2048-token sequence
# --- end shapes
# roofline (harness.roofline; H200: 4.8 TB/s, 989 bf16 TFLOP/s): 1067 MB and 2.15e+03 GFLOP,
#   floor 2.211 ms, compute-bound;
#   the weight alone is 1.05 GB


class Model(nn.Module):
    def __init__(self, hidden: int, vocab: int):
        super().__init__()
        self.lm_head = nn.Linear(hidden, vocab, bias=False, dtype=torch.bfloat16)

    def forward(self, hidden_states, targets):
        logits = self.lm_head(hidden_states)
        return F.cross_entropy(logits.float(), targets)


def get_inputs():
    return [torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16),
            torch.randint(0, VOCAB, (TOKENS,))]


def get_init_inputs():
    return [HIDDEN, VOCAB]
