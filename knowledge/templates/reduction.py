"""Template: reduction over adjacent dims with a fused elementwise prologue and epilogue.

Two mappings (principle tile-grid-mapping): ``rows`` when the reduced dims are innermost (tile
[BLOCK_O rows x BLOCK_R], coalesced along the row); ``cols`` otherwise (one outer index per
program, tile [BLOCK_R x BLOCK_I], coalesced along the contiguous inner dim). The loop over the
reduced dim keeps a 2-d accumulator and reduces it once at the end.
"""
from __future__ import annotations

from knowledge.schema import TemplateInfo
from knowledge.templates import (ReductionSpec, Rendered, compute_type, index_slots, indent, load_expr,
                                 nan_max, nan_min, recorded_return, recorded_wrapper, stmt_lines, take_params, take_views,
                                 taken_lines)

INFO = TemplateInfo(
    name="reduction",
    kind="reduction",
    tunables={"BLOCK_O": [1, 2, 4, 8, 16, 32], "BLOCK_R": [64, 128, 256, 512, 1024, 2048],
              "BLOCK_I": [16, 32, 64, 128, 256, 512, 1024], "num_warps": [1, 2, 4, 8, 16],
              "num_stages": [1, 2, 3, 4], "SPLIT_CHUNK": [8192, 16384, 32768, 65536]},
    defaults={"BLOCK_O": 4, "BLOCK_R": 512, "BLOCK_I": 64, "num_warps": 4, "num_stages": 2,
              "SPLIT_ROWS": 264, "SPLIT_CHUNK": 32768},
    principle_ids=["alg-reduction-prologue", "alg-reduction-epilogue", "alg-fp32-accumulate",
                   "tile-grid-mapping", "alg-argreduce"],
    description="sum/mean/prod/amax/amin/argmax/argmin/logsumexp over adjacent dims, rows or cols mapping",
)

#: a tile reduced along an axis as torch's max/min reductions take it, NaN propagated (tl.max and
#: tl.min do not): tl.reduce with _egg_max_nan / _egg_min_nan
REDUCE_NAN = {"tl.max": "_egg_max_nan", "tl.min": "_egg_min_nan"}


def reduce_call(red: str, x: str, ax) -> str:
    """``red(x, ax)`` (tl.sum / tl.max / tl.min), max and min propagating NaN as torch does."""
    return f"tl.reduce({x}, {ax}, {REDUCE_NAN[red]})" if red in REDUCE_NAN else f"{red}({x}, {ax})"


IDENTITY = {"sum": "0.0", "mean": "0.0", "prod": "1.0", "amax": 'float("-inf")', "amin": 'float("inf")',
            "argmax": 'float("-inf")', "argmin": 'float("inf")', "logsumexp": 'float("-inf")'}


def signature(kname: str, n_in: int, n_out: int, tail: list[str], takes: list[str] = ()) -> str:
    ins = [f"P{i}" for i in range(n_in)]
    outs = [f"O{j}" for j in range(n_out)]
    strides = [f"S{i}_{d}" for i in range(n_in) for d in range(5)]
    sig = ", ".join(ins + outs + ["NROWS", "OD1", "OD2", "R", "INNER"] + strides + list(takes) + tail)
    return f"@triton.jit\ndef {kname}({sig}):\n"


def row_setup(n_in: int, rows_variant: bool) -> list[str]:
    """Program -> (outer row(s), inner block) and per-input row base offsets."""
    if rows_variant:
        lines = [
            "pid = tl.program_id(0)",
            "rows = pid * BLOCK_O + tl.arange(0, BLOCK_O)",
            "if I64:",
            "    rows = rows.to(tl.int64)",
            "rmask = rows < NROWS",
        ]
        lines += [f"b{i} = _egg_index3(rows, OD1, OD2, S{i}_0, S{i}_1, S{i}_2)" for i in range(n_in)]
    else:
        lines = [
            "pid = tl.program_id(0)",
            "nib = tl.cdiv(INNER, BLOCK_I)",
            "row = pid // nib",
            "ib = pid % nib",
            "if I64:",
            "    row = row.to(tl.int64)",
            "ii = ib * BLOCK_I + tl.arange(0, BLOCK_I)",
            "imask = ii < INNER",
        ]
        lines += [f"b{i} = _egg_index3(row, OD1, OD2, S{i}_0, S{i}_1, S{i}_2)" for i in range(n_in)]
    return lines


def tile_loads(spec, inputs: list[int], rows_variant: bool, rr: str, mask: str,
               by_row: list[int] = ()) -> list[str]:
    """Loads of full-domain inputs for one tile of the reduced dim (index vector ``rr``). Cols
    walk, inputs in ``by_row`` (the kernel has a Z{i} flag for each, inner_const_slots): where
    Z{i} (the input's inner stride is 0: a weight per reduced index, an index expanded along
    the inner dims) it is loaded once per reduced index, a [BLOCK_R, 1] tile under ``mr`` (the
    reduced dim's mask) the inner columns broadcast: one load where a row of loads at a zero
    stride were as many scalar loads of one address (Triton cannot see the stride is 0), and a
    take's source row such an index names is read as a contiguous (vectorized) run."""
    out = []
    for i in load_order(spec, inputs):
        if rows_variant:
            out += pro_load(spec, i, f"b{i}[:, None] + {rr}[None, :] * S{i}_3", mask)
            continue
        full = pro_load(spec, i, f"b{i} + {rr}[:, None] * S{i}_3 + ii[None, :] * S{i}_4", mask)
        if i not in by_row:
            out += full
            continue
        out += [f"if Z{i}:", *("    " + ln for ln in pro_load(spec, i, f"b{i} + {rr}[:, None] * S{i}_3", "mr")),
                "else:", *("    " + ln for ln in full)]
    return out


def inner_const_slots(spec) -> list[int]:
    """Full-domain inputs a cols walk may load once per reduced index (tile_loads' ``by_row``):
    all but a take's sources, whose offset moves along the inner dims by construction."""
    takes = getattr(spec, "takes", {})
    return [i for i in spec.pro_inputs if i not in takes]


def load_order(spec, inputs: list[int]) -> list[int]:
    """Inputs in load order: a take's integer indices before the sources they index."""
    index = index_slots(spec)
    return [i for i in inputs if i in index] + [i for i in inputs if i not in index]


def pro_load(spec, i: int, idx: str, mask: str) -> list[str]:
    """Input i at offset ``idx``: converted to the compute type; a take's index as integers;
    a take's source at the rows its index names (taken_lines)."""
    takes = getattr(spec, "takes", {})
    if i in index_slots(spec):
        return [f"x{i} = tl.load(P{i} + {idx}, mask={mask}, other=0)"]
    if i in takes:
        j, _d, wrap = takes[i]
        return taken_lines(i, j, wrap, idx, mask, spec.in_dtypes[i], compute_type(spec))
    return [f"x{i} = {load_expr(f'P{i}', idx, mask, spec.in_dtypes[i], compute_type(spec))}"]


def tile_mask(rows_variant: bool, rr: str) -> str:
    if rows_variant:
        return f"rmask[:, None] & ({rr} < R)[None, :]"
    return f"({rr} < R)[:, None] & imask[None, :]"


def reduced_loads(spec, inputs: list[int], rows_variant: bool) -> list[str]:
    """Loads of reduced-domain inputs (their reduced stride is 0)."""
    ct = compute_type(spec)
    out = []
    for i in inputs:
        idx, mask = (f"b{i}", "rmask") if rows_variant else (f"b{i} + ii * S{i}_4", "imask")
        out.append(f"x{i} = {load_expr(f'P{i}', idx, mask, spec.in_dtypes[i], ct)}")
    return out


def launch_tail(rows_variant: bool, cfg: dict) -> tuple[list[str], str, str]:
    """Constexpr parameters of the kernel, its grid expression and launch keywords."""
    if rows_variant:
        params = ["I64: tl.constexpr", "BLOCK_O: tl.constexpr", "BLOCK_R: tl.constexpr"]
        grid = f"(_egg_cdiv(nrows, {int(cfg['BLOCK_O'])}),)"
        kw = f"BLOCK_O={int(cfg['BLOCK_O'])}, BLOCK_R=BLOCK_R"
    else:
        params = ["I64: tl.constexpr", "BLOCK_R: tl.constexpr", "BLOCK_I: tl.constexpr"]
        grid = f"(nrows * _egg_cdiv(inner, {int(cfg['BLOCK_I'])}),)"
        kw = f"BLOCK_R=BLOCK_R, BLOCK_I={int(cfg['BLOCK_I'])}"
    return params, grid, kw


def launch_line(kname: str, n_out: int, grid: str, kw: str, cfg: dict, takes: bool = False) -> str:
    outs = "".join(f", o{j}" for j in range(n_out))
    tk, tk64 = ("*tk, ", " or tk64") if takes else ("", "")
    return (f"rec.launch({kname}, {grid})(*ts{outs}, nrows, outer[1], outer[2], R, inner, "
            f"*[s for st in sts for s in st], {tk}I64=nrows * R * inner >= 2**31 or far{tk64}, {kw}, "
            f"num_warps={int(cfg['num_warps'])}, num_stages={int(cfg['num_stages'])})")


def wrapper_prelude(n_in: int, pro: list[int], epi: list[int], rdims: list[int] | None,
                    keepdim: bool, inner: bool, spec=None) -> list[str]:
    """Host code: domain shape, reduced dims of this call, reduced-domain inputs lifted to the
    full rank, layout. ``rdims``: the reduced dims as the reference wrote them (negative ones
    count from the end, None: every dim), resolved against the call's rank. A spec's takes:
    their sources narrowed (take_views), kept as views by the contiguous fallback."""
    keep = sorted(getattr(spec, "takes", {}))
    lines = take_views(spec) + [
        f"KEEPDIM = {bool(keepdim)}",
        f"ts = [{', '.join(f'a{i}' for i in range(n_in))}]",
        f"shape = list(_egg_broadcast_shape([ts[i] for i in {pro}]))",
        "dev = ts[0].device",
        "nd = len(shape)",
        f"rdims = sorted(d + nd if d < 0 else d for d in {list(rdims)!r})" if rdims is not None
        else "rdims = list(range(nd))",
        "if not rdims or rdims[0] < 0 or rdims[-1] >= nd:",
        "    raise IndexError(f'Dimension out of range: reduced dims "
        f"{list(rdims) if rdims is not None else 'all'} of a {{nd}}-d tensor')",
        "rshape = [1 if d in rdims else s for d, s in enumerate(shape)]",
        "oshape = rshape if KEEPDIM else [s for d, s in enumerate(shape) if d not in rdims]",
        f"for i in {epi}:",
        "    t = ts[i].expand(oshape)",
        "    if not KEEPDIM:",
        "        for d in rdims:",
        "            t = t.unsqueeze(d)",
        "    ts[i] = t",
        "lay = _egg_reduction_layout(shape, rdims, ts)",
        # strides that do not collapse (a permuted input; an operand broadcast along some of
        # the inner dims, as one more leading dim makes a weight of (B, R, C, 1, 1)):
        # contiguous copies do, a prologue operand's at the domain's full shape
        "if lay is None:",
        f"    ts = [t if k in {keep} else (t.expand(shape) if k in {pro} else t).contiguous() "
        "for k, t in enumerate(ts)]",
        "    lay = _egg_reduction_layout(shape, rdims, ts)",
        "if lay is None:",
        "    raise RuntimeError(f'EGG: reduction layout of {shape} over {rdims} not supported')",
        "outer, R, inner, sts, far = lay",
        "nrows = outer[0] * outer[1] * outer[2]",
    ]
    if inner:
        lines += ["if inner != 1:",
                  "    raise RuntimeError('EGG: kernel built for innermost reduction, got strided')"]
    return lines


SPLIT_OPS = {"sum", "mean", "amax", "amin", "argmax", "argmin"}
COMBINE = {"sum": ("tl.sum", "acc2 + v"), "mean": ("tl.sum", "acc2 + v"),
           "amax": ("tl.max", nan_max("acc2", "v")), "amin": ("tl.min", nan_min("acc2", "v")),
           "argmax": ("tl.max", None), "argmin": ("tl.min", None)}
#: an arg-reduction's (or max/min with indices') extreme lane: the lowest index holding the
#: extreme ``ex`` of ``a`` along ``ax`` (a NaN extreme matched as NaN), from indices ``ix``
ARG_PICK = ("tl.min(tl.where(({a} == {ex}) | (({a} != {a}) & ({ex} != {ex})), {ix}, 2147483647), {ax})")


def arg_update(op: str, tile: str, ridx: str) -> list[str]:
    """One tile's step of an arg-reduction: ``v`` replaces the running extreme ``acc2`` where it
    is beyond it, its index (``ridx``) recorded in ``idx2``; torch takes NaN as the extreme: the
    first NaN of a lane wins, later values never do."""
    cmp = ">" if op == "argmax" else "<"
    return [f"upd = (v {cmp} acc2) | ((v != v) & (acc2 == acc2))", "acc2 = tl.where(upd, v, acc2)",
            f"idx2 = tl.where(upd, {ridx}.to(tl.int32) + tl.zeros({tile}, tl.int32), idx2)"]


def _split_kernels(spec: ReductionSpec, kname: str, cfg: dict, rows_v: bool, zs: list[int]) -> str:
    """Split over programs (tile-split-rows): partial reductions of chunks of the reduced dim,
    then a merge + epilogue. Rows variant: one chunk of one row per program, partials [rows,
    SPLITS]; cols variant: one chunk x BLOCK_I inner columns of one outer index per program,
    partials [rows, SPLITS, INNER]; ``zs``: the inputs with a Z flag (render's)."""
    n_in = len(spec.in_dtypes)
    ct = compute_type(spec)
    red, upd = COMBINE[spec.op]
    ident = IDENTITY[spec.op]
    strides = [f"S{i}_{d}" for i in range(n_in) for d in range(5)]
    ins = [f"P{i}" for i in range(n_in)]
    if rows_v:
        part = ["pid = tl.program_id(0)", "row = (pid // SPLITS).to(tl.int64)", "sp = pid % SPLITS"]
        tile, mask = "[BLOCK_R]", "(rr < R) & (rr < (sp + 1) * CHUNK)"
        rr = "sp * CHUNK + off + tl.arange(0, BLOCK_R)"
    else:
        part = ["pid = tl.program_id(0)", "nib = tl.cdiv(INNER, BLOCK_I)",
                "sp = pid % SPLITS", "t = pid // SPLITS", "ib = t % nib", "row = (t // nib).to(tl.int64)",
                "ii = ib * BLOCK_I + tl.arange(0, BLOCK_I)", "imask = ii < INNER"]
        tile = "[BLOCK_R, BLOCK_I]"
        in_chunk = "((rr < R) & (rr < (sp + 1) * CHUNK))[:, None]"  # the chunk's reduced indices
        mask = f"{in_chunk} & imask[None, :]"
        # 64-bit: rr times the reduced stride (the inner size) can pass 2**31 with few rows
        rr = "(sp * CHUNK + off + tl.arange(0, BLOCK_R)).to(tl.int64)"
    part += [f"b{i} = _egg_index3(row, OD1, OD2, S{i}_0, S{i}_1, S{i}_2)" for i in range(n_in)]
    # an arg-reduction's partials are pairs: each chunk's extreme and its lowest index (WI);
    # the merge takes the extreme of the chunks' and, among the chunks holding it, the lowest
    # index (chunks are in index order: torch's first occurrence)
    arg = spec.op in ("argmax", "argmin")
    ws = ["W", "WI"] if arg else ["W"]
    part += [f"acc2 = tl.full({tile}, {ident}, {ct})"] + ([f"idx2 = tl.zeros({tile}, tl.int32)"] if arg else [])
    part.append("for off in range(0, CHUNK, BLOCK_R):")
    loop = [f"rr = {rr}", f"m = {mask}"]
    if rows_v:
        for i in load_order(spec, spec.pro_inputs):
            loop += pro_load(spec, i, f"b{i} + rr * S{i}_3", "m")
    else:
        loop += [f"mr = {in_chunk}"] if zs else []
        loop += tile_loads(spec, spec.pro_inputs, False, "rr", "m", zs)
    loop += stmt_lines(spec.pro_stmts)
    loop.append(f"v = tl.where(m, {spec.red_var}, {ident})")
    loop += arg_update(spec.op, tile, "rr" if rows_v else "rr[:, None]") if arg else [f"acc2 = {upd}"]
    part += ["    " + ln for ln in loop]
    if arg:
        part += [f"acc = {reduce_call(red, 'acc2', 0)}",
                 # a 0-d extreme broadcast to the tile (Triton's interpreter types a comparison
                 # with a 0-d value as float)
                 "acc_idx = " + ARG_PICK.format(a="acc2", ex="tl.broadcast_to(acc, (BLOCK_R,))" if rows_v
                                                else "acc[None, :]", ix="idx2", ax=0)]
    if rows_v:
        part.append(f"tl.store(W + pid, {'acc' if arg else reduce_call(red, 'acc2', 0)})")
        part += ["tl.store(WI + pid, acc_idx)"] if arg else []
        tail = "SPLITS, CHUNK, BLOCK_R: tl.constexpr"
    else:
        at = "(row * SPLITS + sp) * INNER + ii"
        part.append(f"tl.store(W + {at}, {'acc' if arg else reduce_call(red, 'acc2', 0)}, mask=imask)")
        part += [f"tl.store(WI + {at}, acc_idx, mask=imask)"] if arg else []
        tail = ", ".join(["SPLITS, CHUNK, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr"]
                         + [f"Z{i}: tl.constexpr" for i in zs])
    k_part = (f"@triton.jit\ndef {kname}_part({', '.join(ins + ws + ['NROWS', 'OD1', 'OD2', 'R', 'INNER'] + strides + take_params(spec))}, "
              f"{tail}):\n" + indent(part, 4) + "\n")
    outs = [f"O{j}" for j in range(len(spec.outputs))]
    fin = [ln.replace("if I64:", "if True:") for ln in row_setup(n_in, rows_v)]
    fin.append("s = tl.arange(0, SPLITS_P2)")
    if rows_v:
        at, pm, ax, ex = ("rows[:, None] * SPLITS + s[None, :]", "rmask[:, None] & (s < SPLITS)[None, :]",
                          1, "acc[:, None]")
        fin_tail = "SPLITS, SPLITS_P2: tl.constexpr, BLOCK_O: tl.constexpr"
    else:
        at, pm, ax, ex = ("(row * SPLITS + s[:, None]) * INNER + ii[None, :]",
                          "(s < SPLITS)[:, None] & imask[None, :]", 0, "acc[None, :]")
        fin_tail = "SPLITS, SPLITS_P2: tl.constexpr, BLOCK_I: tl.constexpr"
    fin += [f"pv = tl.load(W + {at}, mask={pm}, other={ident})", f"acc = {reduce_call(red, 'pv', ax)}"]
    if arg:
        fin += [f"pi = tl.load(WI + {at}, mask={pm}, other=2147483647)",
                "acc_idx = " + ARG_PICK.format(a="pv", ex=ex, ix="pi", ax=ax)]
    if spec.op == "mean":
        fin.append("acc = acc / R")
    fin += reduced_loads(spec, spec.epi_inputs, rows_v)
    fin += stmt_lines(spec.epi_stmts)
    oidx, omask = ("rows", "rmask") if rows_v else ("row * INNER + ii", "imask")
    for j, (var, _dt) in enumerate(spec.outputs):
        fin.append(f"tl.store(O{j} + {oidx}, ({var}).to(O{j}.dtype.element_ty), mask={omask})")
    k_fin = (f"@triton.jit\ndef {kname}_fin({', '.join(ins + outs + ws + ['NROWS', 'OD1', 'OD2', 'R', 'INNER'] + strides + take_params(spec))}, "
             f"{fin_tail}):\n" + indent(fin, 4) + "\n")
    return k_part + "\n\n" + k_fin


def render(spec: ReductionSpec, cfg: dict, kname: str, gname: str) -> Rendered:
    cfg = {**INFO.defaults, **(cfg or {})}
    rows_v = spec.inner
    n_in = len(spec.in_dtypes)
    ct = compute_type(spec)
    op = spec.op
    params, grid, kw = launch_tail(rows_v, cfg)
    zs = [] if rows_v else inner_const_slots(spec)
    params += [f"Z{i}: tl.constexpr" for i in zs]
    zkw = "".join(f", Z{i}=sts[{i}][4] == 0" for i in zs)
    kw += zkw
    head = signature(kname, n_in, len(spec.outputs), params, take_params(spec))
    tile = "[BLOCK_O, BLOCK_R]" if rows_v else "[BLOCK_R, BLOCK_I]"
    ax = 1 if rows_v else 0
    ridx = "rr[None, :]" if rows_v else "rr[:, None]"
    body = row_setup(n_in, rows_v)
    ident = IDENTITY[op]
    if op in ("sum", "mean"):
        body.append(f"acc2 = tl.zeros({tile}, {ct})")
    elif op in ("argmax", "argmin"):
        body += [f"acc2 = tl.full({tile}, {ident}, {ct})", f"idx2 = tl.zeros({tile}, tl.int32)"]
    elif op == "logsumexp":
        body += [f"acc2 = tl.full({tile}, {ident}, {ct})", f"sum2 = tl.zeros({tile}, {ct})"]
    else:
        body.append(f"acc2 = tl.full({tile}, {ident}, {ct})")
    loop = ["rr = r0 + tl.arange(0, BLOCK_R)", f"m = {tile_mask(rows_v, 'rr')}"]
    loop += ["mr = (rr < R)[:, None]"] if zs else []
    loop += tile_loads(spec, spec.pro_inputs, rows_v, "rr", "m", zs)
    loop += stmt_lines(spec.pro_stmts)
    loop.append(f"v = tl.where(m, {spec.red_var}, {ident})")
    if op in ("sum", "mean"):
        loop.append("acc2 = acc2 + v")
    elif op == "prod":
        loop.append("acc2 = acc2 * v")
    elif op == "amax":
        loop.append(f"acc2 = {nan_max('acc2', 'v')}")
    elif op == "amin":
        loop.append(f"acc2 = {nan_min('acc2', 'v')}")
    elif op in ("argmax", "argmin"):
        loop += arg_update(op, tile, ridx)
    elif op == "logsumexp":
        loop += ["mn = tl.maximum(acc2, v)",
                 'sc = tl.where(mn == float("-inf"), 0.0, tl.exp(acc2 - mn))',
                 'ev = tl.where(mn == float("-inf"), 0.0, tl.exp(v - mn))',
                 "sum2 = sum2 * sc + ev", "acc2 = mn"]
    body.append("for r0 in range(0, R, BLOCK_R):")
    body += ["    " + ln for ln in loop]
    if op == "sum":
        body.append(f"acc = tl.sum(acc2, {ax})")
    elif op == "mean":
        body.append(f"acc = tl.sum(acc2, {ax}) / R")
    elif op == "prod":
        body.append(f"acc = tl.reduce(acc2, {ax}, _egg_mul)")
    elif op == "amax":
        body.append(f"acc = {reduce_call('tl.max', 'acc2', ax)}")
    elif op == "amin":
        body.append(f"acc = {reduce_call('tl.min', 'acc2', ax)}")
    elif op in ("argmax", "argmin"):
        red = "tl.max" if op == "argmax" else "tl.min"
        ex = "acc[:, None]" if rows_v else "acc[None, :]"
        body += [f"acc = {reduce_call(red, 'acc2', ax)}", "acc_idx = " + ARG_PICK.format(a="acc2", ex=ex, ix="idx2", ax=ax)]
    elif op == "logsumexp":
        ex = "acc[:, None]" if rows_v else "acc[None, :]"
        body += [f"acc = tl.max(acc2, {ax})",
                 f'tot = tl.sum(tl.where(acc2 == float("-inf"), 0.0, sum2 * tl.exp(acc2 - {ex})), {ax})',
                 'acc = tl.where(acc == float("-inf"), acc, acc + tl.log(tot))']
    body += reduced_loads(spec, spec.epi_inputs, rows_v)
    body += stmt_lines(spec.epi_stmts)
    oidx, omask = ("rows", "rmask") if rows_v else ("row * INNER + ii", "imask")
    for j, (var, _dt) in enumerate(spec.outputs):
        body.append(f"tl.store(O{j} + {oidx}, ({var}).to(O{j}.dtype.element_ty), mask={omask})")
    kernel = head + indent(body, 4) + "\n"
    splittable = op in SPLIT_OPS
    if splittable:
        kernel += "\n\n" + _split_kernels(spec, kname, cfg, rows_v, zs)

    w = wrapper_prelude(n_in, spec.pro_inputs, spec.epi_inputs, spec.rdims, spec.keepdim, rows_v, spec)
    w += [f"o{j} = rec.empty(oshape, torch.{dt}, dev)" for j, (_v, dt) in enumerate(spec.outputs)]
    ret = recorded_return(len(spec.outputs))
    w += [
        "if o0.numel() == 0 or R == 0:",
        "    raise RuntimeError('EGG: empty reduction domain')",
        f"BLOCK_R = min({int(cfg['BLOCK_R'])}, _egg_pow2(R))",
    ]
    if splittable:
        # few programs over long reductions: split the reduced dim over SPLITS programs, then
        # merge (tile-split-rows); rows: few rows, cols: few (outer index x inner block) tiles
        outs = "".join(f", o{j}" for j in range(len(spec.outputs)))
        flat = "*[s for st in sts for s in st], *tk" if spec.takes else "*[s for st in sts for s in st]"
        tiles = "nrows" if rows_v else f"nrows * _egg_cdiv(inner, {int(cfg['BLOCK_I'])})"
        w += [
            f"splits = min(1024, _egg_cdiv(R, {int(cfg['SPLIT_CHUNK'])})) if {tiles} < {int(cfg['SPLIT_ROWS'])} else 1",
            "if splits > 1:",
            "    chunk = _egg_cdiv(_egg_cdiv(R, splits), BLOCK_R) * BLOCK_R",
            "    splits = _egg_cdiv(R, chunk)",
            # the partials; an arg-reduction's: each chunk's extreme and its index
            "    parts = [rec.empty(nrows * splits * inner, torch.float32, dev)"
            + (", rec.empty(nrows * splits * inner, torch.int32, dev)]"
               if op in ("argmax", "argmin") else "]"),
        ]
        if rows_v:
            w += [
                f"    rec.launch({kname}_part, (nrows * splits,))(*ts, *parts, nrows, outer[1], outer[2], R, inner, {flat}, "
                f"splits, chunk, BLOCK_R=BLOCK_R, num_warps={int(cfg['num_warps'])})",
                f"    rec.launch({kname}_fin, (_egg_cdiv(nrows, 4),))(*ts{outs}, *parts, nrows, outer[1], outer[2], R, inner, "
                f"{flat}, splits, SPLITS_P2=_egg_pow2(splits), BLOCK_O=4, num_warps=4)",
            ]
        else:
            bi = int(cfg["BLOCK_I"])
            w += [
                f"    rec.launch({kname}_part, ({tiles} * splits,))(*ts, *parts, nrows, outer[1], outer[2], R, inner, {flat}, "
                f"splits, chunk, BLOCK_R=BLOCK_R, BLOCK_I={bi}{zkw}, num_warps={int(cfg['num_warps'])})",
                f"    rec.launch({kname}_fin, ({tiles},))(*ts{outs}, *parts, nrows, outer[1], outer[2], R, inner, "
                f"{flat}, splits, SPLITS_P2=_egg_pow2(splits), BLOCK_I={bi}, num_warps=4)",
            ]
        w.append(f"    return {ret}")
    w += [
        launch_line(kname, len(spec.outputs), grid, kw, cfg, bool(spec.takes)),
        f"return {ret}",
    ]
    return Rendered(kernel, recorded_wrapper(gname, n_in, w), kname, gname, cfg)
