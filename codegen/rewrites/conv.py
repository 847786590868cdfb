"""Convolutions: the bias add moved into the consumer group as an elementwise prologue
(rw-conv-bias-epilogue)."""
from __future__ import annotations

from torch import fx

from codegen.layout import CONV_FUNCTIONAL
from codegen.ops import classify, node_shape
from codegen.rewrites.common import _attr_node, _float, _live, _replace


#: consumer kinds whose Triton group can take an elementwise prologue (the bias add)
BIAS_FUSABLE = {"pointwise", "reduction", "norm", "softmax", "pool"}


def conv_bias_epilogue(gm: fx.GraphModule) -> bool:
    """rw-conv-bias-epilogue: a convolution module with bias whose every consumer is a fused
    kernel becomes the bias-free convolution plus a broadcast add of the bias. PyTorch adds a
    cuDNN convolution's bias in a separate pass over the whole result (output.add_(bias)); as an
    elementwise op the add joins the consumer's kernel: one read and one write of the result
    less, the same fp32 addition."""
    import operator

    import torch.nn as nn

    graph = gm.graph
    changed = False
    for n in _live(graph):
        if n.op != "call_module" or len(n.args) != 1 or n.kwargs:
            continue
        mod = gm.get_submodule(n.target)
        fn = CONV_FUNCTIONAL.get(type(mod))
        shape = node_shape(n)
        if (fn is None or mod.bias is None or mod.padding_mode != "zeros" or not _float(n)
                or not shape or not n.users
                or not all(classify(u, gm).kind in BIAS_FUSABLE for u in n.users)):
            continue
        with graph.inserting_before(n):
            w = _attr_node(gm, graph, f"{n.target}.weight")
            b = _attr_node(gm, graph, f"{n.target}.bias")
            if isinstance(mod, nn.modules.conv._ConvTransposeNd):
                args = (n.args[0], w, None, mod.stride, mod.padding, mod.output_padding, mod.groups,
                        mod.dilation)
            else:
                args = (n.args[0], w, None, mod.stride, mod.padding, mod.dilation, mod.groups)
            conv = graph.create_node("call_function", fn, args, name=f"{n.name}_nobias")
            view = graph.call_method("view", (b, *([1, shape[1]] + [1] * (len(shape) - 2))))
            v = graph.call_function(operator.add, (conv, view))
        _replace(n, v)
        changed = True
    return changed
