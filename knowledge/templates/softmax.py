"""Template: softmax / log-softmax over one dim with fused prologue and epilogue, and reductions
whose result is broadcast back over the reduced dims (x / sqrt(mean(x**2)), x - mean(x)).

One pass when the reduced dim fits one tile (ONE_PASS); otherwise online softmax
(principle alg-online-softmax): pass 1 keeps a running max and a rescaled running sum per lane,
pass 2 recomputes the prologue and writes the normalized values. A broadcast reduction
(principle alg-reduce-broadcast) is the same two passes: pass 1 reduces, statements on the
reduced value follow, pass 2 re-reads the tile (mostly from L2) and runs the epilogue on it.

Few long rows (sampling over a vocabulary: 64 rows of 128k) would leave most SMs idle with one
program per row: a softmax's rows longer than SPLIT_CHUNK are cut into chunks (principle
tile-split-rows), two launches of the same kernel: PHASE 1, one program per (rows, chunk), writes
the chunk's partial (max and rescaled sum); PHASE 2, one program per (rows, chunk), combines the
row's partials and writes its chunk. (A broadcast reduction is planned only over many short
rows, codegen/fusion.py MIN_BROADCAST_REDUCTIONS: it never splits.) The row is read twice, as
in the two-pass kernel, but every SM has work.
"""
from __future__ import annotations

from knowledge.schema import TemplateInfo
from knowledge.templates import (Rendered, SoftmaxSpec, indent, nan_max, nan_min, recorded_return,
                                 recorded_wrapper, stmt_lines)
from knowledge.templates.reduction import (launch_line, launch_tail, reduce_call, row_setup, signature,
                                           tile_loads, tile_mask, wrapper_prelude)
from knowledge.templates import compute_type

INFO = TemplateInfo(
    name="softmax",
    kind="softmax",
    # ONE_PASS_MAX: rows up to this many elements are held in registers in one tile (8192 fp32
    # values over 8 warps is 32 registers per thread for the row).
    tunables={"BLOCK_O": [1, 2, 4, 8], "BLOCK_R": [128, 256, 512, 1024, 2048, 4096],
              "BLOCK_I": [16, 32, 64, 128], "num_warps": [1, 2, 4, 8, 16],
              "num_stages": [1, 2, 3], "ONE_PASS_MAX": [2048, 4096, 8192],
              "SPLIT_CHUNK": [8192, 16384, 32768, 65536]},
    # SPLIT_CHUNK: elements of a row per program of the split kernels (rows longer than this
    # split; the default never splits: knowledge/heuristics.py sets it where rows are few)
    defaults={"BLOCK_O": 1, "BLOCK_R": 1024, "BLOCK_I": 32, "num_warps": 4, "num_stages": 2,
              "ONE_PASS_MAX": 8192, "SPLIT_CHUNK": 1 << 62},
    principle_ids=["alg-online-softmax", "alg-reduce-broadcast", "alg-reduction-prologue",
                   "alg-reduction-epilogue", "alg-fp32-accumulate", "tile-grid-mapping", "tile-split-rows"],
    description="softmax/log_softmax and broadcast reductions (x / rms(x), x - mean(x)), one "
                "pass for short rows, two passes for long rows",
)

NEG = 'float("-inf")'
#: a reduction broadcast back over the reduced dims (principle alg-reduce-broadcast): its fill
#: value, the reduction of a tile along an axis, and the running combine of two tiles
BROADCAST = {"sum": ("0.0", "tl.sum", "{a} + {b}"), "mean": ("0.0", "tl.sum", "{a} + {b}"),
             "amax": (NEG, "tl.max", nan_max("{a}", "{b}")),
             "amin": ('float("inf")', "tl.min", nan_min("{a}", "{b}"))}


def _normalize(op: str, z: str, mx: str, s: str) -> str:
    if op == "softmax":
        return f"tl.exp({z} - {mx}) / {s}"
    return f"({z} - {mx}) - tl.log({s})"


def _online_pass(loop: str, tile: str, ct: str, ax: int, ex, tile_block) -> list[str]:
    """The tiles of ``loop`` read once: a running max and a rescaled running sum per lane, then
    the rows' max ``mx`` and sum ``s`` (principle alg-online-softmax)."""
    lines = [f"m2 = tl.full({tile}, {NEG}, {ct})", f"s2 = tl.zeros({tile}, {ct})", loop]
    lines += ["    " + ln for ln in tile_block("r0 + tl.arange(0, BLOCK_R)")]
    return lines + [
        "    mn = tl.maximum(m2, z)",
        f"    s2 = s2 * tl.where(mn == {NEG}, 0.0, tl.exp(m2 - mn)) + tl.where(mn == {NEG}, 0.0, tl.exp(z - mn))",
        "    m2 = mn",
        f"mx = tl.max(m2, {ax})",
        f"s = tl.sum(tl.where(m2 == {NEG}, 0.0, s2 * tl.exp(m2 - {ex('mx')})), {ax})"]


def _partial(spec: SoftmaxSpec, tile_block) -> list[str]:
    """PHASE 1: the chunk [chunk * CHUNK, + CHUNK) of each row (CHUNK a multiple of BLOCK_R, so
    the tiles end on the chunk's end or on R): its max and its sum rescaled to that max, stored
    at MP/SP[row * SPLITS + chunk]."""
    lines = ["lo = chunk * CHUNK", "hi = tl.minimum(R, lo + CHUNK)"]
    lines += _online_pass("for r0 in range(lo, hi, BLOCK_R):", "[BLOCK_O, BLOCK_R]", compute_type(spec),
                          1, lambda v: f"{v}[:, None]", tile_block)
    return lines + ["tl.store(MP + rows * SPLITS + chunk, mx, mask=rmask)",
                    "tl.store(SP + rows * SPLITS + chunk, s, mask=rmask)"]


def _combine(tile_block, write_block) -> list[str]:
    """PHASE 2: the row's SPLITS partials rescaled to their common max and added, then the chunk
    normalized and written."""
    lines = ["lo = chunk * CHUNK", "hi = tl.minimum(R, lo + CHUNK)",
             "sj = tl.arange(0, SPLITS_P2)",
             "pm = rmask[:, None] & (sj < SPLITS)[None, :]",
             "pidx = rows[:, None] * SPLITS + sj[None, :]",
             f"mp = tl.load(MP + pidx, mask=pm, other={NEG})",
             "sp = tl.load(SP + pidx, mask=pm, other=0.0)",
             "mx = tl.max(mp, 1)",
             f"s = tl.sum(tl.where(mp == {NEG}, 0.0, sp * tl.exp(mp - mx[:, None])), 1)",
             "for r0 in range(lo, hi, BLOCK_R):"]
    lines += ["    " + ln for ln in tile_block("r0 + tl.arange(0, BLOCK_R)") + write_block()]
    return lines


def render(spec: SoftmaxSpec, cfg: dict, kname: str, gname: str) -> Rendered:
    cfg = {**INFO.defaults, **(cfg or {})}
    rows_v = spec.inner
    n_in = len(spec.in_dtypes)
    ct = compute_type(spec)
    bcast = spec.op in BROADCAST
    fill = BROADCAST[spec.op][0] if bcast else NEG
    params, grid, kw = launch_tail(rows_v, cfg)
    params = params + ["ONE_PASS: tl.constexpr"]
    split = rows_v and not bcast  # softmax / log_softmax of few long rows may split them
    if split:  # the split kernels' partials and chunks (PHASE 0: the kernel of one launch)
        params = ["MP", "SP", "SPLITS", "CHUNK"] + params + ["PHASE: tl.constexpr", "SPLITS_P2: tl.constexpr"]
    head = signature(kname, n_in, len(spec.outputs), params)
    tile = "[BLOCK_O, BLOCK_R]" if rows_v else "[BLOCK_R, BLOCK_I]"
    ax = 1 if rows_v else 0
    ex = (lambda v: f"{v}[:, None]") if rows_v else (lambda v: f"{v}[None, :]")
    if rows_v:
        oidx = "rows[:, None] * R + rr[None, :]"
    else:
        oidx = "row * R * INNER + rr[:, None] * INNER + ii[None, :]"

    def tile_block(rr_expr: str) -> list[str]:
        lines = [f"rr = {rr_expr}", f"m = {tile_mask(rows_v, 'rr')}"]
        lines += tile_loads(spec, spec.pro_inputs, rows_v, "rr", "m")
        lines += stmt_lines(spec.pro_stmts)
        lines.append(f"z = tl.where(m, {spec.red_var}, {fill})")
        return lines

    def write_block() -> list[str]:
        lines = [] if bcast else [f"sm = {_normalize(spec.op, 'z', ex('mx'), ex('s'))}"]
        lines += tile_loads(spec, spec.epi_inputs, rows_v, "rr", "m")
        lines += stmt_lines(spec.epi_stmts)
        for j, (var, _dt) in enumerate(spec.outputs):
            lines.append(f"tl.store(O{j} + {oidx}, ({var}).to(O{j}.dtype.element_ty), mask=m)")
        return lines

    def reduced(acc: str) -> list[str]:
        """The reduced value (size-1 reduced axis, broadcasting over the tile) and the
        statements on it."""
        red = BROADCAST[spec.op][1]
        lines = [f"acc = {ex(reduce_call(red, acc, ax))}"]
        if spec.op == "mean":
            lines.append("acc = acc / R")
        return lines + stmt_lines(spec.red_stmts)

    body = row_setup(n_in, rows_v)
    if split:  # program -> (rows, chunk); one launch: SPLITS == 1, chunk 0
        assert body[0] == "pid = tl.program_id(0)"
        body[0:1] = ["pid = tl.program_id(0)", "chunk = pid % SPLITS", "pid = pid // SPLITS"]
    one = tile_block("tl.arange(0, BLOCK_R)")
    if bcast:
        one += reduced("z")
    else:
        one += [f"mx = tl.max(z, {ax})", f"s = tl.sum(tl.exp(z - {ex('mx')}), {ax})"]
    one += write_block()
    loop = ["for r0 in range(0, R, BLOCK_R):"]
    if bcast:
        two = [f"a2 = tl.full({tile}, {fill}, {ct})"] + loop
        two += ["    " + ln for ln in tile_block("r0 + tl.arange(0, BLOCK_R)")]
        two += ["    a2 = " + BROADCAST[spec.op][2].format(a="a2", b="z")]
        two += reduced("a2")
    else:
        two = _online_pass(loop[0], tile, ct, ax, ex, tile_block)
    two += loop
    two += ["    " + ln for ln in tile_block("r0 + tl.arange(0, BLOCK_R)") + write_block()]
    single = ["if ONE_PASS:"] + ["    " + ln for ln in one] + ["else:"] + ["    " + ln for ln in two]
    if split:
        body += ["if PHASE == 0:"] + ["    " + ln for ln in single]
        body += ["elif PHASE == 1:  # the chunk's partial"] + ["    " + ln for ln in _partial(spec, tile_block)]
        body += ["else:  # the row's partials combined, the chunk written"]
        body += ["    " + ln for ln in _combine(tile_block, write_block)]
    else:
        body += single
    kernel = head + indent(body, 4) + "\n"

    # the epilogue's inputs live on the full domain: no reduced-domain lifting needed
    rdims = [spec.dim] if spec.rdims == [] else spec.rdims  # as written; None: every dim
    w = wrapper_prelude(n_in, spec.pro_inputs + spec.epi_inputs, [], rdims, True, rows_v)
    w += [f"o{j} = rec.empty(shape, torch.{dt}, dev)" for j, (_v, dt) in enumerate(spec.outputs)]
    ret = recorded_return(len(spec.outputs))
    one_max = int(cfg["ONE_PASS_MAX"])
    w += [
        "if o0.numel() == 0:",
        f"    return {ret}",
        "BLOCK_R = _egg_pow2(R)",
        f"ONE = BLOCK_R * {int(cfg['BLOCK_O'] if rows_v else cfg['BLOCK_I'])} <= {one_max}",
        f"BLOCK_R = BLOCK_R if ONE else min({int(cfg['BLOCK_R'])}, BLOCK_R)",
    ]
    if split:
        pdt = "torch.float64" if ct == "tl.float64" else "torch.float32"
        split_grid = grid.replace("(_egg_cdiv(", "(splits * _egg_cdiv(")
        w += [
            f"if not ONE and R > {int(cfg['SPLIT_CHUNK'])}:  # few long rows: chunks of a row in parallel",
            f"    chunk = _egg_cdiv({int(cfg['SPLIT_CHUNK'])}, BLOCK_R) * BLOCK_R",
            "    splits = _egg_cdiv(R, chunk)",
            f"    mp = rec.empty(nrows * splits, {pdt}, dev)",
            f"    sp = rec.empty(nrows * splits, {pdt}, dev)",
            *["    " + launch_line(kname, len(spec.outputs), split_grid,
                                  f"MP=mp, SP=sp, SPLITS=splits, CHUNK=chunk, {kw}, ONE_PASS=False, "
                                  f"PHASE={ph}, SPLITS_P2=_egg_pow2(splits)", cfg) for ph in (1, 2)],
            f"    return {ret}",
        ]
        kw += ", MP=o0, SP=o0, SPLITS=1, CHUNK=R, PHASE=0, SPLITS_P2=1"
    w += [
        launch_line(kname, len(spec.outputs), grid, kw + ", ONE_PASS=ONE", cfg),
        f"return {ret}",
    ]
    return Rendered(kernel, recorded_wrapper(gname, n_in, w), kname, gname, cfg)
