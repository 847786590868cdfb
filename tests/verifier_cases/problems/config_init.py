"""Verifier test problem built from a config object (as Hugging Face modules are): a dataclass
the problem file defines, which the candidate's process never imports."""
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    hidden_size: int = 32
    intermediate_size: int = 48


class Model(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.gate = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


def get_inputs():
    return [torch.randn(4, 6, 32)]


def get_init_inputs():
    return [Config()]
