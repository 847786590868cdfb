"""Small fast runs for the time-travel, review and resume tests: a tiny problem (one fused
pointwise kernel), one verification trial, short timing."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

from tests.conftest import ROOT

TINY = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x) * 2.0 + 1.0


def get_inputs():
    return [torch.randn(8, 33)]


def get_init_inputs():
    return []
'''

#: settings that keep a CPU run to a few seconds
FAST = {"device": "cpu", "trials": 1, "timing_rep_ms": 10.0}


def write_tiny(folder: pathlib.Path, name: str = "tiny") -> pathlib.Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / f"{name}.py"
    p.write_text(TINY)
    return p


def egg_env() -> dict:
    return dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT), COLUMNS="200",
                EGG_TIMING_REP_MS="10")


def egg_cmd(*args) -> list[str]:
    return [sys.executable, "-m", "graph.cli", *map(str, args)]


def egg(*args, timeout=300, input=None) -> subprocess.CompletedProcess:
    return subprocess.run(egg_cmd(*args), capture_output=True, text=True, env=egg_env(),
                          timeout=timeout, input=input, cwd=ROOT)
