"""Algebraic rewrites on the captured fx graph (stage 1). Each rule is general, has a principle
entry in knowledge/principles (same id), and returns whether it changed the graph.
The rewritten program is verified like any candidate."""
from __future__ import annotations

from torch import fx

from codegen.ops import classify


def drop_dead_code(gm: fx.GraphModule) -> bool:
    """rw-dead-code: pure ops whose result reaches no output."""
    graph = gm.graph
    changed = False
    for n in reversed(list(graph.nodes)):
        if n.op in ("placeholder", "output") or n.users:
            continue
        op = classify(n, gm)
        if op.kind in ("pointwise", "reduction", "softmax", "view", "identity", "getitem", "param"):
            graph.erase_node(n)
            changed = True
    return changed


RULES = [("rw-dead-code", drop_dead_code)]


def apply_all(gm: fx.GraphModule) -> list[str]:
    applied = []
    for rid, fn in RULES:
        if fn(gm):
            applied.append(rid)
    if applied:
        gm.graph.lint()
    return applied


# ---------------------------------------------------------------------------------------------
# Canonicalization (not algebra): normalization modules become their functional form, with
# get_attr nodes for weight and bias, so the fusion planner sees one op with tensor operands.
def _attr_node(gm: fx.GraphModule, graph: fx.Graph, target: str):
    from torch.fx.passes.shape_prop import _extract_tensor_metadata

    node = graph.get_attr(target)
    try:
        t = gm.get_parameter(target)
    except AttributeError:
        t = gm.get_buffer(target)
    node.meta["tensor_meta"] = _extract_tensor_metadata(t)
    return node


def _module_calls(gm: fx.GraphModule):
    """(node, module) for every call of a submodule on one positional argument."""
    for n in list(gm.graph.nodes):
        if n.op == "call_module" and len(n.args) == 1 and not n.kwargs:
            yield n, gm.get_submodule(n.target)


def norm_modules_to_functionals(gm: fx.GraphModule) -> bool:
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
            else:
                continue
        new.meta = dict(n.meta)
        n.replace_all_uses_with(new)
        graph.erase_node(n)
        changed = True
    return changed


def _flip_dims(n: fx.Node) -> list[int] | None:
    if n.op == "call_method" and n.target == "flip":
        dims = list(n.args[1:]) or list(n.kwargs.values())
    elif n.op == "call_function" and getattr(n.target, "__name__", "") == "flip":
        dims = list(n.args[1:]) or [n.kwargs.get("dims")]
    else:
        return None
    if len(dims) == 1 and isinstance(dims[0], (list, tuple)):
        dims = list(dims[0])
    return dims if all(isinstance(d, int) for d in dims) else None


def flipped_scans(gm: fx.GraphModule) -> bool:
    """x.flip(d).cumsum(d).flip(d) -> a reverse scan (no flip copies)."""
    from codegen import ops as O

    graph = gm.graph
    changed = False
    for n in list(graph.nodes):
        f1 = _flip_dims(n)
        if f1 is None or len(f1) != 1 or len(n.users) != 1:
            continue
        scan = next(iter(n.users))
        kind = scan.target if scan.op == "call_method" else getattr(scan.target, "__name__", "")
        if kind not in ("cumsum", "cumprod") or len(scan.users) != 1:
            continue
        sdim = scan.args[1] if len(scan.args) > 1 else scan.kwargs.get("dim")
        f2 = next(iter(scan.users))
        shape = O.node_shape(n)
        if shape is None or not isinstance(sdim, int) or _flip_dims(f2) is None:
            continue
        nd = len(shape)
        if not (f1[0] % nd == sdim % nd == _flip_dims(f2)[0] % nd) or len(_flip_dims(f2)) != 1:
            continue
        fn = O.reverse_cumsum if kind == "cumsum" else O.reverse_cumprod
        with graph.inserting_before(f2):
            new = graph.create_node("call_function", fn, (n.args[0], sdim), name=f"{kind}_reverse")
        new.meta = dict(f2.meta)
        f2.replace_all_uses_with(new)
        for dead in (f2, scan, n):
            graph.erase_node(dead)
        changed = True
    return changed


def batchnorm_decompose(gm: fx.GraphModule) -> bool:
    """nn.BatchNorm{1,2,3}d as primitives (alg-batchnorm-decompose): channel statistics (one
    kernel), the module's running-statistics bookkeeping (torch, on C values), and elementwise
    normalization that the pointwise fusion merges with its neighbours. Eval mode (or
    track_running_stats with training off) normalizes with the running statistics."""
    import operator

    import torch
    import torch.nn as nn

    from codegen import ops as O

    graph = gm.graph
    changed = False
    for n, mod in _module_calls(gm):
        if not isinstance(mod, (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)):
            continue
        x = n.args[0]
        shape = O.node_shape(x)
        if shape is None or len(shape) < 2:
            continue
        C = shape[1]
        view = [1, C] + [1] * (len(shape) - 2)
        use_batch = mod.training or mod.running_mean is None
        with graph.inserting_before(n):
            if use_batch:
                st = graph.create_node("call_function", O.chanstats, (x,), name="chan_stats")
                mean = graph.call_function(operator.getitem, (st, 0))
                var = graph.call_function(operator.getitem, (st, 1))
                if mod.training and mod.track_running_stats:
                    rm = _attr_node(gm, graph, f"{n.target}.running_mean")
                    rv = _attr_node(gm, graph, f"{n.target}.running_var")
                    nbt = _attr_node(gm, graph, f"{n.target}.num_batches_tracked")
                    mean = graph.create_node("call_function", O.bn_update,
                                             (mean, var, x, rm, rv, nbt, mod.momentum), name="bn_mean")
            else:
                mean = graph.call_method("view", (_attr_node(gm, graph, f"{n.target}.running_mean"), *view))
                var = graph.call_method("view", (_attr_node(gm, graph, f"{n.target}.running_var"), *view))
            y = graph.call_function(operator.sub, (x, mean))
            y = graph.call_function(operator.mul, (y, graph.call_function(
                torch.rsqrt, (graph.call_function(operator.add, (var, mod.eps)),))))
            if mod.weight is not None:
                w = graph.call_method("view", (_attr_node(gm, graph, f"{n.target}.weight"), *view))
                y = graph.call_function(operator.mul, (y, w))
            if mod.bias is not None:
                b = graph.call_method("view", (_attr_node(gm, graph, f"{n.target}.bias"), *view))
                y = graph.call_function(operator.add, (y, b))
        n.replace_all_uses_with(y)
        graph.erase_node(n)
        changed = True
    return changed


CANONICAL = [norm_modules_to_functionals, flipped_scans, batchnorm_decompose]


def canonicalize(gm: fx.GraphModule, inputs: list | None = None) -> None:
    """Apply the canonical forms; re-propagate shapes (on meta inputs) if anything changed."""
    changed = False
    for fn in CANONICAL:
        changed |= bool(fn(gm))
    gm.graph.lint()
    if changed and inputs is not None:
        import torch
        from torch.fx.passes.shape_prop import ShapeProp

        gm.recompile()
        with torch.no_grad():
            ShapeProp(gm).propagate(*inputs)
