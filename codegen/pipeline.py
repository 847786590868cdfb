"""One call from a problem to a ModelNew source: capture, rewrites, fusion, emit."""
from __future__ import annotations

from dataclasses import dataclass, field

from codegen.emit import Emitted, emit_model
from codegen.fusion import FusionPlan, Group, group_inputs, plan_fusion
from codegen.ops import node_dtype, node_shape
from codegen import dropin as D
from codegen import layout as L
from codegen import rewrites as RW
from codegen.constants import fold_constants, non_persistent
from harness.capture import capture
from harness.problem import LoadedProblem, one_line

FALLBACK_CLASS = '''

# ======== EGG: the reference itself (no kernel beat it or none applies) ========
class ModelNew(Model):
    pass
'''


def fallback_source(problem_source: str) -> str:
    return problem_source.rstrip() + "\n" + FALLBACK_CLASS


@dataclass
class Compiled:
    emitted: Emitted | None
    plan: FusionPlan | None
    rewrites: list[str] = field(default_factory=list)
    error: str | None = None


def group_geometry(plan: FusionPlan, g: Group, n_inputs: int) -> dict:
    """Sizes a launch heuristic needs: numel, rows, reduced length, inner length."""
    numel = 1
    for s in g.domain:
        numel *= s
    if g.red is None:
        return {"numel": numel, "n_inputs": n_inputs}
    if g.kind == "chanstats":
        c = g.domain[1] if len(g.domain) > 1 else 1
        return {"numel": numel, "n_inputs": n_inputs, "nrows": c, "r": numel // max(1, c),
                "batch": g.domain[0], "inner": 1, "rows_variant": True}
    if g.kind == "attention":
        q, k = plan.nops[g.red].operands[:2]
        sq, sk = node_shape(q), node_shape(k)
        heads = sq[1] if len(sq) == 4 else 1
        kv_heads = sk[1] if len(sk) == 4 else 1
        return {"numel": numel, "n_inputs": n_inputs, "M": sq[-2], "N": sk[-2],
                "head_dim": sq[-1], "batch_heads": numel // max(1, sq[-2] * sq[-1]),
                "group": max(1, heads // max(1, kv_heads)), "itemsize": node_dtype(q).itemsize}
    if g.kind == "linear_ce":
        x, w = plan.nops[g.red].operands[:2]
        (m_, k_), n_ = node_shape(x), node_shape(w)[0]
        return {"numel": numel, "n_inputs": n_inputs, "M": m_, "N": n_, "K": k_, "batch": 1,
                "itemsize": node_dtype(x).itemsize}
    if g.kind == "matmul":
        op = plan.nops[g.red]
        sa = node_shape(op.operands[0])
        m_, n_ = (g.domain[-2], g.domain[-1]) if op.p["batched"] else (numel // g.domain[-1], g.domain[-1])
        return {"numel": numel, "n_inputs": n_inputs, "M": m_, "N": n_, "K": sa[-1],
                "batch": numel // max(1, m_ * n_), "computed_b": bool(op.p.get("program"))}
    if g.kind == "pool":
        out = 1
        for s in g.out_shape:
            out *= s
        return {"numel": out, "n_inputs": n_inputs}
    if g.kind == "scan":
        r = g.domain[g.rdims[0]]
        return {"numel": numel, "n_inputs": n_inputs, "r": r, "inner": 1,
                "nrows": max(1, numel // max(1, r)), "rows_variant": True}
    if g.kind == "norm":
        op = plan.nops[g.red]
        d = list(g.domain)
        if op.name in ("layer", "rms"):
            k = len(op.p["normalized_shape"])
            r = 1
            for s in d[len(d) - k:]:
                r *= s
        elif op.name == "group":
            r = (d[1] // int(op.p["num_groups"])) * (numel // max(1, d[0] * d[1]))
        else:
            r = numel // max(1, d[0] * d[1])
        return {"numel": numel, "n_inputs": n_inputs, "r": r, "inner": 1,
                "nrows": max(1, numel // max(1, r)), "rows_variant": True}
    lo, hi = g.rdims[0], g.rdims[-1] + 1
    r = 1
    for s in g.domain[lo:hi]:
        r *= s
    inner = 1
    for s in g.domain[hi:]:
        inner *= s
    return {"numel": numel, "n_inputs": n_inputs, "r": r, "inner": inner,
            "nrows": max(1, numel // max(1, r * inner)), "rows_variant": inner == 1}


def _plan(cap, disabled: set[str] | None, use_rewrites: bool, channels_last: bool):
    """Canonical forms, rules, tables at init (codegen.constants), layout and fusion on a capture
    (its graph changes in place)."""
    RW.canonicalize(cap.gm, cap.inputs)
    applied = RW.apply_all(cap.gm, cap.inputs) if use_rewrites else []
    # a rule's output may hold forms the canonical pass rewrites (shape queries; a softmax
    # written out, made torch.softmax by a rule, between the squeeze and unsqueeze of a one-row
    # product), and the canonical form may let a rule apply again (the attention rule)
    new = applied
    for _round in range(4):
        if not new or not RW.canonicalize(cap.gm, cap.inputs):
            break
        new = RW.apply_all(cap.gm, cap.inputs)
        applied += [r for r in new if r not in applied]
    folds = fold_constants(cap.gm, non_persistent(cap.root) if cap.root is not None else set())
    params = L.channels_last(cap.gm) if channels_last else []
    plan = plan_fusion(cap.gm, disabled)
    plan.channels_last_params = params
    plan.capture = cap
    plan.folds = folds
    return plan, applied


#: eval() groups have ids of their own: "e" + the id plan_fusion gives ("eg0", "eg2t")
EVAL_PREFIX = "e"


def split_disabled(disabled: set[str] | None) -> tuple[set[str], set[str]]:
    """Disabled group ids of the train() plan and of the eval() plan (unprefixed)."""
    dis = set(disabled or ())
    ev = {d[len(EVAL_PREFIX):] for d in dis if d.startswith(EVAL_PREFIX)}
    return dis - {EVAL_PREFIX + d for d in ev}, ev


def _reference(cap):
    """The traced graph as it is before any pass (Model's own ops, for calls the kernels do not
    serve): a GraphModule over the same module, with a graph of its own; its meta keeps the
    sources of the graph breaks it calls (harness.capture)."""
    import copy

    from torch import fx

    from harness.capture import RANK_FIXED

    ref = fx.GraphModule(cap.gm, copy.deepcopy(cap.gm.graph))
    ref.meta["egg_break_sources"] = dict(cap.break_sources)
    if cap.gm.meta.get(RANK_FIXED):
        ref.meta[RANK_FIXED] = True
    return ref


def _without_zero_dropout(ref) -> str:
    """The reference's code with every functional dropout of probability 0 taken out: such a call
    is the identity in either mode (its ``training`` argument, which fx bakes from
    ``self.training``, changes nothing), so two traces that differ only there are one (Hugging
    Face attention's ``dropout(p=0.0 if not self.training else self.attention_dropout)`` with a
    zero attention dropout)."""
    import copy

    import torch
    from torch import fx

    F = torch.nn.functional
    targets = {F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, torch.dropout}
    graph = copy.deepcopy(ref.graph)
    for n in list(graph.nodes):
        if n.op != "call_function" or n.target not in targets or not n.args:
            continue
        p = n.args[1] if len(n.args) > 1 else n.kwargs.get("p", 0.5)
        if isinstance(p, (int, float)) and not isinstance(p, bool) and p == 0:
            n.replace_all_uses_with(n.args[0])
            graph.erase_node(n)
    return fx.GraphModule(ref, graph).code


def _probe(prob: LoadedProblem, inputs: list, training: bool, disabled: set[str],
           use_rewrites: bool, channels_last: bool) -> str | None:
    """The kernel part of the file EGG writes for these (meta) inputs, or None."""
    import contextlib
    import io

    from codegen.emit import core_text

    with contextlib.redirect_stderr(io.StringIO()):  # fx's shape propagation prints refusals
        cap = capture(prob, inputs, training)
        if cap.gm is None:
            return None
        plan, _ = _plan(cap, disabled, use_rewrites, channels_last)
        return core_text(plan)


def _accepts(prob: LoadedProblem, inputs: list, training: bool = True) -> bool:
    """Does the model trace and propagate shapes for these (meta) inputs? (No plan: cheap.)"""
    import contextlib
    import io

    with contextlib.redirect_stderr(io.StringIO()):
        return capture(prob, inputs, training).gm is not None


_GUARDS: dict = {}  # (problem hash, disabled, rewrites, layout) -> guards (probing is the cost)


def _init_record(prob: LoadedProblem) -> dict | None:
    """The constructor arguments the file compares a ModelNew's with (codegen.dropin.built_with),
    when the file's binder (codegen.emit.init_binder, from the source) gives the same record for
    them; None (not compared) otherwise: a file whose record its own binder could not match
    would never take its kernels."""
    from codegen.emit import init_binder

    init = prob.init_inputs()
    rec, binder = D.built_with(prob.Model, init), init_binder(prob.source)
    if rec is None or binder is None:
        return None
    ns = dict(vars(prob.module))
    try:
        exec(binder, ns)  # noqa: S102 - the problem's own parameter list
        return rec if ns["_egg_init_args"](*init) == rec else None
    except Exception:  # noqa: BLE001 - defaults the module cannot evaluate again
        return None


def _dropin(prob: LoadedProblem, cap, ref, disabled, use_rewrites: bool, channels_last: bool):
    """The plan's drop-in facts (codegen.dropin): the guard of each mode, the eval() plan when
    the eval() trace gives other kernels, the traced references."""
    tr_dis, ev_dis = split_disabled(disabled)
    key = (prob.sha256, prob.path, frozenset(disabled or ()), use_rewrites, channels_last)
    cap_e = capture(prob, training=False)
    if cap_e.gm is None:
        raise RuntimeError(f"eval() cannot be traced: {cap_e.error}")
    ref_e = _reference(cap_e)
    same_ref = ref_e.code == ref.code or _without_zero_dropout(ref_e) == _without_zero_dropout(ref)
    cached = _GUARDS.get(key)
    if cached is None:
        base_t = _probe(prob, cap.inputs, True, tr_dis, use_rewrites, channels_last)
        # the compile reads the mode only through the trace and the modules mode_modules names
        # (batch norm, dropout): without them, one trace means one file (and train()'s
        # disabled groups are eval()'s)
        plain = same_ref and not D.mode_modules(ref)
        base_e = base_t if plain else _probe(prob, cap.inputs, False, ev_dis, use_rewrites,
                                             channels_last)
        same = base_t is not None and base_t == base_e and same_ref
        g_t = D.derive_guard(cap.inputs, lambda xs: _probe(prob, xs, True, tr_dis, use_rewrites,
                                                           channels_last), base_t,
                             shapes_ok=lambda xs: _accepts(prob, xs))
        probe_e = lambda xs: _probe(prob, xs, False, ev_dis, use_rewrites, channels_last)  # noqa: E731
        # eval()'s kernels usually take what train()'s take: one probe confirms it
        g_e = None if same else (D.confirm_guard(cap.inputs, probe_e, base_e, g_t)
                                 or D.derive_guard(cap.inputs, probe_e, base_e,
                                                   shapes_ok=lambda xs: _accepts(prob, xs, False)))
        if len(_GUARDS) > 256:
            _GUARDS.clear()
        cached = _GUARDS[key] = (g_t, g_e, same)
    g_t, g_e, same = cached
    eval_plan = None
    if not same:
        eval_plan, _ = _plan(cap_e, ev_dis, use_rewrites, channels_last)
        for g in eval_plan.groups:
            g.id = EVAL_PREFIX + g.id
        if not eval_plan.groups:  # no kernel in eval(): Model's own ops are the eval() path
            eval_plan, g_e = None, None
    refs = {"train": ref} if same_ref else {"train": ref, "eval": ref_e}
    modes = D.mode_modules(ref) + [m for m in D.mode_modules(ref_e) if m not in D.mode_modules(ref)]
    params = D.read_state(cap.gm)
    if eval_plan is not None:
        params.update(D.read_state(cap_e.gm))
    tril = set(cap.gm.meta.get("egg_tril_buffers", ()))
    if eval_plan is not None:
        tril |= set(eval_plan.gm.meta.get("egg_tril_buffers", ()))
    g_t, g_e = D.with_defaults(g_t, ref), D.with_defaults(g_e, ref_e)
    return D.Dropin(train=g_t, eval=g_e, same=same, eval_plan=eval_plan, reference=refs,
                    params=params, mode_modules=modes, arg_names=D.arg_names(ref),
                    tril_buffers=sorted(tril), init=_init_record(prob),
                    attrs=D.literal_attrs(cap.root))


def analyze(prob: LoadedProblem, disabled: set[str] | None = None, use_rewrites: bool = True,
            channels_last: bool = False):
    """Capture and plan, without emitting: (plan, rewrites applied, error). ``channels_last``:
    convolutions in channels-last order (codegen.layout). ``plan.dropin`` holds what the
    generated module guards (codegen.dropin); ids in ``disabled`` starting with "e" name groups
    of the eval() plan."""
    cap = capture(prob)
    if cap.gm is None:
        return None, [], cap.error
    try:
        ref = _reference(cap)
        plan, applied = _plan(cap, split_disabled(disabled)[0], use_rewrites, channels_last)
    except Exception as e:  # noqa: BLE001 - a graph the passes cannot handle keeps the reference
        return None, [], f"the captured graph could not be planned: {one_line(e)}"
    try:
        plan.dropin = _dropin(prob, cap, ref, disabled, use_rewrites, channels_last)
    except Exception as e:  # noqa: BLE001 - without the facts no file can be a drop-in
        return None, [], f"the drop-in guards could not be derived: {one_line(e)}"
    return plan, applied, None


def plan_groups(plan: FusionPlan) -> list[tuple[FusionPlan, Group]]:
    """Every fused group the file will hold: the train() plan's, then the eval() plan's."""
    out = [(plan, g) for g in plan.groups]
    ev = getattr(getattr(plan, "dropin", None), "eval_plan", None)
    if ev is not None:
        out += [(ev, g) for g in ev.groups]
    return out


def has_convolution(prob: LoadedProblem) -> bool:
    """Does the captured graph hold a 2-d/3-d convolution the layout change applies to?"""
    cap = capture(prob)
    return cap.gm is not None and bool(L.conv_nodes(cap.gm))


def compile_problem(prob: LoadedProblem, disabled: set[str] | None = None,
                    configs: dict[str, dict] | None = None, header: str = "",
                    use_rewrites: bool = True) -> Compiled:
    plan, applied, err = analyze(prob, disabled, use_rewrites)
    if plan is None:
        return Compiled(None, None, [], err)
    em = emit_model(prob.source, plan, configs, header)
    return Compiled(em, plan, applied)


__all__ = ["Compiled", "compile_problem", "analyze", "fallback_source", "group_geometry",
           "group_inputs", "plan_groups", "split_disabled"]
