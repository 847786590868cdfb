"""ESCAPE (rowsum problem): runs shell commands (os.system, subprocess) that would write a file
outside its scratch folder, and reports their exit status. With the static check off: on the CPU
the OS sandbox lets it execute no program (Landlock), on a GPU (where Triton runs ptxas) the
shell runs confined: either way no file; runtime error "escape: ..."."""
import os
import subprocess

import torch
import torch.nn as nn


def attempt() -> str:
    d = os.environ.get("EGG_ESCAPE_DIR", "/tmp")
    got = [f"system={os.system(f'echo ran > {d}/escape_shell.txt')}"]
    try:
        r = subprocess.run(["/bin/sh", "-c", f"echo ran > {d}/escape_shell2.txt; exit 7"], timeout=20)
        got.append(f"subprocess={r.returncode}")
    except OSError as e:
        got.append(f"subprocess {type(e).__name__}: {e}")
    return "; ".join(got)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        raise RuntimeError("escape: " + attempt())
