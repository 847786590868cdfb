"""Losses decomposed into the ops the planner fuses (rw-loss-decompose; codegen.losses)."""
from __future__ import annotations

from torch import fx

from codegen.ops import node_dtype, node_shape
from codegen.rewrites.common import _live, _replace


def loss_decompose(gm: fx.GraphModule) -> bool:
    """rw-loss-decompose: a loss function (functional or module) with constant arguments the
    decomposition accepts -> its definition in elementwise ops and reductions
    (codegen.losses), which the pointwise and reduction templates fuse into one or two passes."""
    from codegen import losses as LS

    graph = gm.graph
    changed = False
    for n in _live(graph):
        call = LS.call_of(n, gm)
        if call is None:
            continue
        name, tensors, kw = call
        kw = LS.normalized(kw)
        shapes = [node_shape(t) for t in tensors]
        if kw is None or any(s is None for s in shapes):
            continue
        fn, _torch_fn, accepts = LS.LOSSES[name]
        if not accepts([tuple(s) for s in shapes], [node_dtype(t) for t in tensors], kw):
            continue

        try:
            sub = _trace_loss(fn, kw, len(tensors))
        except Exception:  # noqa: BLE001 - an argument the decomposition cannot take: keep the call
            continue
        val_map = dict(zip([p for p in sub.graph.nodes if p.op == "placeholder"], tensors))
        with graph.inserting_before(n):
            out = graph.graph_copy(sub.graph, val_map)
        _replace(n, out)
        changed = True
    return changed


def _trace_loss(fn, kw: dict, n_tensors: int) -> fx.GraphModule:
    """fx graph of fn(tensors..., **kw) with kw baked in as constants."""
    import torch.nn as nn

    if n_tensors == 2:
        class Two(nn.Module):
            def forward(self, a, b):
                return fn(a, b, **kw)

        return fx.symbolic_trace(Two())

    class Three(nn.Module):
        def forward(self, a, b, c):
            return fn(a, b, c, **kw)

    return fx.symbolic_trace(Three())
