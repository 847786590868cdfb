"""Losses decomposed into the ops the planner fuses (rw-loss-decompose; codegen.losses)."""
from __future__ import annotations

from torch import fx

from codegen.ops import classify, node_dtype, node_shape
from codegen.rewrites.common import (_attr_node, _bound, _erase_unused_above, _float, _live, _replace,
                                     _sub_operands)


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


#: the ignore_index of the per-token forms' cross_entropy. The gather they replace raises for
#: every target outside [0, V); so does cross_entropy (the library call and the decomposition's
#: gather; the LM-head op gives NaN: rw-linear-cross-entropy) except at its ignore_index, which
#: gives 0. No int64 is out of reach, so the least one: no index arithmetic of a real program
#: lands there, and -100, the default that padded labels hold, still raises as in eager
NO_IGNORE = -2 ** 63


def cross_entropy_spellings(gm: fx.GraphModule) -> bool:
    """Cross-entropy written the other ways users write it, as ``F.cross_entropy``, so that
    rw-loss-decompose and rw-linear-cross-entropy read one form:

    - ``F.nll_loss(F.log_softmax(z, 1), t, ...)`` (or an ``nn.NLLLoss`` module's call;
      log_softmax as a method, of torch or F, with ``dtype=``, or an ``nn.LogSoftmax``) is
      ``F.cross_entropy(z, t, ...)`` with the same weight / ignore_index / reduction: torch
      defines cross_entropy so;
    - per-token log-probabilities (RLHF / DPO code): ``log_softmax(z, -1).gather(-1,
      t.unsqueeze(-1))`` (or ``t[..., None]``; squeezed or not), and TRL's
      ``selective_log_softmax``: ``gather(z, -1, t.unsqueeze(-1)).squeeze(-1) - logsumexp(z,
      -1)``, are ``-F.cross_entropy(z.reshape(-1, V), t.reshape(-1), reduction='none')`` in t's
      shape (unsqueezed where the gather's was not squeezed), with ignore_index NO_IGNORE.

    z floating with its shape known from the trace, t int64 of z's shape but the last dim, the
    same z node throughout, the log-softmax, index, gather and logsumexp read by the pattern
    alone and no in-place op between its first node and its last; anything else keeps the
    graph."""
    changed = False
    for n in _live(gm.graph):
        changed |= _nll_of_log_softmax(gm, n) or _picked_log_prob(gm, n) or _picked_minus_lse(gm, n)
    return changed


def _log_softmax(n, gm: fx.GraphModule):
    """(z, dim >= 0, dtype or None) of a log_softmax over one dim of a floating z, else None."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    if not isinstance(n, fx.Node):
        return None
    if n.op == "call_module":
        mod = gm.get_submodule(n.target)
        if type(mod) is not nn.LogSoftmax or n.kwargs or len(n.args) != 1:
            return None
        z, dim, dtype = n.args[0], mod.dim, None
    elif (n.op == "call_function" and n.target in (torch.log_softmax, F.log_softmax,
                                                    torch.special.log_softmax)) \
            or (n.op == "call_method" and n.target == "log_softmax"):
        if not n.args or set(n.kwargs) - {"dim", "dtype", "_stacklevel"}:
            return None
        z, rest = n.args[0], list(n.args[1:])
        dim = rest.pop(0) if rest else n.kwargs.get("dim")
        if n.target is F.log_softmax and rest and isinstance(rest[0], int):
            rest.pop(0)  # F.log_softmax(input, dim, _stacklevel, dtype)
        if len(rest) > 1 or (rest and "dtype" in n.kwargs):
            return None
        dtype = rest[0] if rest else n.kwargs.get("dtype")
    else:
        return None
    shape = node_shape(z) if isinstance(z, fx.Node) else None
    if shape is None or not _float(z) or not _int(dim) or not -len(shape) <= dim < len(shape):
        return None
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        return None
    return z, dim % len(shape), dtype


def _gather(n):
    """(source, dim, index) of x.gather(dim, index) / torch.gather(x, dim, index), or of
    torch.take_along_dim(x, index, dim) where the index has the source's shape off dim (then the
    same read), else None."""
    import torch

    if isinstance(n, fx.Node) and n.op == "call_function" and n.target is torch.take_along_dim:
        return _take_along_dim(n)
    if not isinstance(n, fx.Node) or not ((n.op == "call_method" and n.target == "gather")
                                          or (n.op == "call_function" and n.target is torch.gather)):
        return None
    names = ["input", "dim", "index", "sparse_grad"]
    if len(n.args) > 3 or set(n.kwargs) - set(names[1:]):
        return None
    b = dict(zip(names, n.args))
    for k, v in n.kwargs.items():
        if k in b:
            return None
        b[k] = v
    if b.get("sparse_grad", False) is not False or not all(k in b for k in names[:3]):
        return None
    if not isinstance(b["input"], fx.Node) or not isinstance(b["index"], fx.Node) or not _int(b["dim"]):
        return None
    return b["input"], b["dim"], b["index"]


def _take_along_dim(n: fx.Node):
    b = _bound(n, ["input", "indices", ("dim", None)])
    if b is None:
        return None
    x, idx, dim = b["input"], b["indices"], b["dim"]
    if not isinstance(x, fx.Node) or not isinstance(idx, fx.Node) or not _int(dim):
        return None
    sx, si = node_shape(x), node_shape(idx)
    if sx is None or si is None or len(sx) != len(si) or not -len(sx) <= dim < len(sx) \
            or any(a != b for k, (a, b) in enumerate(zip(sx, si)) if k != dim % len(sx)):
        return None
    return x, dim, idx


def _target_of(idx: fx.Node, zshape: tuple):
    """t when idx is t.unsqueeze(-1) (torch.unsqueeze, t[..., None], t[:, None] for 1-d t), t
    an int64 tensor of zshape[:-1] read here only through idx, else None."""
    import operator

    import torch

    t = None
    k = len(zshape) - 1  # t's rank
    if (idx.op == "call_method" and idx.target == "unsqueeze") or (
            idx.op == "call_function" and idx.target is torch.unsqueeze):
        args = list(idx.args) + ([idx.kwargs["dim"]] if "dim" in idx.kwargs else [])
        if len(args) == 2 and set(idx.kwargs) <= {"dim"} and _int(args[1]) and args[1] in (-1, k):
            t = args[0]
    elif idx.op == "call_function" and idx.target is operator.getitem and len(idx.args) == 2:
        key = idx.args[1]
        if isinstance(key, tuple) and key and key[-1] is None and (
                key[:-1] == (Ellipsis,) or (len(key) == k + 1 and all(
                    s == slice(None) for s in key[:-1]))):
            t = idx.args[0]
    if not isinstance(t, fx.Node) or len(idx.users) != 1:
        return None
    if node_dtype(t) != torch.int64 or node_shape(t) != tuple(zshape[:-1]):
        return None
    return t


def _squeezed_last(g: fx.Node, rank: int):
    """The node squeezing g's last dim (g.squeeze(-1), torch.squeeze(g, -1)) when that is g's one
    reader, else None."""
    import torch

    if len(g.users) != 1:
        return None
    (s,) = g.users
    if not ((s.op == "call_method" and s.target == "squeeze")
            or (s.op == "call_function" and s.target is torch.squeeze)):
        return None
    args = list(s.args) + ([s.kwargs["dim"]] if "dim" in s.kwargs else [])
    if len(args) == 2 and set(s.kwargs) <= {"dim"} and args[0] is g and _int(args[1]) \
            and args[1] in (-1, rank - 1):
        return s
    return None


def _nll_of_log_softmax(gm: fx.GraphModule, n: fx.Node) -> bool:
    """nll_loss(log_softmax(z, class dim), t, <args>) -> cross_entropy(z, t, <args>); an
    nn.NLLLoss module's call with its weight (a buffer), ignore_index and reduction."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    module = None
    if n.op == "call_module" and len(n.args) == 2 and not n.kwargs:
        module = gm.get_submodule(n.target)
        if type(module) is not nn.NLLLoss:
            return False
    elif not (n.op == "call_function" and n.target is F.nll_loss and len(n.args) >= 2):
        return False
    logp, t = n.args[0], n.args[1]
    ls = _log_softmax(logp, gm)
    if ls is None or len(logp.users) != 1 or not isinstance(t, fx.Node):
        return False
    z, dim, dtype = ls
    shape = node_shape(z)
    if dim != (0 if len(shape) == 1 else 1) or node_dtype(t) != torch.int64 or node_shape(t) is None \
            or not _no_writes_between(logp, n, gm):
        return False
    graph = gm.graph
    with graph.inserting_before(n):
        z = _cast(graph, z, dtype)
        if module is None:
            args, kwargs = (z, t, *n.args[2:]), dict(n.kwargs)
        else:
            kwargs = {"ignore_index": module.ignore_index, "reduction": module.reduction}
            if module.weight is not None:
                kwargs["weight"] = _attr_node(gm, graph, f"{n.target}.weight")
            args = (z, t)
        new = graph.call_function(F.cross_entropy, args, kwargs)
    new.meta = dict(n.meta)
    _replace(n, new)
    graph.erase_node(logp)
    return True


def _picked_log_prob(gm: fx.GraphModule, n: fx.Node) -> bool:
    """log_softmax(z, -1).gather(-1, t.unsqueeze(-1))[.squeeze(-1)] -> -cross_entropy."""
    g = _gather(n)
    if g is None:
        return False
    logp, gdim, idx = g
    ls = _log_softmax(logp, gm)
    if ls is None or len(logp.users) != 1:
        return False
    z, dim, dtype = ls
    shape = node_shape(z)
    if len(shape) < 2 or dim != len(shape) - 1 or gdim not in (-1, len(shape) - 1):
        return False
    t = _target_of(idx, shape)
    if t is None:
        return False
    sq = _squeezed_last(n, len(shape))
    last = sq if sq is not None else n
    if not _no_writes_between(logp, last, gm):
        return False
    _neg_cross_entropy(gm, last, z, dtype, t, len(shape), keep_last=sq is None)
    _erase_unused_above([n, logp, idx], stop=z)
    return True


def _picked_minus_lse(gm: fx.GraphModule, n: fx.Node) -> bool:
    """gather(z, -1, t.unsqueeze(-1)).squeeze(-1) - logsumexp(z, -1) -> -cross_entropy (and the
    unsqueezed pair: gather(...) - logsumexp(z, -1, keepdim=True)); the other way round,
    logsumexp(z, -1) - gather(...), the loss itself, -> cross_entropy."""
    if n.op not in ("call_function", "call_method"):
        return False
    ops = _sub_operands(gm, n)
    if ops is None:
        return False
    return _picked_and_lse(gm, n, *ops, negate=True) or _picked_and_lse(gm, n, *reversed(ops), negate=False)


def _picked_and_lse(gm: fx.GraphModule, n: fx.Node, picked, lse, negate: bool) -> bool:
    if not isinstance(picked, fx.Node) or not isinstance(lse, fx.Node):
        return False
    sq = None
    g = _gather(picked)
    if g is None and picked.op in ("call_method", "call_function") and picked.args:
        sq, g = picked, _gather(picked.args[0])
    if g is None:
        return False
    z, gdim, idx = g
    gnode = sq.args[0] if sq is not None else picked
    shape = node_shape(z)
    if shape is None or len(shape) < 2 or not _float(z) or gdim not in (-1, len(shape) - 1):
        return False
    if sq is not None and _squeezed_last(gnode, len(shape)) is not sq:
        return False
    op = classify(lse, gm)
    if op.kind != "reduction" or op.name != "logsumexp" or op.operands[0] is not z \
            or set(op.p) - {"dim", "keepdim"} or len(lse.users) != 1:
        return False
    d = op.p.get("dim")
    d = d[0] if isinstance(d, (list, tuple)) and len(d) == 1 else d
    if not _int(d) or d not in (-1, len(shape) - 1) or bool(op.p.get("keepdim")) != (sq is None):
        return False
    # the gather read by the squeeze alone, the squeeze (or the gather) and lse by n alone
    if set(gnode.users) != {sq if sq is not None else n} or (sq is not None and set(sq.users) != {n}):
        return False
    t = _target_of(idx, shape)
    first = min((gnode, lse), key=_position)
    if t is None or not _no_writes_between(first, n, gm):
        return False
    _neg_cross_entropy(gm, n, z, None, t, len(shape), keep_last=sq is None, negate=negate)
    _erase_unused_above([picked, lse, gnode, idx], stop=z)
    return True


def _neg_cross_entropy(gm: fx.GraphModule, n: fx.Node, z: fx.Node, dtype, t: fx.Node, rank: int,
                       keep_last: bool, negate: bool = True) -> None:
    """Replace n by -cross_entropy(z [.to(dtype)] as [-1, V] rows, t flat, reduction none)
    reshaped to t's shape (with a trailing size-1 dim when keep_last), the way a user writes it
    (not negated with ``negate=False``: the loss itself, logsumexp minus the picked logit).
    Negated after the reshape: a reduction of the result (a mean, a masked sum) takes the
    negation into its prologue, which the fusion planner does not do across a view (before the
    reshape, the negation of the LM-head op's rows would be a kernel of its own)."""
    import operator

    import torch.nn.functional as F

    graph = gm.graph
    with graph.inserting_before(n):
        z = _cast(graph, z, dtype)
        zf, tf = z, t
        if rank != 2:
            v = graph.call_function(operator.getitem, (graph.call_function(getattr, (z, "shape")), -1))
            zf = graph.call_method("reshape", (z, -1, v))
            tf = graph.call_method("reshape", (t, -1))
        out = graph.call_function(F.cross_entropy, (zf, tf),
                                  {"reduction": "none", "ignore_index": NO_IGNORE})
        if rank != 2:
            out = graph.call_method("reshape", (out, graph.call_function(getattr, (t, "shape"))))
        if negate:
            out = graph.call_function(operator.neg, (out,))
        if keep_last:
            out = graph.call_method("unsqueeze", (out, -1))
    _replace(n, out)


def _cast(graph: fx.Graph, z: fx.Node, dtype) -> fx.Node:
    """z as log_softmax(z, dtype=dtype) reads it: cast first (z.float() for float32)."""
    import torch

    if dtype is None or dtype == node_dtype(z):
        return z
    if dtype == torch.float32:
        return graph.call_method("float", (z,))
    return graph.call_method("to", (z, dtype))


def _position(n: fx.Node) -> int:
    return list(n.graph.nodes).index(n)


def _no_writes_between(first: fx.Node, last: fx.Node, gm: fx.GraphModule) -> bool:
    """No in-place op from first to last (the rewrite reads z and t at last, the pattern read z
    at first)."""
    from codegen.rewrites.deadcode import _mutates

    m = first
    while m is not last:
        if m.op == "output":
            return False
        if _mutates(m, gm):
            return False
        m = m.next
    return True


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
