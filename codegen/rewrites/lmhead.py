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


def _softcap(gm: fx.GraphModule, n):
    """n = cap * tanh(z / cap) (or z * (1 / cap) inside; the factors in either order), Gemma-2's
    final logit soft cap, its tanh and division used once: (z, cap, the division's node) or
    None."""
    def by_number(node, name):
        if not isinstance(node, fx.Node) or node.op not in ("call_function", "call_method"):
            return None
        op = classify(node, gm)
        if op.kind != "pointwise" or op.name != name or len(op.operands) != 2 or op.p.get("rounding_mode"):
            return None
        a, c = op.operands
        if isinstance(c, fx.Node) and name == "mul":
            a, c = c, a
        if isinstance(a, fx.Node) and isinstance(c, (int, float)) and not isinstance(c, bool):
            return a, float(c)
        return None

    top = by_number(n, "mul")
    if top is None or not 0.0 < top[1] < float("inf"):
        return None
    t, cap = top
    top_op = classify(t, gm) if isinstance(t, fx.Node) and t.op != "placeholder" else None
    if top_op is None or top_op.kind != "pointwise" or top_op.name != "tanh" or len(t.users) != 1:
        return None
    u = top_op.operands[0]
    inner = by_number(u, "div")
    if inner is not None and inner[1] == cap:
        return (inner[0], cap, u) if len(u.users) == 1 else None
    inner = by_number(u, "mul")
    if inner is not None and abs(inner[1] * cap - 1.0) <= 1e-6 and len(u.users) == 1:
        return inner[0], cap, u
    return None


def linear_cross_entropy_pattern(gm: fx.GraphModule) -> bool:
    """rw-linear-cross-entropy: cross_entropy(linear(x, W, b).float(), t) (class indices, mean,
    sum or none, an ignore_index; the logits maybe flattened from [B, S, V] and the targets from
    [B, S]) is one LM-head-and-loss op (codegen.ops linear_cross_entropy) whose template reduces
    each tile of logits where it is made: the [T, V] logits and their fp32 copy are never
    written. Gemma-2's final logit soft cap between the product and the loss (cap * tanh(logits /
    cap), before or after the upcast) is the op's ``softcap``. The logits used anywhere else,
    fp32 logits of a 16-bit product kept 16-bit for the loss (no upcast) or a weight / label
    smoothing keep the library calls."""
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
        cap = _softcap(gm, lin) if lin is not None else None
        if cap is not None:
            lin, _above = _chain_to_linear(gm, cap[0], cap[2])
        lop = classify(lin, gm) if isinstance(lin, fx.Node) and lin.op == "call_function" else None
        if lop is None or lop.kind != "matmul" or lop.name != "linear":
            continue
        x, w, b = lop.operands[:3]
        xs, ws = node_shape(x), node_shape(w)
        if (ls is None or len(ls) != 2 or xs is None or ws is None or len(ws) != 2
                or ls != (_prod(xs[:-1]), ws[0]) or node_dtype(target) != torch.int64
                or node_shape(target) != (ls[0],)):
            continue
        # the cap computed in the product's own 16-bit dtype (eager rounds each step), else fp32
        capped_16 = (cap is not None and node_dtype(x) in (torch.float16, torch.bfloat16)
                     and node_dtype(cap[2]) == node_dtype(x))
        with graph.inserting_before(n):
            xf = x if len(xs) == 2 else graph.call_method("reshape", (x, -1, xs[-1]))
            new = graph.call_function(O.linear_cross_entropy, (xf, w, target, b),
                                      {"ignore_index": int(kw.get("ignore_index", -100)),
                                       "reduction": kw.get("reduction", "mean"),
                                       "softcap": cap[1] if cap is not None else None,
                                       "softcap_16": capped_16})
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
