"""CHEAT (noise problem): leaves the noise out. Its error against a float64 reference that drew
other numbers is about eager's, so the float64 door would let it through. Expected: mismatch
(a model that draws random numbers is held to eager's within the tolerance)."""
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return x * 2.0
