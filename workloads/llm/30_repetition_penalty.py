"""A repetition penalty on next-token logits (CTRL's, as Hugging Face's
RepetitionPenaltyLogitsProcessor writes it): the logits of tokens already generated gathered,
divided by the penalty where positive and multiplied where negative, scattered back."""
import torch
import torch.nn as nn

# --- shapes (workloads/small_shapes.py writes this file with tiny shapes)
BATCH, VOCAB, GENERATED = 32, 128256, 1024
# --- end shapes
# roofline (harness.roofline; H200: 4.8 TB/s, 989 bf16 TFLOP/s): 16.7 MB and 0.000131 GFLOP,
#   floor 0.00347 ms, memory-bound


class Model(nn.Module):
    def __init__(self, penalty: float):
        super().__init__()
        self.penalty = penalty

    def forward(self, scores, input_ids):
        score = torch.gather(scores, 1, input_ids)
        score = torch.where(score < 0, score * self.penalty, score / self.penalty)
        return scores.scatter(1, input_ids, score)


def get_inputs():
    return [torch.randn(BATCH, VOCAB, dtype=torch.bfloat16), torch.randint(0, VOCAB, (BATCH, GENERATED))]


def get_init_inputs():
    return [1.2]
