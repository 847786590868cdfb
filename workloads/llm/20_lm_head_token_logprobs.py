"""Per-token log-probabilities of the taken tokens after the LM head, as RL fine-tuning code
(TRL's policy log-probs) computes them: log_softmax of the fp32 logits over the vocabulary,
gathered at each target token."""
import torch
import torch.nn as nn

# --- shapes (workloads/small_shapes.py writes this file with tiny shapes)
TOKENS, HIDDEN, VOCAB = 2048, 4096, 128256  # Llama-3-8B, one 2048-token sequence
# --- end shapes
# roofline (harness.roofline; H200: 4.8 TB/s, 989 bf16 TFLOP/s): 1067 MB and 2.15e+03 GFLOP,
#   floor 2.207 ms, compute-bound;
#   the weight alone is 1.05 GB


class Model(nn.Module):
    def __init__(self, hidden: int, vocab: int):
        super().__init__()
        self.lm_head = nn.Linear(hidden, vocab, bias=False, dtype=torch.bfloat16)

    def forward(self, hidden_states, targets):
        logits = self.lm_head(hidden_states)
        logp = torch.log_softmax(logits.float(), dim=-1)
        return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def get_inputs():
    return [torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16),
            torch.randint(0, VOCAB, (TOKENS,))]


def get_init_inputs():
    return [HIDDEN, VOCAB]
