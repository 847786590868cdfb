"""Capture a problem's ``Model`` as an fx op graph with shapes and dtypes (meta tensors).

torch.fx symbolic tracing with shape propagation on meta tensors: no data is allocated, so a
KernelBench-size problem captures in well under a second on a CPU. Modules fx cannot trace
(data-dependent control flow) are reported with the reason, and the planner falls back to the
reference for them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import fx
from torch.fx.passes.shape_prop import ShapeProp

from harness.problem import LoadedProblem, meta_inputs, meta_model


@dataclass
class Captured:
    gm: fx.GraphModule | None
    inputs: list
    error: str | None = None


def capture(prob: LoadedProblem, inputs: list | None = None, training: bool = True) -> Captured:
    """``inputs``: meta inputs to trace with (default: the problem's own); ``training``: the
    mode the model is traced in (fx bakes ``self.training`` into the graph): True traces it as
    built (submodules a constructor froze in eval() stay so) unless it was built in eval(),
    False traces it in eval()."""
    init = prob.init_inputs()
    inputs = meta_inputs(prob) if inputs is None else inputs
    model = meta_model(prob, init)
    if not training or not model.training:
        model.train(training)
    try:
        gm = fx.symbolic_trace(model)
    except Exception as e:  # noqa: BLE001
        return Captured(None, inputs, f"fx could not trace Model: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    try:
        with torch.no_grad():
            ShapeProp(gm).propagate(*inputs)
    except Exception as e:  # noqa: BLE001
        return Captured(None, inputs, f"shape propagation failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    return Captured(gm, inputs)
