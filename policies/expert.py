"""The expert policy: decisions from the knowledge base, by rules and measured search. No network.

planner: capture, count, roofline, fusion groups (codegen.fusion) with the principles behind
them. algorithm_designer: emit the fused ModelNew; on a failed verification back out the group
the error names (or the newest one; with more than HALVE_ABOVE groups and no culprit named, the
half expected to save least), on a regression the group with the least expected saving.
tiler / memory_optimizer: launch configurations from knowledge/heuristics.py; on a GPU the
tiler measures a pruned shortlist (policies.search), also for a stage-1 kernel candidate that
lost to the reference by less than NEAR_MISS; the memory optimizer tries pipelining depth,
then convolutions in channels-last order (codegen.layout), each kept only when measured faster.
"""
from __future__ import annotations

import re

import torch

from codegen import pipeline
from codegen.fusion import (FusionPlan, Group, broadcast_epilogue, group_inputs, group_outputs,
                            tail_id)
from codegen.ops import node_dtype, node_shape
from harness import roofline
from harness.problem import load_problem
from harness.runner import says_out_of_memory
from knowledge import heuristics as H
from knowledge.templates import all_templates
from policies.base import GRAPH_PRINCIPLE, Decline, Draft
from state import (Analysis, EggState, FusionGroup, KernelConfig, OpRecord, Plan, RegionRecord,
                   Settings)

PIPELINE_PRINCIPLE = "mem-pipelining"
#: a verified stage-1 kernel candidate at most this much slower than the best is still tuned
NEAR_MISS = 1.10
#: a failed verification that names no group (a deep net's accumulated rounding, an output off
#: somewhere) backs out half of the live groups when more than this many are live, not one: on
#: the H200 ResNet-101 fused 26 groups, failed "lower precision than eager" and backed out one
#: group per 60-70 s verification until its budget ran out; halving needs log2(26) ~ 5 at most
HALVE_ABOVE = 4
LAYOUT_PRINCIPLE = "mem-conv-channels-last"
#: in a candidate's disabled groups: its kernel path is not replayed from a CUDA graph (a graph
#: candidate failed verification: the next one is built without it before any group goes)
NO_GRAPH = "nograph"
#: the principle named in the decision that tries Triton products as cuBLAS calls with tails
LIBRARY_TRY = "alg-library-tail-fusion"
KIND_PRINCIPLES = {
    "pointwise": ["alg-fuse-pointwise-chain", "alg-fp32-accumulate"],
    "reduction": ["alg-reduction-prologue", "alg-reduction-epilogue", "alg-fp32-accumulate"],
    "softmax": ["alg-online-softmax", "alg-reduction-prologue", "alg-reduction-epilogue", "tile-split-rows"],
    "chanstats": ["alg-batchnorm-decompose", "tile-split-rows"],
    "scan": ["alg-scan-carry", "alg-reduction-prologue", "alg-reduction-epilogue"],
    "pool": ["alg-pool-direct", "alg-reduction-prologue", "alg-reduction-epilogue"],
    "norm": ["alg-norm-fusion", "alg-reduction-prologue", "alg-reduction-epilogue", "tile-split-rows"],
    "matmul": ["alg-matmul-epilogue", "alg-no-lower-precision", "tile-grid-mapping"],
    "linear_ce": ["alg-linear-cross-entropy", "alg-online-softmax", "alg-no-lower-precision"],
    "attention": ["alg-flash-attention", "alg-split-kv-decode", "alg-online-softmax",
                  "alg-no-lower-precision"],
}


def group_principles(g: Group) -> list[str]:
    """The principles behind a fused group: its kind's, and alg-reduce-broadcast for a reduction
    whose result its epilogue reads back over the reduced dims."""
    extra = ["alg-reduce-broadcast"] if broadcast_epilogue(g) else []
    if g.kind == "matmul" and g.red is not None and g.red.meta.get("tensor_meta") is not None \
            and len(g.members) == 1 and node_dtype(g.red) in (torch.float16, torch.bfloat16):
        extra.append("alg-decode-gemv")  # a 16-bit product alone is kept only as a decode GEMV
    return KIND_PRINCIPLES[g.kind] + extra


def _numel(shape) -> int:
    n = 1
    for s in shape or ():
        n *= s
    return n


def _bytes(node) -> int:
    dt = node_dtype(node)
    shape = node_shape(node)
    if dt is None or shape is None:
        return 0
    return _numel(shape) * (dt.itemsize if hasattr(dt, "itemsize") else 4)


def bytes_saved(plan: FusionPlan, g: Group) -> float:
    """Eager traffic of the group's ops (each reads its inputs, writes its output) minus the fused
    kernel's (external inputs once, outputs once)."""
    eager = 0
    for m in g.members:
        eager += _bytes(m) + sum(_bytes(t) for t in plan.nops[m].tensor_inputs)
    ins, _, _ = group_inputs(plan, g)
    fused = sum(_bytes(t) for t in ins) + sum(_bytes(o) for o in group_outputs(g))
    return float(max(0, eager - fused))


def us_saved(plan: FusionPlan, g: Group, hw) -> float | None:
    """Expected time saved by the group's kernel, in microseconds: the bytes it saves at the
    device's bandwidth, plus, for an fp32 matrix product, its FLOPs at the fp32 CUDA-core rate
    minus the same at the 3xTF32 rate (principle alg-matmul-epilogue)."""
    bw = getattr(hw, "mem_bandwidth_gbs", None)
    if not bw:
        return None
    us = bytes_saved(plan, g) / (bw * 1e3)
    if g.kind == "matmul" and node_dtype(g.red) == torch.float32:
        peaks = dict(getattr(hw, "peak_tflops", None) or {})
        fp32, fast = peaks.get("fp32"), roofline.peak_of(peaks, "tf32x3")
        if fp32 and fast and fast > fp32:
            geo = pipeline.group_geometry(plan, g, 0)
            flops = 2.0 * geo["M"] * geo["N"] * geo["K"] * geo["batch"]
            us += flops / 1e6 * (1 / fp32 - 1 / fast)
    return us


#: where a machine has no peak rates (the CPU interpreter), regions and groups are weighed with
#: this profile's: the shares say where a GPU's time would go (the interpreter's is not modeled)
ESTIMATE_PROFILE = "h200"


def op_times(fplan: FusionPlan, hw) -> dict:
    """Estimated eager time (ms) of each computing node of the planned graph: its FLOPs at the
    peaks and its bytes at the bandwidth (harness.roofline.node_costs); empty when the graph does
    not run on meta tensors here."""
    cap = fplan.capture
    if cap is None:
        return {}
    try:
        costs = roofline.node_costs(fplan.gm, cap.inputs)
    except Exception:  # noqa: BLE001 - an estimate, never a reason to fail the plan
        return {}
    peaks, bw = dict(getattr(hw, "peak_tflops", None) or {}), getattr(hw, "mem_bandwidth_gbs", 0.0)
    if not peaks or not bw:  # the CPU interpreter: weigh by the GPU the project targets
        import knowledge

        hp = knowledge.hardware_profiles()[ESTIMATE_PROFILE]
        peaks, bw = dict(hp.peak_tflops), hp.mem_bandwidth_gbs
    return {n: c.ms(peaks, bw) for n, c in costs.items()}


def region_records(fplan: FusionPlan, node_ms: dict, cap) -> list[RegionRecord]:
    """Per graph region (codegen.fusion.break_regions): its nodes, groups and estimated time."""
    count = 1 + max(fplan.regions.values(), default=0)
    recs = [RegionRecord(index=i) for i in range(count)]
    costs = {}
    for n, r in fplan.regions.items():
        if n.op in ("call_function", "call_method", "call_module"):
            recs[r].nodes += 1
            ms = node_ms.get(n)
            if ms is not None:
                costs[r] = costs.get(r, 0.0) + ms
    for g in fplan.groups:
        recs[fplan.regions.get(g.members[0], 0)].groups.append(g.id)
    total = sum(costs.values())
    for r in recs:
        r.est_ms = costs.get(r.index)
        r.share = (r.est_ms / total) if total and r.est_ms is not None else None
    breaks = list(getattr(cap, "breaks", []) or [])
    for r, b in zip(recs, breaks):
        r.ends_with = b.describe()[:200]
    return recs


def benefit(g) -> tuple:
    """How much a planned group (state FusionGroup) is expected to save, for ranking: the time
    saved where the hardware profile gives a bandwidth, else the bytes saved; eager's time on its
    ops breaks ties (where the time goes)."""
    saved = g.est_us_saved if g.est_us_saved is not None else g.est_bytes_saved
    return (saved or 0.0, g.est_ms or 0.0)


def graph_choice(state: EggState, fplan, disabled) -> tuple[bool, str]:
    """Is a candidate of this plan launch-bound enough to replay its kernel path from a CUDA
    graph (principle alg-cuda-graph, knowledge.heuristics.use_cuda_graph)? On a GPU only, never
    after a graph candidate failed (NO_GRAPH). (decision, why)."""
    hw = state.hardware
    if hw is None or hw.device != "cuda" or hw.interpreter or NO_GRAPH in (disabled or ()):
        return False, ""
    a = state.analysis
    regions = a.regions if a is not None else []
    measured = [r.measured_ms for r in regions if r.measured_ms is not None]
    estimated = [r.est_ms for r in regions if r.est_ms is not None]
    gpu_ms = (sum(measured) if measured and len(measured) == len(regions) else
              sum(estimated) if estimated else (a.floor_ms if a is not None else None))
    spec = state.problem
    io = sum(t.nbytes for t in (spec.inputs + spec.outputs if spec else []) if not isinstance(t, str))
    return H.use_cuda_graph(len(fplan.groups), gpu_ms, io, hw.mem_bandwidth_gbs or None)


def _kernel_key(fplan, g) -> str:
    from codegen.emit import kernel_key

    try:
        return kernel_key(fplan, g)
    except Exception:  # noqa: BLE001 - a group its template cannot render here counts as its own
        return ""


def budget_deferred(state: EggState, settings: Settings, off: set[str]) -> tuple[set[str], str]:
    """Groups the first stage-1 candidate leaves out so that its verification fits the run's
    time budget (knowledge.heuristics.stage1_group_budget): the groups with the largest expected
    saving are kept. Nothing is deferred in a run without a time limit."""
    left = settings.time_left(state.started_at)
    groups = [g for g in state.plan.groups if g.kind != "library" and g.id not in off]
    if left is None:
        return set(), ""
    ranked = sorted(groups, key=benefit, reverse=True)
    n = H.stage1_group_budget(left, state.hardware.device, [g.kernel_key for g in ranked])
    if len(groups) <= n:
        return set(), ""
    keep, rest = ranked[:n], ranked[n:]
    total = sum(benefit(g)[0] for g in groups) or 1.0
    kept = sum(benefit(g)[0] for g in keep)
    note = (f"time budget ({left:.0f} s left): the {n} of {len(groups)} groups with the largest "
            f"expected saving ({100 * kept / total:.0f}% of it) are fused; "
            f"{len(rest)} deferred ({', '.join(g.id for g in rest[:8])}{'...' if len(rest) > 8 else ''})")
    return {g.id for g in rest}, note


#: seconds the planner's measurement of the regions may take on a GPU (harness.regionprof), and
#: the share of a time-limited run's budget it may use at most
REGION_PROFILE_S = 120.0
REGION_PROFILE_SHARE = 0.1


def measure_regions(state: EggState, settings: Settings, regions: list[RegionRecord]) -> str:
    """On a GPU: eager's time per region measured on a real run (harness.regionprof); the shares
    then come from the measurement. Returns a note ("" when nothing was measured)."""
    hw = state.hardware
    if hw is None or hw.device != "cuda" or hw.interpreter or not regions:
        return ""
    limit = REGION_PROFILE_S
    left = settings.time_left(state.started_at)
    if left is not None:
        limit = min(limit, REGION_PROFILE_SHARE * left)
    if limit < 5:
        return ""
    from harness import regionprof

    got = regionprof.measure_in_child(state.problem.path, "cuda", limit)
    if not got or len(got.get("regions", [])) != len(regions):
        return "regions not measured on the GPU (the estimate is used)"
    total = sum(got["regions"]) or 0.0
    for r, ms in zip(regions, got["regions"]):
        r.measured_ms = ms
        r.share = ms / total if total else r.share
    scaled = (f", node by node {got['interpreted_ms']:.3f} ms scaled to eager's whole call "
              f"{got['eager_ms']:.3f} ms" if got.get("interpreted_ms", 0) > got.get("eager_ms", 0) > 0 else "")
    return (f"eager's time per region measured on the GPU ({got.get('timer')}{scaled}): "
            + ", ".join(f"region {r.index} {r.measured_ms:.3f} ms" for r in regions[:8]))


def group_config(plan: FusionPlan, g: Group, sm_count: int) -> dict:
    ins, _, _ = group_inputs(plan, g)
    geo = pipeline.group_geometry(plan, g, len(ins))
    if g.kind == "pointwise":
        return H.pointwise_config(geo["numel"], geo["n_inputs"], sm_count)
    if g.kind == "pool":
        return H.pool_config(geo["numel"], sm_count)
    if g.kind == "reduction":
        return H.reduction_config(geo["nrows"], geo["r"], geo["inner"], geo["rows_variant"], sm_count)
    if g.kind == "norm":
        return H.norm_config(geo["nrows"], geo["r"], sm_count)
    if g.kind == "scan":
        return H.scan_config(geo["nrows"], geo["r"], sm_count)
    if g.kind == "chanstats":
        return H.chanstats_config(geo["nrows"], geo["batch"], sm_count)
    if g.kind == "attention":
        return H.attention_config(geo["M"], geo["N"], geo["head_dim"], geo["batch_heads"], sm_count,
                                  geo["itemsize"])
    if g.kind == "matmul":
        return H.matmul_config(geo["M"], geo["N"], geo["K"], geo["batch"], sm_count,
                               computed_b=geo.get("computed_b", False))
    if g.kind == "linear_ce":
        return H.linear_ce_config(geo["M"], geo["N"], geo["K"], geo["itemsize"], sm_count)
    return H.softmax_config(geo["nrows"], geo["r"], geo["inner"], geo["rows_variant"], sm_count)


def _memory_outside_candidate(ver) -> bool:
    """The verification failed because the GPU ran out of memory while making the inputs or
    running the reference (a neighbour's memory use, say): no kernel of the candidate is at
    fault, so no group is backed out for it (once)."""
    return ver.category in ("problem", "harness") and says_out_of_memory(ver.reason)


#: a parameter or buffer named in a verifier's reason ("buffer layer3.7.bn1.running_var after
#: the call differs from Model's", "changed its parameter bias")
_STATE_NAMED = re.compile(r"\b(buffer|parameter) ([A-Za-z_][\w.]*)")


def _expected_saving(g) -> float:
    """A group's expected saving: microseconds when estimated, else bytes of traffic."""
    v = g.est_us_saved if g.est_us_saved is not None else g.est_bytes_saved
    return float(v or 0.0)


def _least_saving_half(groups: list) -> list[str]:
    """The ids of the half of ``groups`` (rounded down) expected to save least (ties: the
    newest first)."""
    order = sorted(range(len(groups)), key=lambda i: (_expected_saving(groups[i]), -i))
    return [groups[i].id for i in sorted(order[:len(groups) // 2])]


def _names(ids: list[str], most: int = 6) -> str:
    return ", ".join(ids[:most]) + (f" and {len(ids) - most} more" if len(ids) > most else "")


def _state_owner(state: EggState, disabled: list[str], live: set[str], reason: str
                 ) -> tuple[str, str] | None:
    """(group, what) for a failure that names one of Model's parameters or buffers: the live
    group nearest the ops that read it, producers first (a running statistic is updated from
    the channel statistics a kernel computed, two ops upstream of its update), then consumers.
    None when the reason names none or no live group is near. Backing out the newest group
    instead walks a deep net one group per verification (ResNet-101 on the H200: four 35 s
    verifications backed out four unrelated groups while layer3.7.bn1.running_var stayed wrong)."""
    m = _STATE_NAMED.search(reason or "")
    if m is None:
        return None
    key = m.group(2).rstrip(".")
    try:
        fplan, _rw, _err = pipeline.analyze(load_problem(state.problem.path), set(disabled))
    except Exception:  # noqa: BLE001 - no plan: the caller's fallback decides
        return None
    if fplan is None:
        return None
    attr = next((n for n in fplan.gm.graph.nodes if n.op == "get_attr" and n.target == key), None)
    if attr is None:
        return None

    def live_group(n):
        g = fplan.group_of(n)
        return g.id if g is not None and g.id in live else None

    readers = list(attr.users)
    for direction in ("producers", "consumers"):
        seen, frontier = {attr, *readers}, readers
        for _hop in range(4):
            for n in frontier:
                gid = live_group(n)
                if gid:
                    return gid, f"{m.group(1)} {key}"
            nxt = []
            for n in frontier:
                for x in (n.all_input_nodes if direction == "producers" else n.users):
                    if x not in seen and x.op != "get_attr":
                        seen.add(x)
                        nxt.append(x)
            frontier = nxt
    return None


class ExpertPolicy:
    name = "expert"

    # ------------------------------------------------------------------ planner
    def plan(self, state: EggState, settings: Settings) -> tuple[Analysis, Plan]:
        prob = load_problem(state.problem.path)
        fplan, rewrites, err = pipeline.analyze(prob)
        hw = state.hardware
        cnt = roofline.count(prob, fplan.gm if fplan else None)
        fl = roofline.floor(cnt, hw.peak_tflops, hw.mem_bandwidth_gbs)
        floor, bound = fl.ms, fl.bound
        cap = fplan.capture if fplan else None
        analysis = Analysis(capture=getattr(cap, "method", "fx") if fplan else "none",
                            capture_error=err, flops=cnt.flops,
                            bytes=cnt.nbytes, floor_ms=floor, bound=bound, compute_ms=fl.compute_ms,
                            memory_ms=fl.memory_ms, flops_by_peak=cnt.flops_by_peak,
                            flops_estimated=cnt.estimated_flops,
                            capture_s=round(getattr(cap, "seconds", 0.0), 3),
                            breaks=[b.describe() for b in getattr(cap, "breaks", [])],
                            attr_buffers=list(getattr(cap, "attr_buffers", [])),
                            folds=[f"{f.buffer} {list(f.shape)} from {', '.join(f.nodes[:6])}"
                                   for f in fplan.folds] if fplan else [])
        plan = Plan(rewrites=rewrites)
        if fplan is None:
            plan.notes.append(f"no op graph ({err}): the reference is kept")
            plan.goals = {"algorithm": "none: capture failed", "tiling": "none", "memory": "none"}
            return analysis, plan
        for n in fplan.gm.graph.nodes:
            op = fplan.nops[n]
            analysis.ops.append(OpRecord(
                name=n.name, op=n.op, target=op.name, kind=op.kind,
                shape=list(node_shape(n) or []), dtype=str(node_dtype(n) or "").replace("torch.", ""),
                args=[a.name for a in op.tensor_inputs]))
        node_ms = op_times(fplan, hw)
        for g in fplan.groups:
            ms = [node_ms.get(m) for m in g.members]
            plan.groups.append(FusionGroup(
                id=g.id, kind=g.kind, template=g.template,
                nodes=[m.name for m in g.members] + [a.name for a in g.aliases],
                reason=f"{len(g.members)} op(s) over {tuple(g.domain)} in one pass",
                principle_ids=group_principles(g), est_bytes_saved=bytes_saved(fplan, g),
                est_us_saved=us_saved(fplan, g, hw),
                est_ms=sum(m for m in ms if m) if any(m is not None for m in ms) else None,
                region=fplan.regions.get(g.members[0], 0), kernel_key=_kernel_key(fplan, g)))
        analysis.regions = region_records(fplan, node_ms, cap)
        measured = measure_regions(state, settings, analysis.regions)
        if measured:
            plan.notes.append(measured)
        if len(analysis.regions) > 1:
            how = "measured" if any(r.measured_ms is not None for r in analysis.regions) else "estimated"
            plan.notes.append(
                f"{len(analysis.regions)} regions ({len(analysis.breaks)} graph break(s)); "
                + "; ".join(f"region {r.index}: {len(r.groups)} group(s)"
                            + (f", {100 * r.share:.0f}% of the {how} time" if r.share is not None else "")
                            for r in analysis.regions))
        for n, op in fplan.nops.items():
            if op.kind == "library":
                plan.groups.append(FusionGroup(
                    id=f"lib_{n.name}", kind="library", nodes=[n.name],
                    reason=op.why or "vendor library", principle_ids=["alg-library-heavy-ops"]))
        kernels = [g for g in plan.groups if g.kind != "library"]
        ms = f"{floor:.3f} ms" if floor is not None else "unknown"
        plan.goals = {
            "algorithm": f"{len(kernels)} fused kernel(s); roofline floor {ms} ({bound}-bound)",
            "tiling": "per-kernel block sizes and warps by measured search on the GPU",
            "memory": "pipelining depth of loop kernels; convolutions in channels-last order",
        }
        if not kernels:
            plan.notes.append("every op is a library call: nothing to fuse")
        return analysis, plan

    # ------------------------------------------------------------------ stage 1
    def design(self, state: EggState, settings: Settings) -> Draft | Decline:
        a = state.analysis
        if a is not None and a.capture == "none":
            return Decline(f"no op graph ({a.capture_error}): the reference stays the answer")
        if state.plan is None or not any(g.kind != "library" for g in state.plan.groups):
            return Decline("nothing to fuse: the reference stays the answer")
        off = {g.id for g in state.plan.groups if g.kind != "library" and not g.enabled}
        if not any(g.kind != "library" and g.enabled for g in state.plan.groups):
            return Decline("every fused group was turned off at plan review")
        disabled, why = self._backout(state, "algorithm")
        if why is None and disabled is None:
            return Decline("every fused group was backed out")
        if disabled is None:
            return Decline(why)
        first = ["fuse every planned group"] if not off else [
            f"fuse the planned groups except {', '.join(sorted(off))} (turned off at review)"]
        if why is None:  # the first candidate: as many groups as the run's time budget allows
            deferred, note = budget_deferred(state, settings, off)
            if deferred:
                off = off | deferred
                first = [note]
        return self._build(state, set(disabled or []) | off, stage="algorithm",
                           decisions=[why] if why else first)

    def _backout(self, state: EggState, stage: str) -> tuple[list[str] | None, str | None]:
        """Groups to disable for the next attempt, from the stage's last outcome."""
        mine = [c for c in state.candidates if c.stage == stage]
        if not mine:
            return [], None
        last = mine[-1]
        disabled = list(last.disabled_groups)
        enabled = [g for g in state.plan.groups if g.kind != "library" and g.id not in disabled]
        # a backed-out product's epilogue runs on as a fused tail (codegen.fusion.tail_id)
        tails = [tail_id(g.id) for g in state.plan.groups
                 if g.kind == "matmul" and len(g.nodes) > 1 and g.id in disabled
                 and tail_id(g.id) not in disabled]
        if not enabled and not tails:
            return None, None
        newest = enabled[-1].id if enabled else tails[-1]
        ver = state.verification(last.id)
        if ver is not None and not ver.passed and _memory_outside_candidate(ver):
            before = state.verification(mine[-2].id) if len(mine) > 1 else None
            if before is None or not _memory_outside_candidate(before):
                return disabled, (f"retry unchanged: the GPU ran out of memory outside the candidate "
                                  f"(another process's memory, not a kernel's fault): {ver.reason[:120]}")
        if (ver is not None and not ver.passed and GRAPH_PRINCIPLE in last.principle_ids
                and NO_GRAPH not in disabled):
            return disabled + [NO_GRAPH], (f"build again without the CUDA graph ({GRAPH_PRINCIPLE}) "
                                           f"after: {ver.reason[:160]}")
        if ver is not None and not ver.passed:
            # a group's wrapper (_egg_g3) is its own; its kernel (_egg_k_g3) may serve later
            # groups with the same body too (emit.share_kernels): the wrapper's name comes first
            m = (re.search(r"_egg_(e?g\d+t?)\b", ver.reason)
                 or re.search(r"_egg_k_(e?g\d+t?)", ver.reason))
            live = {g.id for g in enabled} | set(tails)
            # an eval() kernel's group ("eg0", pipeline.EVAL_PREFIX) is not in the plan's records
            named = (m.group(1) if m and (m.group(1) in live or m.group(1).startswith("e")
                                          and m.group(1) not in disabled) else None)
            products = [g for g in enabled if g.kind == "matmul"]
            owner = None if named else _state_owner(state, disabled, live, ver.reason)
            if named:
                victims, how = [named], "named in the error"
            elif owner:
                victims, how = [owner[0]], f"computes the {owner[1]} named in the error"
            elif ver.category == "precision" and products:
                # only a matrix product changes how products round (3xTF32, alg-matmul-epilogue)
                if len(products) > HALVE_ABOVE:
                    victims = _least_saving_half(products)
                    how = f"half of {len(products)} matrix products, after a precision failure"
                else:
                    victims, how = [products[-1].id], "a matrix product, after a precision failure"
            elif len(enabled) > HALVE_ABOVE:
                victims = _least_saving_half(enabled)
                how = f"the half of {len(enabled)} groups expected to save least: the error names none"
            else:
                victims, how = [newest], "the newest group (the error names none)"
            return disabled + victims, f"back out {_names(victims)} ({how}) after: {ver.reason[:160]}"
        tim = state.timing(last.id)
        products = state.products_to_try_on_library() if last.id == state.current_id else []
        if products:
            how = ("came out within noise" if tim is not None and tim.verdict == "noise" else
                   "won with its products' floor a large share of its time (GEMM-bound)")
            return disabled + products, (
                f"back out the matrix product(s) {_names(products)} after {last.id} {how}: cuBLAS, "
                f"each epilogue fused after its product [{LIBRARY_TRY}]")
        if (tim is not None and tim.verdict == "regressed" and f"[{LIBRARY_TRY}]" in last.rationale
                and last.id == state.current_id):
            # the products as cuBLAS calls lost to the Triton ones: the candidate before stands
            return None, (f"{last.id}'s cuBLAS products regressed against the Triton ones: the "
                          "best stage-1 candidate stands")
        if tim is not None and tim.verdict == "regressed":
            if enabled:
                victim = min(enabled, key=_expected_saving).id
            else:
                victim = newest
            return disabled + [victim], f"back out {victim} (least expected saving) after a regression"
        return disabled, "retry"

    def _build(self, state: EggState, disabled: set[str], stage: str, decisions: list[str],
               tweak=None, channels_last: bool = False, principles_extra: tuple = ()) -> Draft | Decline:
        prob = load_problem(state.problem.path)
        fplan, rewrites, err = pipeline.analyze(prob, disabled, channels_last=channels_last)
        if fplan is None:
            return Decline(f"capture failed: {err}")
        if not fplan.groups and not channels_last:
            return Decline("no fused group left")
        sm = state.hardware.sm_count or 132
        # the eval() plan's groups too ("eg0", ...: batch norm on running statistics)
        configs = {g.id: group_config(p, g, sm) for p, g in pipeline.plan_groups(fplan)}
        if tweak is not None:
            tuned = tweak(fplan, configs)
            if tuned is None:
                return Decline("no configuration change applies")
            configs = {**configs, **tuned}  # groups the tweak does not name (eval()'s) keep theirs
        cid = state.new_candidate_id()
        header = f"# candidate {cid} (stage {stage}, expert policy); rewrites: {', '.join(rewrites) or 'none'}"
        from codegen.emit import EmitError, emit_model

        graph, why_graph = graph_choice(state, fplan, disabled)
        try:
            em = emit_model(prob.source, fplan, configs, header, graph=graph)
        except EmitError as e:
            return Decline(f"cannot write a standalone ModelNew: {e}")
        if graph:
            decisions = list(decisions) + [f"{why_graph} [{GRAPH_PRINCIPLE}]"]
        principles = sorted({p for g in fplan.groups for p in group_principles(g)} | set(rewrites)
                            | set(principles_extra) | ({GRAPH_PRINCIPLE} if graph else set()))
        return Draft(
            source=em.source,
            configs=[KernelConfig(group_id=i["id"], template=i["template"], params=i["config"])
                     for i in em.groups],
            disabled_groups=sorted(disabled), kernels=em.kernels, rationale="; ".join(decisions),
            principle_ids=principles, decisions=decisions)

    # ------------------------------------------------------------------ stage 2
    def tile(self, state: EggState, settings: Settings) -> Draft | Decline:
        base = state.candidate(state.best_id)
        if base is None or base.fallback or not base.kernels:
            base = self._near_miss(state)
            if base is None:
                return Decline("no Triton kernel to tile")
        if state.hardware.interpreter:
            return Decline("CPU interpreter: no GPU timing to choose tiles by; "
                           "the heuristic configurations of stage 1 are kept")
        from policies import search

        return search.tile_search(self, state, settings, base)

    def _near_miss(self, state: EggState):
        """The fastest verified stage-1 kernel candidate within NEAR_MISS of the best time, when
        the reference is the best and the tiler has not started from one yet: the stage-1
        heuristic's tiles are a start, and the search gained 1.14-1.20x on every large product of
        dev40 on the H200, more than a near miss loses."""
        if any(c.stage == "tiling" for c in state.candidates):
            return None
        best = state.timing(state.best_id)
        if best is None or not best.candidate_ms:
            return None
        near = []
        for c in state.candidates:
            t, v = state.timing(c.id), state.verification(c.id)
            if (c.stage == "algorithm" and c.kernels and not c.fallback and v is not None
                    and v.passed and t is not None and t.candidate_ms
                    and t.candidate_ms <= NEAR_MISS * best.candidate_ms):
                near.append((t.candidate_ms, c))
        return min(near, key=lambda x: x[0])[1] if near else None

    def optimize_memory(self, state: EggState, settings: Settings) -> Draft | Decline:
        """Memory variants of the best candidate so far, one per attempt, each kept only if the
        profiler measures a gain: pipelining depth of loop kernels, then convolutions in
        channels-last order. Both need GPU timing to be judged."""
        if state.hardware.interpreter:
            return Decline("CPU interpreter: memory variants cannot be measured")
        tried = [c for c in state.candidates if c.stage == "memory"]
        base = state.candidate(state.best_id)
        has_kernels = base is not None and not base.fallback and bool(base.kernels)
        if has_kernels and not any(PIPELINE_PRINCIPLE in c.principle_ids for c in tried):
            draft = self._deepen(state, base)
            if isinstance(draft, Draft):
                return draft
        if not any(LAYOUT_PRINCIPLE in c.principle_ids for c in tried):
            if pipeline.has_convolution(load_problem(state.problem.path)):
                return self._channels_last(state, base if has_kernels else None)
        if not has_kernels:
            return Decline("no Triton kernel and no convolution to lay out")
        return Decline("every memory variant was tried")

    def _channels_last(self, state: EggState, base) -> Draft | Decline:
        """The best candidate's groups (none when the reference is the best) with convolutions
        in channels-last order."""
        if base is None:
            disabled = {g.id for g in state.plan.groups if g.kind != "library"}
            cfg_of = {}
        else:
            disabled = set(base.disabled_groups)
            cfg_of = {c.group_id: dict(c.params) for c in base.configs}
        # a group that runs over the (N, *S, C) view has another geometry than in the base
        # (a reduction over pixels becomes a strided one): the base's tuned tiles do not carry
        # over (a rows config on the cols mapping ran 6.5 ms vs 0.6 ms from the heuristic)
        std_plan, _rw, _err = pipeline.analyze(load_problem(state.problem.path), disabled)
        shape_of = {g.id: (g.kind, g.domain, tuple(g.rdims)) for g in (std_plan.groups if std_plan else [])}

        def keep_tuned(fplan, configs):
            return {g.id: cfg_of[g.id] if g.id in cfg_of and shape_of.get(g.id) == (
                g.kind, g.domain, tuple(g.rdims)) else configs[g.id] for g in fplan.groups}

        return self._build(
            state, disabled, "memory",
            ["convolutions in channels-last order, weights re-laid out at init "
             f"({LAYOUT_PRINCIPLE}); tuned tiles kept for groups of unchanged geometry"],
            tweak=keep_tuned, channels_last=True, principles_extra=(LAYOUT_PRINCIPLE,))

    def _deepen(self, state: EggState, base) -> Draft | Decline:
        cfg_of = {c.group_id: dict(c.params) for c in base.configs}

        def deepen(fplan, configs):
            changed = False
            out = {}
            for g in fplan.groups:
                cfg = dict(cfg_of.get(g.id, configs[g.id]))
                if g.kind in ("reduction", "softmax"):  # the templates with a pipelined loop
                    geo = pipeline.group_geometry(fplan, g, 1)
                    iters = -(-geo["r"] // max(1, cfg.get("BLOCK_R", 1)))
                    st = H.pipeline_stages(iters)
                    if st != cfg.get("num_stages"):
                        cfg["num_stages"] = st
                        changed = True
                out[g.id] = cfg
            return out if changed else None

        return self._build(state, set(base.disabled_groups), "memory",
                           [f"software pipelining depth from loop trip counts ({PIPELINE_PRINCIPLE})"],
                           tweak=deepen, principles_extra=(PIPELINE_PRINCIPLE,))


def template_names() -> list[str]:
    return list(all_templates())
