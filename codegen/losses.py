"""Loss functions as their definitions in elementwise ops and reductions (principle
rw-loss-decompose), so that the pointwise and reduction templates compute a loss in one or two
passes over its inputs instead of eager's elementwise pass, written out, then reduced.

Each entry is a plain function with the semantics of its torch.nn.functional namesake for the
arguments it accepts (``accepts`` says which: anything else keeps the library call). The rule in
codegen.rewrites traces the function with the call's constant arguments and splices its graph in
place of the call. tests/test_rewrites.py checks each against torch.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def _reduce(loss, reduction: str):
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss


def mse_loss(x, y, reduction="mean"):
    return _reduce((x - y) * (x - y), reduction)


def l1_loss(x, y, reduction="mean"):
    return _reduce(torch.abs(x - y), reduction)


def smooth_l1_loss(x, y, reduction="mean", beta=1.0):
    d = torch.abs(x - y)
    if beta == 0.0:
        return _reduce(d, reduction)
    return _reduce(torch.where(d < beta, 0.5 * d * d / beta, d - 0.5 * beta), reduction)


def huber_loss(x, y, reduction="mean", delta=1.0):
    d = torch.abs(x - y)
    return _reduce(torch.where(d < delta, 0.5 * d * d, delta * (d - 0.5 * delta)), reduction)


def kl_div(x, t, reduction="mean", log_target=False):
    if log_target:
        loss = torch.exp(t) * (t - x)
    else:  # xlogy(t, t) - t * x: 0 where t == 0
        loss = torch.where(t == 0, 0.0, t * torch.log(t)) - t * x
    if reduction == "batchmean":
        return loss.sum() / x.shape[0]
    return _reduce(loss, reduction)


def soft_margin_loss(x, y, reduction="mean"):
    return _reduce(torch.log1p(torch.exp(-y * x)), reduction)


def binary_cross_entropy_with_logits(x, y, reduction="mean"):
    # max(x, 0) - x y + log(1 + exp(-|x|)): no overflow for large |x|, as torch computes it
    return _reduce(torch.clamp(x, min=0) - x * y + torch.log1p(torch.exp(-torch.abs(x))), reduction)


def binary_cross_entropy(p, y, reduction="mean"):
    # torch clamps each log at -100 so that p = 0 or 1 gives a finite loss
    lp = torch.clamp(torch.log(p), min=-100.0)
    lq = torch.clamp(torch.log(1 - p), min=-100.0)
    return _reduce(-(y * lp + (1 - y) * lq), reduction)


def cross_entropy(x, t, reduction="mean", ignore_index=-100):
    """Class-index targets over a 2-d input: logsumexp of the row minus the target's logit,
    ignored targets excluded (the mean divides by the targets kept, as torch does)."""
    keep = t != ignore_index
    picked = torch.gather(x, 1, torch.where(keep, t, 0).unsqueeze(1)).squeeze(1)
    # logsumexp - picked: picked - logsumexp is a per-token log-probability to the canonical
    # form cross_entropy_spellings, which runs after the rules too (it would undo this)
    loss = torch.where(keep, torch.logsumexp(x, 1) - picked, 0.0)
    if reduction == "mean":
        return loss.sum() / keep.sum()
    return _reduce(loss, reduction)


def triplet_margin_loss(anchor, positive, negative, margin=1.0, p=2.0, eps=1e-6, swap=False,
                        reduction="mean"):
    """p = 2 and no swap (accepts checks): pairwise_distance(u, v) = ||u - v + eps||_2 over the
    last dim."""
    dp = anchor - positive + eps
    dn = anchor - negative + eps
    d_ap = torch.sqrt((dp * dp).sum(-1))
    d_an = torch.sqrt((dn * dn).sum(-1))
    return _reduce(torch.clamp(d_ap - d_an + margin, min=0.0), reduction)


def _same_float_shapes(shapes, dtypes) -> bool:
    return len(set(shapes)) == 1 and all(d is not None and d.is_floating_point for d in dtypes)


def _elementwise(kw, extra=()) -> bool:
    return kw.get("reduction", "mean") in ("mean", "sum", "none") and all(
        k in ("reduction", *extra) for k in kw)


#: name -> (decomposition, the torch functional, accepts(shapes, dtypes, kwargs) -> bool)
LOSSES = {
    "mse_loss": (mse_loss, F.mse_loss, lambda s, d, kw: _same_float_shapes(s, d) and _elementwise(kw)),
    "l1_loss": (l1_loss, F.l1_loss, lambda s, d, kw: _same_float_shapes(s, d) and _elementwise(kw)),
    "smooth_l1_loss": (smooth_l1_loss, F.smooth_l1_loss, lambda s, d, kw: _same_float_shapes(s, d)
                       and _elementwise(kw, ("beta",)) and float(kw.get("beta", 1.0)) >= 0),
    "huber_loss": (huber_loss, F.huber_loss, lambda s, d, kw: _same_float_shapes(s, d)
                   and _elementwise(kw, ("delta",)) and float(kw.get("delta", 1.0)) > 0),
    "kl_div": (kl_div, F.kl_div, lambda s, d, kw: _same_float_shapes(s, d) and len(s[0]) >= 1
               and kw.get("reduction", "mean") in ("mean", "sum", "none", "batchmean")
               and all(k in ("reduction", "log_target") for k in kw)),
    "soft_margin_loss": (soft_margin_loss, F.soft_margin_loss,
                         lambda s, d, kw: _same_float_shapes(s, d) and _elementwise(kw)),
    "binary_cross_entropy_with_logits": (
        binary_cross_entropy_with_logits, F.binary_cross_entropy_with_logits,
        lambda s, d, kw: _same_float_shapes(s, d) and _elementwise(kw)),
    "binary_cross_entropy": (binary_cross_entropy, F.binary_cross_entropy,
                             lambda s, d, kw: _same_float_shapes(s, d) and _elementwise(kw)),
    "cross_entropy": (cross_entropy, F.cross_entropy, lambda s, d, kw: len(s) == 2
                      and len(s[0]) == 2 and s[1] == s[0][:1] and d[0] is not None
                      and d[0].is_floating_point and d[1] == torch.int64
                      and _elementwise(kw, ("ignore_index",))),
    "triplet_margin_loss": (triplet_margin_loss, F.triplet_margin_loss,
                            lambda s, d, kw: _same_float_shapes(s, d) and len(s[0]) == 2
                            and float(kw.get("p", 2.0)) == 2.0 and not kw.get("swap", False)
                            and _elementwise(kw, ("margin", "eps", "p", "swap"))),
}

#: loss modules -> (functional name, the module's constant arguments)
MODULES = {
    nn.MSELoss: ("mse_loss", lambda m: {"reduction": m.reduction}),
    nn.L1Loss: ("l1_loss", lambda m: {"reduction": m.reduction}),
    nn.SmoothL1Loss: ("smooth_l1_loss", lambda m: {"reduction": m.reduction, "beta": m.beta}),
    nn.HuberLoss: ("huber_loss", lambda m: {"reduction": m.reduction, "delta": m.delta}),
    nn.KLDivLoss: ("kl_div", lambda m: {"reduction": m.reduction, "log_target": m.log_target}),
    nn.SoftMarginLoss: ("soft_margin_loss", lambda m: {"reduction": m.reduction}),
    nn.BCEWithLogitsLoss: ("binary_cross_entropy_with_logits", lambda m: {
        "reduction": m.reduction, **({"weight": m.weight} if m.weight is not None else {}),
        **({"pos_weight": m.pos_weight} if m.pos_weight is not None else {})}),
    nn.BCELoss: ("binary_cross_entropy", lambda m: {
        "reduction": m.reduction, **({"weight": m.weight} if m.weight is not None else {})}),
    nn.CrossEntropyLoss: ("cross_entropy", lambda m: {
        "reduction": m.reduction, "ignore_index": m.ignore_index,
        **({"weight": m.weight} if m.weight is not None else {}),
        **({"label_smoothing": m.label_smoothing} if m.label_smoothing else {})}),
    nn.TripletMarginLoss: ("triplet_margin_loss", lambda m: {
        "margin": m.margin, "p": m.p, "eps": m.eps, "swap": m.swap, "reduction": m.reduction}),
}
FUNCTIONALS = {fn: name for name, (_d, fn, _a) in LOSSES.items()}
#: positional parameters after the tensors, per functional (torch's order)
POSITIONAL = {
    "mse_loss": ("size_average", "reduce", "reduction"),
    "l1_loss": ("size_average", "reduce", "reduction"),
    "smooth_l1_loss": ("size_average", "reduce", "reduction", "beta"),
    "huber_loss": ("reduction", "delta"),
    "kl_div": ("size_average", "reduce", "reduction", "log_target"),
    "soft_margin_loss": ("size_average", "reduce", "reduction"),
    "binary_cross_entropy_with_logits": ("weight", "size_average", "reduce", "reduction", "pos_weight"),
    "binary_cross_entropy": ("weight", "size_average", "reduce", "reduction"),
    "cross_entropy": ("weight", "size_average", "ignore_index", "reduce", "reduction", "label_smoothing"),
    "triplet_margin_loss": ("margin", "p", "eps", "swap", "size_average", "reduce", "reduction"),
}
N_TENSORS = {"triplet_margin_loss": 3}
#: argument values that mean "the default" (the legacy size_average/reduce pair)
_DEFAULTS = {"size_average": None, "reduce": None, "weight": None, "pos_weight": None,
             "label_smoothing": 0.0}


def call_of(node, gm) -> tuple[str, list, dict] | None:
    """(loss name, tensor operands, constant keyword arguments) of a loss call, or None."""
    from torch import fx

    if node.op == "call_module":
        entry = MODULES.get(type(gm.get_submodule(node.target)))
        if entry is None or node.kwargs:
            return None
        name, attrs = entry
        return name, list(node.args), attrs(gm.get_submodule(node.target))
    if node.op != "call_function" or node.target not in FUNCTIONALS:
        return None
    name = FUNCTIONALS[node.target]
    nt = N_TENSORS.get(name, 2)
    tensors = list(node.args[:nt])
    if len(tensors) != nt or not all(isinstance(t, fx.Node) for t in tensors):
        return None
    kw = dict(zip(POSITIONAL[name], node.args[nt:]))
    for k, v in node.kwargs.items():
        if k in kw:
            return None
        kw[k] = v
    return name, tensors, kw


def normalized(kw: dict) -> dict | None:
    """The call's constant arguments without the ones at their defaults; None when an argument
    is a graph value (a tensor weight, say): those keep the library call."""
    from torch import fx

    out = {}
    for k, v in kw.items():
        if isinstance(v, (fx.Node, torch.Tensor)):
            return None
        if k in _DEFAULTS and v == _DEFAULTS[k]:
            continue
        out[k] = v
    return out
