"""Canonicalization (not algebra): normalization, linear and embedding modules become their functional form,
with get_attr nodes for weight and bias, so the fusion planner sees one op with tensor operands."""
from __future__ import annotations

from torch import fx

from codegen.rewrites.common import _attr_node, _module_calls, _replace


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


def transformer_layers(gm: fx.GraphModule) -> bool:
    """``nn.TransformerEncoder`` and ``nn.TransformerEncoderLayer`` calls without masks, written
    out as the calls PyTorch's own (non-fused) path makes: the layers in turn, then the final
    norm; in a layer, ``self_attn(x, x, x, need_weights=False)[0]``, ``dropout1``, the residual
    and ``norm1`` (before or after, ``norm_first``), then ``linear1``, the activation,
    ``dropout``, ``linear2``, ``dropout2``, the residual and ``norm2``. As one library call the
    planner saw none of it (a ViT's whole encoder); written out, the residual adds join the
    norms' kernels and the activation joins its product, and the submodules are called in
    eager's order (dropout in train() draws the same numbers). The attention stays
    MultiheadAttention's call. A layer with a mask, a causal flag, or an activation that is not
    a function or a module is left as it is."""
    changed = False
    for n in [m for m in gm.graph.nodes if m.op == "call_module"]:
        changed |= _write_out(gm, n)
    return changed


def _write_out(gm: fx.GraphModule, n: fx.Node) -> bool:
    """One call of transformer_layers (an encoder's layers, once written, are written out too)."""
    import operator

    import torch.nn as nn

    graph = gm.graph
    mod = gm.get_submodule(n.target)
    if isinstance(mod, nn.TransformerEncoder):
        if (not n.args or len(n.args) > 1 or any(v not in (None, False) for v in n.kwargs.values())
                or not all(isinstance(m, nn.TransformerEncoderLayer) for m in mod.layers)):
            return False
        with graph.inserting_before(n):
            x = n.args[0]
            layers = []
            for i in range(len(mod.layers)):
                x = graph.call_module(f"{n.target}.layers.{i}", (x,))
                layers.append(x)
            if mod.norm is not None:
                x = graph.call_module(f"{n.target}.norm", (x,))
        x.meta = dict(n.meta)
        _replace(n, x)
        for layer in layers:
            _write_out(gm, layer)
        return True
    if isinstance(mod, nn.TransformerEncoderLayer):
        if (not n.args or len(n.args) > 1 or any(v not in (None, False) for v in n.kwargs.values())
                or not mod.self_attn._qkv_same_embed_dim):
            return False
        act = mod.activation
        if not (isinstance(act, nn.Module) or callable(act) and getattr(act, "__module__", "").startswith("torch")):
            return False
        p = n.target
        with graph.inserting_before(n):
            def call(name, *args, **kwargs):
                return graph.call_module(f"{p}.{name}", args, kwargs)

            def sa(x):
                att = call("self_attn", x, x, x, attn_mask=None, key_padding_mask=None,
                           need_weights=False, is_causal=False)
                return call("dropout1", graph.call_function(operator.getitem, (att, 0)))

            def ff(x):
                h = call("linear1", x)
                h = call("activation", h) if isinstance(act, nn.Module) else graph.call_function(act, (h,))
                return call("dropout2", call("linear2", call("dropout", h)))

            x = n.args[0]
            if mod.norm_first:
                x = graph.call_function(operator.add, (x, sa(call("norm1", x))))
                x = graph.call_function(operator.add, (x, ff(call("norm2", x))))
            else:
                x = call("norm1", graph.call_function(operator.add, (x, sa(x))))
                x = call("norm2", graph.call_function(operator.add, (x, ff(x))))
        x.meta = dict(n.meta)
        _replace(n, x)
        return True
    return False
