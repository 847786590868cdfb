"""Canonicalization (not algebra): normalization, linear and embedding modules become their functional form,
with get_attr nodes for weight and bias, so the fusion planner sees one op with tensor operands."""
from __future__ import annotations

from torch import fx

from codegen.rewrites.common import _attr_node, _module_calls


def modules_to_functionals(gm: fx.GraphModule) -> bool:
    """Norm and linear module calls as their functional forms over get_attr parameters, so
    that one op-table entry (and one template) covers both spellings."""
    import torch.nn as nn
    import torch.nn.functional as F

    graph = gm.graph
    changed = False
    for n, mod in _module_calls(gm):
        with graph.inserting_before(n):
            def wb():
                w = _attr_node(gm, graph, f"{n.target}.weight") if getattr(mod, "weight", None) is not None else None
                b = _attr_node(gm, graph, f"{n.target}.bias") if getattr(mod, "bias", None) is not None else None
                return w, b

            if isinstance(mod, nn.LayerNorm):
                w, b = wb()
                new = graph.call_function(F.layer_norm, (n.args[0], tuple(mod.normalized_shape), w, b, mod.eps))
            elif isinstance(mod, nn.GroupNorm):
                w, b = wb()
                new = graph.call_function(F.group_norm, (n.args[0], mod.num_groups, w, b, mod.eps))
            elif isinstance(mod, (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)):
                if mod.track_running_stats:
                    continue
                w, b = wb()
                new = graph.call_function(F.instance_norm, (n.args[0],),
                                          {"weight": w, "bias": b, "eps": mod.eps})
            elif hasattr(nn, "RMSNorm") and isinstance(mod, nn.RMSNorm):
                w, _ = wb()
                new = graph.call_function(F.rms_norm, (n.args[0], tuple(mod.normalized_shape), w, mod.eps))
            elif type(mod) is nn.Embedding and mod.max_norm is None:  # (max_norm renorms rows in place)
                w, _ = wb()
                new = graph.call_function(F.embedding, (n.args[0], w, mod.padding_idx))
            elif type(mod) is nn.Linear:
                w, b = wb()
                new = graph.call_function(F.linear, (n.args[0], w, b))
            else:
                continue
        new.meta = dict(n.meta)
        n.replace_all_uses_with(new)
        graph.erase_node(n)
        changed = True
    return changed
