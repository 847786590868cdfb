"""The op table: how EGG reads each torch op of a captured fx graph.

Every fx node is normalized into an ``NOp``: its kind (pointwise, reduction, softmax, view,
library, ...), a canonical name, its operands bound to named parameters, and for pointwise ops a
Triton expression emitter. An op not in the table is a library op: it stays torch code.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import fx

REQ = object()  # marks a required parameter


@dataclass
class OpDef:
    name: str
    kind: str  # pointwise | reduction | softmax | view | identity
    params: list[tuple[str, Any]]
    #: parameters that are operands (tensors or scalars) of a pointwise op, in order
    operands: tuple[str, ...] = ("input",)


@dataclass
class NOp:
    kind: str  # pointwise | reduction | softmax | view | library | identity | io | getitem | relayout
    # | matmul | attention | linear_ce | norm | pool | scan | chanstats
    name: str
    node: fx.Node
    operands: list[Any] = field(default_factory=list)  # fx.Node or python scalars
    p: dict[str, Any] = field(default_factory=dict)
    why: str = ""  # why this node is a library op (when it is)

    @property
    def tensor_inputs(self) -> list[fx.Node]:
        return [a for a in self.operands if isinstance(a, fx.Node)]


def _d(name, kind, params, operands=("input",)):
    return OpDef(name, kind, [(p if isinstance(p, tuple) else (p, REQ)) for p in params],
                 tuple(operands))


_U = ["input"]
_BIN = ["input", "other", ("alpha", 1)]
POINTWISE: dict[str, OpDef] = {
    "add": _d("add", "pointwise", _BIN, ("input", "other")),
    "sub": _d("sub", "pointwise", _BIN, ("input", "other")),
    "rsub": _d("rsub", "pointwise", _BIN, ("input", "other")),
    "mul": _d("mul", "pointwise", ["input", "other"], ("input", "other")),
    "div": _d("div", "pointwise", ["input", "other", ("rounding_mode", None)], ("input", "other")),
    "pow": _d("pow", "pointwise", ["input", "exponent"], ("input", "exponent")),
    "maximum": _d("maximum", "pointwise", ["input", "other"], ("input", "other")),
    "minimum": _d("minimum", "pointwise", ["input", "other"], ("input", "other")),
    # torch.fmax / fmin: the number where one operand is NaN (maximum / minimum give NaN)
    "fmax": _d("fmax", "pointwise", ["input", "other"], ("input", "other")),
    "fmin": _d("fmin", "pointwise", ["input", "other"], ("input", "other")),
    "where": _d("where", "pointwise", ["condition", "input", "other"],
                ("condition", "input", "other")),
    "clamp": _d("clamp", "pointwise", ["input", ("min", None), ("max", None)],
                ("input", "min", "max")),
    "gt": _d("gt", "pointwise", ["input", "other"], ("input", "other")),
    "ge": _d("ge", "pointwise", ["input", "other"], ("input", "other")),
    "lt": _d("lt", "pointwise", ["input", "other"], ("input", "other")),
    "le": _d("le", "pointwise", ["input", "other"], ("input", "other")),
    "eq": _d("eq", "pointwise", ["input", "other"], ("input", "other")),
    "ne": _d("ne", "pointwise", ["input", "other"], ("input", "other")),
    "leaky_relu": _d("leaky_relu", "pointwise", ["input", ("negative_slope", 0.01), ("inplace", False)]),
    "gelu": _d("gelu", "pointwise", ["input", ("approximate", "none")]),
    "softplus": _d("softplus", "pointwise", ["input", ("beta", 1.0), ("threshold", 20.0)]),
    "elu": _d("elu", "pointwise", ["input", ("alpha", 1.0), ("inplace", False)]),
    "celu": _d("celu", "pointwise", ["input", ("alpha", 1.0), ("inplace", False)]),
    "hardtanh": _d("hardtanh", "pointwise", ["input", ("min_val", -1.0), ("max_val", 1.0), ("inplace", False)]),
    "threshold": _d("threshold", "pointwise", ["input", "threshold", "value", ("inplace", False)]),
    "cast": _d("cast", "pointwise", ["input", "dtype"]),
    "round": _d("round", "pointwise", ["input", ("decimals", 0)]),
}
for _n in ["neg", "abs", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt",
           "sin", "cos", "tan", "sigmoid", "tanh", "relu", "relu6", "silu", "mish", "softsign",
           "selu", "hardsigmoid", "hardswish", "reciprocal", "square", "sign", "floor", "ceil",
           "erf", "logsigmoid", "tanhshrink", "logical_not"]:
    POINTWISE[_n] = _d(_n, "pointwise", _U + [("inplace", False)])

REDUCTIONS: dict[str, OpDef] = {
    "sum": _d("sum", "reduction", ["input", ("dim", None), ("keepdim", False), ("dtype", None)]),
    "mean": _d("mean", "reduction", ["input", ("dim", None), ("keepdim", False), ("dtype", None)]),
    "prod": _d("prod", "reduction", ["input", ("dim", None), ("keepdim", False), ("dtype", None)]),
    "amax": _d("amax", "reduction", ["input", ("dim", ()), ("keepdim", False)]),
    "amin": _d("amin", "reduction", ["input", ("dim", ()), ("keepdim", False)]),
    "argmax": _d("argmax", "reduction", ["input", ("dim", None), ("keepdim", False)]),
    "argmin": _d("argmin", "reduction", ["input", ("dim", None), ("keepdim", False)]),
    "logsumexp": _d("logsumexp", "reduction", ["input", "dim", ("keepdim", False)]),
    "max_dim": _d("max_dim", "reduction", ["input", "dim", ("keepdim", False)]),
    "min_dim": _d("min_dim", "reduction", ["input", "dim", ("keepdim", False)]),
    "softmax": _d("softmax", "softmax", ["input", ("dim", None), ("_stacklevel", 3), ("dtype", None)]),
    "log_softmax": _d("log_softmax", "softmax", ["input", ("dim", None), ("_stacklevel", 3), ("dtype", None)]),
}

VIEWS = {"view", "reshape", "flatten", "unsqueeze", "squeeze", "permute", "transpose", "t",
         "expand", "expand_as", "view_as", "reshape_as", "unflatten", "narrow", "select",
         "movedim", "contiguous", "split", "chunk", "unbind", "size", "dim", "numel"}
IDENTITY = {"clone", "detach", "identity"}

# -- callables of fx call_function nodes -> canonical names ---------------------------------
FUNCTIONS: dict[Any, str] = {
    operator.add: "add", operator.sub: "sub", operator.mul: "mul", operator.truediv: "div",
    operator.neg: "neg", operator.pow: "pow", operator.gt: "gt", operator.ge: "ge",
    operator.lt: "lt", operator.le: "le", operator.eq: "eq", operator.ne: "ne",
    torch.add: "add", torch.sub: "sub", torch.subtract: "sub", torch.rsub: "rsub",
    torch.mul: "mul", torch.multiply: "mul", torch.div: "div", torch.divide: "div",
    torch.true_divide: "div", torch.pow: "pow", torch.maximum: "maximum", torch.minimum: "minimum",
    torch.fmax: "fmax", torch.fmin: "fmin", torch.where: "where",
    operator.invert: "invert", torch.bitwise_not: "invert", torch.masked_fill: "masked_fill",
    operator.and_: "bitwise_and", operator.or_: "bitwise_or", operator.xor: "bitwise_xor",
    torch.bitwise_and: "bitwise_and", torch.bitwise_or: "bitwise_or", torch.bitwise_xor: "bitwise_xor",
    torch.logical_and: "logical_and", torch.logical_or: "logical_or", torch.logical_xor: "logical_xor",
    torch.clamp: "clamp", torch.clip: "clamp", torch.clamp_min: "clamp_min",
    torch.clamp_max: "clamp_max", torch.gt: "gt", torch.ge: "ge", torch.lt: "lt", torch.le: "le",
    torch.eq: "eq", torch.ne: "ne", torch.greater: "gt", torch.less: "lt",
    torch.sum: "sum", torch.mean: "mean", torch.prod: "prod", torch.amax: "amax", torch.amin: "amin",
    torch.argmax: "argmax", torch.argmin: "argmin", torch.logsumexp: "logsumexp",
    torch.max: "max", torch.min: "min", torch.softmax: "softmax", torch.log_softmax: "log_softmax",
    F.softmax: "softmax", F.log_softmax: "log_softmax", torch.special.softmax: "softmax",
    torch.cat: "cat", torch.concat: "cat", torch.concatenate: "cat",
    F.relu: "relu", F.relu6: "relu6", F.leaky_relu: "leaky_relu", F.gelu: "gelu",
    F.silu: "silu", F.mish: "mish", F.softplus: "softplus", F.softsign: "softsign",
    F.elu: "elu", F.celu: "celu", F.selu: "selu", F.hardtanh: "hardtanh",
    F.hardsigmoid: "hardsigmoid", F.hardswish: "hardswish", F.logsigmoid: "logsigmoid",
    F.tanhshrink: "tanhshrink", F.threshold: "threshold", F.sigmoid: "sigmoid", F.tanh: "tanh",
    torch.sigmoid: "sigmoid", torch.tanh: "tanh", torch.relu: "relu", torch.exp: "exp",
    torch.exp2: "exp2", torch.expm1: "expm1", torch.log: "log", torch.log2: "log2",
    torch.log10: "log10", torch.log1p: "log1p", torch.sqrt: "sqrt", torch.rsqrt: "rsqrt",
    torch.sin: "sin", torch.cos: "cos", torch.tan: "tan", torch.abs: "abs", torch.neg: "neg",
    torch.negative: "neg", torch.reciprocal: "reciprocal", torch.square: "square",
    torch.sign: "sign", torch.floor: "floor", torch.ceil: "ceil", torch.erf: "erf", torch.round: "round",
    torch.special.erf: "erf", torch.special.expit: "sigmoid", torch.logical_not: "logical_not",
    torch.selu: "selu", torch.celu: "celu", torch.nn.functional.dropout: "dropout",
    torch.dropout: "dropout", torch.clone: "clone", torch.detach: "detach",
    torch.flatten: "flatten", torch.reshape: "reshape", torch.squeeze: "squeeze",
    torch.unsqueeze: "unsqueeze", torch.permute: "permute", torch.transpose: "transpose",
    torch.t: "t", operator.getitem: "getitem", getattr: "getattr",
    torch.zeros_like: "zeros_like", torch.ones_like: "ones_like", torch.full_like: "full_like",
    F.layer_norm: "layer_norm", F.group_norm: "group_norm", F.instance_norm: "instance_norm",
    torch.layer_norm: "layer_norm", torch.group_norm: "group_norm",
}
if hasattr(F, "rms_norm"):
    FUNCTIONS[F.rms_norm] = "rms_norm"
for _nd in (1, 2, 3):
    FUNCTIONS[getattr(F, f"max_pool{_nd}d")] = f"max_pool{_nd}d"
    FUNCTIONS[getattr(F, f"avg_pool{_nd}d")] = f"avg_pool{_nd}d"
    FUNCTIONS[getattr(torch, f"max_pool{_nd}d")] = f"max_pool{_nd}d"
    if hasattr(torch, f"avg_pool{_nd}d"):
        FUNCTIONS[getattr(torch, f"avg_pool{_nd}d")] = f"avg_pool{_nd}d"
    FUNCTIONS[getattr(F, f"adaptive_avg_pool{_nd}d")] = f"adaptive_avg_pool{_nd}d"

from knowledge.templates import _runtime as RT  # noqa: E402
from knowledge.templates import nan_max, nan_min  # noqa: E402

#: host helpers of the runtime prelude used as fx targets; every generated file defines them
#: too, so the emitter writes their plain names (codegen.emit.RUNTIME_MODULES)
chanstats = RT._egg_chanstats
bn_update = RT._egg_bn_update
reverse_cumsum = RT._egg_reverse_cumsum
reverse_cumprod = RT._egg_reverse_cumprod
exclusive_cumsum = RT._egg_exclusive_cumsum
exclusive_cumprod = RT._egg_exclusive_cumprod
rotate_half = RT._egg_rotate_half
rotate_pairs = RT._egg_rotate_pairs
take = RT._egg_take
#: ops that are a load of their operand at another column (only a pointwise kernel input can be);
#: a take loads its source at the row its index operand names (both kernel inputs: load_roles)
ROLLED = {"rotate_half": "roll", "rotate_pairs": "pair", "take": "take"}
#: integer dtypes a take's index may have (loaded as they are, never converted to floating)
INDEX_DTYPES = (torch.int64, torch.int32)


def load_roles(op: "NOp", role: str) -> list[str]:
    """How a pointwise kernel loads each operand of ``op`` (the slot role of each): ``role`` for
    an ordinary op; a rotation's operand at its rolled column; a take's source at the rows of
    its index (one slot per index: ``take:<index name>``) and its index as integers; a cat's
    k-th piece placed at its columns (``pro|<cat>:<k>``). Inside a cat's piece (``role`` of the
    form ``<base>|<cat>:<k>``) each load is placed there too (a rotation's: ``roll|<cat>:<k>``)."""
    base, bar, ctx = role.partition("|")
    if op.name == "cat":
        return [f"{base}|{op.node.name}:{k}" for k in range(len(op.operands))]
    if op.name == "take":
        return [f"take:{op.operands[1].name}", "index"]
    if op.name in ROLLED:
        return [ROLLED[op.name] + bar + ctx] * len(op.operands)
    return [role] * len(op.operands)


def _cat_op(node: fx.Node, args: tuple, kwargs: dict) -> "NOp":
    """``torch.cat(pieces, dim)`` along the last dim of floating pieces of the result's dtype and
    rank: a pointwise op over the result whose k-th piece is loaded at its columns (the pointwise
    template; codegen.fusion puts the pointwise ops that make a piece in the same kernel, their
    loads placed there too). Anything else stays torch.cat."""
    b = _bind(_d("cat", "x", ["tensors", ("dim", 0), ("out", None)]), args, kwargs)
    pieces, dim, out = b["tensors"], b["dim"], b["out"]
    shape = node_shape(node)
    if out is not None or not isinstance(pieces, (list, tuple)) or len(pieces) < 2 or shape is None \
            or not shape or not isinstance(dim, int) or isinstance(dim, bool) or dim % len(shape) != len(shape) - 1:
        raise TypeError("cat of other than two or more tensors along the last dim")
    for t in pieces:
        if not isinstance(t, fx.Node) or len(node_shape(t) or ()) != len(shape) \
                or node_dtype(t) != node_dtype(node) or node_dtype(t) not in FLOAT_DTYPES:
            raise TypeError("cat of pieces of another rank or dtype")
    return NOp("pointwise", "cat", node, list(pieces), {"dim": -1})
linear_cross_entropy = RT._egg_linear_cross_entropy
relu_attention = RT._egg_relu_attention
masked_attention = RT._egg_masked_attention
dequant_linear = RT._egg_dequant_linear
program_linear = RT._egg_program_linear
mask_fits = RT._egg_mask_fits
complex_fits = RT._egg_complex_fits
FUNCTIONS.update({linear_cross_entropy: "linear_ce", relu_attention: "relu_attention",
                  masked_attention: "masked_attention", dequant_linear: "dequant_linear",
                  program_linear: "program_linear"})
DEQUANT_LINEAR = _d("dequant_linear", "matmul", ["x", "w", ("bias", None)])
RELU_ATTENTION = _d("relu_attention", "attention", ["q", "k", "v", "is_causal", "scale"])
MASKED_ATTENTION = _d("masked_attention", "attention", ["q", "k", "v", "mask", "scale",
                                                         ("enable_gqa", False), ("is_causal", False),
                                                         ("softcap", None), ("factor", None),
                                                         ("drop", None), ("fill", None)])
FUNCTIONS.update({torch.cumsum: "cumsum", torch.cumprod: "cumprod", torch.flip: "flip",
                  reverse_cumsum: "reverse_cumsum", reverse_cumprod: "reverse_cumprod",
                  exclusive_cumsum: "exclusive_cumsum", exclusive_cumprod: "exclusive_cumprod",
                  chanstats: "chanstats", rotate_half: "rotate_half",
                  rotate_pairs: "rotate_pairs", take: "take"})

POOLS: dict[str, OpDef] = {}
for _nd in (1, 2, 3):
    POOLS[f"max_pool{_nd}d"] = _d("max", "pool", ["input", "kernel_size", ("stride", None), ("padding", 0),
                                                   ("dilation", 1), ("ceil_mode", False),
                                                   ("return_indices", False)])
    POOLS[f"avg_pool{_nd}d"] = _d("avg", "pool", ["input", "kernel_size", ("stride", None), ("padding", 0),
                                                   ("ceil_mode", False), ("count_include_pad", True),
                                                   ("divisor_override", None)])


def _tuple(v, nd: int) -> tuple[int, ...]:
    if isinstance(v, (list, tuple)):
        if len(v) == 1:
            v = v[0]
        else:
            if len(v) != nd:
                raise TypeError("pooling parameter of the wrong length")
            return tuple(int(x) for x in v)
    return (int(v),) * nd


def pool_op(name: str, node: fx.Node, args: tuple, kwargs: dict) -> NOp:
    nd = int(name[-2])
    b = _bind(POOLS[name], args, kwargs)
    if b.get("return_indices"):
        raise TypeError("pooling with indices")
    if not isinstance(b["input"], fx.Node):
        raise TypeError("pooling of a non-tensor")
    shape = node_shape(b["input"])
    if shape is None or len(shape) != nd + 2:
        raise TypeError("pooling without a batch and channel dim")
    k = _tuple(b["kernel_size"], nd)
    st = _tuple(b["stride"] if b["stride"] not in (None, [], ()) else k, nd)
    p = {"op": POOLS[name].name, "nd": nd, "kernel": k, "stride": st,
         "padding": _tuple(b.get("padding", 0), nd), "dilation": _tuple(b.get("dilation", 1), nd),
         "ceil_mode": bool(b.get("ceil_mode", False)),
         "count_include_pad": bool(b.get("count_include_pad", True)),
         "divisor_override": b.get("divisor_override")}
    if any(x > 16 for x in k):
        raise TypeError("pooling window too large to unroll")
    return NOp("pool", POOLS[name].name, node, [b["input"]], p)

NORMS: dict[str, OpDef] = {
    "layer_norm": _d("layer", "norm", ["input", "normalized_shape", ("weight", None), ("bias", None),
                                        ("eps", 1e-5), ("cudnn_enable", True)], ("input", "weight", "bias")),
    "rms_norm": _d("rms", "norm", ["input", "normalized_shape", ("weight", None), ("eps", None)],
                   ("input", "weight", "bias")),
    "group_norm": _d("group", "norm", ["input", "num_groups", ("weight", None), ("bias", None),
                                        ("eps", 1e-5), ("cudnn_enabled", True)], ("input", "weight", "bias")),
    "instance_norm": _d("instance", "norm", ["input", ("running_mean", None), ("running_var", None),
                                              ("weight", None), ("bias", None), ("use_input_stats", True),
                                              ("momentum", 0.1), ("eps", 1e-5), ("cudnn_enabled", True)],
                        ("input", "weight", "bias")),
}
for _fn, _name in [("gelu", "gelu"), ("leaky_relu", "leaky_relu"), ("softplus", "softplus"),
                   ("elu", "elu"), ("hardtanh", "hardtanh"), ("hardsigmoid", "hardsigmoid"),
                   ("hardswish", "hardswish"), ("silu", "silu"), ("mish", "mish"),
                   ("relu6", "relu6"), ("log_sigmoid", "logsigmoid")]:
    if hasattr(torch._C._nn, _fn):
        FUNCTIONS[getattr(torch._C._nn, _fn)] = _name

METHODS: dict[str, str] = {
    "add": "add", "sub": "sub", "mul": "mul", "div": "div", "true_divide": "div", "pow": "pow",
    "clamp": "clamp", "clip": "clamp", "clamp_min": "clamp_min", "clamp_max": "clamp_max",
    "maximum": "maximum", "minimum": "minimum", "where": "where_method", "gt": "gt", "ge": "ge",
    "masked_fill": "masked_fill", "bitwise_not": "invert", "bitwise_and": "bitwise_and",
    "bitwise_or": "bitwise_or", "bitwise_xor": "bitwise_xor", "logical_and": "logical_and",
    "logical_or": "logical_or", "logical_xor": "logical_xor",
    "lt": "lt", "le": "le", "eq": "eq", "ne": "ne", "sum": "sum", "mean": "mean", "prod": "prod",
    "amax": "amax", "amin": "amin", "argmax": "argmax", "argmin": "argmin",
    "logsumexp": "logsumexp", "max": "max", "min": "min", "softmax": "softmax",
    "log_softmax": "log_softmax", "relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh",
    "exp": "exp", "exp2": "exp2", "expm1": "expm1", "log": "log", "log2": "log2",
    "log10": "log10", "log1p": "log1p", "sqrt": "sqrt", "rsqrt": "rsqrt", "sin": "sin",
    "cos": "cos", "tan": "tan", "abs": "abs", "neg": "neg", "reciprocal": "reciprocal",
    "square": "square", "sign": "sign", "floor": "floor", "ceil": "ceil", "erf": "erf",
    "round": "round", "float": "cast_float", "half": "cast_half", "bfloat16": "cast_bf16", "double": "cast_double",
    "to": "to", "type_as": "type_as", "clone": "clone", "detach": "detach",
    "logical_not": "logical_not",
}
#: the callables' names of the boolean binary ops -> the pointwise op (codegen.ops.LOGICAL)
_LOGICAL = {f"{k}_{o}": f"logical_{o}" for k in ("bitwise", "logical") for o in ("and", "or", "xor")}
METHODS.update({v: v for v in VIEWS})
METHODS.update({"cumsum": "cumsum", "cumprod": "cumprod", "flip": "flip", "type": "to"})

#: matrix products (the matmul template); operands: input, the second matrix, a linear's bias
MATMULS: dict[str, OpDef] = {
    "linear": _d("linear", "matmul", ["input", "weight", ("bias", None)]),
    "matmul": _d("matmul", "matmul", ["input", "other"]),
    "mm": _d("mm", "matmul", ["input", "mat2"]),
    "bmm": _d("bmm", "matmul", ["input", "mat2"]),
}
FUNCTIONS.update({F.linear: "linear", torch.matmul: "matmul", operator.matmul: "matmul",
                  torch.mm: "mm", torch.bmm: "bmm", F.scaled_dot_product_attention: "sdpa"})
LINEAR_CE = _d("linear_ce", "linear_ce", ["input", "weight", "target", ("bias", None),
                                           ("ignore_index", -100), ("reduction", "mean"),
                                           ("softcap", None), ("softcap_16", False)])
SDPA = _d("sdpa", "attention", ["query", "key", "value", ("attn_mask", None), ("dropout_p", 0.0),
                                ("is_causal", False), ("scale", None), ("enable_gqa", False)])
METHODS.update({"matmul": "matmul", "mm": "mm", "bmm": "bmm"})

MODULES: dict[type, tuple[str, Callable[[nn.Module], dict]]] = {
    nn.ReLU: ("relu", lambda m: {}), nn.ReLU6: ("relu6", lambda m: {}),
    nn.Sigmoid: ("sigmoid", lambda m: {}), nn.Tanh: ("tanh", lambda m: {}),
    nn.SiLU: ("silu", lambda m: {}), nn.Mish: ("mish", lambda m: {}),
    nn.GELU: ("gelu", lambda m: {"approximate": m.approximate}),
    nn.LeakyReLU: ("leaky_relu", lambda m: {"negative_slope": m.negative_slope}),
    nn.ELU: ("elu", lambda m: {"alpha": m.alpha}), nn.CELU: ("celu", lambda m: {"alpha": m.alpha}),
    nn.SELU: ("selu", lambda m: {}), nn.Softsign: ("softsign", lambda m: {}),
    nn.Softplus: ("softplus", lambda m: {"beta": m.beta, "threshold": m.threshold}),
    nn.Hardtanh: ("hardtanh", lambda m: {"min_val": m.min_val, "max_val": m.max_val}),
    nn.Hardsigmoid: ("hardsigmoid", lambda m: {}), nn.Hardswish: ("hardswish", lambda m: {}),
    nn.LogSigmoid: ("logsigmoid", lambda m: {}), nn.Tanhshrink: ("tanhshrink", lambda m: {}),
    nn.Threshold: ("threshold", lambda m: {"threshold": m.threshold, "value": m.value}),
    nn.Softmax: ("softmax", lambda m: {"dim": m.dim}),
    nn.LogSoftmax: ("log_softmax", lambda m: {"dim": m.dim}),
    nn.Identity: ("identity", lambda m: {}),
    nn.Flatten: ("flatten_module", lambda m: {"start_dim": m.start_dim, "end_dim": m.end_dim}),
    nn.Dropout: ("dropout", lambda m: {"p": m.p, "training": m.training}),
}
for _nd in (1, 2, 3):
    MODULES[getattr(nn, f"AdaptiveAvgPool{_nd}d")] = (f"adaptive_avg_pool{_nd}d",
                                                      lambda m: {"output_size": m.output_size})
    MODULES[getattr(nn, f"MaxPool{_nd}d")] = (f"max_pool{_nd}d", lambda m: {
        "kernel_size": m.kernel_size, "stride": m.stride, "padding": m.padding,
        "dilation": m.dilation, "ceil_mode": m.ceil_mode, "return_indices": m.return_indices})
    MODULES[getattr(nn, f"AvgPool{_nd}d")] = (f"avg_pool{_nd}d", (lambda nd: lambda m: {
        "kernel_size": m.kernel_size, "stride": m.stride, "padding": m.padding,
        "ceil_mode": m.ceil_mode, "count_include_pad": m.count_include_pad,
        **({"divisor_override": m.divisor_override} if nd > 1 else {})})(_nd))

FLOAT_DTYPES = {torch.float32, torch.float16, torch.bfloat16, torch.float64}


def _bind(op: OpDef, args: tuple, kwargs: dict) -> dict[str, Any]:
    out: dict[str, Any] = {}
    names = [n for n, _ in op.params]
    if len(args) > len(names):
        raise TypeError(f"{op.name}: too many positional arguments")
    for n, a in zip(names, args):
        out[n] = a
    for k, v in kwargs.items():
        if k not in names:
            raise TypeError(f"{op.name}: unsupported keyword {k!r}")
        if k in out:
            raise TypeError(f"{op.name}: {k!r} given twice")
        out[k] = v
    for n, default in op.params:
        if n not in out:
            if default is REQ:
                raise TypeError(f"{op.name}: missing {n!r}")
            out[n] = default
    return out


def tensor_meta(node: fx.Node):
    return node.meta.get("tensor_meta")


def node_shape(node: fx.Node) -> tuple[int, ...] | None:
    tm = tensor_meta(node)
    return tuple(tm.shape) if tm is not None and hasattr(tm, "shape") else None


def node_dtype(node: fx.Node) -> torch.dtype | None:
    tm = tensor_meta(node)
    return tm.dtype if tm is not None and hasattr(tm, "dtype") else None


def is_scalar(v: Any) -> bool:
    return isinstance(v, (int, float, bool)) and not isinstance(v, fx.Node)


def library(node: fx.Node, why: str) -> NOp:
    return NOp("library", _describe(node), node, why=why)


def _describe(node: fx.Node) -> str:
    if node.op == "call_module":
        return f"module:{node.target}"
    if node.op == "call_method":
        return f"method:{node.target}"
    t = node.target
    return f"fn:{getattr(t, '__module__', '')}.{getattr(t, '__name__', str(t))}"



def _parameter_shape(n: fx.Node):
    """The shape of a parameter or buffer read as ``self.weight.shape`` (or ``.size()``): fixed
    once the module is built, so a constant; None for the shape of anything else (an input's
    shape changes from call to call)."""
    if _shape_of(n) is not None:
        src = _shape_of(n)
    elif n.op == "call_method" and n.target == "size" and len(n.args) == 1 and not n.kwargs:
        src = n.args[0]
    else:
        return None
    if not (isinstance(src, fx.Node) and src.op == "get_attr"):
        return None
    shape = node_shape(src)
    return tuple(int(d) for d in shape) if shape is not None else None

def _same_shape(a, x: fx.Node) -> bool:
    """a is x, or a tensor of the graph traced with x's shape (the canonical forms answer
    ``h.shape`` from the input h was computed from elementwise; the drop-in guards keep dims of
    one traced size equal at the call)."""
    return a is x or (isinstance(a, fx.Node) and node_shape(a) is not None
                      and tuple(node_shape(a)) == tuple(node_shape(x)))


def _shape_of(n) -> fx.Node | None:
    """t when n is ``t.shape``."""
    if (isinstance(n, fx.Node) and n.op == "call_function" and n.target is getattr
            and len(n.args) == 2 and n.args[1] == "shape"):
        return n.args[0]
    return None


def _dim_query_of(n, x: fx.Node, rank: int):
    """d >= 0 when n asks x for the size of its dim d (``x.shape[d]``, ``x.size(d)``), else None."""
    if not isinstance(n, fx.Node):
        return None
    if n.op == "call_method" and n.target == "size" and len(n.args) == 2 and not n.kwargs:
        src, d = n.args
    elif n.op == "call_function" and n.target is operator.getitem and _shape_of(n.args[0]) is not None:
        src, d = _shape_of(n.args[0]), n.args[1]
    else:
        return None
    if not _same_shape(src, x):
        return None
    return d % rank if isinstance(d, int) and not isinstance(d, bool) and -rank <= d < rank else None


def _trailing_shape_of(ns, x) -> tuple | None:
    """The traced sizes of x's last k dims when the normalized shape ``ns`` reads exactly them from
    x (``x.shape[-1:]``, ``(x.shape[-1],)``, ``[x.size(-2), x.size(-1)]``): a norm over the
    input's last dims whatever their sizes (the drop-in guards fix the sizes the file bakes in).
    None for any other form."""
    shape = node_shape(x) if isinstance(x, fx.Node) else None
    if shape is None:
        return None
    rank = len(shape)
    if isinstance(ns, fx.Node):
        if not (ns.op == "call_function" and ns.target is operator.getitem
                and _same_shape(_shape_of(ns.args[0]), x)
                and isinstance(ns.args[1], slice) and ns.args[1].step is None and ns.args[1].stop is None
                and isinstance(ns.args[1].start, int)):
            return None
        start = ns.args[1].start
        start = start % rank if -rank <= start < rank else None
        return tuple(int(v) for v in shape[start:]) if start is not None else None
    if not isinstance(ns, (tuple, list)) or not ns:
        return None
    dims = [_dim_query_of(v, x, rank) for v in ns]
    if dims != list(range(rank - len(ns), rank)):
        return None
    return tuple(int(v) for v in shape[rank - len(ns):])


def classify(node: fx.Node, gm: fx.GraphModule) -> NOp:
    """Normalize one fx node; anything unknown or unsupported becomes a library op."""
    if node.op in ("placeholder", "output"):
        return NOp("io", node.op, node)
    if node.op == "get_attr":
        return NOp("param", "get_attr", node)
    try:
        return _classify(node, gm)
    except TypeError as e:  # argument shapes we do not model: keep the op as torch code
        return library(node, str(e))


def _classify(node: fx.Node, gm: fx.GraphModule) -> NOp:
    args, kwargs = tuple(node.args), dict(node.kwargs)
    if node.op == "call_module":
        mod = gm.get_submodule(node.target)
        entry = MODULES.get(type(mod))
        if entry is None:
            return library(node, f"module {type(mod).__name__} has no template")
        name, attrs = entry
        p = attrs(mod)
        if name == "dropout":
            if p["p"] == 0.0 or not p["training"]:
                return NOp("identity", "identity", node, [args[0]])
            return library(node, "dropout in training mode draws random numbers")
        if name == "identity":
            return NOp("identity", "identity", node, [args[0]])
        if name == "flatten_module":
            return NOp("view", "flatten", node, list(args))
        if name in POOLS:
            return pool_op(name, node, tuple(args[:1]), p)
        if name.startswith("adaptive_avg_pool"):
            return _from_name(name, node, tuple(args[:1]), p)
        return _from_name(name, node, args, kwargs, extra=p)
    if node.op == "call_method":
        name = METHODS.get(node.target)
        if name is None:
            return library(node, f"method {node.target} has no template")
        return _from_name(name, node, args, kwargs)
    if node.target is RT._egg_standard_layout:  # the layout pass's conversion of a result
        return NOp("relayout", "standard_layout", node, [args[0]])
    name = FUNCTIONS.get(node.target)
    if name is None:
        return library(node, f"{_describe(node)} has no template")
    return _from_name(name, node, args, kwargs)


#: integer dtypes a pointwise kernel casts floats to (to_int: truncated toward zero, as torch
#: casts; per-token int8 quantization stores round(x / scale).clamp(-128, 127) as int8) and
#: reads as floats (from_int: the cast of a loaded or computed integer)
CAST_INTS = {torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8}
#: every cast's op name
CASTS = ("cast", "to_int", "from_int")


def _cast(node: fx.Node, src, target) -> NOp:
    """A cast: between floating dtypes ("cast"), a float to an integer dtype ("to_int", a step
    op: a 16-bit value computed in the kernel is rounded to its dtype first, as eager stores
    it) or an integer to a float ("from_int")."""
    sdt = node_dtype(src) if isinstance(src, fx.Node) else None
    if target in CAST_INTS and sdt in FLOAT_DTYPES:
        return NOp("pointwise", "to_int", node, [src], {"dtype": target})
    if target in FLOAT_DTYPES and sdt in CAST_INTS:
        return NOp("pointwise", "from_int", node, [src], {"dtype": target})
    return NOp("pointwise", "cast", node, [src], {"dtype": target})


def _from_name(name: str, node: fx.Node, args: tuple, kwargs: dict, extra: dict | None = None) -> NOp:
    if name in VIEWS:
        return NOp("view", name, node, list(args))
    if name == "getitem":
        return NOp("getitem", "getitem", node, list(args))
    if name == "getattr":
        return NOp("view", "getattr", node, list(args))
    if name in IDENTITY:
        return NOp("identity", "identity", node, [args[0]])
    if name == "dropout":
        b = _bind(_d("dropout", "x", ["input", ("p", 0.5), ("training", True), ("inplace", False)]), args, kwargs)
        if b["p"] == 0.0 or not b["training"]:
            return NOp("identity", "identity", node, [b["input"]])
        return library(node, "dropout in training mode draws random numbers")
    # casts
    if name.startswith("cast_") or name in ("to", "type_as"):
        target = {"cast_float": torch.float32, "cast_half": torch.float16,
                  "cast_bf16": torch.bfloat16, "cast_double": torch.float64}.get(name)
        if target is None:
            target = node_dtype(node)
            extra_args = [a for a in list(args[1:]) + list(kwargs.values())
                          if not isinstance(a, torch.dtype)]
            if any(isinstance(a, (torch.device, str)) for a in extra_args) or target is None:
                return library(node, "to() with a device or memory format")
        return _cast(node, args[0], target)
    if name in ("zeros_like", "ones_like", "full_like"):
        spec = ["input", "fill_value"] if name == "full_like" else ["input"]
        b = _bind(_d(name, "x", spec + [("dtype", None), ("layout", None), ("device", None),
                                        ("requires_grad", False), ("memory_format", None)]), args, kwargs)
        if b["layout"] is not None or b["device"] is not None or b["memory_format"] is not None:
            raise TypeError(f"{name} with layout/device/memory_format")
        value = {"zeros_like": 0.0, "ones_like": 1.0}.get(name, b.get("fill_value"))
        if not is_scalar(value):
            raise TypeError(f"{name} with a non-scalar fill value")
        return NOp("pointwise", "fill", node, [b["input"]], {"value": value})
    if name == "flip":
        return NOp("view", "flip", node, list(args) + list(kwargs.values()))
    if name == "take":  # rw-take: a gathered load (pointwise, its operands kernel inputs)
        b = _bind(_d("take", "x", ["src", "idx", "dim", ("wrap", False)]), args, kwargs)
        if not isinstance(b["src"], fx.Node) or not isinstance(b["idx"], fx.Node) \
                or not isinstance(b["dim"], int) or isinstance(b["dim"], bool) or not isinstance(b["wrap"], bool):
            raise TypeError("take of a non-tensor or along a traced dim")
        if node_dtype(b["idx"]) not in INDEX_DTYPES:
            raise TypeError("take with an index that is not int32/int64")
        return NOp("pointwise", "take", node, [b["src"], b["idx"]], {"dim": b["dim"], "wrap": b["wrap"]})
    if name == "cat":  # pieces placed side by side along the last dim (pointwise template)
        return _cat_op(node, args, kwargs)
    if name in ROLLED:
        shape = node_shape(args[0]) if isinstance(args[0], fx.Node) else None
        if shape is None or not shape or shape[-1] % 2:
            raise TypeError(f"{name} of an odd or unknown last dim")
        # a rolled load of its operand: pointwise, but only where the operand is a kernel input
        return NOp("pointwise", name, node, [args[0]], {"size": int(shape[-1])})
    if name == "linear_ce":
        b = _bind(LINEAR_CE, args, kwargs)
        if not all(isinstance(b[k], fx.Node) for k in ("input", "weight", "target")) or not (
                b["bias"] is None or isinstance(b["bias"], fx.Node)):
            raise TypeError("linear cross-entropy of a non-tensor")
        if (not isinstance(b["ignore_index"], int) or b["reduction"] not in ("mean", "sum", "none")
                or not (b["softcap"] is None or isinstance(b["softcap"], float))
                or not isinstance(b["softcap_16"], bool)):
            raise TypeError("linear cross-entropy with traced arguments")
        return NOp("linear_ce", "linear_ce", node, [b["input"], b["weight"], b["target"], b["bias"]],
                   {"ignore_index": b["ignore_index"], "reduction": b["reduction"],
                    "softcap": b["softcap"], "softcap_16": b["softcap_16"]})
    if name == "chanstats":
        if node_dtype(args[0]) not in FLOAT_DTYPES:
            raise TypeError("channel statistics of a non-floating tensor")
        return NOp("chanstats", "chanstats", node, [args[0]])
    if name in ("cumsum", "cumprod", "reverse_cumsum", "reverse_cumprod", "exclusive_cumsum",
                "exclusive_cumprod"):
        b = _bind(_d(name, "scan", ["input", "dim", ("dtype", None)]), args, kwargs)
        if b["dtype"] is not None or not isinstance(b["input"], fx.Node) or not isinstance(b["dim"], int):
            raise TypeError(f"{name} with dtype= or a non-integer dim")
        if node_dtype(b["input"]) not in FLOAT_DTYPES:
            raise TypeError(f"{name} of a non-floating tensor")
        return NOp("scan", name.replace("reverse_", "").replace("exclusive_", ""), node, [b["input"]],
                   {"dim": b["dim"], "reverse": name.startswith("reverse_"),
                    "exclusive": name.startswith("exclusive_")})
    if name in POOLS:
        return pool_op(name, node, args, kwargs)
    if name == "sdpa":
        b = _bind(SDPA, args, kwargs)
        if b["dropout_p"] not in (0, 0.0):
            raise TypeError("attention with dropout")
        if not all(isinstance(b[k], fx.Node) for k in ("query", "key", "value")):
            raise TypeError("attention of a non-tensor")
        if not all(isinstance(b[k], (bool, float, int, type(None))) for k in ("is_causal", "scale", "enable_gqa")):
            raise TypeError("attention with traced flags")
        mask = b["attn_mask"]
        if mask is not None and (not isinstance(mask, fx.Node) or b["is_causal"]):
            raise TypeError("attention with a mask that is not a tensor, or with is_causal too")
        # a mask tensor: bool (True: attend) or added to the scores; a row with every score
        # -inf gives 0 (SDPA's safe softmax)
        return NOp("attention", "sdpa", node, [b["query"], b["key"], b["value"], mask],
                   {"causal": bool(b["is_causal"]), "scale": b["scale"], "gqa": bool(b["enable_gqa"]),
                    "score": "softmax",
                    "mask": "" if mask is None else "bool" if node_dtype(mask) == torch.bool else "add",
                    "empty": "nan" if mask is None else "zero"})
    if name == "masked_attention":
        b = _bind(MASKED_ATTENTION, args, kwargs)
        if not all(isinstance(b[k], fx.Node) for k in ("q", "k", "v")) \
                or not isinstance(b["mask"], (fx.Node, type(None))) \
                or not isinstance(b["drop"], (fx.Node, type(None))) or (b["drop"] is not None and (
                    b["mask"] is not None or not isinstance(b["fill"], float))) \
                or not isinstance(b["scale"], (float, type(None))) or not isinstance(b["enable_gqa"], bool) \
                or not isinstance(b["is_causal"], bool) or not isinstance(b["softcap"], (float, type(None))) \
                or not isinstance(b["factor"], (float, type(None))) or (b["factor"] and b["scale"] is not None):
            raise TypeError("masked attention of non-tensors or traced flags")
        return NOp("attention", "masked_attention", node, [b["q"], b["k"], b["v"], b["mask"] if b["drop"] is None else b["drop"]],
                   {"causal": b["is_causal"], "scale": b["scale"], "gqa": b["enable_gqa"], "score": "softmax",
                    "mask": "drop" if b["drop"] is not None else "" if b["mask"] is None else "add",
                    "fill": b["fill"], "empty": "nan", "softcap": b["softcap"],
                    "factor": 1.0 if b["factor"] is None else b["factor"]})
    if name == "dequant_linear":  # rw-dequant-linear: a linear of an 8-bit integer weight
        b = _bind(DEQUANT_LINEAR, args, kwargs)
        if not all(isinstance(b[k], fx.Node) for k in ("x", "w")) or not isinstance(b["bias"], (fx.Node, type(None))):
            raise TypeError("dequantizing linear of a non-tensor")
        return NOp("matmul", "linear", node, [b["x"], b["w"], b["bias"]], {"dequant": True})
    if name == "program_linear":  # rw-dequant-program: the weight computed from stored tensors
        x, bias, program, b_nk, *leaves = args
        if kwargs or not isinstance(x, fx.Node) or not isinstance(bias, (fx.Node, type(None))) \
                or not isinstance(program, tuple) or not isinstance(b_nk, bool) or not leaves \
                or not all(isinstance(t, fx.Node) for t in leaves):
            raise TypeError("program linear of non-tensors or a traced program")
        return NOp("matmul", "linear" if b_nk else "matmul", node, [x, leaves[0], bias, *leaves[1:]],
                   {"dequant": True, "program": program, "b_nk": b_nk})
    if name == "relu_attention":
        b = _bind(RELU_ATTENTION, args, kwargs)
        if not all(isinstance(b[k], fx.Node) for k in ("q", "k", "v")) \
                or not isinstance(b["is_causal"], bool) or not isinstance(b["scale"], (float, type(None))):
            raise TypeError("relu attention of non-tensors or traced flags")
        return NOp("attention", "relu_attention", node, [b["q"], b["k"], b["v"]],
                   {"causal": b["is_causal"], "scale": b["scale"], "gqa": False, "score": "relu"})
    if name in MATMULS:
        b = _bind(MATMULS[name], args, kwargs)
        ops_ = [b[k] for k, _ in MATMULS[name].params]
        if not all(isinstance(v, fx.Node) or v is None for v in ops_):
            raise TypeError(f"{name} of a non-tensor")
        return NOp("matmul", name, node, ops_ + [None] * (3 - len(ops_)))
    if name.startswith("adaptive_avg_pool"):  # a global average pool is a mean over space
        nd = int(name[-2])
        b = _bind(_d(name, "x", ["input", "output_size"]), args, kwargs)
        out = b["output_size"]
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
        shape = node_shape(b["input"]) if isinstance(b["input"], fx.Node) else None
        if shape is None or len(shape) != nd + 2 or any(o != 1 for o in outs):
            raise TypeError("adaptive pooling to a size other than 1")
        return NOp("reduction", "mean", node, [b["input"]],
                   {"dim": tuple(range(-nd, 0)), "keepdim": True})  # the last nd dims
    if name in NORMS:
        op = NORMS[name]
        b = _bind(op, args, kwargs)
        if name == "instance_norm" and (b["running_mean"] is not None or not b["use_input_stats"]):
            raise TypeError("instance_norm with running statistics")
        if name == "rms_norm":
            b["bias"] = None
        for k in ("weight", "bias"):
            if b.get(k) is not None and not isinstance(b[k], fx.Node):
                raise TypeError(f"{name}: {k} is not a tensor of the graph")
        if not isinstance(b["input"], fx.Node) or node_dtype(b["input"]) not in FLOAT_DTYPES:
            raise TypeError(f"{name}: input is not a floating tensor")
        p = {"eps": b.get("eps"), "num_groups": b.get("num_groups"),
             "normalized_shape": b.get("normalized_shape")}
        ns = p["normalized_shape"]
        trailing = _trailing_shape_of(ns, b["input"])
        if trailing is not None:  # F.layer_norm(x, x.shape[-1:]), (x.size(-1),): the input's last dims
            ns = trailing
        elif isinstance(ns, fx.Node):  # nanoGPT's F.layer_norm(x, self.weight.shape, ...)
            ns = _parameter_shape(ns)
            if ns is None:
                raise TypeError(f"{name}: normalized_shape read from a tensor's shape in forward")
        if isinstance(ns, int):
            ns = (ns,)
        if ns is not None and not (isinstance(ns, (tuple, list)) and all(
                isinstance(d, int) and not isinstance(d, bool) for d in ns)):
            raise TypeError(f"{name}: normalized_shape is not a constant")
        p["normalized_shape"] = tuple(ns) if ns is not None else None
        return NOp("norm", op.name, node, [b["input"], b.get("weight"), b.get("bias")], p)
    if name == "masked_fill":  # x.masked_fill(mask, value): where(mask, value, x), x's dtype
        b = _bind(_d("m", "x", ["input", "mask", "value"]), args, kwargs)
        if not isinstance(b["mask"], fx.Node) or node_dtype(b["mask"]) != torch.bool:
            raise TypeError("masked_fill by a mask that is not a bool tensor")
        v = b["value"]
        if isinstance(v, fx.Node) and node_shape(v) not in ((), None):
            raise TypeError("masked_fill with a value that is not 0-dimensional")
        if isinstance(v, fx.Node) and node_dtype(v) != node_dtype(b["input"]):
            raise TypeError("masked_fill with a value tensor of another dtype")  # cast to x's first
        return NOp("pointwise", "where", node, [b["mask"], v, b["input"]])
    if name == "invert":  # ~m of a bool tensor: logical not (of integers: bitwise, left to torch)
        b = _bind(_d("i", "x", ["input"]), args, kwargs)
        if not isinstance(b["input"], fx.Node) or node_dtype(b["input"]) != torch.bool:
            raise TypeError("bitwise not of a tensor that is not bool")
        return NOp("pointwise", "logical_not", node, [b["input"]])
    if name in _LOGICAL:  # m1 & m2 of bool tensors, logical_and of any (integers' bitwise & stays torch)
        b = _bind(_d("l", "x", ["input", "other"]), args, kwargs)
        x, y = b["input"], b["other"]
        if not (isinstance(x, fx.Node) and isinstance(y, fx.Node)):
            raise TypeError(f"{name} with a Python operand")
        if name.startswith("bitwise") and not node_dtype(x) == node_dtype(y) == torch.bool:
            raise TypeError(f"{name} of tensors that are not bool")
        return NOp("pointwise", _LOGICAL[name], node, [x, y])
    if name == "where_method":  # x.where(cond, other)
        b = _bind(_d("w", "x", ["input", "condition", "other"]), args, kwargs)
        return NOp("pointwise", "where", node, [b["condition"], b["input"], b["other"]])
    if name in ("clamp_min", "clamp_max"):
        b = _bind(_d(name, "x", ["input", "bound"]), args, kwargs)
        p = {"min": b["bound"], "max": None} if name == "clamp_min" else {"min": None, "max": b["bound"]}
        return NOp("pointwise", "clamp", node, [b["input"], p["min"], p["max"]])
    if name in ("max", "min"):
        rest = list(args[1:]) + list(kwargs.values())
        if rest and isinstance(rest[0], fx.Node):  # elementwise max/min of two tensors
            b = _bind(POINTWISE["maximum"], args, kwargs)
            return NOp("pointwise", "maximum" if name == "max" else "minimum", node,
                       [b["input"], b["other"]])
        if not rest:  # full reduction
            return NOp("reduction", "amax" if name == "max" else "amin", node, [args[0]],
                       {"dim": None, "keepdim": False})
        name = "max_dim" if name == "max" else "min_dim"
    if name in POINTWISE:
        op = POINTWISE[name]
        b = _bind(op, args, kwargs)
        if extra:
            b.update(extra)
        if b.get("inplace"):
            raise TypeError(f"{name}: in-place variant kept as torch code")
        operands = [b[k] for k in op.operands]
        p = {k: v for k, v in b.items() if k not in op.operands}
        for v in operands:
            if not (isinstance(v, fx.Node) or is_scalar(v) or v is None):
                raise TypeError(f"{name}: operand of type {type(v).__name__}")
        if name == "div" and p.get("rounding_mode") not in (None,):
            raise TypeError("div with a rounding mode")
        if name == "round" and p.pop("decimals", 0) != 0:
            raise TypeError("round with decimals")
        return NOp("pointwise", name, node, operands, p)
    if name in REDUCTIONS:
        op = REDUCTIONS[name]
        b = _bind(op, args, kwargs)
        if extra:
            b.update(extra)
        if b.get("dtype") is not None:
            raise TypeError(f"{name} with dtype=")
        if not isinstance(b["input"], fx.Node):
            raise TypeError(f"{name} of a non-tensor")
        p = {k: v for k, v in b.items() if k not in ("input", "_stacklevel", "dtype")}
        if op.kind == "softmax" and p.get("dim") is None:
            raise TypeError(f"{name} without dim")
        return NOp(op.kind, name, node, [b["input"]], p)
    raise TypeError(f"{name} has no template")


# -- Triton expressions for pointwise ops ---------------------------------------------------
def lit(v: Any) -> str:
    """A Python scalar as a Triton literal."""
    if isinstance(v, bool):
        return "1.0" if v else "0.0"
    v = float(v)
    if math.isinf(v):
        return 'float("inf")' if v > 0 else 'float("-inf")'
    if math.isnan(v):
        return 'float("nan")'
    return repr(v)


SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


def _pow(a: str, e: Any) -> str:
    if isinstance(e, str):
        return f"tl.exp({e} * tl.log({a}))"
    e = float(e)
    if e == 2.0:
        return f"({a} * {a})"
    if e == 3.0:
        return f"({a} * {a} * {a})"
    if e == 4.0:
        return f"(({a} * {a}) * ({a} * {a}))"
    if e == 1.0:
        return f"({a})"
    if e == 0.0:
        return f"({a} * 0.0 + 1.0)"
    if e == 0.5:
        return f"_egg_sqrt({a})"
    if e == -1.0:
        return f"_egg_div(1.0, {a})"
    if e == -0.5:
        return f"(1.0 / tl.sqrt({a}))"
    if e == int(e):  # integer power of any sign base: |a|^e with the sign of a^e
        mag = f"tl.exp({lit(e)} * tl.log(tl.abs({a})))"
        if int(e) % 2:
            return f"tl.where({a} < 0, -{mag}, {mag})"
        return mag
    return f"tl.exp({lit(e)} * tl.log({a}))"


def _div(op: NOp, x: str, y: str) -> str:
    """x / y as eager computes it (a step function after it, ``round(x / scale)``, needs the
    same rounding, not a value within the tolerance):
    - a tensor by a Python number: CUDA's division kernel multiplies by the divisor's fp32
      reciprocal (div_true_kernel_cuda, "may lose one bit"), the CPU's divides fp32 and
      multiplies 16-bit tensors (``_egg_sdiv`` picks by where the kernel runs);
    - a number by a tensor (``c / t``): Tensor.__rtruediv__ is ``t.reciprocal() * c``;
    - otherwise IEEE division (``_egg_div``; Triton's own `/` on fp32 is within 2 ulp)."""
    num, den = op.operands[0], op.operands[1]
    if isinstance(num, fx.Node) and is_scalar(den) and not isinstance(den, bool) and float(den) != 0:
        dt = node_dtype(op.node)
        if dt == torch.float64:
            return f"_egg_div({x}, {y})"
        inv = lit(float(torch.tensor(1.0) / torch.tensor(float(den))))  # 1.0f / (float)den
        if dt in (torch.bfloat16, torch.float16):
            return f"({x} * {inv})"
        return f"_egg_sdiv({x}, {y}, {inv})"
    if op.node.target is operator.truediv and is_scalar(num) and isinstance(den, fx.Node):
        return f"(_egg_div(1.0, {y}) * {x})"
    return f"_egg_div({x}, {y})"


def _clamp(a: str, lo: str | None, hi: str | None) -> str:
    out = a
    if lo is not None:
        out = nan_max(out, lo)
    if hi is not None:
        out = nan_min(out, hi)
    return out


def emit(op: NOp, a: list[str | None]) -> str:
    """Triton expression of a pointwise op over operand expressions ``a`` (None: absent)."""
    n, p = op.name, op.p
    x = a[0]
    if n == "add":
        b = a[1] if p.get("alpha", 1) == 1 else f"({a[1]} * {lit(p['alpha'])})"
        return f"({x} + {b})"
    if n == "sub":
        b = a[1] if p.get("alpha", 1) == 1 else f"({a[1]} * {lit(p['alpha'])})"
        return f"({x} - {b})"
    if n == "rsub":
        b = x if p.get("alpha", 1) == 1 else f"({x} * {lit(p['alpha'])})"
        return f"({a[1]} - {b})"
    if n == "div":
        return _div(op, x, a[1])
    simple = {
        "mul": "({0} * {1})", "maximum": nan_max("{0}", "{1}"),
        "minimum": nan_min("{0}", "{1}"), "fmax": "tl.maximum({0}, {1})", "fmin": "tl.minimum({0}, {1})",
        "gt": "({0} > {1})", "ge": "({0} >= {1})",
        "lt": "({0} < {1})", "le": "({0} <= {1})", "eq": "({0} == {1})", "ne": "({0} != {1})",
    }
    if n in simple:
        return simple[n].format(x, a[1])
    if n == "where":
        return f"tl.where({a[0]}, {a[1]}, {a[2]})"
    if n in LOGICAL:  # on the operands' truth (bool held as int1, or a float / integer != 0)
        return f"(({x} != 0) {LOGICAL[n]} ({a[1]} != 0))"
    if n == "rotate_half":  # x is the operand loaded at column (j + D/2) % D (pointwise template)
        d = int(p["size"])
        return f"tl.where((offs % {d}) < {d // 2}, -({x}), {x})"
    if n == "take":  # x is the source loaded at the row its index names (pointwise template)
        return x
    if n == "rotate_pairs":  # x is the operand loaded at column j ^ 1 (pointwise template)
        return f"tl.where((offs % 2) == 0, -({x}), {x})"
    if n == "fill":
        return f"(tl.zeros_like({x}) + {lit(p['value'])})"
    if n == "pow":
        return _pow(x, a[1] if isinstance(op.operands[1], fx.Node) else op.operands[1])
    if n == "clamp":
        return _clamp(x, a[1], a[2])
    if n in CASTS:  # a value of the target dtype, held in fp32 (to_int: the truncated integer)
        from knowledge.templates import TL_DTYPE

        if n == "from_int":  # a loaded integer stays one until read as a float
            x = f"({x}).to(tl.float32)"
        dt = str(p["dtype"]).replace("torch.", "")
        if dt == "float32":
            return f"({x})"
        return f"({x}).to({TL_DTYPE[dt]}).to(tl.float32)"
    unary = {
        "neg": "(-{0})", "abs": "tl.abs({0})", "exp": "tl.exp({0})", "exp2": "tl.exp2({0})",
        "expm1": "(tl.exp({0}) - 1.0)", "log": "tl.log({0})", "log2": "tl.log2({0})",
        "log10": "(tl.log({0}) * 0.4342944819032518)", "log1p": "tl.log(1.0 + {0})",
        "sqrt": "_egg_sqrt({0})", "rsqrt": "(1.0 / tl.sqrt({0}))", "sin": "tl.sin({0})",
        "cos": "tl.cos({0})", "tan": "(tl.sin({0}) / tl.cos({0}))", "sigmoid": "tl.sigmoid({0})",
        "tanh": "_egg_tanh({0})", "relu": nan_max("{0}", "0.0"),
        "relu6": nan_min(nan_max("{0}", "0.0"), "6.0"), "silu": "({0} * tl.sigmoid({0}))",
        "mish": "({0} * _egg_tanh(_egg_softplus({0}, 1.0, 20.0)))",
        "softsign": "({0} / (1.0 + tl.abs({0})))",
        "selu": f"({SELU_SCALE!r} * tl.where({{0}} > 0, {{0}}, {SELU_ALPHA!r} * (tl.exp({{0}}) - 1.0)))",
        "hardsigmoid": nan_min(nan_max("{0} / 6.0 + 0.5", "0.0"), "1.0"),
        "hardswish": f"({{0}} * {nan_min(nan_max('{0} + 3.0', '0.0'), '6.0')} / 6.0)",
        "reciprocal": "_egg_div(1.0, {0})", "square": "({0} * {0})",
        "sign": "tl.where({0} > 0, 1.0, tl.where({0} < 0, -1.0, 0.0))",
        "floor": "tl.floor({0})", "ceil": "tl.ceil({0})", "erf": "tl.math.erf({0})",
        "round": "_egg_rint({0})",
        "logsigmoid": "(tl.minimum({0}, 0.0) - tl.log(1.0 + tl.exp(-tl.abs({0}))))",
        "tanhshrink": "({0} - _egg_tanh({0}))", "logical_not": "({0} == 0)",
    }
    if n in unary:
        return unary[n].format(x)
    if n == "leaky_relu":
        return f"tl.where({x} > 0, {x}, {x} * {lit(p['negative_slope'])})"
    if n == "gelu":
        if p.get("approximate", "none") == "tanh":
            inner = f"0.7978845608028654 * ({x} + 0.044715 * {x} * {x} * {x})"
            return f"(0.5 * {x} * (1.0 + _egg_tanh({inner})))"
        return f"(0.5 * {x} * (1.0 + tl.math.erf({x} * 0.7071067811865476)))"
    if n == "softplus":
        return f"_egg_softplus({x}, {lit(p['beta'])}, {lit(p['threshold'])})"
    if n == "elu":
        return f"tl.where({x} > 0, {x}, {lit(p['alpha'])} * (tl.exp({x}) - 1.0))"
    if n == "celu":
        al = lit(p["alpha"])
        return f"tl.where({x} > 0, {x}, {al} * (tl.exp({x} / {al}) - 1.0))"
    if n == "hardtanh":
        return _clamp(x, lit(p["min_val"]), lit(p["max_val"]))
    if n == "threshold":
        return f"tl.where({x} > {lit(p['threshold'])}, {x}, {lit(p['value'])})"
    raise KeyError(f"no Triton expression for {n}")


#: the comparisons (bool results; codegen.fusion compares signed integers with them too)
COMPARISONS = {"gt", "ge", "lt", "le", "eq", "ne"}
LOGICAL = {"logical_and": "&", "logical_or": "|", "logical_xor": "!="}
BOOL_RESULT = COMPARISONS | {"logical_not"} | set(LOGICAL)
#: ops whose result jumps where their operand crosses a point: a 16-bit operand computed in the
#: group is rounded to its dtype before them, as eager's stored intermediate is (codegen.emit)
STEP_OPS = COMPARISONS | {"floor", "ceil", "sign", "round", "to_int"}
