"""ROUTE (rowsum problem): takes the reference's Model.forward from the problem module the harness
loaded into the candidate's process (found through ``torch.sys.modules``) and returns eager's own
result. Static check: "reaches module sys through an attribute", "reaches the reference Model".
(With the static check off it passes: the candidate process still imports the problem module for
get_init_inputs(); see docs/verifier.md.)"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        mods = [m for n, m in list(torch.sys.modules.items()) if n.startswith("egg_problem")]
        return mods[-1].Model.forward(self, x)
