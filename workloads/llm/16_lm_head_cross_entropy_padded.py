"""LM head + cross-entropy as a training loop writes it: [batch, seq, hidden] states, logits
flattened to [tokens, vocab] and upcast, padding targets ignored (-100)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

# --- shapes (workloads/small_shapes.py writes this file with tiny shapes)
BATCH, SEQ, HIDDEN, VOCAB, PAD = 2, 1024, 4096, 128256, 64  # Llama-3-8B; 64 padded tokens
# --- end shapes
# roofline (harness.roofline; H200: 4.8 TB/s, 989 bf16 TFLOP/s): 1067 MB and 2.15e+03 GFLOP,
#   floor 2.211 ms, compute-bound;
#   the weight alone is 1.05 GB


class Model(nn.Module):
    def __init__(self, hidden: int, vocab: int):
        super().__init__()
        self.lm_head = nn.Linear(hidden, vocab, bias=False, dtype=torch.bfloat16)

    def forward(self, hidden_states, labels):
        logits = self.lm_head(hidden_states)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), labels.view(-1),
                               ignore_index=-100)


def get_inputs():
    labels = torch.randint(0, VOCAB, (BATCH, SEQ))
    labels[:, SEQ - PAD:] = -100
    return [torch.randn(BATCH, SEQ, HIDDEN, dtype=torch.bfloat16), labels]


def get_init_inputs():
    return [HIDDEN, VOCAB]
