"""Token embedding scaled by sqrt(hidden) (Gemma's input embedding: the normalizer kept as a
bf16 buffer), for a prefill batch."""
import torch
import torch.nn as nn

# --- shapes (workloads/small_shapes.py writes this file with tiny shapes)
BATCH, SEQ, VOCAB, HIDDEN = 4, 2048, 128256, 4096
# --- end shapes
# roofline (harness.roofline; H200: 4.8 TB/s, 989 bf16 TFLOP/s): 134 MB and 0.0336 GFLOP,
#   floor 0.028 ms, memory-bound
#   (the table's rows the ids name, not the whole table: harness.roofline counts indexed reads so)


class Model(nn.Module):
    def __init__(self, vocab: int, hidden: int):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, hidden, dtype=torch.bfloat16)
        self.register_buffer("normalizer", torch.tensor(hidden ** 0.5, dtype=torch.bfloat16), persistent=False)

    def forward(self, input_ids):
        return self.embed_tokens(input_ids) * self.normalizer


def get_inputs():
    return [torch.randint(0, VOCAB, (BATCH, SEQ))]


def get_init_inputs():
    return [VOCAB, HIDDEN]
