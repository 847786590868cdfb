"""Dead code and value copies: pure ops whose result reaches no output (rw-dead-code); copies of a
value nothing mutates, and the same pure op computed twice (canonical forms)."""
from __future__ import annotations

from torch import fx

from codegen.ops import classify
from codegen.rewrites.common import _op_name, _replace


#: PyTorch functions and tensor methods whose results are random draws: dropping a dead one
#: would change the random numbers every later draw in the forward gets
RANDOM_OPS = {"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout",
              "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm",
              "bernoulli", "multinomial", "normal", "poisson", "rrelu", "gumbel_softmax",
              "fractional_max_pool2d", "fractional_max_pool3d", "native_dropout"}

#: tensor methods and functions called for an effect on autograd or streams, not for a value
EFFECT_OPS = {"register_hook", "register_post_accumulate_grad_hook", "retain_grad", "record_stream",
              "backward", "grad"}


#: runtime helpers called for what they write or raise (a dead batch norm's running statistics,
#: a mask's shape check, the strides a complex view needed)
EFFECT_HELPERS = {"_egg_bn_update", "_egg_mask_fits", "_egg_complex_fits"}


def has_effect(n: fx.Node) -> bool:
    """Kept though nothing reads its result (rw-dead-code, and the emitter's last clean-up): fx's
    own rule; in-place ops, ``out=`` (fx keeps ``copy_`` into a buffer as a call_method it calls
    pure: ``self.h.copy_(x)`` would vanish); random draws (later draws depend on them); calls
    for their effect on autograd or streams; the runtime helpers of EFFECT_HELPERS; modules that
    are not pure (fx calls every module pure: a dead batch norm's statistics update in train()
    would vanish)."""
    if n.is_impure():
        return True
    if n.op == "call_module":
        gm = n.graph.owning_module
        try:
            return gm is None or not pure_module(gm.get_submodule(n.target))
        except AttributeError:
            return True
    if n.op not in ("call_method", "call_function"):
        return False
    name = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "")
    return (name.endswith("_") and not name.endswith("__") or name in RANDOM_OPS | EFFECT_OPS
            or name in EFFECT_HELPERS or "out" in n.kwargs or bool(n.kwargs.get("inplace")))


def _pure_library(n: fx.Node) -> bool:
    """A library op (one EGG has no template for: einsum, a convolution, cat, zeros_like, an
    nn module) that only computes its result: a PyTorch function, tensor method or torch.nn
    module without an effect (has_effect)."""
    if n.op == "call_function":
        mod = getattr(n.target, "__module__", None) or ""
        if not (mod == "torch" or mod.startswith("torch.")) or mod.startswith("torch.fx"):
            return False
    elif n.op not in ("call_method", "call_module"):
        return False
    return not has_effect(n)


def pure_module(m) -> bool:
    """A torch.nn module whose call only computes its result: no buffers (batch norm updates
    its running statistics in train()), not in place, no random draw."""
    import torch

    return (type(m).__module__.startswith("torch.nn.modules") and not list(m.buffers())
            and not getattr(m, "inplace", False)
            and not isinstance(m, (torch.nn.Dropout, torch.nn.Dropout1d, torch.nn.Dropout2d,
                                   torch.nn.Dropout3d, torch.nn.AlphaDropout,
                                   torch.nn.FeatureAlphaDropout, torch.nn.RReLU)))


def drop_dead_code(gm: fx.GraphModule) -> bool:
    """rw-dead-code: pure ops whose result reaches no output (Mamba-2's forward that returns only
    the final state still computes the diagonal blocks' einsum; eager pays for it)."""
    graph = gm.graph
    changed = False
    for n in reversed(list(graph.nodes)):
        if n.op in ("placeholder", "output") or n.users or has_effect(n):
            continue  # (an in-place op, a random draw: its effect is its point)
        op = classify(n, gm)
        if op.kind in ("pointwise", "reduction", "softmax", "view", "identity", "getitem", "param") \
                or op.kind == "library" and _pure_library(n):
            graph.erase_node(n)
            changed = True
    return changed


def _mutates(n: fx.Node, gm: fx.GraphModule) -> bool:
    """Could this node write into a tensor it is given (an in-place op)?"""
    import operator

    if n.op == "call_method":
        return n.target.endswith("_") and not n.target.endswith("__")
    if n.op == "call_function":
        name = getattr(n.target, "__name__", "")
        return (n.target is operator.setitem or (name.endswith("_") and not name.endswith("__"))
                or bool(n.kwargs.get("inplace")) or "out" in n.kwargs)
    if n.op == "call_module":
        return bool(getattr(gm.get_submodule(n.target), "inplace", False))
    return False


def drop_value_copies(gm: fx.GraphModule) -> bool:
    """``x.clone()`` and ``x.detach()`` are x's values: in a forward that writes into no tensor
    (no in-place op anywhere in the graph) their users read x itself, so that
    ``y = conv(x); z = y.clone().detach(); (y + b) * z`` is one kernel reading y once instead
    of a copy of y plus a kernel reading both. A copy that is an output stays (an output must
    not alias an input or another output)."""
    graph = gm.graph
    if any(_mutates(n, gm) for n in graph.nodes):
        return False
    changed = False
    for n in list(graph.nodes):
        op = classify(n, gm) if n.op in ("call_function", "call_method") else None
        if (op is None or op.kind != "identity" or n.kwargs or len(n.args) != 1
                or not isinstance(n.args[0], fx.Node) or any(u.op == "output" for u in n.users)):
            continue
        if _op_name(n) not in ("clone", "detach"):
            continue
        _replace(n, n.args[0])
        changed = True
    return changed


#: op kinds (codegen.ops) whose result depends only on their operands
_PURE_KINDS = ("pointwise", "reduction", "softmax", "view", "norm", "getitem")


def _key(a):
    """A hashable stand-in for an fx argument (nodes by identity, slices and lists by value)."""
    if isinstance(a, fx.Node):
        return ("node", id(a))
    if isinstance(a, (list, tuple)):
        return (type(a).__name__, tuple(_key(v) for v in a))
    if isinstance(a, dict):
        return ("dict", tuple(sorted((k, _key(v)) for k, v in a.items())))
    if isinstance(a, slice):
        return ("slice", _key(a.start), _key(a.stop), _key(a.step))
    return ("value", type(a).__name__, repr(a))


def common_subexpressions(gm: fx.GraphModule) -> bool:
    """The same pure op on the same operands, written twice (``x.float() * rsqrt(x.float()...)``,
    ``q.shape`` asked in two places), is computed once: the rules that match a value by identity
    (the norm's input is the value it squares) see one value. Only where nothing in the forward
    writes into a tensor (a value read before and after an in-place op differs), never a random
    draw or a module call, and never two outputs made one (an output must not alias another)."""
    graph = gm.graph
    if any(_mutates(n, gm) for n in graph.nodes):
        return False
    seen: dict = {}
    changed = False
    for n in list(graph.nodes):
        if n.op not in ("call_function", "call_method") or has_effect(n) or _op_name(n) in RANDOM_OPS:
            continue
        if classify(n, gm).kind not in _PURE_KINDS:
            continue
        key = (n.op, n.target if n.op == "call_method" else id(n.target), _key(n.args), _key(n.kwargs))
        first = seen.get(key)
        if first is None:
            seen[key] = n
            continue
        if any(u.op == "output" for u in n.users) and any(u.op == "output" for u in first.users):
            continue
        n.replace_all_uses_with(first)
        graph.erase_node(n)
        changed = True
    return changed
