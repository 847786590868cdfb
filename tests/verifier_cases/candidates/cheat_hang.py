"""BROKEN (rowsum problem): never returns (waits on a queue nobody fills, like a deadlock).
Expected: timeout."""
import queue

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.never = queue.Queue()

    def forward(self, x):
        self.never.get()
        return (x * x).sum(dim=-1, keepdim=True)
