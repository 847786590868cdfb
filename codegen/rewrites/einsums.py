"""Einsums that are matrix products, written as ``matmul`` (a canonical form).

Attention written with einsum, ``einsum('bhid,bhjd->bhij', q, k)`` then
``einsum('bhij,bhjd->bhid', p, v)``, is the same product as ``q @ k.transpose(-1, -2)`` and
``p @ v``; a projection ``einsum('bnd,de->bne', x, w)`` is ``x @ w``. torch.einsum computes them
with the same batched product (operands permuted, one contraction); as a library call the planner
cannot fuse them, and the attention pattern (rw-attention) does not see them.

A two-operand einsum (explicit ``->``, no ``...``, each letter once per operand, every shared
letter of one size: no size-1 broadcasting) becomes ``matmul(X', Y')`` when it contracts exactly
one letter and neither operand has a letter that is summed alone:
- letters of both operands and the output are batch dims (in the output's order);
- letters of X and the output alone are rows: the one last in the output is the product's row
  dim, any others lead X' (the product broadcasts Y over them); Y's own output letter, at most
  one, is the column dim; a missing row or column dim is an ``unsqueeze`` taken back by a
  ``squeeze``;
- X and Y are taken in the order that makes the product's dims the output's order; where no order
  does, the result is permuted and made contiguous (as einsum's own result is).
Where the output ends with X's row and Y's column letters and a leading letter is missing from
one operand (latent attention's ``einsum('bhqr,btr->bhqt', q, kv)``), that letter is a size-1 dim
of the operand instead (``kv.unsqueeze(1)``, a right operand stored as (col, k) read through
``transpose(-2, -1)``): the product broadcasts it and writes the output's order, and attention
written so is multi-query attention for rw-attention.
Operands are permuted views (``permute``); the product reads them as they are. An einsum whose
result is indexed is left to rw-select-first, which indexes its operands; the canonical pass
after the rules writes the smaller einsum as a product.
"""
from __future__ import annotations

import operator

import torch
from torch import fx

from codegen.ops import classify, node_dtype, node_shape
from codegen.rewrites.common import _annotate, _einsum_parts, _float, _live, _replace


def _layout(sx: str, sy: str, out: str):
    """(X's letters, Y's letters, the product's letters, squeeze row, squeeze col) taking X as
    the left operand, or None when it is not a product of this form."""
    k = [c for c in sx if c in sy and c not in out]
    if len(k) != 1 or any(c not in sy and c not in out for c in sx) or any(
            c not in sx and c not in out for c in sy) or any(c not in sx + sy for c in out):
        return None
    batch = [c for c in out if c in sx and c in sy]
    rows = [c for c in out if c in sx and c not in sy]
    cols = [c for c in out if c in sy and c not in sx]
    if len(cols) > 1:
        return None
    lead, row = rows[:-1], rows[-1:]
    x_letters = lead + batch + row + k
    y_letters = batch + k + cols
    prod = lead + batch + row + cols
    return x_letters, y_letters, prod, not row, not cols


def _broadcast_layout(sx: str, sy: str, out: str) -> bool:
    """X's row letter and Y's column letter end the output, one letter is contracted, every
    other letter leads the output, and one of those leading letters is missing from an operand
    (latent attention's ``einsum('bhqr,btr->bhqt', q, kv)``: kv has no head letter). The product
    is then ``X' @ Y'`` with the missing letters as size-1 dims it broadcasts, in the output's
    order: no permute of the result, and an attention written so reads as multi-query attention
    ([B, 1, T, D] keys) rather than a product over a permuted batch."""
    if len(out) < 3:
        return False
    row, col, lead = out[-2], out[-1], out[:-2]
    k = [c for c in sx if c in sy and c not in out]
    return (len(k) == 1 and row in sx and row not in sy and col in sy and col not in sx
            and set(sx) <= set(lead) | {row, k[0]} and set(sy) <= set(lead) | {col, k[0]}
            and any(c not in sx or c not in sy for c in lead))


def _broadcast_operand(call, node: fx.Node, spec: str, out: str, right: bool):
    """The operand of _broadcast_layout as the product reads it: its leading letters in the
    output's order, a size-1 dim where it lacks one, then (row, k) on the left and (k, col) on
    the right; a right operand stored as (col, k) is transposed (a view: the attention rule reads
    ``k.transpose(-1, -2)``)."""
    lead = [c for c in out[:-2] if c in spec]
    own = [c for c in spec if c not in lead]  # the two letters of the matrix dims, as stored
    # left: (row, k); right: as stored, (k, col) or (col, k) then transposed
    tail = own if right else [out[-2]] + [c for c in own if c != out[-2]]
    x = _permuted(call, node, spec, lead + tail)
    for i, c in enumerate(out[:-2]):
        if c not in spec:
            x = call("call_method", "unsqueeze", x, i)
    if right and tail[0] == out[-1]:  # stored (col, k): the product reads its transpose
        x = call("call_method", "transpose", x, -2, -1)
    return x


def _permuted(call, node: fx.Node, spec: str, letters: list):
    order = [spec.index(c) for c in letters]
    if order == list(range(len(spec))):
        return node
    return call("call_method", "permute", node, *order)


def einsum_as_matmul(gm: fx.GraphModule) -> bool:
    """A two-operand einsum that is a matrix product -> ``matmul`` of permuted views (module
    docstring)."""
    graph = gm.graph
    changed = False
    for n in _live(graph):
        parts = _einsum_parts(n)
        if parts is None or len(parts[2]) != 2:
            continue
        if any(u.op == "call_function" and u.target is operator.getitem for u in n.users):
            continue  # rw-select-first takes the index into the einsum first; the canonical
            # pass after the rules writes the smaller einsum as a product
        (sa, sb), out, (a, b), (ha, hb) = parts
        if not (_float(a) and _float(b)) or node_dtype(a) != node_dtype(b):
            continue
        size = dict(zip(sa, ha))
        if any(size.get(c, s) != s for c, s in zip(sb, hb)):
            continue  # a letter of two sizes (einsum broadcasts size 1): left alone
        made = []

        def call(kind: str, target, *args):
            made.append(graph.create_node(kind, target, args))
            return made[-1]

        bc = next(((x, y) for x, y in (((a, sa), (b, sb)), ((b, sb), (a, sa)))
                   if _broadcast_layout(x[1], y[1], out)), None)
        if bc is not None:  # a leading letter one operand lacks: a size-1 dim the product broadcasts
            (x, sx), (y, sy) = bc
            with graph.inserting_before(n):
                new = call("call_function", torch.matmul, _broadcast_operand(call, x, sx, out, False),
                           _broadcast_operand(call, y, sy, out, True))
            _annotate(made)
            new.meta = {**n.meta, **new.meta}
            _replace(n, new)
            changed = True
            continue
        choices = [(lay, x, y) for lay, x, y in ((_layout(sa, sb, out), (a, sa), (b, sb)),
                                                 (_layout(sb, sa, out), (b, sb), (a, sa)))
                   if lay is not None]
        if not choices:
            continue
        # the order whose product has the output's order, else the first
        lay, (x, sx), (y, sy) = next((c for c in choices if "".join(c[0][2]) == out), choices[0])
        x_letters, y_letters, prod, no_row, no_col = lay
        with graph.inserting_before(n):
            xp = _permuted(call, x, sx, x_letters)
            yp = _permuted(call, y, sy, y_letters)
            if no_row:
                xp = call("call_method", "unsqueeze", xp, -2)
            if no_col:
                yp = call("call_method", "unsqueeze", yp, -1)
            new = call("call_function", torch.matmul, xp, yp)
            if no_col:
                new = call("call_method", "squeeze", new, -1)
            if no_row:
                new = call("call_method", "squeeze", new, -1 if no_col else -2)
            if "".join(prod) != out:
                new = call("call_method", "permute", new, *[prod.index(c) for c in out])
                new = call("call_method", "contiguous", new)
        _annotate(made)  # shapes for the forms after this one (the attention scores' queries)
        new.meta = {**n.meta, **new.meta}
        _replace(n, new)
        changed = True
    return changed


def einsum_outer(gm: fx.GraphModule) -> bool:
    """A two-operand einsum that contracts nothing (every letter in the output: an outer
    product, RoPE's ``einsum('i,j->ij', t, inv_freq)``), ``torch.outer(a, b)`` and a matrix
    product over a dim of one (``a[.., M, 1] @ b[.., 1, N]``, batch dims broadcast as the
    product broadcasts them) ->
    ``x' * y'``, each operand permuted to the output's letter order with a size-1 dim where it
    lacks a letter: one product per output element, rounded once, as einsum's batched product
    of one term rounds it. As a library call it was a kernel of its own that no pointwise
    consumer could take (the cos / sin tables of rotary embeddings: five kernels)."""
    graph = gm.graph
    changed = False
    for n in _live(graph):
        if (n.op == "call_function" and n.target in (torch.matmul, operator.matmul) and len(n.args) == 2
                and not n.kwargs and all(isinstance(o, fx.Node) for o in n.args)):
            # a product over one term (Hugging Face's rotary tables: inv_freq[:, None] @
            # positions[None, :], [.., D/2, 1] @ [.., 1, T]) is the broadcast multiply itself
            (a, b), (sa, sb) = n.args, [node_shape(o) for o in n.args]
            if (sa is None or sb is None or len(sa) < 2 or len(sb) < 2 or sa[-1] != 1 or sb[-2] != 1
                    or not (_float(a) and _float(b)) or node_dtype(a) != node_dtype(b)):
                continue
            with graph.inserting_before(n):
                new = graph.create_node("call_function", operator.mul, (a, b))
            _annotate([new])
            new.meta = {**n.meta, **new.meta}
            _replace(n, new)
            changed = True
            continue
        if n.op == "call_function" and n.target in (torch.outer, torch.ger) and len(n.args) == 2 and not n.kwargs:
            specs, out, ops = ("i", "j"), "ij", list(n.args)
            shapes = [node_shape(o) if isinstance(o, fx.Node) else None for o in ops]
            if any(s is None or len(s) != 1 for s in shapes):
                continue
        else:
            parts = _einsum_parts(n)
            if parts is None or len(parts[2]) != 2:
                continue
            specs, out, ops, shapes = parts
        (sa, sb), (a, b) = specs, ops
        if (not (_float(a) and _float(b)) or node_dtype(a) != node_dtype(b) or len(set(out)) != len(out)
                or set(sa) | set(sb) != set(out)):
            continue
        size = dict(zip(sa, shapes[0]))
        if any(size.get(c, s) != s for c, s in zip(sb, shapes[1])):
            continue  # a letter of two sizes (einsum broadcasts size 1): left alone
        made = []

        def call(kind: str, target, *args):
            made.append(graph.create_node(kind, target, args))
            return made[-1]

        with graph.inserting_before(n):
            xs = []
            for x, sx in ((a, sa), (b, sb)):
                order = [c for c in out if c in sx]
                if list(sx) != order:
                    x = call("call_method", "permute", x, *[sx.index(c) for c in order])
                for i, c in enumerate(out):
                    if c not in sx:
                        x = call("call_method", "unsqueeze", x, i)
                xs.append(x)
            new = call("call_function", operator.mul, xs[0], xs[1])
        _annotate(made)
        new.meta = {**n.meta, **new.meta}
        _replace(n, new)
        changed = True
    return changed


def _row_wise(gm: fx.GraphModule, n: fx.Node) -> bool:
    """n computes each element from its one tensor operand's element (a cast, a unary op, an op
    with a number) or is a softmax over the last dim: the same op on a view with one more
    size-1 dim before the last gives that view of its result."""
    if n.op not in ("call_function", "call_method"):
        return False
    op = classify(n, gm)
    tensors = [o for o in op.operands if isinstance(o, fx.Node) and node_shape(o) is not None]
    if len(tensors) != 1 or any(isinstance(o, fx.Node) and node_dtype(o) is not None and o is not tensors[0]
                                for o in op.operands):
        return False
    if op.kind == "pointwise":
        return node_shape(tensors[0]) == node_shape(n)
    d = op.p.get("dim")
    # a dim written as rank - 1 is renamed -1 when the squeeze is undone: where it sits
    # (a keyword, or the second of two arguments) is known
    return op.kind == "softmax" and _last_dim(d, len(node_shape(n))) and (
        d == -1 or "dim" in n.kwargs or len(n.args) == 2)


def _last_dim(d, rank: int) -> bool:
    return isinstance(d, int) and not isinstance(d, bool) and d in (-1, rank - 1)


def _softmax_over_last(n: fx.Node) -> None:
    """A softmax whose dim was the last (as -1 or as rank - 1) names it -1: its operand gains a
    dim before the last."""
    if "dim" in n.kwargs:
        n.kwargs = {**n.kwargs, "dim": -1}
    else:
        n.args = (n.args[0], -1)


def squeezes_undone(gm: fx.GraphModule) -> bool:
    """``unsqueeze(f(squeeze(x, -2)), -2)`` with f a chain of row-wise ops (casts, scalings,
    a softmax over the last dim), each read only by the next, is ``f(x)``: decode attention
    written with a 3-d query (``einsum('bhd,bhsd->bhs', q, k)``, written as a product of a
    query with one row) keeps its row dim through the softmax, so rw-attention sees
    ``softmax(q @ k^T * c) @ v`` (the split-KV decode kernel)."""
    graph = gm.graph
    changed = False
    for u in _live(graph):
        if not (u.op == "call_method" and u.target == "unsqueeze" and len(u.args) == 2
                and u.args[1] == -2 and not u.kwargs and isinstance(u.args[0], fx.Node)):
            continue
        chain, s = [], u.args[0]
        while _row_wise(gm, s) and len(s.users) == 1:
            chain.append(s)
            s = next(o for o in classify(s, gm).operands if isinstance(o, fx.Node) and node_shape(o) is not None)
        if not (s.op == "call_method" and s.target == "squeeze" and len(s.args) == 2 and s.args[1] == -2
                and not s.kwargs and isinstance(s.args[0], fx.Node) and len(s.users) == 1):
            continue
        x = s.args[0]
        xs = node_shape(x)
        if xs is None or len(xs) < 2 or xs[-2] != 1:
            continue
        first = chain[-1] if chain else None
        if first is None:
            u.replace_all_uses_with(x)
        else:
            first.replace_input_with(s, x)
            u.replace_all_uses_with(chain[0])
        graph.erase_node(u)
        graph.erase_node(s)
        for m in chain:  # shapes change: the next propagation records them
            if classify(m, gm).kind == "softmax" and classify(m, gm).p.get("dim") != -1:
                _softmax_over_last(m)
            m.meta.pop("tensor_meta", None)
        changed = True
    return changed


def _view_shape(v: fx.Node):
    """The shape argument of ``y.view(...)`` / ``y.reshape(...)`` / ``torch.reshape(y, s)``:
    (one node or sequence holding the whole shape, or the list of its entries), else None."""
    import torch

    if v.kwargs or len(v.args) < 2 or not (
            (v.op == "call_method" and v.target in ("view", "reshape"))
            or (v.op == "call_function" and v.target is torch.reshape)):
        return None
    if len(v.args) == 2 and isinstance(v.args[1], (fx.Node, tuple, list)):
        return v.args[1]
    if v.op == "call_function":
        return None
    return list(v.args[1:])


def _rows_broadcast(t, n: int) -> bool:
    """Is t read the same by every row of an [M, n] product and of its rows reshaped: a number,
    or a tensor of at most two dims, all of size 1 but a last of 1 or n."""
    if not isinstance(t, fx.Node):
        return isinstance(t, (int, float)) and not isinstance(t, bool)
    s = node_shape(t)
    return s is not None and len(s) <= 2 and all(d == 1 for d in s[:-1]) and (not s or s[-1] in (1, n))


def flattened_products(gm: fx.GraphModule) -> bool:
    """``(a @ W [* c] [+ b]).view(*lead, N)``, a 2-d product (mm or matmul) whose rows are
    reshaped into leading dims, is ``a.view(*lead, K) @ W [* c] [+ b]``: the reshape moves onto
    the left operand (splitting its row dim, always a view) and the product gives the result's
    shape itself, so the ops that read it (an activation) join its epilogue instead of
    starting a kernel of their own after the reshape. Hugging Face GPT-2's ``Conv1D``
    (``addmm(bias, x.view(-1, K), W).view(size_out)``) and ``x.view(-1, K) @ W`` written out.

    Applies when each op between the product and the reshape is read only by the next, is a
    multiplication by a number or an addition of a number or of a tensor every row reads alike
    (a bias [N] or [1, N], maybe scaled by add's alpha), and the reshape keeps the last dim (N) and has at least 3 dims. The
    left operand's reshape raises where the product's would (their leading sizes must multiply
    to M), and the original flatten of ``a`` stays (it raises on a layout it cannot view)."""
    import torch

    graph = gm.graph
    changed = False
    for v in _live(graph):
        shape = _view_shape(v)
        out = node_shape(v)
        if shape is None or out is None or len(out) < 3 or not isinstance(v.args[0], fx.Node):
            continue
        chain, y = [], v.args[0]  # from the reshape's input down to the product
        while True:
            if len(y.users) != 1 or node_dtype(y) is None:
                break
            op = classify(y, gm)
            if op.kind == "matmul" and op.name in ("mm", "matmul"):
                break
            if op.kind != "pointwise" or op.name not in ("add", "mul") or len(op.operands) != 2:
                y = None
                break
            inner = [o for o in op.operands if isinstance(o, fx.Node) and o in y.all_input_nodes
                     and len(o.users) == 1 and classify(o, gm).kind in ("pointwise", "matmul")]
            # add's alpha scales its second operand: a bias (addmm's beta), not the product
            if len(inner) != 1 or (op.p.get("alpha", 1) != 1 and op.operands[0] is not inner[0]):
                y = None
                break
            other = op.operands[1] if op.operands[0] is inner[0] else op.operands[0]
            ok = (_rows_broadcast(other, out[-1]) if op.name == "add"
                  else not isinstance(other, fx.Node) and _rows_broadcast(other, out[-1]))
            if not ok:
                y = None
                break
            chain.append(y)
            y = inner[0]
        if y is None or len(y.users) != 1 or y.kwargs or len(y.args) != 2:
            continue
        op = classify(y, gm)
        if op.kind != "matmul" or op.name not in ("mm", "matmul"):
            continue
        a, w = y.args
        sa, sw, sy = node_shape(a), node_shape(w), node_shape(y)
        if sa is None or sw is None or sy is None or len(sa) != 2 or len(sw) != 2 \
                or tuple(sy) != (sa[0], sw[1]) or out[-1] != sw[1] or not _float(a):
            continue
        lead = 1
        for d in out[:-1]:
            lead *= d
        if lead != sa[0]:
            continue
        with graph.inserting_before(v):  # after the shape's own nodes
            k = graph.call_method("size", (a, 1))
            if isinstance(shape, (list, tuple)):
                new_shape = tuple(shape[:-1]) + (k,)
            else:
                lead_sizes = graph.call_function(operator.getitem, (shape, slice(None, -1)))
                new_shape = graph.call_function(operator.add, (lead_sizes, (k,)))
            av = graph.call_method("view", (a, new_shape))
            prod = graph.call_function(torch.matmul, (av, w))
        prod.meta = dict(v.meta)
        y.replace_all_uses_with(prod)
        graph.erase_node(y)
        for m in reversed(chain):  # now of the reshape's shape (a bias reads alike), after it
            v.prepend(m)
            m.meta = dict(v.meta)
        v.replace_all_uses_with(v.args[0])
        graph.erase_node(v)
        changed = True
    return changed
