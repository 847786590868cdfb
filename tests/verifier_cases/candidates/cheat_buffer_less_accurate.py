"""CHEAT (running_var_far problem): its outputs are right, but the buffer it updates is 0.3% off
(a shortcut in the running statistics): further from the float64 result than eager's, so the
float64 door that lets an accurate buffer through keeps this one out. Expected: mismatch,
naming the buffer."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.register_buffer("running_var", torch.ones(features))

    def forward(self, x):
        m = x.mean(dim=0)
        if self.training:
            x64 = x.double()
            var = ((x64 * x64).mean(dim=0) - x64.mean(dim=0) ** 2) * 1.003
            self.running_var.copy_(var.to(self.running_var.dtype))
        return x - m
