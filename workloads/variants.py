"""Equivalent variants of a problem file: the same math written the other ways users write it.

A plan must not depend on the spelling (issue 21): ``x.sum(-1) / n`` or ``x.mean(-1)``,
``x * rsqrt(v)`` or ``x / sqrt(v)``, keepdim or unsqueeze, the weight multiplied before or after
the downcast, repeat_interleave or expand + reshape for grouped KV heads, attention by
scaled_dot_product_attention or written out, cross_entropy or nll_loss of log_softmax, ... Each rule below rewrites a problem's source
(its ``ast``: every match of the rule, helpers appended as module-level functions that fx traces
through) into one variant. tests/test_variants.py checks, for the workload suite and for problems
written in tests, that each variant gets the same plan as its original (the same template kinds,
the same number of kernels) and that eager's outputs of the two agree within the verifier's
tolerance (a rule marked ``exact=False`` changes rounding: cast order, scores rounded to 16 bits;
the check is what makes it an equivalent variant).

    python workloads/variants.py PROBLEM.py OUT_DIR     # writes OUT_DIR/<stem>__<rule>.py
"""
import ast
import copy
import pathlib
import sys
from dataclasses import dataclass
from typing import Callable

HELPERS = {
    "_v_mean": '''
def _v_mean(t, dim, keepdim=False):
    return t.sum(dim, keepdim=keepdim) / t.shape[dim]
''',
    "_v_repeat_kv": '''
def _v_repeat_kv(x, n_rep):
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)
''',
    "_v_sdpa_repeat": '''
def _v_sdpa_repeat(q, k, v, enable_gqa=False, **kwargs):
    g = q.shape[1] // k.shape[1]
    return torch.nn.functional.scaled_dot_product_attention(
        q, _v_repeat_kv(k, g), _v_repeat_kv(v, g), **kwargs)
''',
    "_v_gqa_heads": '''
def _v_gqa_heads(q, k, v):
    g = q.shape[1] // k.shape[1]
    return k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
''',
    "_v_attention": '''
def _v_attention(q, k, v, is_causal=False, enable_gqa=False, scale=None):
    if enable_gqa:
        k, v = _v_gqa_heads(q, k, v)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    s = torch.matmul(q, k.transpose(-2, -1)) * scale
    if is_causal:
        keep = torch.ones((q.shape[-2], k.shape[-2]), dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    p = torch.softmax(s.float(), dim=-1).to(q.dtype)
    return p @ v
''',
    "_v_attention_einsum": '''
def _v_attention_einsum(q, k, v, is_causal=False, enable_gqa=False, scale=None):
    if enable_gqa:
        k, v = _v_gqa_heads(q, k, v)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = torch.einsum("bhid,bhjd->bhij", q, k) * scale
    if is_causal:
        i, j = s.shape[-2:]
        mask = torch.ones((i, j), dtype=torch.bool, device=q.device).triu(1)
        s = s.masked_fill(mask, -torch.finfo(s.dtype).max)
    p = s.float().softmax(dim=-1).to(q.dtype)
    return torch.einsum("bhij,bhjd->bhid", p, v)
''',
    "_v_halves": '''
def _v_halves(t):
    h = t.shape[-1] // 2
    return t[..., :h], t[..., h:]
''',
    "_v_silu": '''
def _v_silu(t):
    return t * torch.sigmoid(t)
''',
    "_v_softmax": '''
def _v_softmax(t, dim):
    e = torch.exp(t - t.amax(dim, keepdim=True))
    return e / e.sum(dim, keepdim=True)
''',
    "_v_softmax_values": '''
def _v_softmax_values(t, dim):
    e = torch.exp(t - t.max(dim, keepdim=True).values)
    return e / e.sum(dim, keepdim=True)
''',
    "_v_layer_norm": '''
def _v_layer_norm(t, weight, bias, eps):
    x = t.float()
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    y = ((x - mu) * torch.rsqrt(var + eps)).to(t.dtype)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y
''',
}


@dataclass(frozen=True)
class Rule:
    name: str
    doc: str
    transformer: Callable[[], ast.NodeTransformer]
    exact: bool = True  # the same values as the original (False: within rounding)
    helpers: tuple[str, ...] = ()
    imports: tuple[str, ...] = ()


def _is_attr_call(node, method: str) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == method)


def _dotted(node) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _kw(node: ast.Call, name: str):
    for k in node.keywords:
        if k.arg == name:
            return k.value
    return None


def _int_const(v) -> bool:
    """Is v an integer literal (-1 is a negated constant in the AST)?"""
    if isinstance(v, ast.UnaryOp) and isinstance(v.op, ast.USub):
        v = v.operand
    return isinstance(v, ast.Constant) and isinstance(v.value, int) and not isinstance(v.value, bool)


def _const_true(v) -> bool:
    return isinstance(v, ast.Constant) and v.value is True


def _call(func: str, args: list, keywords: list | None = None) -> ast.Call:
    return ast.Call(func=ast.parse(func, mode="eval").body, args=args, keywords=keywords or [])


class _Counting(ast.NodeTransformer):
    def __init__(self):
        self.hits = 0


class MeanAsSum(_Counting):
    """x.mean(d[, keepdim=k]) / torch.mean(x, d, ...) -> x.sum(d, keepdim=k) / x.shape[d]."""

    def visit_Call(self, node):
        self.generic_visit(node)
        if _is_attr_call(node, "mean") and _dotted(node.func.value) != "torch":
            x, rest = node.func.value, node.args
        elif _dotted(node.func) == "torch.mean" and node.args:
            x, rest = node.args[0], node.args[1:]
        else:
            return node
        dim = rest[0] if rest else _kw(node, "dim")
        if not _int_const(dim) or len(rest) > 1 \
                or any(k.arg not in ("dim", "keepdim") for k in node.keywords):
            return node
        keep = _kw(node, "keepdim") or ast.Constant(False)
        self.hits += 1
        return _call("_v_mean", [x, dim, keep])


class KeepdimAsUnsqueeze(_Counting):
    """x.R(d, keepdim=True) -> x.R(d).unsqueeze(d) for R in mean, sum, amax, amin."""

    def visit_Call(self, node):
        self.generic_visit(node)
        if not (isinstance(node.func, ast.Attribute) and node.func.attr in ("mean", "sum", "amax", "amin")
                and _dotted(node.func.value) != "torch" and _const_true(_kw(node, "keepdim"))):
            return node
        dim = node.args[0] if node.args else _kw(node, "dim")
        if not _int_const(dim):
            return node
        self.hits += 1
        red = ast.Call(func=node.func, args=[dim], keywords=[])
        return ast.Call(func=ast.Attribute(value=red, attr="unsqueeze", ctx=ast.Load()), args=[dim],
                        keywords=[])


class RsqrtAsReciprocal(_Counting):
    """torch.rsqrt(v) / v.rsqrt() -> 1.0 / torch.sqrt(v)."""

    def visit_Call(self, node):
        self.generic_visit(node)
        if _dotted(node.func) == "torch.rsqrt" and len(node.args) == 1:
            v = node.args[0]
        elif _is_attr_call(node, "rsqrt") and not node.args and _dotted(node.func.value) != "torch":
            v = node.func.value
        else:
            return node
        self.hits += 1
        return ast.BinOp(left=ast.Constant(1.0), op=ast.Div(), right=_call("torch.sqrt", [v]))


class MulRsqrtAsDiv(_Counting):
    """h * torch.rsqrt(v) (either side) -> h / torch.sqrt(v)."""

    def visit_BinOp(self, node):
        self.generic_visit(node)
        if not isinstance(node.op, ast.Mult):
            return node
        for h, r in ((node.left, node.right), (node.right, node.left)):
            if isinstance(r, ast.Call) and _dotted(r.func) == "torch.rsqrt" and len(r.args) == 1:
                self.hits += 1
                return ast.BinOp(left=h, op=ast.Div(), right=_call("torch.sqrt", [r.args[0]]))
        return node


#: torch dtype attributes a cast names
DTYPES = {"float32", "float", "float16", "half", "bfloat16", "float64", "double"}


def _dtype_like(v) -> bool:
    """Is v written as a dtype: torch.float32, x.dtype, a name called dtype?"""
    if isinstance(v, ast.Attribute):
        return v.attr == "dtype" or (_dotted(v.value) == "torch" and v.attr in DTYPES)
    return isinstance(v, ast.Name) and "dtype" in v.id


class CastSpelling(_Counting):
    """x.to(D) with one positional dtype -> x.type(D); x.float() -> x.to(torch.float32)."""

    def visit_Call(self, node):
        self.generic_visit(node)
        if (_is_attr_call(node, "to") and len(node.args) == 1 and not node.keywords
                and _dtype_like(node.args[0])):
            self.hits += 1
            return ast.Call(func=ast.Attribute(value=node.func.value, attr="type", ctx=ast.Load()),
                            args=node.args, keywords=[])
        if _is_attr_call(node, "float") and not node.args and not node.keywords:
            self.hits += 1
            return ast.Call(func=ast.Attribute(value=node.func.value, attr="to", ctx=ast.Load()),
                            args=[ast.parse("torch.float32", mode="eval").body], keywords=[])
        return node


class WeightBeforeDowncast(_Counting):
    """self.weight * h.to(D) -> (h * self.weight.float()).to(D): the weight multiplied in fp32
    before the downcast (one rounding instead of two: not the same values)."""

    def visit_BinOp(self, node):
        self.generic_visit(node)
        if not isinstance(node.op, ast.Mult):
            return node
        for w, c in ((node.left, node.right), (node.right, node.left)):
            if (_dotted(w).startswith("self.") and _is_attr_call(c, "to") and len(c.args) == 1
                    and not c.keywords):
                self.hits += 1
                up = ast.Call(func=ast.Attribute(value=w, attr="float", ctx=ast.Load()), args=[], keywords=[])
                prod = ast.BinOp(left=c.func.value, op=ast.Mult(), right=up)
                return ast.Call(func=ast.Attribute(value=prod, attr="to", ctx=ast.Load()), args=c.args,
                                keywords=[])
        return node


class RepeatInterleaveAsExpand(_Counting):
    """torch.repeat_interleave(x, n, dim=1) / x.repeat_interleave(n, dim=1) -> Hugging Face's
    repeat_kv: x[:, :, None].expand(b, h, n, s, d).reshape(b, h * n, s, d)."""

    def visit_Call(self, node):
        self.generic_visit(node)
        if _dotted(node.func) == "torch.repeat_interleave" and len(node.args) >= 2:
            x, n, rest = node.args[0], node.args[1], node.args[2:]
        elif _is_attr_call(node, "repeat_interleave") and node.args:
            x, n, rest = node.func.value, node.args[0], node.args[1:]
        else:
            return node
        dim = rest[0] if rest else _kw(node, "dim")
        if not (isinstance(dim, ast.Constant) and dim.value == 1):
            return node
        self.hits += 1
        return _call("_v_repeat_kv", [x, n])


class GqaAsRepeat(_Counting):
    """scaled_dot_product_attention(q, k, v, ..., enable_gqa=True) -> the same call on k and v
    repeated per query head (expand + reshape), without enable_gqa."""

    def visit_Call(self, node):
        self.generic_visit(node)
        if not _dotted(node.func).endswith("scaled_dot_product_attention") or len(node.args) != 3 \
                or not _const_true(_kw(node, "enable_gqa")):
            return node
        self.hits += 1
        return _call("_v_sdpa_repeat", list(node.args), list(node.keywords))


class SdpaByHand(_Counting):
    """scaled_dot_product_attention(q, k, v, is_causal=, enable_gqa=, scale=) -> written out:
    q @ k^T * scale, a causal mask by masked_fill, softmax in fp32, @ v (the scores rounded to
    the operands' dtype as eager computes them: not the same values)."""

    helper = "_v_attention"

    def visit_Call(self, node):
        self.generic_visit(node)
        if not _dotted(node.func).endswith("scaled_dot_product_attention") or len(node.args) != 3 \
                or any(k.arg not in ("is_causal", "enable_gqa", "scale") for k in node.keywords):
            return node
        self.hits += 1
        return _call(self.helper, list(node.args), list(node.keywords))


class SdpaByEinsum(SdpaByHand):
    """scaled_dot_product_attention -> written with einsum ('bhid,bhjd->bhij', then
    'bhij,bhjd->bhid'), the causal mask of the scores' own size (``i, j = s.shape[-2:]``)
    filled with ``-torch.finfo(s.dtype).max`` (research code's spelling; not the same values:
    the scores rounded as eager computes them)."""

    helper = "_v_attention_einsum"


class ChunkAsSlices(_Counting):
    """x.chunk(2, dim=-1) -> (x[..., :h], x[..., h:]) with h = x.shape[-1] // 2."""

    def visit_Call(self, node):
        self.generic_visit(node)
        if not _is_attr_call(node, "chunk") or not node.args:
            return node
        dim = node.args[1] if len(node.args) > 1 else _kw(node, "dim")
        if not (isinstance(node.args[0], ast.Constant) and node.args[0].value == 2
                and isinstance(dim, ast.UnaryOp) and isinstance(dim.op, ast.USub)
                and isinstance(dim.operand, ast.Constant) and dim.operand.value == 1):
            return node
        self.hits += 1
        return _call("_v_halves", [node.func.value])


class SiluExplicit(_Counting):
    """F.silu(x) -> x * torch.sigmoid(x) (rounded after each op in 16-bit eager)."""

    def visit_Call(self, node):
        self.generic_visit(node)
        if _dotted(node.func) not in ("F.silu", "torch.nn.functional.silu") or len(node.args) != 1:
            return node
        self.hits += 1
        return _call("_v_silu", node.args)


class RotateHalfChunked(_Counting):
    """A module-level ``rotate_half(x)`` written with x.chunk(2, -1) and x2 * -1."""

    BODY = ("x1, x2 = x.chunk(2, dim=-1)\n"
            "return torch.cat((x2 * -1, x1), dim=-1)\n")

    def visit_FunctionDef(self, node):
        if node.name != "rotate_half" or [a.arg for a in node.args.args] != ["x"]:
            return node
        self.hits += 1
        node.body = ast.parse(self.BODY).body
        return node


class GatherAsTakeAlongDim(_Counting):
    """torch.gather(x, d, i) / x.gather(d, i) -> torch.take_along_dim(x, i, dim=d) (the same
    read where the index has the source's size off d, as every gather here does)."""

    def visit_Call(self, node):
        self.generic_visit(node)
        if _dotted(node.func) == "torch.gather" and len(node.args) == 3 and not node.keywords:
            x, d, i = node.args
        elif _is_attr_call(node, "gather") and _dotted(node.func.value) != "torch" \
                and len(node.args) == 2 and not node.keywords:
            x, (d, i) = node.func.value, node.args
        else:
            return node
        self.hits += 1
        return _call("torch.take_along_dim", [x, i], [ast.keyword(arg="dim", value=d)])


class EmbeddingAsIndex(_Counting):
    """F.embedding(ids, w) -> w[ids] (no other arguments)."""

    def visit_Call(self, node):
        self.generic_visit(node)
        if _dotted(node.func) not in ("F.embedding", "torch.nn.functional.embedding") \
                or len(node.args) != 2 or node.keywords:
            return node
        self.hits += 1
        return ast.Subscript(value=node.args[1], slice=node.args[0], ctx=ast.Load())


class IndexSelectAsIndex(_Counting):
    """x.index_select(0, i) / torch.index_select(x, 0, i) -> x[i]."""

    def visit_Call(self, node):
        self.generic_visit(node)
        if _dotted(node.func) == "torch.index_select" and len(node.args) == 3:
            x, d, i = node.args
        elif _is_attr_call(node, "index_select") and _dotted(node.func.value) != "torch" and len(node.args) == 2:
            x, (d, i) = node.func.value, node.args
        else:
            return node
        if node.keywords or not (isinstance(d, ast.Constant) and d.value == 0):
            return node
        self.hits += 1
        return ast.Subscript(value=x, slice=i, ctx=ast.Load())


class CrossEntropyFlat(_Counting):
    """F.cross_entropy(x.float(), t) with x a name -> F.cross_entropy(x.view(-1,
    x.shape[-1]).float(), t.view(-1)) (as training code flattens [B, S, V])."""

    def visit_Call(self, node):
        self.generic_visit(node)
        if _dotted(node.func) not in ("F.cross_entropy", "torch.nn.functional.cross_entropy") \
                or len(node.args) != 2:
            return node
        lg, t = node.args
        if not (_is_attr_call(lg, "float") and isinstance(lg.func.value, ast.Name) and not lg.args):
            return node
        self.hits += 1
        flat = ast.parse("X.view(-1, X.shape[-1]).float()", mode="eval").body
        node.args = [_Subst({"X": lg.func.value}).visit(flat),
                     ast.Call(func=ast.Attribute(value=t, attr="view", ctx=ast.Load()),
                              args=[ast.Constant(-1)], keywords=[])]
        return node


class CrossEntropyAsNll(_Counting):
    """F.cross_entropy(x, t[, weight=, ignore_index=, reduction=]) -> F.nll_loss(F.log_softmax(x,
    dim=1), t, ...): torch's own definition of cross_entropy (the class dim is 1), the same
    kernels in eager."""

    def visit_Call(self, node):
        self.generic_visit(node)
        name = _dotted(node.func)
        if name not in ("F.cross_entropy", "torch.nn.functional.cross_entropy") or len(node.args) != 2 \
                or any(k.arg not in ("weight", "ignore_index", "reduction") for k in node.keywords):
            return node
        self.hits += 1
        ns = name.rsplit(".", 1)[0]
        logp = _call(f"{ns}.log_softmax", [node.args[0]], [ast.keyword(arg="dim", value=ast.Constant(1))])
        return _call(f"{ns}.nll_loss", [logp, node.args[1]], list(node.keywords))


class SoftmaxSpelling(_Counting):
    """torch.softmax(x, dim=d) / F.softmax(x, dim=d) -> x.softmax(d)."""

    def visit_Call(self, node):
        self.generic_visit(node)
        if _dotted(node.func) not in ("torch.softmax", "F.softmax", "torch.nn.functional.softmax") \
                or len(node.args) != 1 or [k.arg for k in node.keywords] != ["dim"]:
            return node
        self.hits += 1
        return ast.Call(func=ast.Attribute(value=node.args[0], attr="softmax", ctx=ast.Load()),
                        args=[node.keywords[0].value], keywords=[])


class DivAsReciprocalMul(_Counting):
    """x / c -> x * (1.0 / c) for c a number, a name, an attribute (self.temperature) or a
    math.sqrt(...) call: another rounding, the same op for the planner. Not in a function that
    rounds to integers (round, floor, ceil, trunc: a quantizer's round(x / scale) moves by one
    where an ulp crosses a half: not an equivalent program)."""

    STEPS = ("round", "floor", "ceil", "trunc")

    def visit_FunctionDef(self, node):
        for n in ast.walk(node):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in self.STEPS:
                return node
        self.generic_visit(node)
        return node

    def visit_BinOp(self, node):
        self.generic_visit(node)
        c = node.right
        scalar_like = (isinstance(c, (ast.Constant, ast.Name, ast.Attribute))
                       or (isinstance(c, ast.Call) and _dotted(c.func) == "math.sqrt"))
        if not isinstance(node.op, ast.Div) or not scalar_like or isinstance(node.left, ast.Constant):
            return node
        self.hits += 1
        return ast.BinOp(left=node.left, op=ast.Mult(),
                         right=ast.BinOp(left=ast.Constant(1.0), op=ast.Div(), right=c))


class SoftmaxWrittenOut(_Counting):
    """torch.softmax(x, dim=d) / F.softmax(x, d) / x.softmax(d), no dtype -> exp(x - amax(x, d))
    / sum(that, d) (rounded after each op in 16-bit eager)."""

    helper = "_v_softmax"

    def visit_Call(self, node):
        self.generic_visit(node)
        name = _dotted(node.func)
        if name in ("torch.softmax", "F.softmax", "torch.nn.functional.softmax"):
            x, rest = (node.args[0] if node.args else None), node.args[1:]
        elif _is_attr_call(node, "softmax") and name not in ("torch.softmax",):
            x, rest = node.func.value, node.args
        else:
            return node
        kws = {k.arg: k.value for k in node.keywords}
        dim = rest[0] if rest else kws.pop("dim", None)
        if x is None or dim is None or kws or len(rest) > 1:
            return node
        self.hits += 1
        return _call(self.helper, [x, dim])


class LayerNormWrittenOut(_Counting):
    """A call of an ``nn.LayerNorm`` attribute (``self.norm = nn.LayerNorm(d, ...)`` in __init__;
    one normalized dim) -> mean, biased variance and rsqrt written out in fp32, cast back, then
    the weight and bias."""

    def __init__(self):
        super().__init__()
        self.norms: set[str] = set()

    def visit_Module(self, node):
        for n in ast.walk(node):
            if (isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.value, ast.Call)
                    and _dotted(n.value.func) in ("nn.LayerNorm", "torch.nn.LayerNorm")
                    and _dotted(n.targets[0]).startswith("self.")
                    and not any(k.arg == "elementwise_affine" for k in n.value.keywords)):
                self.norms.add(_dotted(n.targets[0]))
        self.generic_visit(node)
        return node

    def visit_Call(self, node):
        self.generic_visit(node)
        name = _dotted(node.func)
        if name not in self.norms or len(node.args) != 1 or node.keywords:
            return node
        self.hits += 1
        return self.replacement(name, node.args[0])

    @staticmethod
    def _attr(name: str, a: str):
        return ast.parse(f"{name}.{a}", mode="eval").body

    def replacement(self, name: str, x):
        return _call("_v_layer_norm", [x] + [self._attr(name, a) for a in ("weight", "bias", "eps")])


class SoftmaxMaxValues(SoftmaxWrittenOut):
    """As softmax_written_out, the maximum read as ``t.max(d, keepdim=True).values`` (the
    named-tuple field; fx records an attribute read, not an index)."""

    helper = "_v_softmax_values"


class LayerNormFunctional(LayerNormWrittenOut):
    """A call of an ``nn.LayerNorm`` attribute (one normalized dim, affine) ->
    ``torch.nn.functional.layer_norm(x, x.shape[-1:], self.norm.weight, ...)``: the
    normalized shape read from the input in forward."""

    def replacement(self, name: str, x):
        ns = ast.Subscript(value=ast.Attribute(value=copy.deepcopy(x), attr="shape", ctx=ast.Load()),
                           slice=ast.Slice(lower=ast.UnaryOp(op=ast.USub(), operand=ast.Constant(1))),
                           ctx=ast.Load())
        return _call("torch.nn.functional.layer_norm",
                     [x, ns] + [self._attr(name, a) for a in ("weight", "bias", "eps")])


def _is_upcast(v) -> bool:
    """``x.float()`` or ``x.to(torch.float32)`` of a plain name x."""
    if not isinstance(v, ast.Call) or not isinstance(v.func, ast.Attribute) or not isinstance(v.func.value, ast.Name):
        return False
    if v.func.attr == "float":
        return not v.args and not v.keywords
    return (v.func.attr == "to" and len(v.args) == 1 and not v.keywords
            and _dotted(v.args[0]) == "torch.float32")


def _assigned(stmt) -> set[str]:
    return {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


class UpcastEachUse(_Counting):
    """``h = x.float()`` (or ``.to(torch.float32)``) read several times -> ``x.float()`` written
    at each read (Gemma's ``x.float() * torch.rsqrt(x.float().pow(2).mean(-1, ...))``): the same
    upcast computed twice. Only in a function's straight-line statements, up to where h or x is
    assigned again."""

    def visit_FunctionDef(self, node):
        self.generic_visit(node)
        body, i = node.body, 0
        while i < len(body):
            st = body[i]
            if not (isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name)
                    and _is_upcast(st.value)):
                i += 1
                continue
            h, x = st.targets[0].id, st.value.func.value.id
            rest = body[i + 1:]
            end = next((j + 1 for j, later in enumerate(rest) if _assigned(later) & {h, x}), len(rest))
            reads = lambda sts, name: sum(isinstance(n, ast.Name) and n.id == name  # noqa: E731
                                          and isinstance(n.ctx, ast.Load) for s2 in sts for n in ast.walk(s2))
            last = rest[end - 1] if end else None
            if (reads(rest[:end], h) < 2
                    or (last is not None and not isinstance(last, (ast.Assign, ast.AugAssign, ast.AnnAssign))
                        and _assigned(last) & {h, x})  # assigned in a branch or a loop: not followed
                    or (last is not None and h not in _assigned(last) and reads(rest[end:], h))):
                i += 1  # h read after x changes is not x.float() any more
                continue
            sub = _Copies({h: st.value})
            body[i + 1:i + 1 + end] = [sub.visit(s2) for s2 in rest[:end]]
            del body[i]
            self.hits += 1
        return node


class _Copies(ast.NodeTransformer):
    """Name loads replaced by a fresh copy of an expression."""

    def __init__(self, names: dict):
        self.names = names

    def visit_Name(self, node):
        if node.id in self.names and isinstance(node.ctx, ast.Load):
            return copy.deepcopy(self.names[node.id])
        return node


class _Subst(ast.NodeTransformer):
    def __init__(self, names: dict):
        self.names = names

    def visit_Name(self, node):
        return self.names.get(node.id, node)


RULES: list[Rule] = [
    Rule("mean_as_sum_div", MeanAsSum.__doc__, MeanAsSum, helpers=("_v_mean",)),
    Rule("keepdim_as_unsqueeze", KeepdimAsUnsqueeze.__doc__, KeepdimAsUnsqueeze),
    Rule("rsqrt_as_reciprocal_sqrt", RsqrtAsReciprocal.__doc__, RsqrtAsReciprocal, exact=False),
    Rule("mul_rsqrt_as_div_sqrt", MulRsqrtAsDiv.__doc__, MulRsqrtAsDiv, exact=False),
    Rule("cast_spelling", CastSpelling.__doc__, CastSpelling),
    Rule("weight_before_downcast", WeightBeforeDowncast.__doc__, WeightBeforeDowncast, exact=False),
    Rule("repeat_interleave_as_expand", RepeatInterleaveAsExpand.__doc__, RepeatInterleaveAsExpand,
         helpers=("_v_repeat_kv",)),
    Rule("gqa_as_repeated_kv", GqaAsRepeat.__doc__, GqaAsRepeat,
         helpers=("_v_repeat_kv", "_v_sdpa_repeat")),
    Rule("sdpa_written_out", SdpaByHand.__doc__, SdpaByHand, exact=False,
         helpers=("_v_gqa_heads", "_v_attention"), imports=("math",)),
    Rule("sdpa_as_einsum", SdpaByEinsum.__doc__, SdpaByEinsum, exact=False,
         helpers=("_v_gqa_heads", "_v_attention_einsum")),
    Rule("chunk_as_slices", ChunkAsSlices.__doc__, ChunkAsSlices, helpers=("_v_halves",)),
    Rule("silu_written_out", SiluExplicit.__doc__, SiluExplicit, exact=False, helpers=("_v_silu",)),
    Rule("rotate_half_chunked", RotateHalfChunked.__doc__, RotateHalfChunked),
    Rule("cross_entropy_flattened", CrossEntropyFlat.__doc__, CrossEntropyFlat),
    Rule("cross_entropy_as_nll_log_softmax", CrossEntropyAsNll.__doc__, CrossEntropyAsNll),
    Rule("softmax_method", SoftmaxSpelling.__doc__, SoftmaxSpelling),
    Rule("div_as_reciprocal_mul", DivAsReciprocalMul.__doc__, DivAsReciprocalMul, exact=False),
    Rule("softmax_written_out", SoftmaxWrittenOut.__doc__, SoftmaxWrittenOut, exact=False,
         helpers=("_v_softmax",)),
    Rule("layer_norm_written_out", LayerNormWrittenOut.__doc__, LayerNormWrittenOut, exact=False,
         helpers=("_v_layer_norm",)),
    Rule("softmax_max_values", SoftmaxMaxValues.__doc__, SoftmaxMaxValues, exact=False,
         helpers=("_v_softmax_values",)),
    Rule("layer_norm_shape_from_input", LayerNormFunctional.__doc__, LayerNormFunctional),
    Rule("upcast_each_use", UpcastEachUse.__doc__, UpcastEachUse),
    Rule("gather_as_take_along_dim", GatherAsTakeAlongDim.__doc__, GatherAsTakeAlongDim),
    Rule("embedding_as_index", EmbeddingAsIndex.__doc__, EmbeddingAsIndex),
    Rule("index_select_as_index", IndexSelectAsIndex.__doc__, IndexSelectAsIndex),
]


def apply(rule: Rule, source: str) -> str | None:
    """The variant of source under one rule (None: the rule matches nothing there)."""
    tree = ast.parse(source)
    tr = rule.transformer()
    tree = tr.visit(tree)
    if not tr.hits:
        return None
    ast.fix_missing_locations(tree)
    body = ast.unparse(tree)
    head = [f"import {m}" for m in rule.imports if not _imports(source, m)]
    helpers = [HELPERS[h].strip("\n") for h in rule.helpers]
    # helpers go after the imports: they use torch, and fx traces through them
    lines = body.splitlines()
    last_import = max((i for i, ln in enumerate(lines) if ln.startswith(("import ", "from "))), default=-1)
    out = lines[:last_import + 1] + head + [""] + helpers + [""] + lines[last_import + 1:]
    return "\n".join(out) + "\n"


def _imports(source: str, module: str) -> bool:
    return any(ln.strip() in (f"import {module}",) for ln in source.splitlines())


def variants(source: str) -> list[tuple[Rule, str]]:
    """Every rule that applies to source, with its variant."""
    out = []
    for rule in RULES:
        v = apply(rule, source)
        if v is not None:
            out.append((rule, v))
    return out


def write_variants(problem: str | pathlib.Path, out_dir: str | pathlib.Path) -> list[pathlib.Path]:
    problem, out = pathlib.Path(problem), pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for rule, src in variants(problem.read_text()):
        p = out / f"{problem.stem}__{rule.name}.py"
        p.write_text(src)
        paths.append(p)
    return paths


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__)
        sys.exit(0 if len(sys.argv) == 2 and sys.argv[1] in ("-h", "--help") else
                 "usage: python workloads/variants.py PROBLEM.py OUT_DIR")
    for p in write_variants(sys.argv[1], sys.argv[2]):
        print(p)
