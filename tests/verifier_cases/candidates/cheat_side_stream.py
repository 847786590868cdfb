"""CHEAT (rowsum problem): runs its work on a side CUDA stream, so that events recorded on the
current stream (the timer's) do not see it. Expected: static check, uses another CUDA stream.
scripts/gpu_cheats.py runs a heavier variant on a GPU with the static check off: its values are
right, and timing flags it (synchronized wall time far above event time)."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.side = torch.cuda.Stream() if torch.cuda.is_available() else None

    def forward(self, x):
        if self.side is None:
            return (x * x).sum(dim=-1, keepdim=True)
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            out = (x * x).sum(dim=-1, keepdim=True)
        return out
