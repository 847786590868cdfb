"""LM head + cross-entropy (rw-linear-cross-entropy)."""
from __future__ import annotations

from torch import fx

from codegen.ops import classify, node_dtype, node_shape
from codegen.rewrites.common import _erase_unused_above, _is_shape_query, _live


def _feeds_only(n: fx.Node, inside: set) -> bool:
    """Do all of n's (transitive) uses end in nodes of ``inside``?"""
    todo, seen = list(n.users), set()
    while todo:
        u = todo.pop()
        if u in inside or u in seen:
            continue
        seen.add(u)
        if u.op == "output" or not u.users:
            return False
        todo.extend(u.users)
    return True


def _chain_to_linear(gm: fx.GraphModule, n, consumer: fx.Node):
    """Follow n (read by consumer) up through casts and reshapes (``logits.view(-1,
    logits.shape[-1]).float()``), each used only by the next and by shape queries that feed the
    chain: (the node reached or None, the chain's nodes)."""
    chain = []
    while isinstance(n, fx.Node) and n.op in ("call_function", "call_method"):
        op = classify(n, gm)
        if not ((op.kind == "pointwise" and op.name == "cast") or op.kind == "identity"
                or (op.kind == "view" and op.name in ("view", "reshape", "flatten"))):
            break
        chain.append(n)
        n = n.args[0]
    inside = set(chain) | {consumer}
    for m in chain + ([n] if isinstance(n, fx.Node) else []):
        for u in m.users:
            if u not in inside and not (_is_shape_query(u) and _feeds_only(u, inside)):
                return None, chain
    return n, chain


def linear_cross_entropy_pattern(gm: fx.GraphModule) -> bool:
    """rw-linear-cross-entropy: cross_entropy(linear(x, W, b).float(), t) (class indices, mean,
    sum or none, an ignore_index; the logits maybe flattened from [B, S, V] and the targets from
    [B, S]) is one LM-head-and-loss op (codegen.ops linear_cross_entropy) whose template reduces
    each tile of logits where it is made: the [T, V] logits and their fp32 copy are never
    written. The logits used anywhere else, fp32 logits of a 16-bit product kept 16-bit for the
    loss (no upcast) or a weight / label smoothing keep the library calls."""
    import torch

    from codegen import losses as LS
    from codegen import ops as O

    graph = gm.graph
    changed = False
    for n in _live(graph):
        call = LS.call_of(n, gm)
        if call is None or call[0] != "cross_entropy":
            continue
        (logits, target), kw = call[1], LS.normalized(call[2])
        if kw is None or set(kw) - {"reduction", "ignore_index"} or not isinstance(logits, fx.Node):
            continue
        if kw.get("reduction", "mean") not in ("mean", "sum", "none") or node_dtype(logits) != torch.float32:
            continue
        ls = node_shape(logits)
        if len(logits.users) != 1:
            continue
        lin, _chain = _chain_to_linear(gm, logits, n)
        lop = classify(lin, gm) if isinstance(lin, fx.Node) and lin.op == "call_function" else None
        if lop is None or lop.kind != "matmul" or lop.name != "linear":
            continue
        x, w, b = lop.operands[:3]
        xs, ws = node_shape(x), node_shape(w)
        if (ls is None or len(ls) != 2 or xs is None or ws is None or len(ws) != 2
                or ls != (_prod(xs[:-1]), ws[0]) or node_dtype(target) != torch.int64
                or node_shape(target) != (ls[0],)):
            continue
        with graph.inserting_before(n):
            xf = x if len(xs) == 2 else graph.call_method("reshape", (x, -1, xs[-1]))
            new = graph.call_function(O.linear_cross_entropy, (xf, w, target, b),
                                      {"ignore_index": int(kw.get("ignore_index", -100)),
                                       "reduction": kw.get("reduction", "mean")})
        new.meta = dict(n.meta)
        n.replace_all_uses_with(new)
        graph.erase_node(n)
        _erase_unused_above([logits], stop=x)
        changed = True
    return changed


def _prod(xs) -> int:
    """The product of a shape's sizes."""
    out = 1
    for v in xs:
        out *= int(v)
    return out
