"""CHEAT (rowsum problem): returns an empty tensor at once and fills it from a background thread
later (deferred computation that a careless timer would not see). Static check: imports
threading. With the static check off: mismatch (the judge copies outputs as soon as they arrive)."""
import threading
import time

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        out = torch.zeros((x.shape[0], 1), device=x.device, dtype=x.dtype)
        xs = x.clone()

        def fill():
            time.sleep(0.5)
            out.copy_((xs * xs).sum(dim=-1, keepdim=True))

        threading.Thread(target=fill, daemon=True).start()
        return out
