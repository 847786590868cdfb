"""One call from a problem to a ModelNew source: capture, rewrites, fusion, emit."""
from __future__ import annotations

from dataclasses import dataclass, field

from codegen.emit import Emitted, emit_model
from codegen.fusion import FusionPlan, Group, group_inputs, plan_fusion
from codegen.ops import node_shape
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
        sq, sk = (node_shape(t) for t in plan.nops[g.red].operands[:2])
        return {"numel": numel, "n_inputs": n_inputs, "M": sq[-2], "N": sk[-2],
                "head_dim": sq[-1], "batch_heads": numel // max(1, sq[-2] * sq[-1])}
    if g.kind == "matmul":
        op = plan.nops[g.red]
        sa = node_shape(op.operands[0])
        m_, n_ = (g.domain[-2], g.domain[-1]) if op.p["batched"] else (numel // g.domain[-1], g.domain[-1])
        return {"numel": numel, "n_inputs": n_inputs, "M": m_, "N": n_, "K": sa[-1],
                "batch": numel // max(1, m_ * n_)}
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


def analyze(prob: LoadedProblem, disabled: set[str] | None = None, use_rewrites: bool = True,
            channels_last: bool = False):
    """Capture and plan, without emitting: (plan, rewrites applied, error). ``channels_last``:
    convolutions in channels-last order (codegen.layout)."""
    cap = capture(prob)
    if cap.gm is None:
        return None, [], cap.error
    try:
        RW.canonicalize(cap.gm, cap.inputs)
        applied = RW.apply_all(cap.gm, cap.inputs) if use_rewrites else []
        if applied:  # a rule's output may hold forms the canonical pass rewrites (shape queries)
            RW.canonicalize(cap.gm, cap.inputs)
        folds = fold_constants(cap.gm, non_persistent(cap.root) if cap.root is not None else set())
        params = L.channels_last(cap.gm) if channels_last else []
        plan = plan_fusion(cap.gm, disabled)
    except Exception as e:  # noqa: BLE001 - a graph the passes cannot handle keeps the reference
        return None, [], f"the captured graph could not be planned: {one_line(e)}"
    plan.channels_last_params = params
    plan.capture = cap
    plan.folds = folds
    return plan, applied, None


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
           "group_inputs"]
