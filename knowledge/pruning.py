"""Rules that prune a tuning space before any GPU time is spent, and the cost model that ranks
what is left (principles tile-prune-rules, tile-block-size, mem-block-count).

Everything here is a small named formula of a launch configuration, the kernel's geometry (the
sizes of pipeline.group_geometry: numel, nrows, r, inner, n_inputs, rows_variant; matmul and
attention kernels may give M, N, K, head_dim) and the device's limits. The numbers are
estimates: the compile check (harness.compile_check) measures registers, spills and shared
memory for the shortlist, and the GPU times it. A rule that is too strict hides the best
configuration, so the search always keeps the incumbent.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from knowledge.heuristics import next_pow2
from knowledge.schema import ConfigSpace

#: registers one thread may hold on sm_70 and later (CUDA C Programming Guide, "Compute
#: Capabilities" table: maximum number of 32-bit registers per thread = 255).
MAX_REGS_PER_THREAD = 255
#: registers a kernel uses besides its tile (program id, pointers, strides, loop counters), and
#: registers per live value per element: ptxas reuses registers across the unrolled elements.
#: Fit to sm_90 cubins of the templates' kernels (scripts/stage2_measure.py on workloads/small,
#: 2026-11-29: 14-40 registers measured for small tiles; with 16 and 0.75 the estimate stays
#: above the measurement, by ~1.3x at the median, so the rules err on the side of measuring).
BASE_REGS = 16
REGS_PER_LIVE_VALUE = 0.75
#: more than half of a tile's lanes masked off wastes more than a larger tile gains.
MIN_MASK_EFFICIENCY = 0.5
#: the least size of each dimension of tl.dot's operands (Triton's semantics: M, N and K of a
#: dot are at least 16), so a matmul tile masks at least what a 16-wide tile would: a decode
#: GEMV of 4 rows runs 16-row tiles whatever the configuration.
DOT_MIN = 16
#: bytes in flight per SM that saturate HBM: Little's law with ~0.7 us DRAM latency under load
#: (microbenchmark studies of A100/H100 report 0.5-0.8 us) at ~36 GB/s per SM (4.8 TB/s / 132).
INFLIGHT_BYTES_PER_SM = 24 * 1024
#: fixed cost of one program beyond its memory traffic (scheduling, index math, the final
#: cross-warp reduction), in microseconds per program per SM slot.
PROGRAM_OVERHEAD_US = 0.15
#: CUDA's limit of resident thread blocks per SM (sm_80 - sm_90: 32).
MAX_PROGRAMS_PER_SM = 32


@dataclass
class Device:
    """The limits the rules need; from a HardwareInfo or a HardwareProfile."""

    sm_count: int = 132
    smem_per_block: int = 232448
    regs_per_sm: int = 65536
    max_warps_per_sm: int = 64
    mem_bandwidth_gbs: float = 4800.0
    peak_tflops: float = 989.0  # the kernel's dtype on tensor cores, for matmul-like kernels


def device_of(hw, dtype: str = "fp32") -> Device:
    """Device limits from a state HardwareInfo (or a knowledge HardwareProfile)."""
    from knowledge import hardware_profiles

    prof = hardware_profiles().get(getattr(hw, "profile_id", getattr(hw, "id", "")))
    peaks = dict(getattr(hw, "peak_tflops", {}) or {})
    d = Device()
    d.sm_count = int(getattr(hw, "sm_count", 0) or (prof.sm_count if prof else d.sm_count))
    d.smem_per_block = int(getattr(hw, "smem_per_block", 0) or (prof.smem_per_block if prof else d.smem_per_block))
    if prof is not None:
        d.regs_per_sm, d.max_warps_per_sm = prof.regs_per_sm, prof.max_warps_per_sm
    d.mem_bandwidth_gbs = float(getattr(hw, "mem_bandwidth_gbs", 0) or d.mem_bandwidth_gbs)
    d.peak_tflops = float(peaks.get(dtype) or peaks.get("fp32") or d.peak_tflops)
    return d


# ------------------------------------------------------------------ what a kernel's config means
def _kind(kind: str, geo: dict) -> str:
    """The mapping a config describes: pointwise, rows, cols, matmul, attention or generic."""
    if kind in ("pointwise", "pool"):  # pool: one output per lane, BLOCK outputs per program
        return "pointwise"
    if kind in ("reduction", "softmax", "norm", "scan"):
        return "rows" if geo.get("rows_variant", True) else "cols"
    if kind in ("matmul", "attention"):
        return kind
    if kind == "linear_ce":  # its fused mapping is a tensor-core product's tiles
        return "matmul"
    return "generic"


def relevant_params(kind: str, geo: dict, names) -> list[str]:
    """Parameters of a space that change the kernel for this mapping (others are left at the
    incumbent's value: varying them would time identical kernels)."""
    drop = {"pointwise": {"num_stages"}, "rows": {"BLOCK_I"}, "cols": {"BLOCK_O"}}.get(_kind(kind, geo), set())
    if kind == "attention":
        # split-KV decode sizes its query tile from the packed rows (at most DECODE_ROWS of them);
        # prefill never splits
        from knowledge.templates.attention import DECODE_QUERIES

        decode = (int(geo.get("group", 1)) * int(geo.get("M", 1)) <= int(geo.get("decode_rows", 64))
                  or int(geo.get("M", 1)) <= DECODE_QUERIES)
        drop = {"BLOCK_M"} if decode else {"SPLIT_PROGRAMS"}
    return [n for n in names if n not in drop]


def canonical(kind: str, cfg: dict, geo: dict) -> dict:
    """The config as the kernel really runs it: the reduction wrappers clamp BLOCK_R to the
    row's next power of two."""
    c = dict(cfg)
    r = int(geo.get("r", 0) or 0)
    if _kind(kind, geo) in ("rows", "cols") and r and "BLOCK_R" in c:
        c["BLOCK_R"] = min(int(c["BLOCK_R"]), next_pow2(r))
    return c


def identity_key(kind: str, cfg: dict, geo: dict) -> tuple:
    """Configs with equal keys run the same kernel: a one-pass softmax ignores BLOCK_R and
    num_stages, a single loop iteration ignores num_stages, ONE_PASS_MAX only matters through
    the one-pass decision; a norm's one pass ignores BLOCK and SPLIT_CHUNK, its split kernels
    BLOCK_O, and ONE_MAX matters through the decision and the rows it lets a program hold."""
    c = canonical(kind, cfg, geo)
    m = _kind(kind, geo)
    if m == "rows" and kind == "norm" and geo.get("r"):
        bo, br, one = norm_tile(c, geo)
        keep = {"num_warps": c.get("num_warps"), "one": one}
        if one:
            keep["BLOCK_O"] = bo  # BLOCK and SPLIT_CHUNK are the split kernels'
        else:
            keep.update(BLOCK=br, SPLIT_CHUNK=c.get("SPLIT_CHUNK"))
        return tuple(sorted(keep.items()))
    if m in ("rows", "cols") and geo.get("r"):
        single = kind == "softmax" and one_pass(c, geo)
        if "ONE_PASS_MAX" in c:
            c["ONE_PASS_MAX"] = single
        if kind == "softmax" and "SPLIT_CHUNK" in c:  # it matters through the chunks it makes
            c["SPLIT_CHUNK"] = softmax_splits(c, geo)
        if single:
            c.pop("BLOCK_R", None)
        if single or c.get("BLOCK_R", 0) >= int(geo["r"]):
            c.pop("num_stages", None)
    return tuple(sorted(c.items()))


def norm_tile(cfg: dict, geo: dict) -> tuple[int, int, bool]:
    """(rows, values of a row, one pass) a norm program holds per step, as the norm template's
    wrapper decides: BLOCK_O whole rows (at most ONE_MAX values in all) when the row's next power
    of two fits ONE_MAX; else BLOCK values of one row (the split statistics and apply kernels)."""
    br = next_pow2(int(geo.get("r", 1) or 1))
    one_max = int(cfg.get("ONE_MAX", 4096))
    if br <= one_max:
        return max(1, min(int(cfg.get("BLOCK_O", 1)), one_max // br)), br, True
    return 1, min(int(cfg.get("BLOCK", 2048)), br), False


def softmax_splits(cfg: dict, geo: dict) -> int:
    """Chunks the softmax template cuts each row into (1: no split): rows variant, two passes,
    rows longer than SPLIT_CHUNK (rounded up to whole BLOCK_R tiles), as its wrapper decides.
    (A broadcast reduction, which never splits, is planned only for rows of at most
    codegen.fusion.MAX_BROADCAST_LENGTH, no longer than the least SPLIT_CHUNK the space holds.)"""
    r = int(geo.get("r", 1) or 1)
    if not geo.get("rows_variant", True) or one_pass(cfg, geo):
        return 1
    chunk = int(cfg.get("SPLIT_CHUNK", 1 << 62))
    if r <= chunk:
        return 1
    br = min(int(cfg.get("BLOCK_R", 1024)), next_pow2(r))
    return math.ceil(r / (math.ceil(chunk / br) * br))


def one_pass(cfg: dict, geo: dict) -> bool:
    """The softmax template holds the whole row in one tile when it fits ONE_PASS_MAX."""
    r = int(geo.get("r", 1) or 1)
    width = cfg.get("BLOCK_O", 1) if geo.get("rows_variant", True) else cfg.get("BLOCK_I", 1)
    return next_pow2(r) * int(width) <= int(cfg.get("ONE_PASS_MAX", 8192))


def tile_elems(kind: str, cfg: dict, geo: dict) -> int:
    """Elements a program holds per step (per loop iteration)."""
    m = _kind(kind, geo)
    if m == "pointwise":
        return int(cfg.get("BLOCK", 1024))
    if m == "rows" and kind == "norm":
        bo, br, _one = norm_tile(cfg, geo)
        return bo * br
    if m in ("rows", "cols"):
        r = int(geo.get("r", 1) or 1)
        br = next_pow2(r) if (kind == "softmax" and one_pass(cfg, geo)) else min(int(cfg.get("BLOCK_R", 1)), next_pow2(r))
        other = cfg.get("BLOCK_O", 1) if m == "rows" else cfg.get("BLOCK_I", 1)
        return br * int(other)
    if m == "matmul":
        return int(cfg.get("BLOCK_M", 64)) * int(cfg.get("BLOCK_N", 64))
    if m == "attention":
        return int(cfg.get("BLOCK_M", 64)) * int(cfg.get("BLOCK_N", 64))
    n = 1
    for k, v in cfg.items():
        if k.startswith("BLOCK"):
            n *= int(v)
    return n


def programs(kind: str, cfg: dict, geo: dict) -> int:
    """Grid size (programs launched)."""
    m = _kind(kind, geo)
    if m == "pointwise":
        return math.ceil(geo.get("numel", 1) / max(1, cfg.get("BLOCK", 1024)))
    if m == "rows" and kind == "norm":
        bo, br, one = norm_tile(cfg, geo)
        if one:
            return math.ceil(geo.get("nrows", 1) / bo)
        chunk = int(cfg.get("SPLIT_CHUNK", 16384))  # the statistics kernel: chunks of each row
        return int(geo.get("nrows", 1)) * math.ceil(int(geo.get("r", 1) or 1) / max(br, chunk))
    if m == "rows":
        n = math.ceil(geo.get("nrows", 1) / max(1, cfg.get("BLOCK_O", 1)))
        return n * softmax_splits(cfg, geo) if kind == "softmax" else n
    if m == "cols":
        return geo.get("nrows", 1) * math.ceil(geo.get("inner", 1) / max(1, cfg.get("BLOCK_I", 1)))
    if m == "matmul":
        return (math.ceil(geo.get("M", 1) / cfg.get("BLOCK_M", 64))
                * math.ceil(geo.get("N", 1) / cfg.get("BLOCK_N", 64)) * geo.get("batch", 1)
                * int(cfg.get("SPLIT_K", 1) or 1))
    if m == "attention":
        return math.ceil(geo.get("M", 1) / cfg.get("BLOCK_M", 64)) * geo.get("batch_heads", 1)
    return max(1, math.ceil(geo.get("numel", 1) / max(1, tile_elems(kind, cfg, geo))))


def grid_params(kind: str, geo: dict) -> list[str]:
    """Parameters whose growth shrinks the grid."""
    return {"pointwise": ["BLOCK"], "rows": ["BLOCK_O"], "cols": ["BLOCK_I"],
            "matmul": ["BLOCK_M", "BLOCK_N"], "attention": ["BLOCK_M"]}.get(_kind(kind, geo), [])


def mask_efficiency(kind: str, cfg: dict, geo: dict) -> float:
    """Fraction of launched lanes that do useful work (the rest is masked off)."""
    def eff(n, b):
        n, b = int(n), max(1, int(b))
        return n / (math.ceil(n / b) * b) if n > 0 else 1.0

    m = _kind(kind, geo)
    if m == "pointwise":
        return eff(geo.get("numel", 1), cfg.get("BLOCK", 1024))
    if m == "rows" and kind == "norm":
        bo, br, _one = norm_tile(cfg, geo)
        return eff(int(geo.get("r", 1) or 1), br) * eff(geo.get("nrows", 1), bo)
    if m in ("rows", "cols"):
        r = int(geo.get("r", 1) or 1)
        br = next_pow2(r) if (kind == "softmax" and one_pass(cfg, geo)) else min(int(cfg.get("BLOCK_R", 1)), next_pow2(r))
        e = eff(r, br)
        if m == "rows":
            return e * eff(geo.get("nrows", 1), cfg.get("BLOCK_O", 1))
        return e * eff(geo.get("inner", 1), cfg.get("BLOCK_I", 1))
    if m == "matmul":  # relative to the least tile tl.dot allows: what no configuration avoids
        def rel(n, b):
            return eff(n, b) / eff(n, min(int(b), DOT_MIN))

        return (rel(geo.get("M", 1), cfg.get("BLOCK_M", 64)) * rel(geo.get("N", 1), cfg.get("BLOCK_N", 64))
                * rel(geo.get("K", 1), cfg.get("BLOCK_K", 32)))
    if m == "attention":
        return eff(geo.get("M", 1), cfg.get("BLOCK_M", 64)) * eff(geo.get("N", geo.get("M", 1)), cfg.get("BLOCK_N", 64))
    return 1.0


# ------------------------------------------------------------------ resource estimates
@dataclass
class Resources:
    threads: int
    elems_per_thread: float
    regs: int  # estimated registers per thread (before the 255 cap)
    smem: int  # estimated shared memory per program, bytes
    step_bytes: int  # bytes a program loads per loop step


def resources(kind: str, cfg: dict, geo: dict, itemsize: int = 4) -> Resources:
    """Registers per thread and shared memory per program, estimated from the tile.

    Values are computed in fp32 (the templates upcast every load, principle
    alg-fp32-accumulate): one register per element and live value, two for fp64.
    """
    warps = int(cfg.get("num_warps", 4))
    threads = 32 * warps
    stages = int(cfg.get("num_stages", 1) or 1)
    m = _kind(kind, geo)
    n_in = max(1, int(geo.get("n_inputs", 1)))
    wide = 2 if itemsize >= 8 else 1
    tile = tile_elems(kind, cfg, geo)
    ept = tile / threads
    smem = 0
    if m == "pointwise":
        live = n_in + 2  # the inputs, an offset, the result
        regs = BASE_REGS + REGS_PER_LIVE_VALUE * ept * live * wide
        step = tile * itemsize * n_in
    elif m in ("rows", "cols"):
        acc = 2 if kind in ("softmax",) or geo.get("op") in ("argmax", "argmin", "logsumexp") else 1
        live = acc + n_in + 1  # accumulator(s), the loaded inputs, an index
        regs = BASE_REGS + REGS_PER_LIVE_VALUE * ept * live * wide
        step = tile * itemsize * n_in
        r = int(geo.get("r", 1) or 1)
        loops = math.ceil(r / max(1, min(int(cfg.get("BLOCK_R", 1)), next_pow2(r))))
        if stages > 1 and loops > 1 and not (kind == "softmax" and one_pass(cfg, geo)):
            smem += (stages - 1) * step  # loads of later iterations staged in shared memory
        rows = cfg.get("BLOCK_O", 1) if m == "rows" else cfg.get("BLOCK_I", 1)
        smem += warps * int(rows) * 4 * acc  # the cross-warp reduction's scratch
    elif m == "matmul":
        bm, bn, bk = (int(cfg.get(k, d)) for k, d in (("BLOCK_M", 64), ("BLOCK_N", 64), ("BLOCK_K", 32)))
        regs = BASE_REGS + bm * bn / threads + (bm + bn) * bk / threads / 2
        smem = max(1, stages) * (bm * bk + bk * bn) * itemsize
        step = (bm + bn) * bk * itemsize
    elif m == "attention":
        bm, bn = int(cfg.get("BLOCK_M", 64)), int(cfg.get("BLOCK_N", 64))
        d = int(geo.get("head_dim", 128))
        regs = BASE_REGS + (bm * d + 2 * bm * bn) / threads
        smem = bm * d * itemsize + max(1, stages) * 2 * bn * d * itemsize
        step = 2 * bn * d * itemsize
    else:
        regs = BASE_REGS + ept * 3
        step = tile * itemsize
    return Resources(threads, ept, int(math.ceil(regs)), int(smem), int(step))


def programs_per_sm(res: Resources, dev: Device) -> int:
    """Resident programs per SM, limited by warps, registers and shared memory (the CUDA
    occupancy calculator's three limits; registers allocated in units of 8 per thread)."""
    warps = max(1, res.threads // 32)
    by_warps = dev.max_warps_per_sm // warps
    regs = min(MAX_REGS_PER_THREAD, max(16, res.regs))
    by_regs = dev.regs_per_sm // (int(math.ceil(regs / 8) * 8) * res.threads)
    by_smem = (dev.smem_per_block // res.smem) if res.smem > 0 else MAX_PROGRAMS_PER_SM
    return max(0, min(by_warps, by_regs, by_smem, MAX_PROGRAMS_PER_SM))


def prune_reason(kind: str, cfg: dict, geo: dict, dev: Device, itemsize: int = 4,
                 space: ConfigSpace | None = None) -> str | None:
    """Why this configuration is not worth GPU time, or None when it should be measured."""
    w = int(cfg.get("num_warps", 4))
    if w < 1 or w > 32 or w & (w - 1):
        return f"num_warps={w} is not a power of two in 1..32"
    res = resources(kind, cfg, geo, itemsize)
    if res.elems_per_thread < 1:
        return f"{res.threads} threads for a tile of {tile_elems(kind, cfg, geo)} elements: lanes idle"
    limit = min(MAX_REGS_PER_THREAD, dev.regs_per_sm // res.threads)
    if res.regs > limit:
        return f"~{res.regs} registers per thread exceed {limit}: spills"
    if res.smem > dev.smem_per_block:
        return f"~{res.smem} bytes of shared memory exceed {dev.smem_per_block}"
    if programs_per_sm(res, dev) < 1:
        return "no program fits on an SM"
    eff = mask_efficiency(kind, cfg, geo)
    if eff < MIN_MASK_EFFICIENCY:
        return f"{100 * (1 - eff):.0f}% of the tile masked off"
    n = programs(kind, cfg, geo)
    if n < dev.sm_count and space is not None:
        for p in grid_params(kind, geo):
            smaller = [v for v in space.params.get(p, []) if v < cfg.get(p, 0)]
            if smaller and programs(kind, {**cfg, p: max(smaller)}, geo) > n:
                return f"{n} programs for {dev.sm_count} SMs while a smaller {p} launches more"
    return None


# ------------------------------------------------------------------ cost model
def traffic_bytes(kind: str, cfg: dict, geo: dict, itemsize: int = 4) -> float:
    """Compulsory bytes the kernel moves (two reads of the row for a two-pass softmax)."""
    numel = float(geo.get("numel", 1))
    n_in = max(1, int(geo.get("n_inputs", 1)))
    m = _kind(kind, geo)
    if m == "pointwise":
        return numel * itemsize * (n_in + 1)
    if m in ("rows", "cols"):
        passes = 1
        if kind == "softmax":
            passes = 1 if one_pass(cfg, geo) else 2
            return numel * itemsize * (n_in * passes + 1)
        return numel * itemsize * n_in + numel / max(1, geo.get("r", 1)) * itemsize
    if m == "matmul":
        M, N, K = (geo.get(k, 1) for k in ("M", "N", "K"))
        bm, bn = cfg.get("BLOCK_M", 64), cfg.get("BLOCK_N", 64)
        # every program re-reads its A panel and B panel (L2 catches part of it)
        return itemsize * (M * K * math.ceil(N / bn) + K * N * math.ceil(M / bm)) / 4 + itemsize * M * N
    return numel * itemsize * (n_in + 1)


def estimate_us(kind: str, cfg: dict, geo: dict, dev: Device, itemsize: int = 4) -> float:
    """A simple time estimate (microseconds) to rank configurations, not to predict them:
    traffic over bandwidth, degraded by masked lanes, the last partial wave and too few bytes
    in flight per SM, plus a fixed cost per program; tensor-core time for matmul kernels."""
    res = resources(kind, cfg, geo, itemsize)
    m = _kind(kind, geo)
    pps = max(1, programs_per_sm(res, dev))
    n = programs(kind, cfg, geo)
    slots = dev.sm_count * pps
    waves = math.ceil(n / slots)
    wave_eff = n / (waves * slots) if waves > 1 else 1.0  # the last, partial wave
    busy_sms = min(dev.sm_count, n)
    resident = min(pps, math.ceil(n / max(1, busy_sms)))
    depth = 1
    if m in ("rows", "cols") and not (kind == "softmax" and one_pass(cfg, geo)):
        depth = max(1, int(cfg.get("num_stages", 1) or 1) - 1)  # loads of later steps in flight
    inflight_eff = min(1.0, resident * res.step_bytes * depth / INFLIGHT_BYTES_PER_SM)
    sm_eff = busy_sms / dev.sm_count
    eff = max(1e-3, mask_efficiency(kind, cfg, geo) * wave_eff * inflight_eff * sm_eff)
    bw = dev.mem_bandwidth_gbs * 1e3  # bytes per microsecond
    t = traffic_bytes(kind, cfg, geo, itemsize) / (bw * eff)
    if m == "matmul":
        flops = 2.0 * geo.get("M", 1) * geo.get("N", 1) * geo.get("K", 1) * geo.get("batch", 1)
        t = max(t, flops / (dev.peak_tflops * 1e6 * max(1e-3, mask_efficiency(kind, cfg, geo) * wave_eff)))
    return t + math.ceil(n / dev.sm_count) / pps * PROGRAM_OVERHEAD_US


# ------------------------------------------------------------------ the space as candidates
def enumerate_space(space: ConfigSpace, base: dict, kind: str, geo: dict, limit: int = 50000) -> list[dict]:
    """Every point of the space over the parameters that matter for this geometry, other
    parameters at the incumbent's value, canonicalized and deduplicated (incumbent first)."""
    names = relevant_params(kind, geo, [n for n in space.params if n in base or n in space.default])
    grids = [space.params[n] for n in names]
    out, seen = [], set()

    def add(c: dict) -> None:
        cc = canonical(kind, c, geo)
        k = identity_key(kind, cc, geo)
        for name in ("BLOCK_R", "num_stages"):  # values the kernel ignores: the incumbent's
            if name in cc and name in base and name not in dict(k):
                cc[name] = base[name]
        if k not in seen:
            seen.add(k)
            out.append(cc)

    add(dict(base))
    for vals in itertools.islice(itertools.product(*grids), limit):
        c = dict(base)
        c.update(zip(names, vals))
        add(c)
    return out


@dataclass
class Ranked:
    config: dict
    estimate_us: float
    pruned: str | None = None
    distance: float = 0.0  # from the incumbent, in doublings summed over parameters


#: estimates within this factor of each other are ties (the model is not finer than that);
#: ties go to the configuration nearest the incumbent, whose heuristics encode experience.
TIE_FACTOR = 1.03


def distance(a: dict, b: dict) -> float:
    d = 0.0
    for k in set(a) | set(b):
        x, y = a.get(k), b.get(k)
        if isinstance(x, bool) or isinstance(y, bool) or x == y:
            continue
        if isinstance(x, (int, float)) and isinstance(y, (int, float)) and x > 0 and y > 0:
            d += abs(math.log2(x) - math.log2(y))
        else:
            d += 1.0
    return d


def rank_space(space: ConfigSpace, base: dict, kind: str, geo: dict, dev: Device,
               itemsize: int = 4) -> tuple[list[Ranked], list[Ranked]]:
    """(kept, pruned): the space's candidates that pass the rules, best estimate first (ties
    nearest the incumbent first), and the pruned ones with their reasons. The incumbent is
    always kept."""
    kept, pruned = [], []
    base_c = canonical(kind, base, geo)
    for c in enumerate_space(space, base, kind, geo):
        why = prune_reason(kind, c, geo, dev, itemsize, space)
        r = Ranked(c, estimate_us(kind, c, geo, dev, itemsize), None, distance(c, base_c))
        if why is not None and c != base_c:
            r.pruned = why
            pruned.append(r)
        else:
            kept.append(r)
    best = min((r.estimate_us for r in kept), default=1.0)
    kept.sort(key=lambda r: (int(math.log(max(r.estimate_us, 1e-9) / max(best, 1e-9)) / math.log(TIE_FACTOR)),
                             r.distance))
    return kept, pruned


def shortlist(ranked: list[Ranked], base: dict, width: int, kind: str = "", geo: dict | None = None) -> list[dict]:
    """The incumbent plus the best ``width - 1`` others in rank order, first at most one per
    combination of tile shape (primary and grid parameters) so the shortlist spans shapes
    rather than ten warp counts of one tile; then filled in rank order."""
    geo = geo or {}
    keys = [k for k in [primary_param(kind, geo)] + grid_params(kind, geo) if k]
    out = [dict(base)]
    shapes = {tuple(base.get(k) for k in keys)}
    for r in ranked:
        if len(out) >= width:
            break
        shape = tuple(r.config.get(k) for k in keys)
        if r.config in out or (keys and shape in shapes):
            continue
        shapes.add(shape)
        out.append(r.config)
    for r in ranked:
        if len(out) >= width:
            break
        if r.config not in out:
            out.append(r.config)
    return out


def primary_param(kind: str, geo: dict) -> str | None:
    return {"pointwise": "BLOCK", "rows": "BLOCK_R", "cols": "BLOCK_R", "matmul": "BLOCK_K",
            "attention": "BLOCK_N"}.get(_kind(kind, geo))
