"""ESCAPE (rowsum problem): writes a file outside its scratch folder (in the folder named by
EGG_ESCAPE_DIR, set by the test, and next to the scratch folder), then reports what happened in
its error. Caught statically (imports os, opens files); with the static check off the
OS sandbox (Landlock) refuses the writes: runtime error "escape: ... PermissionError", no file."""
import os

import torch
import torch.nn as nn


def attempt() -> str:
    got = []
    dirs = [os.environ.get("EGG_ESCAPE_DIR", "/tmp")]
    if os.path.basename(os.getcwd()).startswith("egg-candidate-"):  # its scratch: try next to it
        dirs.append(os.path.dirname(os.getcwd()))
    for d in dirs:
        path = os.path.join(d, "escape_write_outside.txt")
        try:
            with open(path, "w") as f:
                f.write("written by a candidate\n")
            got.append(f"wrote {path}")
        except OSError as e:
            got.append(f"{type(e).__name__}: {e}")
    return "; ".join(got)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        raise RuntimeError("escape: " + attempt())
