"""BROKEN (rowsum problem): allocates 16 GiB of scratch memory on the input's device.
Expected (with a small --memory-limit): memory."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        scratch = torch.ones((16 << 30) // 4, device=x.device)
        return (x * x).sum(dim=-1, keepdim=True) + scratch[:1] - 1.0
