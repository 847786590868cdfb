"""HONEST (int_quant problem): the quotient kept in fp32 (eager rounds it to bf16 before the
round). Its integers differ from eager's at ~700 of 16384 elements, each by one, and from
float64's at fewer elements than eager's: they pass by the decision regime. Expected: passed."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        scale = x.abs().mean(dim=-1, keepdim=True) / 16
        q = torch.round(x.float() / scale.float()).clamp(-127, 127).to(torch.int8)
        return q, scale
