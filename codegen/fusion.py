"""Fusion planning: which fx nodes are computed together in one Triton kernel.

Greedy over the nodes in topological order (principles alg-fuse-pointwise-chain,
alg-reduction-prologue, alg-reduction-epilogue). A group's kernel runs where its last member was,
so a node may join a group only if no member of the group has a user outside the group that runs
before the joining node; that single rule keeps the program order valid.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import fx

from codegen.ops import (COMPARISONS, FLOAT_DTYPES, INDEX_DTYPES, ROLLED, NOp, classify, load_roles, node_dtype,
                         node_shape)

FUSABLE_DTYPES = FLOAT_DTYPES | {torch.bool}


@dataclass(eq=False)
class Group:
    id: str
    # pointwise | reduction | softmax | norm | pool | scan | chanstats | matmul | attention | linear_ce
    kind: str
    members: list[fx.Node] = field(default_factory=list)
    domain: tuple[int, ...] = ()
    red: fx.Node | None = None  # the reduction / softmax node
    aliases: dict[fx.Node, str] = field(default_factory=dict)  # getitem -> acc / acc_idx
    out_shape: tuple[int, ...] = ()  # reduced domain of a reduction
    rdims: list[int] = field(default_factory=list)
    keepdim: bool = False
    disabled: bool = False
    #: members that make a piece of a cat in this kernel (pointwise): member -> (the cat, the
    #: piece's index); the kernel computes them at the cat's columns, their loads placed there
    placed: dict[fx.Node, tuple[fx.Node, int]] = field(default_factory=dict)

    @property
    def template(self) -> str:
        return self.kind

    def prologue(self) -> list[fx.Node]:
        if self.red is None:
            return []
        return self.members[: self.members.index(self.red)]

    def epilogue(self) -> list[fx.Node]:
        if self.red is None:
            return list(self.members)
        return [m for m in self.members[self.members.index(self.red) + 1:]]


@dataclass
class FusionPlan:
    gm: fx.GraphModule
    nops: dict[fx.Node, NOp]
    groups: list[Group]
    order: dict[fx.Node, int]
    notes: list[str] = field(default_factory=list)
    #: parameters ModelNew re-lays out channels-last at construction (codegen.layout)
    channels_last_params: list[str] = field(default_factory=list)
    #: the graph region of each node: graph breaks (harness.capture) cut the program into
    #: regions, and no kernel spans two (a break's statement may have effects)
    regions: dict[fx.Node, int] = field(default_factory=dict)
    #: how the graph was captured (harness.capture.Captured: graph breaks, their sources, plain
    #: tensor attributes registered as buffers); None when built from a bare graph
    capture: object | None = None
    #: tables computed once at init (codegen.constants.Fold)
    folds: list = field(default_factory=list)
    #: what the generated module guards (codegen.dropin.Dropin; set by pipeline.analyze)
    dropin: object = None

    def group_of(self, node: fx.Node) -> Group | None:
        for g in self.groups:
            if node in g.members or node in g.aliases:
                return g
        return None


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def norm_pattern(g: "Group", norm: NOp, t_shape) -> str | None:
    """How a normalization kernel indexes an extra input: full, scalar, affine, row (layer / RMS
    norm: constant over the normalized dims) or not at all."""
    dom = tuple(g.domain)
    t_shape = tuple(t_shape or ())
    if t_shape == dom:
        return "full"
    if _numel(t_shape) == 1:
        return "scalar"
    nd = len(dom)
    if len(t_shape) > nd:
        return None
    ts = (1,) * (nd - len(t_shape)) + t_shape
    if norm.name in ("layer", "rms"):
        k = len(norm.p.get("normalized_shape") or ())
        if all(s == 1 for s in ts[: nd - k]) and ts[nd - k:] == dom[nd - k:]:
            return "affine"
        if all(s == 1 for s in ts[nd - k:]) and broadcasts_to(ts, dom):
            return "row"  # one value per normalized row (a per-channel bias before a norm over W)
        return None
    if nd >= 2 and ts[1] == dom[1] and all(s == 1 for i, s in enumerate(ts) if i != 1):
        return "affine"
    return None


def _norm_layout_ok(op: NOp, shape) -> bool:
    nd = len(shape)
    if op.name in ("layer", "rms"):
        ns = tuple(op.p.get("normalized_shape") or ())
        return 0 < len(ns) <= nd and tuple(shape[nd - len(ns):]) == ns
    if op.name == "group":
        g = op.p.get("num_groups")
        return nd >= 2 and isinstance(g, int) and g > 0 and shape[1] % g == 0
    return op.name == "instance" and nd >= 3


def pool_aux_pattern(in_shape, t_shape) -> str | None:
    """Extra inputs a pooling prologue can read without window indexing."""
    t_shape = tuple(t_shape or ())
    if _numel(t_shape) == 1:
        return "scalar"
    nd = len(in_shape)
    if len(t_shape) > nd:
        return None
    ts = (1,) * (nd - len(t_shape)) + t_shape
    if ts[1] == in_shape[1] and all(s == 1 for i, s in enumerate(ts) if i != 1):
        return "channel"
    return None


def chanstats_aux_pattern(in_shape, t_shape) -> str | None:
    """How a channel-statistics prologue reads an input: full-size, per channel or scalar."""
    if tuple(t_shape or ()) == tuple(in_shape):
        return "full"
    return pool_aux_pattern(in_shape, t_shape)


#: a pointwise chain is recomputed inside channel statistics when it reads at most this many
#: full-size tensors (each read twice instead of the chain's value written once and read twice)
MAX_RECOMPUTE_READS = 2
MAX_RECOMPUTE_OPS = 12

#: operand dtypes the matmul template computes on tensor cores (fp32 as 3xTF32)
MATMUL_DTYPES = {torch.float32, torch.float16, torch.bfloat16}


def broadcasts_to(t_shape, shape) -> bool:
    """Can a tensor of t_shape be read broadcast over shape (without growing it)?"""
    t_shape = tuple(t_shape or ())
    if len(t_shape) > len(shape):
        return False
    return all(a == b or a == 1 for a, b in zip(reversed(t_shape), reversed(tuple(shape))))


def matmul_form(op: NOp) -> tuple[bool, bool] | str:
    """(batched, b_nk) of a matrix product the template computes, or why it cannot."""
    a, b, bias = op.operands[:3]
    sa, sb = node_shape(a), node_shape(b)
    if sa is None or sb is None or node_shape(op.node) is None:
        return "matrix product of unknown shapes"
    if op.p.get("program"):  # rw-dequant-program: B computed in registers from stored tensors
        out = op.p["program"][-1]
        kn = (out[1][1], out[1][0]) if op.p["b_nk"] else tuple(out[1])
        if len(sa) < 2 or node_dtype(a) not in (torch.float16, torch.bfloat16) or len(kn) != 2 \
                or kn[0] != sa[-1] or out[2] != str(node_dtype(a)).replace("torch.", "") \
                or (bias is not None and (node_dtype(bias) != node_dtype(a)
                                          or tuple(node_shape(bias) or ()) != (kn[1],))):
            return "a computed weight the template cannot read with this input"
        return False, bool(op.p["b_nk"])
    # rw-dequant-linear's: an 8-bit integer weight the template converts to A's dtype in registers
    dq = op.p.get("dequant") and node_dtype(b) in (torch.int8, torch.uint8) \
        and node_dtype(a) in (torch.float16, torch.bfloat16)
    dts = {node_dtype(t) for t in (a, b, bias) if isinstance(t, fx.Node) and not (dq and t is b)}
    if len(dts) != 1 or not dts <= MATMUL_DTYPES:
        return f"matrix product over {', '.join(sorted(str(d) for d in dts))}: no tensor-core path"
    if op.name == "linear":
        ok = len(sa) >= 2 and len(sb) == 2 and sb[1] == sa[-1]
        if ok and bias is not None and tuple(node_shape(bias) or ()) != (sb[0],):
            return "linear bias is not a vector over the output features"
        return (False, True) if ok else "linear of a vector input"
    if len(sa) >= 2 and len(sb) == 2 and op.name in ("matmul", "mm") and sa[-1] == sb[0]:
        return False, False
    if op.name in ("matmul", "bmm") and len(sa) == len(sb) >= 3 and sa[:-2] == sb[:-2] \
            and sa[-1] == sb[-2]:
        return True, False
    return "matrix product with broadcast batch dims or vector operands"


#: head dims the attention template holds in registers (BLOCK_D = next power of two)
MAX_HEAD_DIM = 256
#: operand dtypes the attention template computes on tensor cores (fp32 as 3xTF32)
ATTENTION_DTYPES = {torch.float32, torch.float16, torch.bfloat16}


def attention_form(op: NOp) -> str | None:
    """Why the attention template cannot take this scaled_dot_product_attention (None: it can)."""
    q, k, v = op.operands[:3]
    sq, sk, sv = node_shape(q), node_shape(k), node_shape(v)
    if sq is None or sk is None or sv is None:
        return "attention of unknown shapes"
    dts = {node_dtype(t) for t in (q, k, v)}
    if len(dts) != 1 or not dts <= ATTENTION_DTYPES:
        # fp64 (or mixed dtypes): no tensor-core path, PyTorch's math kernel stays
        return f"attention over {', '.join(sorted(str(d) for d in dts))}: no tensor-core path"
    if not (len(sq) == len(sk) == len(sv) and len(sq) in (3, 4)):
        return "attention operands are not all 3-d or all 4-d"
    if sk != sv or sq[0] != sk[0] or sq[-1] != sk[-1]:
        return "attention with different batch, head dims or key/value shapes"
    if sq[-1] > MAX_HEAD_DIM:
        return f"head dim {sq[-1]} above {MAX_HEAD_DIM}: the query block would not fit registers"
    if len(sq) == 4 and sq[1] != sk[1] and not (op.p.get("gqa") and sq[1] % sk[1] == 0):
        return "attention heads differ without grouped-query attention"
    if op.p.get("mask"):
        mask = op.operands[3]
        sm, dm = node_shape(mask), node_dtype(mask)
        scores = tuple(sq[:-1]) + (sk[-2],)
        if sm is None or (dm != torch.bool if op.p["mask"] in ("bool", "drop") else dm not in ATTENTION_DTYPES):
            return f"attention mask of {dm}: neither bool nor a 16/32-bit float"
        try:
            fits = tuple(torch.broadcast_shapes(tuple(sm), scores)) == scores
        except RuntimeError:
            fits = False
        if not fits:
            return f"attention mask {list(sm)} does not broadcast to the scores {list(scores)}"
    return None


def linear_ce_form(op: NOp) -> str | None:
    """Why the LM-head + cross-entropy template cannot take this call (None: it can)."""
    x, w, t, b = op.operands[:4]
    sx, sw, st = node_shape(x), node_shape(w), node_shape(t)
    if sx is None or sw is None or st is None:
        return "linear cross-entropy of unknown shapes"
    dts = {node_dtype(x), node_dtype(w)} | ({node_dtype(b)} if b is not None else set())
    if len(dts) != 1 or not dts <= MATMUL_DTYPES:
        return f"linear cross-entropy over {', '.join(sorted(str(d) for d in dts))}: no tensor-core path"
    if node_dtype(t) != torch.int64:
        return "linear cross-entropy with targets that are not int64 class indices"
    if len(sx) != 2 or len(sw) != 2 or sw[1] != sx[1] or tuple(st) != (sx[0],):
        return "linear cross-entropy of other than x [T, H], W [V, H], targets [T]"
    if b is not None and tuple(node_shape(b) or ()) != (sw[0],):
        return "linear cross-entropy with a bias that is not a vector over the vocabulary"
    return None


#: a product with fewer rows or columns than this is a matrix-vector product in all but name: a
#: tensor-core tile (64 wide at least) wastes most of its work; measured on the H200: a GEMV
#: (N = 1, K = 1M) ran 10x slower than cuBLAS (docs/results/matmul_l12_h200.md)
VECTOR_LIKE = 16


def vector_like(op: NOp, out_shape) -> bool:
    """Is the product a matrix-vector product over a large matrix: M or N below VECTOR_LIKE and
    at least a million elements in the matrix (tiny products are launch-bound either way)?"""
    out = tuple(out_shape)
    n = out[-1]
    m = out[-2] if op.p.get("batched") else _numel(out[:-1])
    k = (node_shape(op.operands[0]) or (1,))[-1]
    return min(m, n) < VECTOR_LIKE and max(m, n) * k >= 1 << 20


#: a decode GEMV: at most this many rows (tokens being decoded) ...
DECODE_ROWS = 16
#: ... against a 16-bit weight of at least this many elements (the weight read dominates)
DECODE_WEIGHT = 1 << 22


def decode_gemv(op: NOp, out_shape) -> bool:
    """A linear layer applied to a handful of decoding tokens with a large 16-bit weight: the
    template's split-K tiles of 16 rows stream the weight over every SM, where cuBLAS's GEMV
    reached 65% of the H200's bandwidth (workloads/llm/09_decode_gemv, 0.042 ms,
    docs/results/workloads_h200.md); principle alg-decode-gemv."""
    if op.name != "linear" or op.p.get("batched") or node_dtype(op.node) not in (torch.float16, torch.bfloat16):
        return False
    out = tuple(out_shape)
    m, n = _numel(out[:-1]), out[-1]
    k = (node_shape(op.operands[0]) or (1,))[-1]
    return m <= DECODE_ROWS and n * k >= DECODE_WEIGHT and n >= 1024 and k >= 256


def _all_float(nodes) -> bool:
    return all(node_dtype(n) in FUSABLE_DTYPES for n in nodes)


#: integer tensors a pointwise kernel compares (loaded as they are, never converted): signed
#: ones, which Triton promotes to the wider one as torch does (uint8 against a signed int would
#: stay unsigned in Triton where torch widens it)
COMPARED_INTS = {torch.int8, torch.int16, torch.int32, torch.int64}


def _int_comparison(op, n: fx.Node) -> bool:
    """A comparison of signed integer tensors (positions against lengths: a padding mask built
    in forward), exact in the kernel: the operands stay integers and the result is bool."""
    return (op.name in COMPARISONS and node_dtype(n) == torch.bool
            and bool(op.tensor_inputs) and all(node_dtype(t) in COMPARED_INTS for t in op.tensor_inputs))


def norm_dims(dim, nd: int) -> list[int] | None:
    """A reduction's dim argument as sorted non-negative dims (None: all); None if not ints."""
    if dim is None or dim == () or dim == []:
        return list(range(nd))
    dims = list(dim) if isinstance(dim, (list, tuple)) else [dim]
    if not all(isinstance(d, int) for d in dims):
        return None
    return sorted(d % nd for d in dims) if nd else []


#: reductions whose result a broadcast epilogue reads back over the reduced dims (x / rms(x),
#: x - mean(x)): the template re-reads the reduced tile, so the reduction must be one an
#: identity-filled tile combines exactly
BROADCAST_OPS = ("sum", "mean", "amax", "amin")
#: a broadcast epilogue keeps one program per independent reduction (no split over programs):
#: below this many reductions most SMs would idle, and the split reduction + pointwise pass it
#: replaces is faster (principle alg-reduce-broadcast)
MIN_BROADCAST_REDUCTIONS = 1024
#: ... and each reduction short enough to be held in registers in one pass (the softmax
#: template's budget): a longer one is read twice either way, and its second read only hits L2
#: while the programs in flight fit it (128 rows of 256 KB do not)
MAX_BROADCAST_LENGTH = 8192


def broadcast_epilogue(g: "Group") -> list[fx.Node]:
    """Members of a reduction group (kind softmax: reduce, then write the full domain) that run
    on the full domain after the reduction: a broadcast epilogue reading the reduced value and
    the tile the reduction read (principle alg-reduce-broadcast). Empty for anything else."""
    if g.kind != "softmax" or g.red is None or node_shape(g.red) == tuple(g.domain):
        return []
    return [m for m in g.epilogue() if node_shape(m) == tuple(g.domain)]


def rolls_internal(members, nops) -> bool:
    """Would a rotate-half (or a take) read a value computed in the same kernel? It is a load of
    its operand at another column (row), so its operands must come from memory (kernel inputs)."""
    inside = set(members)
    return any(nops[m].name in ROLLED and any(t in inside for t in nops[m].tensor_inputs)
               for m in members)


def is_break(n: fx.Node) -> bool:
    """Is the node a graph break (a statement harness.capture left to PyTorch)?"""
    return n.op == "call_function" and getattr(n.target, "__module__", None) == BREAK_MODULE


#: the module of the functions graph breaks call (harness.capture.GENERATED_MODULE)
BREAK_MODULE = "egg_breaks"


def break_regions(nodes) -> dict[fx.Node, int]:
    """Region of each node in program order: a graph break ends its region."""
    out, k = {}, 0
    for n in nodes:
        out[n] = k
        if is_break(n):
            k += 1
    return out


def _parameter_chains_into_norms(groups: list, where: dict, order: dict, nops: dict,
                                 region: dict) -> None:
    """A pointwise group over a norm's result that also computes, from parameters and buffers
    alone, a vector it reads per column (Gemma's ``(rms_norm(x) * (1.0 + w.float())).type_as(x)``:
    the greedy pass put ``1.0 + w.float()`` first and the product joined it) becomes the norm
    kernel's epilogue: the vector recomputed per column in the norm kernel, one launch and one
    pass over the rows fewer (principle alg-fuse-pointwise-chain). Only when the norm's values
    are all it reads besides parameters, buffers and numbers, those load per column (affine) or
    as a scalar, the members of another shape are computed from those alone, the values it
    leaves to others have the norm's shape, and the norm kernel reads nothing it computes."""
    for p in list(groups):
        if p.kind != "pointwise" or p.red is not None or p.placed:
            continue
        members = set(p.members)
        ext = {t for m in p.members for t in nops[m].tensor_inputs if t not in members}
        made = {where.get(t) for t in ext if t.op != "get_attr"}
        if len(made) != 1:
            continue
        g = made.pop()
        if g is None or g.kind != "norm" or g.red is None or region.get(g.red) != region.get(p.members[0]):
            continue
        red_op = nops[g.red]
        params = [t for t in ext if t.op == "get_attr"]
        if any(norm_pattern(g, red_op, node_shape(t)) not in ("affine", "scalar") for t in params):
            continue
        # members of another shape than the norm's: computed from parameters alone
        from_params: set = set()
        ok = True
        for m in sorted(p.members, key=order.__getitem__):
            if tuple(node_shape(m) or ()) == tuple(g.domain):
                continue
            if (all(t in from_params or t.op == "get_attr" for t in nops[m].tensor_inputs)
                    and norm_pattern(g, red_op, node_shape(m)) in ("affine", "scalar")):
                from_params.add(m)
            else:
                ok = False
                break
        outside = [m for m in p.members if any(u not in members for u in m.users)]
        if (not ok or any(m in from_params for m in outside)
                or any(where.get(u) is g for m in p.members for u in m.users)):
            continue
        groups.remove(p)
        g.members = g.members + sorted(p.members, key=order.__getitem__)
        for m in p.members:
            where[m] = g


def _merge_pointwise(groups: list, where: dict, order: dict, nops: dict,
                     region: dict | None = None) -> None:
    """Merge a pointwise group into a pointwise consumer group over the same domain when every
    other user of its values runs after the consumer's kernel (so nothing needs them earlier)."""
    changed = True
    while changed:
        changed = False
        for b in groups:
            if b.kind != "pointwise":
                continue
            last_b = max(order[m] for m in b.members)
            feeders = []
            for m in b.members:
                for t in m.all_input_nodes:
                    a = where.get(t)
                    if a is not None and all(a is not f for f in feeders):
                        feeders.append(a)
            for a in feeders:
                if a is None or a is b or a.kind != "pointwise" or a.domain != b.domain:
                    continue
                if region and region.get(a.members[0]) != region.get(b.members[0]):
                    continue
                ok = all(u in a.members or u in b.members or order[u] > last_b
                         for m in a.members for u in m.users)
                if not ok or rolls_internal(a.members + b.members, nops):
                    continue
                b.members = sorted(a.members + b.members, key=lambda m: order[m])
                b.placed.update(a.placed)
                for m in a.members:
                    where[m] = b
                groups.remove(a)
                changed = True
                break
            if changed:
                break


def plan_fusion(gm: fx.GraphModule, disabled: set[str] | None = None) -> FusionPlan:
    """Group the graph's nodes into kernels. Groups whose id is in ``disabled`` are dropped
    (their nodes stay torch code), which is how a failing or slow group is backed out."""
    nodes = list(gm.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    region = break_regions(nodes)
    nops = {n: classify(n, gm) for n in nodes}
    where: dict[fx.Node, Group] = {}
    groups: list[Group] = []

    def users_ok(g: Group, n: fx.Node, strict: bool) -> bool:
        """Every user of every member is in the group, n, or (unless strict) runs after n; and
        n is in the group's region (no kernel spans a graph break)."""
        if g.members and region.get(g.members[0]) != region.get(n):
            return False
        for m in list(g.members) + list(g.aliases):
            for u in m.users:
                if u in g.members or u in g.aliases or u is n:
                    continue
                if strict or order[u] < order[n]:
                    return False
        return True

    def broadcast_join_ok(g: Group, n: fx.Node) -> bool:
        """Can a full-domain pointwise op join reduction group g as its broadcast epilogue
        (principle alg-reduce-broadcast)? A keepdim sum/mean/amax/amin whose values (and those
        of the epilogue on its result) nothing but n reads, an epilogue on the reduced domain
        that reads no other tensor, n's other inputs read broadcast over the domain, enough
        independent reductions to fill the GPU with one program each, each short enough for
        one pass over registers."""
        if (nops[g.red].name not in BROADCAST_OPS or not g.keepdim or g.aliases
                or not users_ok(g, n, strict=True) or any(nops[m].name in ROLLED for m in g.members)):
            return False  # (the softmax template makes no take of its prologue)
        inside = set(g.members)
        if any(t not in inside for m in g.epilogue() for t in nops[m].tensor_inputs):
            return False
        if not all(t in inside or broadcasts_to(node_shape(t), g.domain)
                   for t in nops[n].tensor_inputs):
            return False
        n_red = _numel(g.out_shape)
        return (n_red >= MIN_BROADCAST_REDUCTIONS
                and _numel(g.domain) <= MAX_BROADCAST_LENGTH * n_red)

    def new_group(kind: str, **kw) -> Group:
        g = Group(id=f"g{len(groups)}", kind=kind, **kw)
        groups.append(g)
        return g

    def absorb_prologue(g: Group, src: fx.Node, ok=lambda pg: True, outputs: bool = False) -> None:
        """Fold the pointwise group that produces ``src`` (over g's domain) into g as its
        prologue (principle alg-reduction-prologue): all of it when nothing else uses its
        values, else the members only g's reduction-like op uses (directly or through each
        other); the rest stays a pointwise kernel whose outputs g reads (e.g. a residual sum
        that is also returned stays, its cast to fp32 for the norm moves into the norm).
        ``outputs``: g's template also stores prologue values that are used after g (the norm
        template does), so the whole chain moves when its other users run after g."""
        pg = where.get(src)
        if pg is None or pg.kind != "pointwise" or pg.domain != g.domain or pg.placed \
                or region.get(pg.members[0]) != region.get(g.red):
            return  # (a cat's pieces are computed at its columns: only the pointwise template)
        if users_ok(pg, g.red, strict=True) or (outputs and users_ok(pg, g.red, strict=False)):
            move = list(pg.members)
        else:
            moving: set[fx.Node] = set()
            for m in reversed(pg.members):
                if m.users and all(u in moving or u is g.red for u in m.users):
                    moving.add(m)
            move = [m for m in pg.members if m in moving]
        if (not move or any(nops[m].name in ROLLED and not (nops[m].name == "take" and g.kind == "reduction")
                            for m in move)
                or not ok(Group(id="", kind="pointwise", members=move, domain=pg.domain))):
            return  # (a rotate-half is a rolled load only the pointwise template makes; a take
            # the pointwise and reduction templates make)
        if len(move) == len(pg.members):
            groups.remove(pg)
        else:
            pg.members = [m for m in pg.members if m not in move]
        g.members = move + g.members
        for m in move:
            where[m] = g

    def chain_of(pg: Group, t: fx.Node) -> tuple[list[fx.Node], set[fx.Node]]:
        """The members of pointwise group pg that ``t`` is computed from (t included), in
        order, and the tensors they read from outside the chain."""
        need, todo = [], [t]
        while todo:
            x = todo.pop()
            if x in need or where.get(x) is not pg:
                continue
            need.append(x)
            todo.extend(nops[x].tensor_inputs)
        need.sort(key=order.__getitem__)
        return need, {e for x in need for e in nops[x].tensor_inputs if e not in need}

    def copy_chain(need: list[fx.Node], before: fx.Node, g: Group) -> dict[fx.Node, fx.Node]:
        """Copies of the chain ``need`` in the graph just before ``before``, members of g (the
        chain recomputed there): original -> copy."""
        copy: dict[fx.Node, fx.Node] = {}
        with gm.graph.inserting_before(before):
            for k, x in enumerate(need):
                c = gm.graph.node_copy(x, lambda a: copy.get(a, a))
                c.meta = dict(x.meta)
                copy[x] = c
                nops[c] = classify(c, gm)
                order[c] = order[before] - 1 + (k + 1) / (len(need) + 1)
                region[c] = region[before]
                where[c] = g
        return copy

    def recompute_shared(g: Group) -> None:
        """The pointwise chains g's members read that other kernels read too (what
        absorb_prologue could not move), recomputed inside g where that reads fewer bytes
        than the chain's value (principle alg-reduction-prologue): a bf16 input cast to fp32 for
        an amax and for the scaling after it was a kernel of its own that wrote the fp32 copy
        for both to read; now the reduction reads the bf16 input, and the cast fuses with its
        other consumer. Full-size reads count (per-row vectors and scalars are small)."""
        numel = _numel(g.domain)
        for m in list(g.members):
            for t in list(nops[m].tensor_inputs):
                pg = where.get(t)
                if (t in g.members or pg is None or pg is g or pg.kind != "pointwise"
                        or pg.domain != g.domain or pg.placed or region.get(pg.members[0]) != region.get(m)):
                    continue
                need, ext = chain_of(pg, t)
                dts = [node_dtype(e) for e in ext if _numel(node_shape(e)) == numel]
                out = node_dtype(t)
                if (len(need) > MAX_RECOMPUTE_OPS or any(nops[x].name in ROLLED for x in need)
                        or out is None or None in dts
                        or sum(d.itemsize for d in dts) >= out.itemsize):
                    continue
                copy = copy_chain(need, m, g)
                m.replace_input_with(t, copy[t])
                nops[m].operands = [copy[t] if o is t else o for o in nops[m].operands]
                g.members = sorted(g.members + list(copy.values()), key=order.__getitem__)

    def cat_group(n: fx.Node, op: NOp, shape) -> Group | None:
        """A cat along the last dim (principle alg-cat-placed) with the pointwise kernels that make
        its pieces, in one kernel over the cat's result: each piece's ops computed at its columns,
        their loads placed there, so no piece is written and read back to be copied. A piece's
        kernel moves in when it makes that piece alone (every member feeds it, nothing else reads
        a member, the cat is the piece's one reader) without a take or an interleaved rotation
        (a rotate-half rolls within the piece's columns), and reads a tensor with the piece's
        width (which gives the piece's columns at run time). None (torch.cat stays) when no
        piece's kernel can move in: a cat of values read from memory is a copy either way."""
        if shape is None or not _all_float([n] + op.tensor_inputs) or len(set(op.operands)) != len(op.operands):
            return None
        absorbed: dict[int, Group] = {}
        for k, p in enumerate(op.operands):
            width = (node_shape(p) or (0,))[-1]
            if width < 2:
                return None  # a piece of one column: a broadcast operand could not be told apart
            pg = where.get(p)
            if (pg is None or pg.kind != "pointwise" or pg.placed or tuple(pg.domain) != tuple(node_shape(p))
                    or pg in absorbed.values() or region.get(pg.members[0]) != region.get(n)
                    or set(p.users) != {n}):
                continue
            inside = set(pg.members)
            feeds, todo = set(), [p]
            while todo:
                m = todo.pop()
                if m in inside and m not in feeds:
                    feeds.add(m)
                    todo.extend(nops[m].tensor_inputs)
            ext = [t for m in pg.members for t in nops[m].tensor_inputs if t not in inside]
            if (feeds != inside or any(u not in inside for m in inside if m is not p for u in m.users)
                    or any(nops[m].name in ("take", "rotate_pairs", "cat") for m in inside)
                    or not any((node_shape(t) or (0,))[-1] == width for t in ext)):
                continue
            absorbed[k] = pg
        if not absorbed:
            return None
        members = sorted([m for pg in absorbed.values() for m in pg.members] + [n], key=order.__getitem__)
        g = new_group("pointwise", members=members, domain=tuple(shape))
        for k, pg in absorbed.items():
            groups.remove(pg)
            g.placed.update({m: (n, k) for m in pg.members})
        for m in members:
            where[m] = g
        return g

    def recompute_prologue(g: Group, src: fx.Node) -> None:
        """Give g (channel statistics) the pointwise chain that produces ``src`` as its
        prologue (principle alg-reduction-prologue): moved when only g reads it, else a copy
        of the chain recomputed inside g, so the chain's value need not be written for g and
        read back: the other consumers (the normalization after a batch norm's statistics)
        then fuse with the original chain. Applies when the chain reads at most
        MAX_RECOMPUTE_READS full-size tensors (reading them again costs no more than writing
        and re-reading the value) besides per-channel vectors and scalars."""
        pg = where.get(src)
        if pg is None or pg.kind != "pointwise" or pg.domain != g.domain or pg.placed \
                or region.get(pg.members[0]) != region.get(g.red):
            return
        need, ext = chain_of(pg, src)
        pats = [chanstats_aux_pattern(g.domain, node_shape(t)) for t in ext]
        if (None in pats or pats.count("full") > MAX_RECOMPUTE_READS or len(need) > MAX_RECOMPUTE_OPS
                or any(nops[m].name in ROLLED for m in need)):
            return
        if all(u in need or u is g.red for m in need for u in m.users):
            absorb_prologue(g, src)  # nothing else reads the chain: it moves
            return
        copy = copy_chain(need, g.red, g)
        g.red.replace_input_with(src, copy[src])
        nops[g.red].operands = [copy[src] if o is src else o for o in nops[g.red].operands]
        g.members = [copy[m] for m in need] + g.members

    for n in nodes:
        op = nops[n]
        shape = node_shape(n)
        if op.kind == "getitem" or (op.kind == "view" and op.name == "getattr"):
            src = op.operands[0] if op.operands else None
            key = op.operands[1] if len(op.operands) > 1 else None
            slot = ({0: "acc", 1: "acc_idx", "values": "acc", "indices": "acc_idx"}.get(key)
                    if isinstance(key, (int, str)) else None)  # x[:, 0] indexes with slices
            g = where.get(src) if isinstance(src, fx.Node) else None
            # an element of the op's tuple (max's values, indices); ``norm(x)[0]``, the first
            # row of one tensor, is an index like any other (it was read as the norm's own value)
            tm = src.meta.get("tensor_meta") if isinstance(src, fx.Node) else None
            tup = isinstance(tm, (tuple, list)) and not hasattr(tm, "shape")  # (TensorMetadata is one)
            if g is not None and g.red is src and slot is not None and tup:
                g.aliases[n] = slot
                where[n] = g
            continue
        if op.kind == "relayout":
            # a channels-last result converted back (codegen.layout): a pointwise group that
            # produces it writes the standard layout itself (principle mem-conv-channels-last)
            src = op.operands[0]
            g = where.get(src) if isinstance(src, fx.Node) else None
            if g is None or g.kind != "pointwise" or shape is None:
                op.kind, op.why = "library", "a layout conversion of a value no pointwise kernel makes"
                continue
            op.kind, op.name = "identity", "identity"
            op.p = {**op.p, "standard_layout": True}
        if op.kind == "identity":
            src = op.operands[0]
            g = where.get(src) if isinstance(src, fx.Node) else None
            if g is None or shape is None:
                continue
            op.kind, op.name = "pointwise", "identity"
        if op.kind == "pointwise" and op.name == "cat":
            if cat_group(n, op, shape) is None:
                op.kind, op.why = "library", "a cat of values no pointwise kernel makes: torch.cat copies them"
            continue
        if op.kind == "pointwise":
            if op.name == "take":  # a floating source read at integer indices
                typed = _all_float([n, op.operands[0]]) and node_dtype(op.operands[1]) in INDEX_DTYPES
            else:
                typed = (_all_float([n] + op.tensor_inputs) or _int_comparison(op, n)
                         or op.name in ("to_int", "from_int"))  # ops.CAST_INTS, by construction
            if shape is None or not typed:
                op.kind, op.why = "library", "dtype not handled by the pointwise template"
                continue
            cands = [where[t] for t in op.tensor_inputs if t in where]
            if op.name in ROLLED:  # its operand must stay a kernel input
                cands = []
            cands.sort(key=lambda g: max(order[m] for m in g.members + list(g.aliases)))
            joined = False
            for g in reversed(cands):
                if g.kind == "pointwise":
                    if shape == g.domain and users_ok(g, n, strict=False):
                        joined = True
                    elif (len(shape) >= len(g.domain) and shape != g.domain
                          and torch.broadcast_shapes(shape, g.domain) == shape
                          and users_ok(g, n, strict=True)):
                        g.domain = shape
                        joined = True
                elif g.kind == "reduction" and shape == g.out_shape and users_ok(g, n, False):
                    joined = True
                elif (g.kind == "reduction" and shape == g.domain
                      and broadcast_join_ok(g, n)):
                    g.kind, g.out_shape = "softmax", g.domain  # reduce, then write the domain
                    joined = True
                elif g.kind == "softmax" and shape == g.domain and users_ok(g, n, False):
                    joined = True
                elif g.kind == "scan" and shape == g.domain and users_ok(g, n, False):
                    joined = True
                elif g.kind == "pool" and shape == g.out_shape and users_ok(g, n, False):
                    joined = True
                elif (g.kind == "matmul" and shape == g.out_shape and users_ok(g, n, False)
                      and all(t in g.members or broadcasts_to(node_shape(t), shape)
                              for t in op.tensor_inputs)):
                    joined = True
                elif (g.kind == "norm" and shape == g.domain and users_ok(g, n, False)
                      and all(t in g.members or norm_pattern(g, nops[g.red], node_shape(t))
                              for t in op.tensor_inputs)):
                    joined = True
                if joined:
                    g.members.append(n)
                    where[n] = g
                    break
            if not joined and (not cands or all(c.kind == "pointwise" for c in cands)):
                # no producer it could join: an open group over the same domain (horizontal
                # fusion: shared loads, one launch less) if the program order allows it. Also
                # where its producers' groups are pointwise over another domain (a table of
                # [T, D] it reads broadcast): partial RoPE's ``q_rot * cos`` went to a kernel of
                # its own beside ``rotate_half(q_rot) * sin``, reading q_rot twice
                for g in reversed(groups):
                    if (g.kind == "pointwise" and g.domain == shape and users_ok(g, n, strict=False)
                            and not rolls_internal(g.members + [n], nops)):
                        g.members.append(n)
                        where[n] = g
                        joined = True
                        break
            if not joined:
                if op.name == "identity":
                    op.kind = "identity"
                    continue
                g = new_group("pointwise", members=[n], domain=shape)
                where[n] = g
            continue
        if op.kind == "matmul":
            form = matmul_form(op)
            if isinstance(form, str):
                op.kind, op.why = "library", form
                continue
            op.p["batched"], op.p["b_nk"] = form
            g = new_group("matmul", members=[n], domain=shape, red=n, out_shape=shape)
            where[n] = g
            continue
        if op.kind == "linear_ce":
            why = linear_ce_form(op)
            if why:
                op.kind, op.why = "library", why
                continue
            g = new_group("linear_ce", members=[n], domain=node_shape(op.operands[0]), red=n,
                          out_shape=shape)
            where[n] = g
            continue
        if op.kind == "attention":
            why = attention_form(op)
            if why:
                op.kind, op.why = "library", why
                continue
            g = new_group("attention", members=[n], domain=shape, red=n, out_shape=shape)
            where[n] = g
            continue
        if op.kind == "chanstats":
            src = op.operands[0]
            in_shape = node_shape(src)
            items = [u for u in n.users]
            keys = sorted(nops[u].operands[1] if nops[u].kind == "getitem" else -1 for u in items)
            if in_shape is None or len(in_shape) < 2 or keys not in ([0, 1], [0, 1, 2]):
                op.kind, op.why = "library", "channel statistics used other than as (mean, var, count)"
                continue
            g = new_group("chanstats", members=[n], domain=in_shape, red=n)
            for u in items:
                g.aliases[u] = ("mean", "var", "count")[nops[u].operands[1]]
                where[u] = g
            where[n] = g
            recompute_prologue(g, src)
            continue
        if op.kind == "scan":
            src = op.operands[0]
            in_shape = node_shape(src)
            if in_shape is None or not in_shape:
                op.kind, op.why = "library", "scan of an unknown shape"
                continue
            d = op.p["dim"] % len(in_shape)
            if _numel(in_shape[d + 1:]) != 1:
                op.kind, op.why = "library", "scan along a non-innermost dim"
                continue
            g = new_group("scan", members=[n], domain=in_shape, red=n, rdims=[d], out_shape=in_shape)
            absorb_prologue(g, src)
            where[n] = g
            continue
        if op.kind == "pool":
            src = op.operands[0]
            in_shape = node_shape(src)
            if in_shape is None or node_dtype(src) not in FLOAT_DTYPES or shape is None:
                op.kind, op.why = "library", "pooling of a non-floating tensor"
                continue
            g = new_group("pool", members=[n], domain=in_shape, red=n, out_shape=shape)

            def one_windowed_input(pg: Group) -> bool:  # the window loads exactly one full tensor
                ext = {t for m in pg.members for t in nops[m].tensor_inputs if t not in pg.members}
                full = [t for t in ext if node_shape(t) == in_shape]
                return len(full) == 1 and all(t in full or pool_aux_pattern(in_shape, node_shape(t))
                                              for t in ext)

            absorb_prologue(g, src, one_windowed_input)
            where[n] = g
            continue
        if op.kind == "norm":
            src = op.operands[0]
            in_shape = node_shape(src)
            if in_shape is None or not _norm_layout_ok(op, in_shape):
                op.kind, op.why = "library", "normalization layout not handled"
                continue
            g = new_group("norm", members=[n], domain=in_shape, red=n, out_shape=in_shape)
            absorb_prologue(g, src, lambda pg: all(
                norm_pattern(g, op, node_shape(t)) for m in pg.members
                for t in nops[m].tensor_inputs if t not in pg.members), outputs=True)
            where[n] = g
            continue
        if op.kind in ("reduction", "softmax"):
            src = op.operands[0]
            in_shape = node_shape(src)
            if in_shape is None or node_dtype(src) not in FLOAT_DTYPES or len(in_shape) == 0:
                op.kind, op.why = "library", "reduction input is not a floating tensor"
                continue
            nd = len(in_shape)
            dims = norm_dims(op.p.get("dim"), nd)
            if dims is None or (dims and dims != list(range(dims[0], dims[-1] + 1))):
                op.kind, op.why = "library", "reduced dims are not adjacent"
                continue
            if op.kind == "softmax" and len(dims) != 1:
                op.kind, op.why = "library", "softmax over several dims"
                continue
            if op.name in ("argmax", "argmin") and op.p.get("dim") is None and nd > 1:
                op.kind, op.why = "library", "argmax over a flattened tensor"
                continue
            keepdim = bool(op.p.get("keepdim", False))
            out_shape = tuple(1 if d in dims else s for d, s in enumerate(in_shape)) if keepdim \
                else tuple(s for d, s in enumerate(in_shape) if d not in dims)
            g = new_group(op.kind, members=[n], domain=in_shape, red=n, rdims=dims,
                          keepdim=keepdim, out_shape=out_shape if op.kind == "reduction" else in_shape)
            absorb_prologue(g, src)
            recompute_shared(g)
            where[n] = g
            continue
    _merge_pointwise(groups, where, order, nops, region)
    _parameter_chains_into_norms(groups, where, order, nops, region)
    # a 16-bit product with nothing to fuse stays cuBLAS's: the template only wins by the
    # epilogue pass it saves (principle alg-matmul-epilogue); fp32 products run as 3xTF32
    for g in list(groups):
        if g.kind != "matmul":
            continue
        why = None
        if decode_gemv(nops[g.red], g.out_shape):
            pass  # a few rows against a large 16-bit weight: split-K tiles (alg-decode-gemv)
        elif nops[g.red].p.get("dequant"):
            pass  # the integer weight read as it is: no 16-bit copy of it written and read
        elif len(g.members) == 1 and node_dtype(g.red) != torch.float32:
            why = "16-bit matrix product with no epilogue to fuse: cuBLAS as fast"
        elif vector_like(nops[g.red], g.out_shape):
            why = (f"matrix-vector product (fewer than {VECTOR_LIKE} rows or columns): "
                   "tensor-core tiles would waste most of their work; cuBLAS's GEMV")
        if why:
            groups.remove(g)
            nops[g.red].kind, nops[g.red].why = "library", why
    # a (values, indices) reduction whose tuple itself is used elsewhere stays torch code
    for g in list(groups):
        if g.red is not None and nops[g.red].name in ("max_dim", "min_dim"):
            if any(u not in g.aliases for u in g.red.users):
                groups.remove(g)
                nops[g.red].kind, nops[g.red].why = "library", "the (values, indices) tuple escapes"
    # renumber in emission order (position of the last member)
    groups.sort(key=lambda g: max(order[m] for m in g.members + list(g.aliases)))
    kept = []
    for i, g in enumerate(groups):
        g.id = f"g{i}"
        if not (disabled and g.id in disabled):
            kept.append(g)
            continue
        g.disabled = True
        tail = g.epilogue() if g.kind == "matmul" else []
        if tail and tail_id(g.id) not in disabled:
            # a backed-out product stays cuBLAS's; its epilogue is still one fused pass over the
            # product (principle alg-library-tail-fusion), under an id of its own
            nops[g.red].kind = "library"
            nops[g.red].why = f"matrix product backed out ({g.id}): cuBLAS, epilogue fused after it"
            kept.append(Group(id=tail_id(g.id), kind="pointwise", members=tail, domain=g.out_shape))
    return FusionPlan(gm, nops, merge_tails(kept, order, region, nops), order, regions=region)


def merge_tails(groups: list[Group], order: dict, region: dict, nops: dict) -> list[Group]:
    """A backed-out product's tail joins the group that reads it (principles
    alg-fuse-pointwise-chain, alg-reduction-prologue): another tail of the same domain that is its
    only reader (a gated MLP's silu(gate), read by ``* up``), or a norm over its values (the
    residual add after an output projection and the RMSNorm after it) whose template also stores
    the values read after the norm. One pass instead of writing the values and reading them
    back; the joined group runs where its last op did."""
    tails = [g for g in groups if g.kind == "pointwise" and g.id.endswith("t")]
    owner = {m: g for g in groups for m in g.members}
    for a in tails:
        inside = set(a.members)
        users = [u for m in a.members for u in m.users if u not in inside]
        readers = {owner.get(u) for u in users}
        same = [b for b in readers if b is not None and b is not a and b.domain == a.domain
                and region.get(b.members[0]) == region.get(a.members[0])]
        b = None
        if len(readers) == 1 and same and same[0].kind == "pointwise" and same[0].id.endswith("t"):
            b = same[0]
        norms = [g for g in same if g.kind == "norm"]
        if b is None and len(norms) == 1:
            n = norms[0]
            ext = {t for m in a.members for t in nops[m].tensor_inputs if t not in inside}
            if (all(order[m] < order[n.red] for m in a.members)  # a prologue, all of it
                    and all(owner.get(u) is n or order[u] > order[n.red] for u in users)
                    and not any(nops[m].name in ROLLED for m in a.members)
                    and all(norm_pattern(n, nops[n.red], node_shape(t)) for t in ext)):
                b = n
        if b is None:
            continue
        b.members = sorted(b.members + a.members, key=order.__getitem__)
        for m in a.members:
            owner[m] = b
        groups.remove(a)
    return groups


def tail_id(group_id: str) -> str:
    """Id of the fused tail a backed-out matrix product leaves (its epilogue as pointwise)."""
    return f"{group_id}t"


def group_slots(plan: FusionPlan, g: Group) -> tuple[list[fx.Node], dict[tuple[str, fx.Node], int]]:
    """External tensor inputs of a group and the slot of each (role, tensor): role "pro" (the
    full domain, before a reduction-like op, or in its broadcast epilogue), "epi" (after it, on
    its result's domain), "roll" / "pair" (a rotation's operand, loaded at the rolled column),
    "take:<index>" (a take's source, loaded at the rows that index names) or "index" (a take's
    integer index, loaded as it is); any of those placed at a cat's piece (``<role>|<cat>:<k>``,
    member_role). A tensor read in two roles gets two slots."""
    inside = set(g.members) | set(g.aliases)
    pro_nodes = set(g.prologue()) | ({g.red} if g.red is not None else set())
    slots: dict[tuple[str, fx.Node], int] = {}
    ins: list[fx.Node] = []
    bcast = set(broadcast_epilogue(g))  # full-domain members read the tile's loads
    for m in g.members:
        role = member_role(g, m, "epi" if g.red is not None and m not in pro_nodes and m not in bcast else "pro")
        op = plan.nops[m]
        for t, r in zip(op.operands, load_roles(op, role)):
            if not isinstance(t, fx.Node) or t in inside or (r, t) in slots:
                continue
            slots[(r, t)] = len(ins)
            ins.append(t)
    return ins, slots


def member_role(g: Group, m: fx.Node, role: str) -> str:
    """The role a member's loads take: ``role``, placed at its cat's piece (``role|<cat>:<k>``)
    when the member makes a piece of a cat in the same kernel."""
    if m in g.placed:
        cat, k = g.placed[m]
        return f"{role}|{cat.name}:{k}"
    return role


def slot_roles(slots: dict[tuple[str, fx.Node], int]) -> tuple[list[int], list[int]]:
    """The slots the prologue reads (full domain, rolled and placed ones included) and the
    epilogue's."""
    pro = sorted(i for (role, _t), i in slots.items()
                 if role in ("pro", "roll", "pair", "index") or role.startswith("take:") or "|" in role)
    epi = sorted(i for (role, _t), i in slots.items() if role == "epi")
    return pro, epi


def group_inputs(plan: FusionPlan, g: Group) -> tuple[list[fx.Node], list[int], list[int]]:
    """External tensor inputs of a group, and which of them the prologue / epilogue read
    (group_slots: a tensor read both before and after the reduction gets two slots)."""
    ins, slots = group_slots(plan, g)
    return (ins, *slot_roles(slots))


def group_outputs(g: Group) -> list[fx.Node]:
    """Members (or reduction aliases) whose value is used outside the group."""
    inside = set(g.members) | set(g.aliases)
    out = []
    for m in list(g.members) + list(g.aliases):
        if m is g.red and g.aliases:
            continue  # a tuple-valued reduction is used through its getitem aliases
        if any(u not in inside for u in m.users):
            out.append(m)
    return out
