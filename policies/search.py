"""Measured search of launch configurations (stage 2, tiler) on the GPU.

Per kernel, a shortlist around the heuristic configuration (principle tile-prune-rules): the
primary block size halved and doubled, the warps halved and doubled, pruned by rules that need
no GPU (blocks beyond the dimension they tile, grids that leave most SMs idle, tiles that exceed
the register budget). Kernels are tuned one after another (coordinate descent), each variant
timed as a whole candidate in the run's profiling process; a variant replaces the incumbent only
when it is faster beyond the measured noise.
"""
from __future__ import annotations

import math
import pathlib
import tempfile

from codegen import pipeline
from codegen.emit import emit_model
from codegen.fusion import group_inputs
from harness import profile as P
from harness.problem import load_problem
from harness.timing import noise_verdict
from knowledge import heuristics as H
from policies.base import Decline, Draft
from state import KernelConfig

#: registers per thread are ~255 max; a tile of more than 64 fp32 values per thread per input
#: spills (Hopper: 65536 registers per SM, one program of 4 warps = 128 threads).
MAX_ELEMS_PER_THREAD = 64


def _primary(kind: str, rows_variant: bool) -> str:
    if kind == "pointwise":
        return "BLOCK"
    return "BLOCK_R" if rows_variant else "BLOCK_I"


def shortlist(kind: str, cfg: dict, geo: dict, sm_count: int, n_inputs: int) -> list[dict]:
    rows_v = geo.get("rows_variant", True)
    key = _primary(kind, rows_v)
    out = [dict(cfg)]
    for f in (0.5, 2.0):
        c = dict(cfg)
        c[key] = int(cfg[key] * f)
        out.append(c)
    for f in (0.5, 2.0):
        c = dict(cfg)
        c["num_warps"] = int(cfg["num_warps"] * f)
        out.append(c)
    if kind != "pointwise" and rows_v:
        for f in (0.5, 2.0):
            c = dict(cfg)
            c["BLOCK_O"] = max(1, int(cfg.get("BLOCK_O", 1) * f))
            out.append(c)
    seen, keep = set(), []
    for c in out:
        k = tuple(sorted(c.items()))
        if k in seen or not _plausible(kind, c, geo, sm_count, n_inputs):
            continue
        seen.add(k)
        keep.append(c)
    return keep


def _plausible(kind: str, c: dict, geo: dict, sm_count: int, n_inputs: int) -> bool:
    w = c.get("num_warps", 4)
    if w < 1 or w > 16 or w & (w - 1):
        return False
    threads = 32 * w
    if kind == "pointwise":
        b = c["BLOCK"]
        if b < 128 or b > 16384 or b < threads:
            return False
        if math.ceil(geo["numel"] / b) < sm_count and b > 256:  # leaves SMs idle
            return False
        return b * max(1, n_inputs) / threads <= MAX_ELEMS_PER_THREAD * 2
    tile = c.get("BLOCK_R", 1) * (c.get("BLOCK_O", 1) if geo.get("rows_variant") else c.get("BLOCK_I", 1))
    if c.get("BLOCK_R", 1) > 2 * H.next_pow2(geo.get("r", 1)) and c.get("BLOCK_R", 1) > 16:
        return False  # all masked beyond the row
    if not geo.get("rows_variant") and c.get("BLOCK_I", 1) > 2 * H.next_pow2(geo.get("inner", 1)):
        return False
    if tile < threads // 2:
        return False
    return tile / threads <= MAX_ELEMS_PER_THREAD


def tile_search(policy, state, settings, base) -> Draft | Decline:
    prob = load_problem(state.problem.path)
    disabled = set(base.disabled_groups)
    fplan, _rw, err = pipeline.analyze(prob, disabled)
    if fplan is None or not fplan.groups:
        return Decline(f"nothing to tile ({err or 'no groups'})")
    sm = state.hardware.sm_count or 132
    current = {c.group_id: dict(c.params) for c in base.configs}
    sess = P.session(P.session_key(settings.run_dir, state.problem.sha256, "cuda"),
                     state.problem.path, "cuda", settings.timing_rep_ms, settings.profile_timeout_s)
    work = pathlib.Path(settings.run_dir or tempfile.mkdtemp(prefix="egg-search-")) / "search"
    work.mkdir(parents=True, exist_ok=True)
    decisions: list[str] = []
    n_variant = 0

    def timed(configs: dict) -> dict | None:
        nonlocal n_variant
        p2, _, _ = pipeline.analyze(prob, disabled)
        em = emit_model(prob.source, p2, configs, "# tiling variant")
        path = work / f"{state.new_candidate_id()}_v{n_variant}.py"
        n_variant += 1
        path.write_text(em.source)
        try:
            return sess.time_candidate(str(path))
        except P.ProfileError as e:
            decisions.append(f"variant failed to run: {str(e)[:120]}")
            return None

    best_t = timed(current)
    if best_t is None:
        return Decline("the stage-1 kernels could not be re-timed for tiling")
    changed = False
    for g in fplan.groups:
        ins, _, _ = group_inputs(fplan, g)
        geo = pipeline.group_geometry(fplan, g, len(ins))
        base_cfg = current.get(g.id)
        if base_cfg is None:
            continue
        for cand in shortlist(g.kind, base_cfg, geo, sm, len(ins))[1: 1 + settings.search_width]:
            trial = dict(current)
            trial[g.id] = cand
            t = timed(trial)
            if t is None:
                continue
            if noise_verdict(t, best_t) == "improved":
                decisions.append(f"{g.id}: {cand} beats {current[g.id]} "
                                 f"({t['median_ms']:.4f} vs {best_t['median_ms']:.4f} ms)")
                current, best_t, changed = trial, t, True
    if not changed:
        return Decline(f"measured {n_variant} variants: the stage-1 configurations are best within noise")
    em = emit_model(prob.source, pipeline.analyze(prob, disabled)[0], current,
                    f"# candidate {state.new_candidate_id()} (stage tiling, expert policy)")
    return Draft(source=em.source,
                 configs=[KernelConfig(group_id=i["id"], template=i["template"], params=i["config"])
                          for i in em.groups],
                 disabled_groups=sorted(disabled), kernels=em.kernels,
                 rationale="; ".join(decisions), principle_ids=["tile-block-size", "tile-prune-rules"],
                 decisions=decisions)
