"""Memory layout on the op graph: convolutions in channels-last order (principle
mem-conv-channels-last).

``channels_last(gm)`` rewrites the captured graph in place: every 2-d/3-d convolution on a
floating tensor gets its input converted to channels-last order (``_egg_channels_last``, a no-op
when it already is), its weight re-laid out once at construction (the returned parameter names,
for ``_egg_params_channels_last`` in ``ModelNew.__init__``), and its result handed on in that
order only to consumers that handle any order at the speed of the standard one (pointwise
chains, which the pointwise template walks in memory order, and torch ops). Anything else
(reductions, norms, pools, views) and every 4-d/5-d result of the model get the standard order
back (``_egg_standard_layout``), so callers see eager's layout.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import fx

from codegen import ops as O
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


def _needs_standard(gm: fx.GraphModule, conv: fx.Node) -> bool:
    """Does a consumer reached through pointwise ops need the standard order?"""
    seen, todo = set(), list(conv.users)
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
            continue  # x.shape, x.size(0): no data read
        if op.kind not in LAYOUT_FREE:
            return True
        if op.kind in ("pointwise", "identity"):
            todo.extend(u.users)
    return False


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
        if _needs_standard(gm, n):
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
