"""Select before computing (rw-select-first): an index taken of a result that nothing else reads
is taken of the operands instead, so that only the selected part is computed. Language models
written as ``self.lm_head(h)[:, -1, :]`` (the next token's logits: the LM head over every
position, then all rows but one thrown away) and Mamba-2's final state (an einsum over every
chunk, then ``[:, -1]``) pay eager for work nobody reads; torch.compile does too.

The index (``operator.getitem``: ints, slices and one Ellipsis) moves through
- a matrix product whose second operand is a matrix (``F.linear``, ``matmul``, ``@``, ``mm``), when
  it keeps the output's last dim whole: ``linear(x, W, b)[i] = linear(x[i], W, b)``;
- an einsum (explicit ``->``, no ``...``, no letter twice in an operand): each indexed output
  letter is indexed in every operand that carries it, at the same size (an int drops the letter);
- a pointwise op whose one tensor operand has the result's shape (``exp``, ``x * s``, ``relu``),
  so that ``(lm_head(h) / t)[:, -1]`` reaches the product.
Each element selected is computed by the same op on the same values (a product's rows may round
differently at another row count: the verifier's contract decides).
"""
from __future__ import annotations

import operator

import torch
from torch import fx

from codegen.ops import classify, node_shape
from codegen.rewrites.common import _einsum_parts, _live


def _entries(idx, rank: int) -> list | None:
    """The index as one entry per dim (ints and slices; slice(None) for untouched dims), or None
    when it holds anything else (None, tensors, lists, a symbolic bound, two Ellipses)."""
    items = list(idx) if isinstance(idx, tuple) else [idx]
    if sum(i is Ellipsis for i in items) > 1:
        return None
    for i in items:
        if i is Ellipsis:
            continue
        if isinstance(i, bool) or not isinstance(i, (int, slice)):
            return None
        if isinstance(i, slice) and not all(v is None or (isinstance(v, int) and not isinstance(v, bool))
                                            for v in (i.start, i.stop, i.step)):
            return None
    if Ellipsis in items:
        k = items.index(Ellipsis)
        fill = rank - (len(items) - 1)
        if fill < 0:
            return None
        items = items[:k] + [slice(None)] * fill + items[k + 1:]
    if len(items) > rank:
        return None
    return items + [slice(None)] * (rank - len(items))


def _whole(e) -> bool:
    return isinstance(e, slice) and e == slice(None)


def _index_node(graph: fx.Graph, src, entries: list):
    """``src[entries]`` (nothing when every entry is whole)."""
    if all(_whole(e) for e in entries):
        return src
    while entries and _whole(entries[-1]):
        entries = entries[:-1]
    return graph.call_function(operator.getitem, (src, tuple(entries)))


def _through_product(gm, n: fx.Node, op, entries: list):
    """linear(x, W, b)[i] -> linear(x[i], W, b) (matmul(a, B) likewise) when the index keeps the
    last dim whole and the second operand is a matrix; a batched product of two operands of the
    result's rank and batch dims (an einsum written as matmul) indexes both on the batch dims and
    the first on its rows (an int row kept as a slice of one, squeezed after)."""
    a, b = op.operands[0], op.operands[1]
    sa, sb = node_shape(a), node_shape(b)
    if sa is None or sb is None or len(sa) < 2 or not _whole(entries[-1]) or len(entries) != len(sa):
        return None
    graph = gm.graph
    if len(sb) == 2:
        with graph.inserting_before(n):
            a2 = _index_node(graph, a, entries[:-1] + [slice(None)])
            if op.name == "linear":
                return graph.call_function(torch.nn.functional.linear, (a2, b, op.operands[2]))
            return graph.call_function(torch.matmul, (a2, b))
    if op.name not in ("matmul", "bmm") or len(sb) != len(sa) or tuple(sa[:-2]) != tuple(sb[:-2]):
        return None
    batch, row = entries[:-2], entries[-2]
    one_row = isinstance(row, int)
    if one_row:
        row = slice(row, row + 1) if row != -1 else slice(-1, None)
    with graph.inserting_before(n):
        a2 = _index_node(graph, a, batch + [row, slice(None)])
        b2 = _index_node(graph, b, batch + [slice(None), slice(None)])
        new = graph.call_function(torch.matmul, (a2, b2))
        return graph.call_method("squeeze", (new, -2)) if one_row else new


def _through_einsum(gm, n: fx.Node, entries: list):
    parts = _einsum_parts(n)
    if parts is None:
        return None
    specs, out, ops, shapes = parts
    oshape = node_shape(n)
    if oshape is None or len(out) != len(entries):
        return None
    chosen = {out[d]: e for d, e in enumerate(entries) if not _whole(e)}
    for letter in chosen:
        size = oshape[out.index(letter)]
        if any(letter in sp and s[sp.index(letter)] != size for s, sp in zip(shapes, specs)):
            return None  # a broadcast size-1 operand dim: not indexed the same way
    new_ops, new_specs = [], []
    with gm.graph.inserting_before(n):
        for o, sp in zip(ops, specs):
            es = [chosen.get(c, slice(None)) for c in sp]
            new_ops.append(_index_node(gm.graph, o, es))
            new_specs.append("".join(c for c, e in zip(sp, es) if not isinstance(e, int)))
        new_out = "".join(c for c in out if not isinstance(chosen.get(c), int))
        return gm.graph.call_function(torch.einsum, (",".join(new_specs) + "->" + new_out, *new_ops))


def _through_pointwise(gm, n: fx.Node, op, entries: list):
    tensors = [o for o in op.operands if isinstance(o, fx.Node)]
    if len(tensors) != 1 or node_shape(tensors[0]) != node_shape(n):
        return None
    src = tensors[0]
    with gm.graph.inserting_before(n):
        sel = _index_node(gm.graph, src, entries)
        new = gm.graph.node_copy(n, lambda x: sel if x is src else x)
    return new


def select_first(gm: fx.GraphModule) -> bool:
    """rw-select-first (module docstring)."""
    graph = gm.graph
    changed = False
    for g in _live(graph):
        if g.op != "call_function" or g.target is not operator.getitem or len(g.args) != 2:
            continue
        src, idx = g.args
        if not isinstance(src, fx.Node) or len(src.users) != 1 or src.op not in ("call_function", "call_method"):
            continue
        shape = node_shape(src)
        entries = _entries(idx, len(shape)) if shape is not None else None
        if entries is None or all(_whole(e) for e in entries):
            continue
        op = classify(src, gm)
        new = None
        if op.kind == "matmul" and op.name in ("linear", "matmul", "mm", "bmm"):
            new = _through_product(gm, src, op, entries)
        elif op.kind == "library" and src.op == "call_function" and src.target is torch.einsum:
            new = _through_einsum(gm, src, entries)
        elif op.kind == "pointwise":
            new = _through_pointwise(gm, src, op, entries)
        if new is None:
            continue
        g.replace_all_uses_with(new)
        graph.erase_node(g)
        graph.erase_node(src)
        changed = True
    return changed
