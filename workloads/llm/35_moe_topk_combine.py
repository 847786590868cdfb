"""A mixture-of-experts layer's router and combine (Mixtral-style: softmax over experts in fp32,
top-2, weights renormalized), the chosen experts' outputs gathered and summed with them."""
import torch
import torch.nn as nn

# --- shapes (workloads/small_shapes.py writes this file with tiny shapes)
TOKENS, EXPERTS, TOP_K, HIDDEN = 2048, 8, 2, 4096
# --- end shapes
# roofline (harness.roofline; H200: 4.8 TB/s, 989 bf16 TFLOP/s): 50.4 MB and 0.0337 GFLOP,
#   floor 0.0105 ms, memory-bound


class Model(nn.Module):
    def __init__(self, top_k: int):
        super().__init__()
        self.top_k = top_k

    def forward(self, router_logits, expert_out):
        weights = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
        weights, chosen = torch.topk(weights, self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        idx = chosen.unsqueeze(-1).expand(-1, -1, expert_out.shape[-1])
        picked = torch.gather(expert_out, 1, idx)
        return (picked.float() * weights.unsqueeze(-1)).sum(dim=1).to(expert_out.dtype)


def get_inputs():
    return [torch.randn(TOKENS, EXPERTS, dtype=torch.bfloat16),
            torch.randn(TOKENS, EXPERTS, HIDDEN, dtype=torch.bfloat16)]


def get_init_inputs():
    return [TOP_K]
