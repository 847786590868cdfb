"""HONEST (running_var_far problem): updates the running-statistics buffer in float64, more
accurately than eager's fp32. The buffer differs from eager's by more than the fp32 tolerance,
and passes through the float64 door (its error against the float64 reference is smaller than
eager's). Expected: passed."""
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
            var = (x64 * x64).mean(dim=0) - x64.mean(dim=0) ** 2
            self.running_var.copy_(var.to(self.running_var.dtype))
        return x - m
