"""Softmax and attention: softmax over a size-1 dim (rw-softmax-size1); attention written out
(rw-attention): q @ k^T * scale, an optional causal mask, softmax, @ v; GQA key/value heads
repeated (a canonical form)."""
from __future__ import annotations

from torch import fx

from codegen.ops import classify, node_dtype, node_shape
from codegen.rewrites.common import (_annotate, _erase_unused_above, _float, _live, _op_name, _ops, _replace,
                                     _static_int)


def softmax_size1(gm: fx.GraphModule) -> bool:
    """rw-softmax-size1: softmax over a size-1 dimension is x - x + 1 (1, or NaN where x is not
    finite, as eager gives); log_softmax is x - x."""
    import operator

    graph = gm.graph
    changed = False
    for n, op in _ops(gm, "softmax", ("softmax", "log_softmax")):
        x = op.operands[0]
        shape = node_shape(x)
        dim = op.p.get("dim")
        if not _float(x) or not shape or not isinstance(dim, int) or shape[dim % len(shape)] != 1:
            continue
        with graph.inserting_before(n):
            v = graph.call_function(operator.sub, (x, x))
            if op.name == "softmax":
                v = graph.call_function(operator.add, (v, 1.0))
        _replace(n, v)
        changed = True
    return changed


#: a finite mask fill at or below this is -inf for a softmax: exp(fill - row max) is exactly 0
#: in fp32 for any row max above fill + 104 (a causal row always keeps its finite diagonal)
MASK_FILL_MAX = -1e9


def _through(gm: fx.GraphModule, n):
    """Follow single-user casts (and identities) from n: (the first other node, casts passed)."""
    casts = []
    while isinstance(n, fx.Node):
        op = classify(n, gm)
        if not ((op.kind == "pointwise" and op.name == "cast") or op.kind == "identity") or len(n.users) > 1:
            break
        if op.kind == "pointwise":
            casts.append(op.p["dtype"])
        n = op.operands[0]
    return n, casts


def _transposed_last(n) -> fx.Node | None:
    """x when n is x with its last two dims swapped (transpose(-2, -1), .mT, permute, .t())."""
    if not isinstance(n, fx.Node) or n.op not in ("call_method", "call_function"):
        return None
    x = n.args[0] if n.args else None
    shape = node_shape(x) if isinstance(x, fx.Node) else None
    if shape is None or len(shape) < 2:
        return None
    nd = len(shape)
    name = _op_name(n)
    if name in ("transpose", "swapaxes", "swapdims") and len(n.args) == 3 and not n.kwargs:
        return x if {n.args[1] % nd, n.args[2] % nd} == {nd - 2, nd - 1} else None
    if name == "permute":
        dims = list(n.args[1:]) if len(n.args) > 2 else list(n.args[1]) if len(n.args) == 2 else []
        want = list(range(nd - 2)) + [nd - 1, nd - 2]
        return x if [d % nd for d in dims if isinstance(d, int)] == want and len(dims) == nd else None
    if name == "t" and nd == 2:
        return x
    if n.op == "call_function" and n.target is getattr and n.args[1] == "mT":
        return x
    return None


#: tensor methods that make a new tensor from their receiver's dtype and device alone
NEW_FACTORIES = ("new_ones", "new_zeros", "new_full", "new_empty", "new_tensor")


#: torch functions that make a new tensor from their first argument's shape, dtype and device
LIKE_FACTORIES = ("ones_like", "zeros_like", "full_like", "empty_like")


def _constant_value(gm: fx.GraphModule, n: fx.Node, bump: int = 0, given: dict | None = None,
                    shape_only: bool = False):
    """The value of n when it depends on no tensor's values, only on traced constants and on
    shape or device queries of the graph's inputs: evaluated on the CPU with every input dim
    grown by ``bump`` (inputs as meta tensors, their device read as the CPU's). None when n reads
    a value it cannot know (an input's or a parameter's data, a buffer), or evaluating fails.
    Parameters and buffers are meta tensors of their shapes (their values may change through
    load_state_dict): their shapes can be read, a value read from them stays meta. ``given``:
    values for get_attr nodes (a buffer's stand-in). ``shape_only``: n's shape is wanted (a meta
    result gives its shape). Returns (value, whether it read an input's shape)."""
    import re

    import torch

    order, seen, todo = [], set(), [n]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        order.append(m)
        todo.extend(m.all_input_nodes)
    pos = {m: i for i, m in enumerate(gm.graph.nodes)}
    env, shaped = {}, False
    try:
        for m in sorted(order, key=pos.__getitem__):
            if m.op == "placeholder":
                sh = node_shape(m)
                if sh is None:
                    return None
                env[m] = torch.empty([d + bump for d in sh], dtype=node_dtype(m), device="meta")
                continue
            if m.op == "get_attr" and given and m in given:
                env[m] = given[m]
                continue
            if m.op == "get_attr":
                if re.fullmatch(r"_tensor_constant\d+", str(m.target)):
                    env[m] = getattr(gm, m.target)
                elif node_shape(m) is not None:  # a parameter or buffer: its shape only
                    env[m] = torch.empty(node_shape(m), dtype=node_dtype(m), device="meta")
                else:
                    return None
                continue
            args = fx.node.map_arg(m.args, env.__getitem__)
            kwargs = fx.node.map_arg(m.kwargs, env.__getitem__)
            if m.op == "call_function" and m.target is getattr and args[1] == "device":
                env[m] = torch.device("cpu")
                continue
            if m.op == "call_function" and m.target is getattr and args[1] in ("shape", "ndim"):
                shaped = True
            if m.op == "call_method" and m.target in ("size", "dim"):
                shaped = True
            if m.op == "call_function" and getattr(m.target, "__name__", "") in LIKE_FACTORIES \
                    and isinstance(args[0], torch.Tensor) and args[0].device.type == "meta":
                # torch.ones_like(x) reads only x's shape, dtype and device
                args = (torch.empty(args[0].shape, dtype=args[0].dtype),) + tuple(args[1:])
                val = m.target(*args, **kwargs)
            elif m.op == "call_function":
                val = m.target(*args, **kwargs)
            elif m.op == "call_method" and m.target in NEW_FACTORIES:
                # x.new_ones(...) reads only x's dtype and device: made from a CPU stand-in
                val = getattr(torch.empty(0, dtype=args[0].dtype), m.target)(*args[1:], **kwargs)
            elif m.op == "call_method":
                val = getattr(args[0], m.target)(*args[1:], **kwargs)
            elif m.op == "call_module":  # on the captured (meta) module: a shape, never a value
                val = gm.get_submodule(m.target)(*args, **kwargs)
            else:
                return None
            env[m] = val  # meta tensors only for shape queries: a value read stays meta
    except Exception:  # noqa: BLE001 - a form the evaluation cannot run: not a known constant
        return None
    out = env[n]
    if shape_only:
        return (tuple(out.shape), shaped) if isinstance(out, torch.Tensor) else None
    if isinstance(out, torch.Tensor) and out.device.type == "meta":
        return None  # it depends on an input's or a parameter's values
    return out, shaped


def _causal_2d(rows: int, cols: int):
    """Keep-mask of torch's is_causal (top-left aligned): key j visible to query i when j <= i."""
    import torch

    return torch.ones(rows, cols, dtype=torch.bool).tril()


def _is_causal_mask(val, kind: str) -> bool:
    """Is val (broadcast over leading dims) the causal mask of its own last two dims, as the
    ``kind`` of use reads it: 'drop' (True where masked: masked_fill), 'keep' (True where kept:
    where), 'add' (0 where kept, -inf or <= MASK_FILL_MAX where masked: an additive mask)."""
    import torch

    if not isinstance(val, torch.Tensor) or val.dim() < 2 or val.numel() != val.shape[-2] * val.shape[-1]:
        return False
    m = val.reshape(val.shape[-2], val.shape[-1])
    keep = _causal_2d(*m.shape)
    if kind == "add":
        if not m.is_floating_point():
            return False
        return bool((m[keep] == 0).all()) and bool((m[~keep] <= MASK_FILL_MAX).all())
    if m.dtype != torch.bool:
        if m.is_floating_point() or not bool(((m == 0) | (m == 1)).all()):
            return False
        m = m.bool()
    return bool((m == (keep if kind == "keep" else ~keep)).all())


def _fill_value(v) -> float | None:
    """A where's fill as a number: a number, or a tensor of one value made for it
    (``torch.full_like(s, -inf)``, ``torch.full(shape, -inf)``, ``torch.tensor(-inf)``)."""
    import torch

    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if not isinstance(v, fx.Node) or v.op not in ("call_function", "call_method"):
        return None
    name = _op_name(v)
    if set(v.kwargs) - {"dtype", "device", "layout", "requires_grad", "fill_value"}:
        return None
    if name in ("full_like", "full", "new_full"):
        args = list(v.args) + ([v.kwargs["fill_value"]] if "fill_value" in v.kwargs else [])
        val = args[1] if len(args) > 1 else None
    elif v.op == "call_function" and v.target is torch.tensor and len(v.args) == 1:
        val = v.args[0]
    else:
        return None
    return float(val) if isinstance(val, (int, float)) and not isinstance(val, bool) else None


def _mask_step(gm: fx.GraphModule, n: fx.Node):
    """(scores, mask node, kind, fill) when n masks scores: masked_fill(s, mask, fill), where(mask,
    s, fill), where(mask, fill, s) (the fill a number or a full_like of one) or s + mask (fill
    None), with a fill at or below MASK_FILL_MAX; else None."""
    import operator

    import torch

    name = _op_name(n)
    args = list(n.args)
    if name == "masked_fill" and len(args) + len(n.kwargs) == 3:
        s, mask = args[0], args[1] if len(args) > 1 else n.kwargs.get("mask")
        fill = args[2] if len(args) > 2 else n.kwargs.get("value")
        if isinstance(fill, (int, float)) and not isinstance(fill, bool) and fill <= MASK_FILL_MAX:
            return s, mask, "drop", float(fill)
        return None
    if n.op == "call_function" and n.target is torch.where and len(args) == 3 and not n.kwargs:
        cond, a, b = args
        fa, fb = _fill_value(a), _fill_value(b)
        if fb is not None and fb <= MASK_FILL_MAX:
            return a, cond, "keep", fb
        if fa is not None and fa <= MASK_FILL_MAX:
            return b, cond, "drop", fa
        return None
    if n.op == "call_function" and n.target in (operator.add, torch.add) and len(args) == 2 and not n.kwargs:
        a, b = args
        # the scores are the operand a product reaches (mask + scores as well as scores + mask)
        pairs = ((b, a), (a, b)) if _reads_product(gm, a) is False and _reads_product(gm, b) else ((a, b), (b, a))
        for s, mask in pairs:
            if isinstance(mask, fx.Node) and isinstance(s, fx.Node) and node_shape(s) is not None \
                    and node_shape(mask) is not None and len(node_shape(mask)) <= len(node_shape(s)):
                return s, mask, "add", None
    return None


def _reads_product(gm: fx.GraphModule, n) -> bool | None:
    """Does n's value come from a matrix product (at any depth)? None: n is not a node."""
    if not isinstance(n, fx.Node):
        return None
    todo, seen = [n], set()
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        if m.op in ("call_function", "call_method") and classify(m, gm).kind == "matmul":
            return True
        todo.extend(m.all_input_nodes)
    return False


def _mask_is_causal(gm: fx.GraphModule, mask, kind: str, scores_shape) -> tuple[bool, fx.Node | None]:
    """The mask is causal at the traced size (and of the scores' size there) and, when it is
    built from the inputs' shapes, also at another size (every input dim grown by one, where the
    model runs so).

    A mask read from one buffer (minGPT's ``self.bias[:, :, :T, :T] == 0``) is causal when the
    buffer is the lower-triangular ones (a stand-in of its shape with those values gives the
    causal mask at both sizes); then (True, the buffer's get_attr): the file takes the kernels only
    while the buffer holds those values (codegen.dropin ``tril_buffers``, checked once per
    version of the buffer), since load_state_dict can change it."""
    if not isinstance(mask, fx.Node):
        return False, None
    given, buf = None, None
    got = _constant_value(gm, mask)
    if got is None:
        buf = _one_buffer(gm, mask)
        if buf is None:
            return False, None
        given = {buf: _tril_stand_in(buf)}
        got = _constant_value(gm, mask, given=given)
        if got is None:
            return False, None
    val, shaped = got
    if tuple(val.shape[-2:]) != tuple(scores_shape[-2:]) or not _is_causal_mask(val, kind):
        return False, None
    if shaped:
        again = _constant_value(gm, mask, bump=1, given=given)
        # (None: the model does not run with every input dim grown, e.g. a layer norm over the
        # features before the length is read; the drop-in guard then decides, since it compiles
        # the problem again at other sizes and frees a dim only where the file stays the same)
        if again is not None and not _is_causal_mask(again[0], kind):
            return False, None
    return True, buf


def _one_buffer(gm: fx.GraphModule, mask: fx.Node) -> fx.Node | None:
    """The one buffer (a get_attr of a registered buffer) the mask's values come from, else None.
    What reaches the mask only through a shape query (``x.size()``, ``x.shape``) gives no values
    (a layer norm's weight before the length is read)."""
    found, todo, seen = [], [mask], set()
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        if (m.op == "call_method" and m.target in ("size", "dim")) or (
                m.op == "call_function" and m.target is getattr and len(m.args) > 1
                and m.args[1] in ("shape", "ndim", "device", "dtype")):
            continue  # a shape query: the values above it do not reach the mask
        todo.extend(m.all_input_nodes)
        if m.op == "get_attr":
            found.append(m)
    if len(found) != 1 or str(found[0].target) not in dict(gm.named_buffers()):
        return None
    return found[0]


def _tril_stand_in(buf: fx.Node):
    """The lower-triangular ones of the buffer's shape and dtype (on the CPU)."""
    import torch

    sh, dt = node_shape(buf), node_dtype(buf)
    if sh is None or len(sh) < 2 or dt is None:
        return None
    return torch.ones(sh[-2:], dtype=dt).tril().expand(sh).clone()


def _number(gm: fx.GraphModule, v):
    """A Python number v, or an fx value computed from constants and input shapes (math.sqrt of
    a head dim): (value at the traced size, value at the grown size or None if it does not
    depend on shapes); None for anything else."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v), None
    if not isinstance(v, fx.Node) or node_shape(v) is not None:
        return None
    got = _constant_value(gm, v)
    if got is None or not isinstance(got[0], (int, float)) or isinstance(got[0], bool):
        return None
    if not got[1]:
        return float(got[0]), None
    again = _constant_value(gm, v, bump=1)
    if again is None or not isinstance(again[0], (int, float)):
        # the grown size does not run (a linear layer on the inputs' last dim): the value at the
        # traced size, as a constant; the file then holds it, so the drop-in guard fixes every
        # dim it depends on (codegen.dropin: a size the file bakes in is not free)
        return float(got[0]), None
    return float(got[0]), float(again[0])


def _scale_step(gm: fx.GraphModule, n, head_dim: tuple[int, int] | None = None):
    """(x, factor) when n is x * c, c * x or x / c for a number c; factor "head" when c is
    1/sqrt(head dim) (a divide: sqrt(head dim)) computed from the inputs' shapes, as sdpa's
    default scale is, at the traced and at the grown size; else None."""
    import math

    if not isinstance(n, fx.Node) or n.op not in ("call_function", "call_method"):
        return None
    op = classify(n, gm)
    if op.kind not in ("pointwise", "library") or _op_name(n) not in ("mul", "truediv", "div") \
            or len(n.args) != 2 or n.kwargs:
        return None
    a, b = n.args
    pairs = [(a, b), (b, a)] if _op_name(n) == "mul" else [(a, b)]
    for x, c in pairs:
        if not _float(x):
            continue
        num = _number(gm, c)
        if num is None or num[0] == 0:
            return None
        inv = _op_name(n) != "mul"
        if num[1] is None:
            return x, (1.0 / num[0] if inv else num[0])
        if head_dim is None:
            return None
        want = [math.sqrt(d) if inv else 1.0 / math.sqrt(d) for d in head_dim]
        if all(abs(g - w) <= 1e-9 * w for g, w in zip(num, want)):
            return x, "head"
        return None
    return None


def _plain_product(op) -> bool:
    """Is op a matmul / bmm of two tensors (no bias)?"""
    return (op is not None and op.kind == "matmul" and op.name in ("matmul", "bmm")
            and op.operands[2] is None)


def _qk_head_dim(gm: fx.GraphModule, s: fx.Node) -> tuple[int, int] | None:
    """The head dim of the q @ k^T below s (through scale steps), for a shape-derived scale: at
    the traced size and with every input dim grown by one (the head dim of ``C // n_head`` may
    stay, of a traced input grows)."""
    while isinstance(s, fx.Node):
        op = classify(s, gm) if s.op in ("call_function", "call_method") else None
        if op is not None and op.kind == "matmul" and node_shape(op.operands[0]):
            hd = int(node_shape(op.operands[0])[-1])
            grown = _constant_value(gm, op.operands[0], bump=1, shape_only=True)
            return hd, (int(grown[0][-1]) if grown is not None and grown[0] else hd + 1)
        if op is None or not s.args or not isinstance(s.args[0], fx.Node):
            return None
        s = s.args[0] if _float(s.args[0]) else (s.args[1] if len(s.args) > 1 else None)
    return None


def _bias_fits(gm: fx.GraphModule, mask, inner: fx.Node, add: fx.Node, kind: str, scale: float,
               head: int) -> bool:
    """Can the additive mask of ``inner + mask`` (not a causal one) be the attention kernel's
    bias: an add outside every scale factor (the kernel adds it to the scaled scores), a tensor
    of 16/32-bit floats that broadcasts to the scores without growing them, and the sum kept in
    the scores' dtype or fp32 (an fp64 sum would be computed in fp32)."""
    import torch

    if kind != "add" or scale != 1.0 or head or not isinstance(mask, fx.Node):
        return False
    sm, si = node_shape(mask), node_shape(inner)
    if sm is None or si is None or node_dtype(mask) not in (torch.float32, torch.float16, torch.bfloat16):
        return False
    if node_dtype(add) not in (node_dtype(inner), torch.float32):
        return False
    try:
        return tuple(torch.broadcast_shapes(tuple(sm), tuple(si))) == tuple(si)
    except RuntimeError:
        return False


def _fill_fits(mask, inner: fx.Node, kind: str, fill: float | None, scale: float, head: int) -> bool:
    """Can the masked_fill / where of ``inner`` by ``mask`` (not a causal one) be the attention
    kernel's fill mask: a bool tensor that broadcasts to the scores without growing them, filled
    with a number at or below MASK_FILL_MAX that no factor after it changes (-inf stays -inf
    under a positive factor; a finite fill must be the score the softmax sees)."""
    import torch

    if kind not in ("drop", "keep") or fill is None or not isinstance(mask, fx.Node):
        return False
    if fill != float("-inf") and (scale != 1.0 or head):
        return False
    if scale <= 0:
        return False
    sm, si = node_shape(mask), node_shape(inner)
    if sm is None or si is None or node_dtype(mask) != torch.bool:
        return False
    try:
        return tuple(torch.broadcast_shapes(tuple(sm), tuple(si))) == tuple(si)
    except RuntimeError:
        return False


def _reads(n: fx.Node, other: fx.Node) -> bool:
    """Does n's value depend on other's (other among its inputs, at any depth)?"""
    todo, seen = [n], set()
    while todo:
        m = todo.pop()
        if m is other:
            return True
        if m in seen:
            continue
        seen.add(m)
        todo.extend(m.all_input_nodes)
    return False


def _tanh_of(gm: fx.GraphModule, n) -> fx.Node | None:
    """x when n is tanh(x) (torch.tanh, F.tanh, x.tanh()) of a floating x."""
    if not isinstance(n, fx.Node) or n.op not in ("call_function", "call_method") or n.kwargs:
        return None
    op = classify(n, gm)
    if op.kind != "pointwise" or op.name != "tanh" or len(n.args) != 1 or not _float(n.args[0]):
        return None
    return n.args[0]


def _scores_chain(gm: fx.GraphModule, x, bias_ok: bool = False):
    """Walk up from the scores a softmax (or ReLU) reads: [scale and one causal mask, in either
    order, casts between] -> q @ k^T. (q, k, k^T, causal, scale, head, buffer, bias, softcap)
    with ``head`` the number of 1/sqrt(head_dim) factors seen (then ``scale`` is 1.0),
    ``buffer`` the name of the lower-triangular buffer the causal mask reads (None: a mask of
    constants or shapes), or None when it is not that chain. ``bias_ok``: an additive mask that
    is not causal (an input: Hugging Face's padding mask; a bias: ALiBi's) may be added outside
    the scale factors, inside the causal mask if there is one: ``bias`` is that mask (else
    None); a bool mask that is not causal may fill the scores it marks (``masked_fill(s, m,
    fill)``, ``where(m, s, fill)``: a padding mask ``m == 0``) inside the causal mask and
    outside the bias, with no factor after it unless the fill is -inf: ``fills`` is (the mask,
    fill, True where the mask marks the kept scores) (else None); and the scaled scores may be
    soft-capped below every mask, ``c * tanh(scores)`` (Gemma's): ``softcap`` is c (else None;
    the factors inside the tanh are ``scale``)."""
    s, _ = _through(gm, x)
    causal, scale, head, ok, tril, bias, softcap, fills = False, 1.0, 0, True, None, None, None, None
    while ok and isinstance(s, fx.Node) and len(s.users) == 1:
        up, _ = _through(gm, s)
        if up is not s:  # casts between the steps (scores.float() / c)
            s = up
            continue
        sc = _scale_step(gm, s, head_dim=_qk_head_dim(gm, s))
        if sc is not None:
            s, c = sc
            if c == "head":
                head += 1
            else:
                scale *= c
            continue
        inner = _tanh_of(gm, s) if bias_ok and softcap is None else None
        if inner is not None:
            if head or scale == 0:
                return None  # a cap of 1/sqrt(head dim): not a number the kernel bakes in
            s, softcap, scale = inner, float(scale), 1.0
            continue
        # masks sit outside the tanh (inside it they are no masks); a bias inside the causal mask
        step = _mask_step(gm, s) if softcap is None and bias is None else None
        if step is None:
            break
        inner, mask, kind, fill = step
        if fills is not None and fills[1] != float("-inf"):
            ok = False  # a mask inside a finite fill: the fill would replace its -inf
            break
        # the factors seen so far scale the masked scores: -inf times a negative is +inf
        is_causal, buf = _mask_is_causal(gm, mask, kind, node_shape(inner)) if (
            not causal and isinstance(inner, fx.Node) and scale > 0) else (False, None)
        if is_causal:
            s, causal, tril = inner, True, buf
            continue
        if bias_ok and isinstance(inner, fx.Node) and _bias_fits(gm, mask, inner, s, kind, scale, head):
            s, bias = inner, mask
            continue
        if bias_ok and fills is None and isinstance(inner, fx.Node) and _fill_fits(mask, inner, kind, fill, scale, head):
            s, fills = inner, (mask, fill, kind == "keep")
            continue
        ok = False
    if not ok or head > 1 or (head and scale != 1.0 and not bias_ok):
        return None  # a number, or 1/sqrt(D) (times a number where bias_ok): not 1/D
    if not isinstance(s, fx.Node) or len(s.users) != 1:
        return None
    qk = classify(s, gm) if s.op in ("call_function", "call_method") else None
    if not _plain_product(qk):
        return None
    q, kt = qk.operands[:2]
    k = _transposed_last(kt)
    if k is None and not _stored_keys(q, kt):
        return None  # (k None: keys stored transposed, kt itself [..., D, T])
    if not all(_float(t) for t in (q, kt)):
        return None
    if any(m is not None and _reads(m, s) for m in (bias, fills and fills[0])):
        return None  # a mask made from the scores themselves
    return q, k, kt, causal, scale, head, tril, bias, softcap, fills


def _needs_tril(gm: fx.GraphModule, buffer: fx.Node | None, q: fx.Node, k: fx.Node) -> None:
    """Record that the rewritten graph holds only while ``buffer`` is the lower-triangular ones
    (``gm.meta['egg_tril_buffers']``: the drop-in guard checks it, codegen.dropin), and keep
    the mask's shape check: the kernel reads no mask, but where the buffer's slice does not fit
    the scores (a sequence longer than the buffer) Model raises, and so must the file. The
    check reads the slice's shape (a view), not its values."""
    if buffer is None:
        return
    from codegen.ops import mask_fits

    gm.meta.setdefault("egg_tril_buffers", set()).add(str(buffer.target))
    view = buffer
    while len(view.users) == 1:
        u = next(iter(view.users))
        if classify(u, gm).kind not in ("view", "getitem") or u.args[0] is not view:
            break
        view = u
    with gm.graph.inserting_after(max(view, q, k, key=_position(gm))):
        # named apart: fx names a node after its target, and the emitted forward calls the
        # runtime helper by its plain name
        gm.graph.create_node("call_function", mask_fits, (view, q, k), {}, name="mask_ok")


def _position(gm: fx.GraphModule):
    pos = {n: i for i, n in enumerate(gm.graph.nodes)}
    return pos.__getitem__


def _stored_keys(q, kt) -> bool:
    """kt is the keys stored transposed, [..., D, T] (a cache kept as k^T, read by ``q @ k_t``):
    a batched tensor of q's rank that is no transpose the rule could walk through. The kernel
    reads it through ``kt.transpose(-2, -1)``, a view."""
    sq, st = node_shape(q), node_shape(kt)
    return (isinstance(kt, fx.Node) and sq is not None and st is not None and 3 <= len(st) == len(sq)
            and sq[-1] == st[-2])


def _key_shape(k, kt):
    """k's shape; for keys stored transposed (k None), kt's with its last two dims swapped."""
    if k is not None:
        return node_shape(k)
    st = node_shape(kt)
    return None if st is None else (*st[:-2], st[-1], st[-2])


def _fits(n: fx.Node, q, k, kt, v, shape, fold: bool = True) -> bool:
    """q, k, v of one dtype (the product's too), of the product's rank, one batch, q and k of
    one head dim, k and v of one length: what the attention kernel takes. One key/value head
    that the products broadcast over the query heads (multi-query attention, [B, 1, T, D]) is
    taken too: see _broadcast_heads; with ``fold``, so are 5-d products over two head dims
    (see _folded). k None: the keys stored transposed (kt, _stored_keys)."""
    sq, sk, sv = node_shape(q), _key_shape(k, kt), node_shape(v)
    if sq is None or sk is None or sv is None:
        return False
    return (len({node_dtype(q), node_dtype(kt if k is None else k), node_dtype(v), node_dtype(n)}) == 1
            and len(sq) == len(sk) == len(sv) == len(shape)
            and (len(sq) < 5 or (fold and _folded(sq, sk) is not None))
            and (sq[:-2] == sk[:-2] or _broadcast_heads(sq, sk) or _folded(sq, sk) == "grouped")
            and sk[:-2] == sv[:-2] and sq[-1] == sk[-1] and sk[-2] == sv[-2])


def _broadcast_heads(sq, sk) -> bool:
    """k (and v) of shape [B, 1, T, D] against q of [B, H, L, D], H > 1: torch.matmul broadcasts
    the one key/value head over the query heads, which is scaled_dot_product_attention with
    enable_gqa=True (H query heads sharing one group's key and value)."""
    return (sq is not None and sk is not None and len(sq) == len(sk) == 4 and sq[0] == sk[0]
            and sk[1] == 1 and sq[1] > 1)


def _folded(sq, sk) -> str | None:
    """5-d attention over two head dims, q [B, K, G, L, D]: "grouped" where k is [B, K, 1, T, D]
    (grouped-query attention written as ``q.view(B, KV, G, L, D)`` against each group's one
    cache, by matmuls or einsums that broadcast it), "heads" where k is [B, K, G, T, D]. Either
    is 4-d attention over K * G heads (q.flatten(1, 2), head h = kv * G + g), the grouped one
    with enable_gqa (head h reads key/value head h // G); else None."""
    if sq is None or sk is None or len(sq) != 5 or len(sk) != 5 or sq[:2] != sk[:2]:
        return None
    if sk[2] == sq[2]:
        return "heads"
    return "grouped" if sk[2] == 1 and sq[2] > 1 else None


def _kernel_operands(gm: fx.GraphModule, n: fx.Node, q, k, kt, v):
    """(q, k, v, k as written, fold) as the attention kernel reads them, the nodes made before
    n: keys stored transposed read as ``kt.transpose(-2, -1)`` (then that view is "k as
    written"); 5-d products (_folded) as 4-d ``flatten(1, 2)`` (a view where the strides allow;
    the keys' size-1 group dim squeezed). ``fold``: _folded's answer (None: 4-d as written)."""
    fold = _folded(node_shape(q), _key_shape(k, kt))
    if fold == "heads" and k is not None and all(_expanded_group(t) is not None for t in (k, v)):
        # each group's one cache expanded over the G dim (``k.unsqueeze(2).expand(...)``): read
        # the one head (enable_gqa) instead of a copy per query head that flatten would make
        fold, k, v = "grouped", _expanded_group(k), _expanded_group(v)
    made = []

    def _made(node):
        made.append(node)
        return node

    with gm.graph.inserting_before(n):
        k_written = k = k if k is not None else _made(gm.graph.call_method("transpose", (kt, -2, -1)))
        if fold is not None:
            q = _made(gm.graph.call_method("flatten", (q, 1, 2)))
            # a size-1 dim the program inserted (k.unsqueeze(2), an einsum's broadcast letter)
            # is read from under it
            k, v = ((_getitem_unsqueeze2(t) or _made(gm.graph.call_method("squeeze", (t, 2)))
                     if fold == "grouped" else _made(gm.graph.call_method("flatten", (t, 1, 2))))
                    for t in (k, v))
    _annotate(made)
    return q, k, v, k_written, fold


def _expanded_group(t):
    """x (5-d, size 1 at dim 2) when t is ``x.expand(...)`` or ``x.expand_as(...)``, else None."""
    if not isinstance(t, fx.Node) or t.op != "call_method" or t.target not in ("expand", "expand_as"):
        return None
    x = t.args[0]
    sx = node_shape(x) if isinstance(x, fx.Node) else None
    return x if sx is not None and len(sx) == 5 and sx[2] == 1 else None


def _unfold(gm: fx.GraphModule, new: fx.Node, q5: fx.Node) -> None:
    """The kernel's 4-d result [B, K * G, L, D] back to the product's [B, K, G, L, D] (K read from
    q's shape at run time), replacing new in every reader."""
    import torch
    from torch.fx.passes.shape_prop import _extract_tensor_metadata

    tm = new.meta["tensor_meta"]
    s = tuple(tm.shape)
    new.meta["tensor_meta"] = _extract_tensor_metadata(
        torch.empty((s[0], s[1] * s[2], *s[3:]), dtype=tm.dtype, device="meta"))
    with gm.graph.inserting_after(new):
        size = gm.graph.call_method("size", (q5, 1))
    with gm.graph.inserting_after(size):
        out = gm.graph.call_method("unflatten", (new, 1, (size, -1)))
    new.replace_all_uses_with(out, delete_user_cb=lambda u: u is not out)
    out.meta["tensor_meta"] = tm


def _pv_products(gm: fx.GraphModule):
    """(n, p, v, shape) of each live product n = p @ v of a 3-d to 5-d floating result: where an
    attention written out ends."""
    for n in _live(gm.graph):
        op = classify(n, gm) if n.op in ("call_function", "call_method") else None
        if not _plain_product(op):
            continue
        p, v = op.operands[:2]
        shape = node_shape(n)
        if _float(v) and shape is not None and node_shape(v) is not None and len(shape) in (3, 4, 5):
            yield n, p, v, shape


def _swap_in(gm: fx.GraphModule, n: fx.Node, p, kt, target, args: tuple, kwargs: dict,
             tril, q, k, q5: fx.Node | None = None) -> None:
    """Replace the product n (and the chain above it that nothing else reads: p, k^T) by one
    call of ``target``; record the causal buffer it relies on (q, k: as written). ``q5``: the
    5-d query of a folded product (_kernel_operands), whose shape the result is unflattened to."""
    import torch.nn.functional as F

    _needs_tril(gm, tril, q, k)
    with gm.graph.inserting_before(n):
        # a runtime helper's node named apart: fx names a node after its target, and the
        # emitted forward calls the helper by its plain name (a group kept on PyTorch)
        name = None if target is F.scaled_dot_product_attention else "attention"
        new = gm.graph.create_node("call_function", target, args, kwargs, name=name)
    new.meta = dict(n.meta)
    n.replace_all_uses_with(new)
    gm.graph.erase_node(n)
    if q5 is not None:
        _unfold(gm, new, q5)
    _erase_unused_above([p, kt], stop=None)


def attention_pattern(gm: fx.GraphModule) -> bool:
    """rw-attention: softmax(q @ k^T * scale [masked causally], -1) @ v, written out, is
    scaled_dot_product_attention(q, k, v, is_causal=..., scale=scale): one flash kernel that
    never writes the scores. The scale may be a multiply or a divide by a number (none: 1.0);
    the softmax may run in fp32 between casts; the mask may be a masked_fill, a where or an
    additive mask, and is only taken when it depends on no tensor values and equals torch's
    top-left causal mask (evaluated at the traced size and, if built from the inputs' shapes,
    at a second size). The kernel's scores are fp32 where eager rounds them to the operands'
    dtype: the rewritten program is verified like any candidate."""
    import torch
    import torch.nn.functional as F

    from codegen.ops import masked_attention

    changed = False
    for n, p, v, shape in _pv_products(gm):
        sm, _casts = _through(gm, p)
        sop = classify(sm, gm) if isinstance(sm, fx.Node) else None
        if sop is None or sop.kind not in ("softmax", "library") or _op_name(sm) not in ("softmax",) \
                or len(sm.users) != 1:
            continue
        x = sm.args[0]
        dim = sm.args[1] if len(sm.args) > 1 else sm.kwargs.get("dim")
        if not isinstance(x, fx.Node) or node_shape(x) is None or not isinstance(dim, int) \
                or dim % len(node_shape(x)) != len(node_shape(x)) - 1 \
                or set(sm.kwargs) - {"dim", "dtype", "_stacklevel"}:
            continue
        if sm.kwargs.get("dtype") not in (None, torch.float32):
            continue
        found = _scores_chain(gm, x, bias_ok=True)
        if found is None:
            continue
        q, k, kt, causal, scale, head, tril, bias, softcap, fills = found
        if not _fits(n, q, k, kt, v, shape) or (bias is not None and fills is not None):
            continue  # (the kernels read one mask tensor)
        if len(shape) == 5 and (bias is not None or fills is not None):
            continue  # (a mask of the 5-d scores: not folded)
        grouped = _broadcast_heads(node_shape(q), _key_shape(k, kt))
        q4, k4, v4, k, fold = _kernel_operands(gm, n, q, k, kt, v)
        gqa = {"enable_gqa": True} if grouped or fold == "grouped" else {}
        q5 = q if fold is not None else None
        if fills is not None:
            drop, fill, keep = fills
            if keep:  # where(m, s, fill): the kernel fills where its mask is True
                with gm.graph.inserting_before(n):
                    drop = gm.graph.call_function(torch.logical_not, (drop,))
                _annotate([drop])
            _swap_in(gm, n, p, kt, masked_attention, (q4, k4, v4, None, None if head else float(scale)),
                     {k_: v_ for k_, v_ in (("is_causal", causal), ("softcap", softcap),
                                            ("factor", float(scale) if head else None)) if v_}
                     | {"drop": drop, "fill": fill} | gqa, tril, q, k, q5)
            changed = True
            continue
        if bias is not None or softcap is not None or (head and scale != 1.0):
            # softmax(cap * tanh(q @ k^T * scale) + mask [causal]) @ v: NaN rows where every
            # score is -inf, as written (scaled_dot_product_attention would give 0 there); a
            # scale of c / sqrt(head dim) is scale None times factor c
            kw = {k_: v_ for k_, v_ in (("is_causal", causal), ("softcap", softcap),
                                        ("factor", float(scale) if head else None)) if v_}
            _swap_in(gm, n, p, kt, masked_attention, (q4, k4, v4, bias, None if head else float(scale)),
                     kw | gqa, tril, q, k, q5)
        else:
            _swap_in(gm, n, p, kt, F.scaled_dot_product_attention, (q4, k4, v4),
                     {"is_causal": causal, "scale": None if head else float(scale)} | gqa, tril, q, k, q5)
        changed = True
    return changed


def relu_attention_pattern(gm: fx.GraphModule) -> bool:
    """rw-relu-attention: relu(q @ k^T * scale [masked causally]) @ v, written out (ReLU in
    place of the softmax), is one attention kernel that never writes the scores: each key tile's
    positive scores times its values add to the output (no maximum, no sum to divide by). The
    scores' chain is the softmax rule's (scale, one causal mask, casts); the mask's -inf is 0
    after the ReLU, as the kernel drops the masked positions. The kernel's scores are fp32 where
    eager rounds them to the operands' dtype: verified like any candidate."""
    from codegen.ops import relu_attention

    changed = False
    for n, p, v, shape in _pv_products(gm):
        r, _casts = _through(gm, p)
        rop = classify(r, gm) if isinstance(r, fx.Node) else None
        if rop is None or rop.kind != "pointwise" or rop.name != "relu" or len(r.users) != 1 \
                or not isinstance(rop.operands[0], fx.Node):
            continue
        found = _scores_chain(gm, rop.operands[0])
        if found is None:
            continue
        q, k, kt, causal, scale, head, tril, _bias, _cap, _fills = found
        if not _fits(n, q, k, kt, v, shape, fold=False) or _broadcast_heads(node_shape(q), _key_shape(k, kt)):
            continue  # (the ReLU kernel reads one key/value head per query head)
        q, k4, v, k, _fold = _kernel_operands(gm, n, q, k, kt, v)
        # scale None: 1/sqrt(head dim) of the call's q
        _swap_in(gm, n, p, kt, relu_attention, (q, k4, v, causal, None if head else float(scale)), {},
                 tril, q, k)
        changed = True
    return changed


def _getitem_unsqueeze2(n: fx.Node) -> fx.Node | None:
    """x when n is x with a size-1 dim inserted at position 2: x.unsqueeze(2), torch.unsqueeze(x,
    2) or x[:, :, None] (any trailing full slices or an Ellipsis)."""
    import operator

    import torch

    if not isinstance(n, fx.Node):
        return None
    x = n.args[0] if n.args else None
    xs, ns = (node_shape(x) if isinstance(x, fx.Node) else None), node_shape(n)
    if xs is None or ns is None or len(ns) != len(xs) + 1 or ns[2] != 1 or ns[:2] + ns[3:] != xs:
        return None
    if (n.op == "call_method" and n.target == "unsqueeze") or (
            n.op == "call_function" and n.target is torch.unsqueeze):
        d = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
        return x if isinstance(d, int) and d % (len(xs) + 1) == 2 else None
    if n.op == "call_function" and n.target is operator.getitem and isinstance(n.args[1], tuple):
        idx = n.args[1]
        full = slice(None, None, None)
        if len(idx) >= 3 and idx[0] == full and idx[1] == full and idx[2] is None and all(
                i == full or i is Ellipsis for i in idx[3:]):
            return x
    return None


def _repeated_heads(gm: fx.GraphModule, n) -> tuple[fx.Node, int] | None:
    """(x, g) when n repeats each head of x (B, H_kv, S, D) g times in place (head h of n is head
    h // g of x), as grouped-query attention reads it: x.repeat_interleave(g, dim=1) or
    x[:, :, None].expand(B, H_kv, g, S, D).reshape(B, H_kv * g, S, D) (Hugging Face's
    repeat_kv); None otherwise (x.repeat(1, g, 1, 1) tiles the heads: another mapping)."""
    import torch

    if not isinstance(n, fx.Node) or n.op not in ("call_function", "call_method"):
        return None
    ns = node_shape(n)
    if ns is None or len(ns) != 4:
        return None
    name = _op_name(n)
    if name == "repeat_interleave":
        x = n.args[0] if n.args else n.kwargs.get("input")
        names = ("repeats", "dim", "output_size")
        b = dict(zip(names, n.args[1:]))
        b.update({k: v for k, v in n.kwargs.items() if k in names})
        xs = node_shape(x) if isinstance(x, fx.Node) else None
        g, dim = _static_int(b.get("repeats")), b.get("dim")
        if (xs is None or len(xs) != 4 or g is None or g < 1
                or not isinstance(dim, int) or dim % 4 != 1 or set(n.kwargs) - set(names) - {"input"}):
            return None
        return (x, g) if tuple(ns) == (xs[0], xs[1] * g, xs[2], xs[3]) else None
    if name in ("reshape", "view") or (n.op == "call_function" and n.target is torch.reshape):
        e = n.args[0] if n.args else None
        if not isinstance(e, fx.Node) or _op_name(e) != "expand" or len(e.users) != 1:
            return None
        es = node_shape(e)
        u = e.args[0] if e.args else None
        x = _getitem_unsqueeze2(u) if isinstance(u, fx.Node) and len(u.users) == 1 else None
        xs = node_shape(x) if x is not None else None
        if xs is None or es is None or len(xs) != 4 or len(es) != 5:
            return None
        g = es[2]
        if (es[:2], es[3:]) != (tuple(xs[:2]), tuple(xs[2:])) \
                or tuple(ns) != (xs[0], xs[1] * g, xs[2], xs[3]):
            return None
        return x, int(g)
    return None


def gqa_repeats(gm: fx.GraphModule) -> bool:
    """scaled_dot_product_attention(q, R(k), R(v)) with R repeating each key/value head g times
    in place (repeat_interleave along the heads, or expand + reshape as Hugging Face's repeat_kv)
    is scaled_dot_product_attention(q, k, v, enable_gqa=True): the same values, and the kernel
    reads the shared head through its index instead of a copy of the cache per query head. The
    same for rw-attention's masked attention (Hugging Face's eager attention)."""
    import torch.nn.functional as F

    from codegen.ops import masked_attention

    graph = gm.graph
    changed = False
    for n in _live(graph):
        if n.op == "call_function" and n.target is masked_attention:  # rw-attention's, masked
            names = ["query", "key", "value", "mask", "scale", "enable_gqa", "is_causal", "softcap", "factor",
                     "drop", "fill"]
        elif n.op == "call_function" and n.target is F.scaled_dot_product_attention:
            names = ["query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"]
        else:
            continue
        b = dict(zip(names, n.args))
        b.update(n.kwargs)
        rk, rv = _repeated_heads(gm, b.get("key")), _repeated_heads(gm, b.get("value"))
        qs = node_shape(b["query"]) if isinstance(b.get("query"), fx.Node) else None
        if rk is None or rv is None or rk[1] != rv[1] or qs is None or len(qs) != 4:
            continue
        if qs[1] != node_shape(rk[0])[1] * rk[1]:
            continue
        old_k, old_v = b["key"], b["value"]
        b["key"], b["value"], b["enable_gqa"] = rk[0], rv[0], True
        n.args = (b.pop("query"), b.pop("key"), b.pop("value"))
        n.kwargs = b
        _erase_unused_above([old_k, old_v], stop=None)
        changed = True
    return changed


def sdpa_flags_from_shapes(gm: fx.GraphModule) -> bool:
    """A scaled_dot_product_attention flag (is_causal; attn_mask a traced None) that is a traced
    Python value computed from shapes and constants only, e.g. Hugging Face's ``is_causal = query.shape[2] > 1 and
    attention_mask is None`` (a graph break: fx cannot branch on a traced shape), becomes its
    value at the traced size, when it is the same with every input dim grown by one. The file
    then holds it, and the drop-in guard fixes a dim whose change would change it (it compiles
    the problem again at other sizes; a size of 1, where this flag flips, is never free)."""
    import torch.nn.functional as F

    changed = False
    for n in _live(gm.graph):
        if not (n.op == "call_function" and n.target is F.scaled_dot_product_attention):
            continue
        for name, pos, kind in (("attn_mask", 3, type(None)), ("is_causal", 5, bool)):
            at = pos if len(n.args) > pos else name
            flag = n.args[at] if isinstance(at, int) else n.kwargs.get(name)
            if not isinstance(flag, fx.Node) or node_shape(flag) is not None:
                continue
            got, again = _constant_value(gm, flag), _constant_value(gm, flag, bump=1)
            if got is None or not isinstance(got[0], kind) or (again is not None and again[0] is not got[0]):
                continue
            if isinstance(at, int):
                n.args = n.args[:at] + (got[0],) + n.args[at + 1:]
            else:
                n.kwargs = {**n.kwargs, name: got[0]}
            changed = True
    return changed


#: nn.MultiheadAttention.forward's positional parameters, need_weights's place among them
_MHA_NEED_WEIGHTS_ARG = 4


def mha_weights_unused(gm: fx.GraphModule) -> bool:
    """rw-mha-no-weights: an ``nn.MultiheadAttention`` call whose attention weights (its second
    output) nothing reads is asked not to return them (``need_weights=False``): PyTorch then runs
    its fused scaled-dot-product attention instead of materialising the (batch, heads, L, S)
    softmax to average it over heads. The attended output is the same math."""
    import operator

    import torch.nn as nn

    changed = False
    for n in gm.graph.nodes:
        if n.op != "call_module" or not isinstance(gm.get_submodule(n.target), nn.MultiheadAttention):
            continue
        if len(n.args) > _MHA_NEED_WEIGHTS_ARG:
            given = n.args[_MHA_NEED_WEIGHTS_ARG]
        else:
            given = n.kwargs.get("need_weights", True)
        if given is False:
            continue
        if not all(u.op == "call_function" and u.target is operator.getitem and len(u.args) == 2
                   and (u.args[1] == 0 or (u.args[1] in (1, -1) and not u.users)) for u in n.users):
            continue  # the weights are read, or the tuple itself is passed on
        for u in [u for u in n.users if u.args[1] != 0]:
            gm.graph.erase_node(u)  # unused reads of the weights (None once they are not made)
        if len(n.args) > _MHA_NEED_WEIGHTS_ARG:
            args = list(n.args)
            args[_MHA_NEED_WEIGHTS_ARG] = False
            n.args = tuple(args)
        else:
            n.kwargs = {**n.kwargs, "need_weights": False}
        changed = True
    return changed


#: a product with an added input -> (the product it adds to, the rank of its result)
_ADD_PRODUCTS = {"addmm": ("mm", 2), "baddbmm": ("bmm", 3)}


def addmm_as_product(gm: fx.GraphModule) -> bool:
    """``torch.addmm(input, a, b, beta=β, alpha=α)`` as ``mm(a, b) * α`` (β = 0: the input is
    not read, as PyTorch documents) or ``mm(a, b) * α + input * β`` (``torch.add(.., input,
    alpha=β)``: one op on the product, which the epilogue takes), and ``torch.baddbmm`` the
    same with ``bmm``; functions or methods, factors of 1 left out. A linear layer written with
    addmm (Hugging Face GPT-2's ``Conv1D``) becomes a product whose bias, and the activation
    after it, join the matmul template's epilogue; attention scores spelled with baddbmm (Bloom,
    GPT-NeoX style) become the product the attention pattern reads.

    Left to PyTorch where the two could differ: ``out=`` or other arguments; β or α not plain
    numbers (β = 0 decides what is read; addmm does not read the product when α = 0, so a 0
    there, or an α only known per call, stays addmm's); operands not all floating of one dtype
    (addmm raises where ``+`` would promote); an input that does not broadcast to the result
    without growing it (addmm raises where ``+`` would broadcast to a larger shape)."""
    import operator

    import torch

    from codegen.fusion import broadcasts_to

    graph = gm.graph
    changed = False
    for n in _live(graph):
        if n.op == "call_function" and n.target in (torch.addmm, torch.baddbmm):
            name = n.target.__name__
        elif n.op == "call_method" and n.target in _ADD_PRODUCTS:
            name = n.target
        else:
            continue
        product, rank = _ADD_PRODUCTS[name]
        args = list(n.args)
        kw = dict(n.kwargs)
        if len(args) != 3 or set(kw) - {"beta", "alpha"}:
            continue
        inp, a, b = args
        beta, alpha = kw.get("beta", 1), kw.get("alpha", 1)
        def number(x) -> bool:
            return isinstance(x, (int, float)) and not isinstance(x, bool)

        # baddbmm's alpha may be a Python number computed in the forward (1 / math.sqrt(d)): a
        # node without a tensor's metadata; bmm reads the product whatever alpha is
        scalar_node = (name == "baddbmm" and isinstance(alpha, fx.Node) and node_shape(alpha) is None
                       and node_dtype(alpha) is None)
        if not number(beta) or not (number(alpha) or scalar_node) or (number(alpha) and alpha == 0):
            continue
        if not (_float(inp) and _float(a) and _float(b)) \
                or len({node_dtype(inp), node_dtype(a), node_dtype(b)}) != 1:
            continue
        out, si = node_shape(n), node_shape(inp)
        if out is None or si is None or len(out) != rank or not broadcasts_to(si, out):
            continue
        made = []

        def call(*args):
            made.append(graph.call_function(*args))
            return made[-1]

        with graph.inserting_before(n):
            new = call(getattr(torch, product), (a, b))
            if scalar_node or alpha != 1:
                new = call(operator.mul, (new, alpha if scalar_node else float(alpha)))
            if beta == 1:
                new = call(operator.add, (inp, new))
            elif beta != 0:  # the input scaled where the epilogue reads it: one op on the product
                new = call(torch.add, (new, inp), {"alpha": float(beta)})
        _annotate(made)  # shapes for the forms after this one (flattened_products)
        new.meta = {**n.meta, **new.meta}
        _replace(n, new)
        changed = True
    return changed
