"""Memory layout on the op graph: convolutions in channels-last order (principle
mem-conv-channels-last).

``channels_last(gm)`` rewrites the captured graph in place: every 2-d/3-d convolution on a
floating tensor gets its input converted to channels-last order (``_egg_channels_last``, a no-op
when it already is), its weight re-laid out once at construction (the returned parameter names,
for ``_egg_params_channels_last`` in ``ModelNew.__init__``), and its result handed on in that
order only to consumers that handle any order at the speed of the standard one (pointwise
chains, which the pointwise template walks in memory order, and torch ops). When the pointwise
chain ends in reductions (sum, mean, amax, amin, logsumexp, max/min over dims, softmax), the
chain and the reductions are re-expressed over the (N, *S, C) view of the result, a contiguous
view: the chain fuses into the reduction as its prologue and reads the result once, where a
conversion back would read and write it once more. Anything else (norms, pools, views) and every
4-d/5-d result of the model get the standard order back (``_egg_standard_layout``), so callers
see eager's layout.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import fx

from codegen import ops as O
from codegen.fusion import norm_dims
from knowledge.templates import _runtime as R

#: convolution modules and their functional forms (conv_nodes keeps the 2-d and 3-d ones)
CONV_FUNCTIONAL = {nn.Conv1d: F.conv1d, nn.Conv2d: F.conv2d, nn.Conv3d: F.conv3d,
                   nn.ConvTranspose1d: F.conv_transpose1d, nn.ConvTranspose2d: F.conv_transpose2d,
                   nn.ConvTranspose3d: F.conv_transpose3d}
CONV_MODULES = tuple(CONV_FUNCTIONAL)
CONV_FUNCTIONS = set(CONV_FUNCTIONAL.values()) | {torch.conv2d, torch.conv3d,
                                                  torch.conv_transpose2d, torch.conv_transpose3d}
FLOATS = (torch.float32, torch.float16, torch.bfloat16)
#: consumer kinds that take a channels-last tensor at full speed
LAYOUT_FREE = {"pointwise", "library", "identity"}
#: view-kind consumers that only ask for the shape
SHAPE_QUERIES = {"size", "dim", "numel"}
SHAPE_ATTRS = {"shape", "dtype", "device", "ndim"}


def _conv_input(n: fx.Node):
    return n.args[0] if n.args else n.kwargs.get("input")


def conv_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    """The graph's 2-d/3-d convolutions on floating tensors."""
    out = []
    for n in gm.graph.nodes:
        is_conv = ((n.op == "call_module" and isinstance(gm.get_submodule(n.target), CONV_MODULES))
                   or (n.op == "call_function" and n.target in CONV_FUNCTIONS))
        x = _conv_input(n) if is_conv else None
        if (isinstance(x, fx.Node) and len(O.node_shape(x) or ()) in (4, 5)
                and O.node_dtype(x) in FLOATS):
            out.append(n)
    return out


def _insert(gm: fx.GraphModule, fn, x: fx.Node, before: fx.Node | None = None) -> fx.Node:
    g = gm.graph
    tag = "cl" if fn is R._egg_channels_last else "std"
    with (g.inserting_before(before) if before is not None else g.inserting_after(x)):
        # named after the value, not the function: the generated forward calls the function
        new = g.create_node("call_function", fn, (x,), name=f"{x.name}_{tag}")
    new.meta = dict(x.meta)
    return new


def _reached(gm: fx.GraphModule, conv: fx.Node):
    """(node, its NOp) for every consumer reached from the convolution through pointwise ops
    (those are yielded too, and walked through); results and shape queries (x.shape,
    x.size(0): no data read) are skipped."""
    seen, todo = {conv}, list(conv.users)
    while todo:
        u = todo.pop()
        if u in seen:
            continue
        seen.add(u)
        if u.op == "output":
            continue
        op = O.classify(u, gm)
        if op.kind == "view" and (op.name in SHAPE_QUERIES or (
                op.name == "getattr" and u.args[1:2] and u.args[1] in SHAPE_ATTRS)):
            continue
        yield u, op
        if op.kind in ("pointwise", "identity"):
            todo.extend(u.users)


def _needs_standard(gm: fx.GraphModule, conv: fx.Node) -> bool:
    """Does a consumer reached through pointwise ops need the standard order?"""
    return any(op.kind not in LAYOUT_FREE for _u, op in _reached(gm, conv))


#: reductions that run on the channels-last data itself, over its (N, *S, C) view
VIEW_REDUCTIONS = {"sum", "mean", "amax", "amin", "logsumexp", "max_dim", "min_dim", "softmax",
                   "log_softmax"}


def _adaptive_pool(n: fx.Node) -> bool:
    """F.adaptive_avg_poolNd (classified as a mean over space when the size is 1)."""
    return n.op == "call_function" and O.FUNCTIONS.get(n.target, "").startswith("adaptive_avg_pool")


def _nhwc_chain(gm: fx.GraphModule, conv: fx.Node):
    """(chain, reductions) when every consumer reached from the convolution through pointwise ops
    is a reduction of VIEW_REDUCTIONS (with integer dims), a layout-free op or a result, and at
    least one is such a reduction; None otherwise. The chain holds the pointwise ops."""
    nd = len(O.node_shape(conv) or ())
    chain: list[fx.Node] = []
    reds: list[fx.Node] = []
    for u, op in _reached(gm, conv):
        if op.kind in ("pointwise", "identity"):
            if O.node_shape(u) is None or len(O.node_shape(u)) != nd or any(
                    len(O.node_shape(t) or ()) > nd for t in op.tensor_inputs):
                return None
            chain.append(u)
        elif (op.kind in ("reduction", "softmax") and op.name in VIEW_REDUCTIONS
              and u.op in ("call_function", "call_method")):
            dims = op.p.get("dim")
            positional = "dim" in u.kwargs or len(u.args) > 1 or _adaptive_pool(u)
            if (dims is None or dims in ((), []) or norm_dims(dims, nd) is None
                    or (op.operands[0] is not conv and op.operands[0] not in chain)
                    or not positional):
                return None
            reds.append(u)
        elif op.kind != "library":
            return None
    return (chain, reds) if reds else None


def _meta(node: fx.Node, shape, dtype) -> None:
    from torch.fx.passes.shape_prop import _extract_tensor_metadata

    node.meta["tensor_meta"] = _extract_tensor_metadata(torch.empty(shape, dtype=dtype, device="meta"))


def _view(g: fx.Graph, x: fx.Node, order: list[int]) -> fx.Node:
    """x.permute(*order), inserted right after x, with its shape recorded."""
    with g.inserting_after(x):
        v = g.call_method("permute", (x, *order))
    sh = O.node_shape(x)
    _meta(v, [sh[i] for i in order], O.node_dtype(x))
    return v


def _to_nhwc(gm: fx.GraphModule, conv: fx.Node, chain: list[fx.Node], reds: list[fx.Node]) -> None:
    """Re-express conv -> pointwise chain -> reductions over the (N, *S, C) view of the
    channels-last result (a contiguous view): the chain's other operands get the same view, each
    reduction's dims are mapped into it and its result is viewed back in the logical order, and
    every other consumer of a chain value sees it viewed back. The pointwise chain then fuses
    into the reduction as its prologue, one pass over the convolution's result instead of a
    layout conversion and a pass."""
    g = gm.graph
    nd = len(O.node_shape(conv))
    perm = [0, *range(2, nd), 1]
    inv = [perm.index(i) for i in range(nd)]
    members = set(chain)
    outside = {u for n in [conv] + chain for u in n.users
               if u not in members and u not in reds}
    back = {}  # chain value -> its logical-order view, for consumers outside the chain
    conv_v = _view(g, conv, perm)
    new_of = {conv: conv_v}
    position = {n: i for i, n in enumerate(g.nodes)}
    for m in sorted(chain, key=position.__getitem__):
        for a in m.all_input_nodes:
            if a in new_of:
                m.replace_input_with(a, new_of[a])
            elif a not in members and len(O.node_shape(a) or ()) >= 1:
                with g.inserting_before(m):
                    t = g.create_node("call_function", R._egg_nhwc_operand, (a, nd),
                                      name=f"{a.name}_nhwc")
                sh = (1,) * (nd - len(O.node_shape(a))) + tuple(O.node_shape(a))
                _meta(t, [sh[i] for i in perm], O.node_dtype(a))
                m.replace_input_with(a, t)
        sh = O.node_shape(m)
        _meta(m, [sh[i] for i in perm], O.node_dtype(m))
        new_of[m] = m
    for x in [conv] + chain:
        for u in [u for u in outside if x in u.all_input_nodes]:
            if x not in back:
                back[x] = _view(g, new_of[x], inv)
            u.replace_input_with(x, back[x])
    for r in reds:
        _reduce_in_view(gm, r, new_of, perm, nd)


def _reduce_in_view(gm: fx.GraphModule, r: fx.Node, new_of: dict, perm: list[int], nd: int) -> None:
    """Point reduction r at the (N, *S, C) view of its input, with its dims mapped, and view its
    result(s) back in the logical order."""
    g = gm.graph
    op = O.classify(r, gm)
    src = op.operands[0]
    dims = op.p["dim"]
    new_dims = sorted(perm.index(d) for d in norm_dims(dims, nd))
    keep = bool(op.p.get("keepdim", False)) or op.kind == "softmax"
    r.replace_input_with(src, new_of[src])
    nd_dim = new_dims if isinstance(dims, (list, tuple)) else new_dims[0]
    if _adaptive_pool(r):  # a global average pool: its second argument is a size, not dims
        r.target, r.args, r.kwargs = torch.mean, (new_of[src], nd_dim), {"keepdim": True}
    elif "dim" in r.kwargs:
        r.update_kwarg("dim", nd_dim)
    else:
        args = list(r.args)
        args[1] = nd_dim
        r.args = tuple(args)
    # the reduced result's dims, in the view's order, and the permutation back to logical order
    kept_view = [perm[i] for i in range(nd) if keep or i not in new_dims]
    order_back = [kept_view.index(d) for d in sorted(kept_view)]
    vshape = [O.node_shape(new_of[src])[i] for i in range(nd)]
    out_shape = [1 if i in new_dims else s for i, s in enumerate(vshape)] if keep else \
        [s for i, s in enumerate(vshape) if i not in new_dims]
    values = [r] if op.name not in ("max_dim", "min_dim") else list(r.users)
    for v in values:
        _meta(v, out_shape, O.node_dtype(v))
        if order_back == list(range(len(order_back))):
            continue
        b = _view(g, v, order_back)
        v.replace_all_uses_with(b, delete_user_cb=lambda u, b=b: u is not b)


def channels_last(gm: fx.GraphModule) -> list[str]:
    """Rewrite the graph's convolutions to channels-last (module docstring); returns the names of
    the parameters to re-lay out at construction. No convolution: the graph is left as it is."""
    convs = conv_nodes(gm)
    params: list[str] = []
    for n in convs:
        x = _conv_input(n)
        n.replace_input_with(x, _insert(gm, R._egg_channels_last, x, before=n))
        if n.op == "call_module":
            params.append(f"{n.target}.weight")
        else:
            w = n.args[1] if len(n.args) > 1 else n.kwargs.get("weight")
            if isinstance(w, fx.Node) and w.op == "get_attr":
                params.append(str(w.target))
            elif isinstance(w, fx.Node):
                n.replace_input_with(w, _insert(gm, R._egg_channels_last, w, before=n))
        viewed = _nhwc_chain(gm, n)
        if viewed is not None:
            _to_nhwc(gm, n, *viewed)
        elif _needs_standard(gm, n):
            std = _insert(gm, R._egg_standard_layout, n)
            n.replace_all_uses_with(std, delete_user_cb=lambda u, s=std: u is not s)
    if convs:
        _standard_results(gm, next(m for m in gm.graph.nodes if m.op == "output"))
    gm.graph.lint()
    gm.recompile()
    return list(dict.fromkeys(params))


def _standard_results(gm: fx.GraphModule, out: fx.Node) -> None:
    """Every 4-d/5-d result leaves in the standard order (a no-op where it already is)."""
    def fix(a):
        if isinstance(a, fx.Node) and len(O.node_shape(a) or ()) in (4, 5):
            return _insert(gm, R._egg_standard_layout, a, before=out)
        return a
    out.args = (fx.node.map_aggregate(out.args[0], fix),)


def init_lines(params: list[str]) -> list[str]:
    return [f"_egg_params_channels_last(self, {params!r})"] if params else []
