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
Operands are permuted views (``permute``); the product reads them as they are. An einsum whose
result is indexed is left to rw-select-first, which indexes its operands; the canonical pass
after the rules writes the smaller einsum as a product.
"""
from __future__ import annotations

import operator

import torch
from torch import fx

from codegen.ops import node_dtype
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
        choices = [(lay, x, y) for lay, x, y in ((_layout(sa, sb, out), (a, sa), (b, sb)),
                                                 (_layout(sb, sa, out), (b, sb), (a, sa)))
                   if lay is not None]
        if not choices:
            continue
        # the order whose product has the output's order, else the first
        lay, (x, sx), (y, sy) = next((c for c in choices if "".join(c[0][2]) == out), choices[0])
        x_letters, y_letters, prod, no_row, no_col = lay
        made = []

        def call(kind: str, target, *args):
            made.append(graph.create_node(kind, target, args))
            return made[-1]

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
