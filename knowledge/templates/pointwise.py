"""Template: fused elementwise chain over one (broadcast) iteration domain.

The domain is walked in the memory order of its first dense full-size input (channels-last in,
channels-last out, both coalesced; the standard order otherwise). Inputs laid out like the walk
are indexed by the flat offset; others (broadcast bias, permuted views) by a 4-d strided index
after collapsing mergeable dims. When such an input exists and the innermost collapsed dim has
at least 128 elements, each program takes a block of one row of that dim (ROWS): the outer
index is split once per program and the strided index is a multiply-add per element, with no
integer division by a runtime size (three of them per element took RoPE's tables to 0.33 ms on
the H200 against torch.compile's 0.048 ms). A rotate-half operand (RoPE) is loaded at the
column rolled by half its last dim, by two masked contiguous loads (the first half of each row
reading the second, the second the first); an interleaved-RoPE operand is loaded as it lies and
each (even, odd) pair swapped in registers (_egg_swap_pairs); the domain is walked in its
standard order. Both keep every load a 16-byte vector (a load at a computed rolled column was
one two-byte load per element: RoPE at 67% of roofline on the H100, 79% after).

Outputs asked for in the standard layout (a convolution's channels-last result converted back
for the caller, codegen.layout) are written in it directly when the walk is channels-last: a
second kernel takes (BLOCK_C channels x BLOCK_S pixels) tiles of one image, read along C and
written along the pixels, both coalesced (Triton moves the tile through shared memory), instead
of a walk plus a transposing copy of the result (principle mem-conv-channels-last).
"""
from __future__ import annotations

from knowledge.schema import TemplateInfo
from knowledge.templates import (PointwiseSpec, Rendered, compute_type, index_slots, indent, load_expr,
                                 stmt_lines, take_views, taken_lines)

INFO = TemplateInfo(
    name="pointwise",
    kind="pointwise",
    # BLOCK: elements per program. 1024-4096 keep >= 16 KB in flight per program on Hopper
    # (tuning table knowledge/tuning/pointwise.yaml lists the measured space).
    tunables={"BLOCK": [512, 1024, 2048, 4096, 8192], "num_warps": [2, 4, 8, 16]},
    defaults={"BLOCK": 1024, "num_warps": 4},
    principle_ids=["alg-fuse-pointwise-chain", "alg-fp32-accumulate", "mem-block-count", "mem-vector-loads",
                   "alg-cat-placed"],
    description="elementwise chain; flat or strided-broadcast indexing per input",
)


def render(spec: PointwiseSpec, cfg: dict, kname: str, gname: str) -> Rendered:
    cfg = {**INFO.defaults, **(cfg or {})}
    n = len(spec.in_dtypes)
    ct = compute_type(spec)
    # a cat's coordinate (its column of the result's last dim) is the offset of an operand laid
    # out (1, ..., 1, total) with stride 1: slot n + q, never loaded
    na = n + len(spec.cats)
    ins = [f"P{i}" for i in range(na)]
    outs = [f"O{j}" for j in range(len(spec.outputs))]
    strides = [f"S{i}_{d}" for i in range(na) for d in range(4)]
    flags = [f"F{i}: tl.constexpr" for i in range(na)]
    index = index_slots(spec)
    # B{i}: operand i is constant along a row (innermost stride 0: a per-row scale, a token id)
    by_row = [i for i in range(n) if i not in spec.rolls and i not in spec.pairs and i not in spec.takes
              and i not in spec.places]
    strided = sorted(spec.takes) + sorted(spec.places)  # G{i}, GS{i}: stride and size along a dim
    gathered = ([f"G{i}, GS{i}" for i in strided] + [f"B{i}: tl.constexpr" for i in by_row]
                + [f"CO{q}_{k}" for q, wit in enumerate(spec.cats) for k in range(len(wit))])
    sig = ", ".join(ins + outs + ["N", "D1", "D2", "D3"] + strides + flags + gathered
                    + ["I64: tl.constexpr", "ROWS: tl.constexpr", "RB: tl.constexpr", "BLOCK: tl.constexpr"])
    body = [
        "pid = tl.program_id(0)",
        "if I64:",
        "    pid = pid.to(tl.int64)",
        # ROWS: each program takes BLOCK columns of RB rows of the innermost dim, whose outer
        # index is split once per row: no integer division per element (a runtime divisor
        # costs ~20 instructions; RoPE's broadcast tables took 3 per element, 0.33 ms on the
        # H200 where torch.compile's constant divisors took 0.048 ms); RB rows where a row is
        # short, so that a program still holds a block's worth of elements (one 128-wide row
        # a program made 262144 programs of Meta's RoPE: 0.39 ms where eager took 0.29)
        "if ROWS:",
        "    nb = tl.cdiv(D3, BLOCK)",
        "    row = (pid // nb) * RB + tl.arange(0, RB)[:, None]",
        "    col = (pid % nb) * BLOCK + tl.arange(0, BLOCK)[None, :]",
        "    rmask = row < N // D3",
        "    mask = (col < D3) & rmask",
        "    offs = row * D3 + col",
        "    r2 = row % D2",
        "    r1 = (row // D2) % D1",
        "    r0 = row // D2 // D1",
        "else:",
        "    offs = pid * BLOCK + tl.arange(0, BLOCK)",
        "    mask = offs < N",
    ]
    for q in range(len(spec.cats)):  # each cat's column of the result's last dim
        body += _index_lines(n + q, {"F": "offs", "R": "col", "S": "offs"}) + [f"c{q} = i{n + q}"]
    for j in index:  # a take's indices first, as integers (never converted)
        _load(body, j, lambda idx, m, j=j: f"tl.load(P{j} + {idx}, mask={m}, other=0)")
    for i in range(n):
        if i in spec.places:  # a cat's piece: its columns of the result
            _placed_load(body, i, spec.places[i], spec.rolls.get(i), spec.in_dtypes[i], ct)
            continue
        if i in spec.rolls:  # rotate-half operand: the column rolled by D/2 within its row of D
            _rolled_load(body, i, spec.rolls[i], spec.in_dtypes[i], ct)
            continue
        if i in index:
            continue
        if i in spec.takes:  # gathered: the source's row the index names
            _taken_load(body, i, spec.takes[i][0], spec.takes[i][2], spec.in_dtypes[i], ct)
            continue
        if i in spec.pairs:  # interleaved rotation: the other column of each (even, odd) pair
            body += _index_lines(i, {"F": "offs", "R": "col", "S": "offs"}) + [
                f"x{i} = {load_expr(f'P{i}', f'i{i}', 'mask', spec.in_dtypes[i], ct)}",
                f"x{i} = _egg_swap_pairs(x{i}, ROWS, RB, BLOCK)"]
            continue
        _load(body, i, lambda idx, m, i=i: load_expr(f"P{i}", idx, m, spec.in_dtypes[i], ct))
    body += stmt_lines(spec.stmts)
    for j, (var, _dt) in enumerate(spec.outputs):
        body.append(f"tl.store(O{j} + offs, ({var}).to(O{j}.dtype.element_ty), mask=mask)")
    kernel = f"@triton.jit\ndef {kname}({sig}):\n{indent(body, 4)}\n"
    # rolled loads and a cat's columns index the domain in its standard order (rows of the last dim)
    rolled = bool(spec.rolls or spec.pairs or spec.cats)
    tiled = (bool(spec.std_outputs) and len(spec.std_outputs) == len(spec.outputs) and not rolled
             and not spec.takes)
    if tiled:
        kernel += "\n\n" + _tiled_kernel(spec, kname)

    args = ", ".join(f"a{i}" for i in range(n))
    out_allocs = [
        f"o{j} = _egg_empty(shape, order, torch.{dt}, dev)"
        for j, (_v, dt) in enumerate(spec.outputs)
    ]
    outs_t = "".join(f"o{j}, " for j in range(len(spec.outputs)))
    # the launch's int arguments and keywords: functions of the inputs' shapes and strides only
    # (the plan a call with the same ones launches again, _EGG_PLANS)
    ints = ", ".join(["n", "dims[1]", "dims[2]", "dims[3]"] + [f"*sts[{i}]" for i in range(na)])
    kws = ", ".join(
        [f"F{i}=flat[{i}]" for i in range(na)]
        + [f"G{i}=g{i}, GS{i}=gs{i}" for i in strided] + [f"B{i}=sts[{i}][3] == 0" for i in by_row]
        + [f"CO{q}_{k}=co{q}[{k}]" for q, wit in enumerate(spec.cats) for k in range(len(wit))]
        + ["I64=n + BLOCK >= 2**31 or far" + (" or tk64" if spec.takes or spec.places else ""),
           "ROWS=rows", "RB=RB", "BLOCK=B", f"num_warps={int(cfg['num_warps'])}"]
    )
    ret = ", ".join(f"o{j}" for j in range(len(spec.outputs)))
    std = [f"o{j} = _egg_standard_layout(o{j})" for j in spec.std_outputs]
    # a take's source narrowed to index 0 along its dim (broadcast with the domain there), with
    # the stride and size the kernel reads the indexed row at
    wbody = take_views(spec) + _cat_views(spec)
    coords = "".join(f", cv{q}" for q in range(len(spec.cats)))
    cvs = "(" + "".join(f"cv{q}, " for q in range(len(spec.cats))) + ")"
    wbody += [
        f"ts = ({args}{coords},)",
        "shape = _egg_broadcast_shape(ts)",
        "dev = ts[0].device",
        # rolled loads index the domain in its standard order (columns of the last dim)
        f"lay = _egg_pointwise_layout(shape, ts{', False' if rolled else ''})",
        # strides that do not collapse to 4 dims (a permuted input): copies do; then broadcast
        # operands that keep dims apart (a 5-d domain) as full-size copies. A take's source
        # stays the view it is (the kernel reads its other rows through it). A call that
        # copies is never planned: its copies are made each time
        f"keep = {sorted(spec.takes) + sorted(spec.places) + list(range(n, na))!r}",
        "if lay is None:",
        "    _egg_keep_plan(plan, False)",
        "    plan = None",
        "    ts = tuple(t if k in keep else t.contiguous() for k, t in enumerate(ts))",
        f"    lay = _egg_pointwise_layout(shape, ts{', False' if rolled else ''})",
        "if lay is None:",
        "    ts = tuple(t if k in keep else t.expand(shape).contiguous() for k, t in enumerate(ts))",
        f"    lay = _egg_pointwise_layout(shape, ts{', False' if rolled else ''})",
        "if lay is None:",
        "    raise RuntimeError(f'EGG: pointwise domain {tuple(shape)} needs more than 4 dimensions')",
        "dims, sts, flat, order, far = lay",
        *([f"if dims[3] > 1 and any(sts[i][3] for i in {sorted(spec.places)!r}):",
           "    raise RuntimeError('EGG: a cat\\'s last dim is not the innermost walked')"] if spec.places else []),
        f"BLOCK = {int(cfg['BLOCK'])}",
    ]
    if tiled:
        t_args = ", ".join(
            ["*ts"] + [f"o{j}" for j in range(len(spec.outputs))]
            + ["C", "S", "nct", "*[s for st in st3 for s in st]", "I64=math.prod(shape) + BLOCK >= 2**31 or far",
               "BLOCK_C=BC", "BLOCK_S=BS", f"num_warps={int(cfg['num_warps'])}"])
        wbody += [
            "ncs = _egg_ncs_layout(shape, ts, order)",
            "if ncs is not None and math.prod(shape) > 0:",
            "    _egg_keep_plan(plan, False)",
            "    N, C, S, st3 = ncs",
            *[f"    o{j} = torch.empty(shape, device=dev, dtype=torch.{dt})"
              for j, (_v, dt) in enumerate(spec.outputs)],
            "    BC = min(64, _egg_pow2(C))",
            "    BS = max(16, BLOCK // BC)",
            "    nct = _egg_cdiv(C, BC)",
            f"    {kname}_t[(nct * _egg_cdiv(S, BS), N)]({t_args})",
            f"    return {ret}",
        ]
    wbody += [
        *out_allocs,
        f"n = o0.numel()",
        "if n == 0:",
        f"    _egg_keep_plan(plan, (shape, order, dev, None, {cvs}, (), {{}}))",
        f"    return {ret}",
        # rows of the innermost collapsed dim when an operand needs a strided index and the rows
        # are long enough to fill a block (_egg_pointwise_rows); else the flat walk
        "rows, B = _egg_pointwise_rows(dims, flat, BLOCK)",
        "RB = max(1, BLOCK // B) if rows else 1  # rows a program takes: a block's worth",
        "grid = (_egg_cdiv(n // dims[3], RB) * _egg_cdiv(dims[3], B),) if rows else (_egg_cdiv(n, B),)",
        f"ints = ({ints},)",
        f"kw = dict({kws})",
        f"_egg_keep_plan(plan, (shape, order, dev, grid, {cvs}, ints, kw))",
        f"{kname}[grid](*ts, {outs_t}*ints, **kw)",
    ]
    wbody += std
    wbody.append(f"return {ret}")
    first = f"def {gname}_first(plan, {args}):\n{indent(wbody, 4)}\n"
    # a call whose inputs' shapes, strides and device were seen before: the plan then (a
    # coordinate operand's plan holds it as it is: one per total width, rank and device)
    key = ", ".join([repr(gname)] + [f"a{i}.shape, a{i}.stride()" for i in range(n)] + ["a0.device"])
    fast = [
        f"plan = ({key})",
        "got = _EGG_PLANS.get(plan)",
        "if not got:  # not seen (None) or never planned (False)",
        f"    return {gname}_first(plan if got is None else None, {args})",
        f"shape, order, dev, grid, cvs, ints, kw = got",
        *out_allocs,
        "if grid is None:  # nothing to launch (an empty domain), as the first call returned",
        f"    return {ret}",
        f"ts = ({args}, *cvs, {outs_t})",
        f"_egg_launch_planned({kname}, plan, grid, (*ts, *ints), kw, ts)",
        *std,
        f"return {ret}",
    ]
    wrapper = first + f"\n\ndef {gname}({args}):\n{indent(fast, 4)}\n"
    return Rendered(kernel, wrapper, kname, gname, cfg)


def _index_lines(i: int, idx: dict[str, str]) -> list[str]:
    """i{i} = operand i's offset at domain columns idx (F: flat; R: the column of a row; S:
    the flat offset of a strided 4-d index)."""
    return [f"if F{i}:", f"    i{i} = {idx['F']}", "elif ROWS:",
            f"    i{i} = r0 * S{i}_0 + r1 * S{i}_1 + r2 * S{i}_2 + ({idx['R']}) * S{i}_3", "else:",
            f"    i{i} = _egg_index4({idx['S']}, D1, D2, D3, S{i}_0, S{i}_1, S{i}_2, S{i}_3)"]


def _row_offset(i: int) -> str:
    """Operand i's offset at the row of the rows walk (its columns' term left out: an operand
    constant along the row)."""
    return f"r0 * S{i}_0 + r1 * S{i}_1 + r2 * S{i}_2"


def _load(body: list[str], i: int, load) -> None:
    """x{i} = load(offset, mask) of operand i. In rows mode an operand constant along the row
    (B{i}: innermost stride 0: a per-row scale, a 0-d buffer, an embedding's token id) is loaded
    once per row, as a (RB, 1) block the row broadcasts: one load where a block of loads at a
    zero stride were as many scalar loads of one address (Triton cannot see the stride is 0),
    and a take's source row it names is read as a contiguous (vectorized) run of columns."""
    body += ["if ROWS and B%d:" % i,
             f"    i{i} = {_row_offset(i)}",
             f"    x{i} = {load(f'i{i}', 'rmask')}",
             "else:"]
    body += ["    " + ln for ln in _index_lines(i, {"F": "offs", "R": "col", "S": "offs"})]
    body.append(f"    x{i} = {load(f'i{i}', 'mask')}")


def _taken_load(body: list[str], i: int, j: int, wrap: bool, dtype: str, ct: str) -> None:
    """Source i at the row index j names along its dim (stride G{i}, size GS{i}): the narrowed
    source's offset at the domain's index plus index * stride; with ``wrap`` a negative index
    counts from the end (as ``x[ids]`` does). An index outside [0, size) reads NaN, never a
    number and never memory outside the source (eager raises there; a kernel cannot)."""
    body += _index_lines(i, {"F": "offs", "R": "col", "S": "offs"})
    body += taken_lines(i, j, wrap, f"i{i}", "mask", dtype, ct)


def _cat_views(spec: PointwiseSpec) -> list[str]:
    """Wrapper lines of a spec's cats (principle alg-cat-placed): each piece's width read from an
    input of that width, the pieces' offsets ``co{q}``, each placed input checked against its
    piece's width and narrowed to column 0 of the last dim (the kernel adds column * stride,
    masked to the piece), and ``cv{q}``, the operand whose offset is the cat's column. Nothing
    without cats."""
    if not spec.cats:
        return []
    n = len(spec.in_dtypes)
    lines = ["nd = max(" + ", ".join(f"a{i}.dim()" for i in range(n)) + ")"]
    for q, wit in enumerate(spec.cats):
        lines += [f"wd{q} = [" + ", ".join(f"a{w}.shape[-1]" for w in wit) + "]",
                  f"co{q} = [sum(wd{q}[:k]) for k in range({len(wit)})]",
                  f"cv{q} = _egg_coord_view(sum(wd{q}), nd, a{wit[0]}.device)"]
    for i, (q, k) in sorted(spec.places.items()):
        lines += [f"if a{i}.shape[-1] != wd{q}[{k}]:",
                  f"    raise RuntimeError(f'EGG: a piece of a cat is {{wd{q}[{k}]}} columns wide, an "
                  f"input of it {{a{i}.shape[-1]}}')",
                  f"a{i}, g{i}, gs{i}, tb{i} = _egg_take_view(a{i}, a{i}, -1)"]
    placed = " or ".join(f"tb{i}" for i in sorted(spec.places))
    return lines + [f"tk64 = tk64 or {placed}" if spec.takes else f"tk64 = {placed}"]


def _placed_load(body: list[str], i: int, qk: tuple[int, int], roll: int | None, dtype: str, ct: str) -> None:
    """Input i of piece k of cat q at the result's column c{q}: the piece's column t = c{q} minus
    the piece's offset, added (times the input's stride there) to the input narrowed to column
    0, masked to 0 <= t < its width; nothing is read outside the piece. The narrowed input is
    constant along the row (the coordinate operand keeps the last dim apart, innermost): in the
    rows walk its offset is the row's alone, so the columns stay contiguous (vector loads). A
    rotate-half operand (``roll``: its width D) reads column (t + D/2) % D, two masked loads."""
    q, k = qk
    body += ["if ROWS:", f"    i{i} = {_row_offset(i)}", "else:",
             f"    i{i} = _egg_index4(offs, D1, D2, D3, S{i}_0, S{i}_1, S{i}_2, S{i}_3)",
             f"t{i} = c{q} - CO{q}_{k}"]
    if roll is None:
        body.append(f"x{i} = " + load_expr(f"P{i}", f"i{i} + t{i} * G{i}",
                                           f"mask & (t{i} >= 0) & (t{i} < GS{i})", dtype, ct))
        return
    h = roll // 2
    body += [f"lo{i} = t{i} < {h}  # the first half of the piece reads the second",
             f"x{i}a = " + load_expr(f"P{i}", f"i{i} + (t{i} + {h}) * G{i}", f"mask & (t{i} >= 0) & lo{i}", dtype, ct),
             f"x{i}b = " + load_expr(f"P{i}", f"i{i} + (t{i} - {h}) * G{i}",
                                     f"mask & (t{i} >= {h}) & (t{i} < GS{i})", dtype, ct),
             f"x{i} = tl.where(lo{i}, x{i}a, x{i}b)"]


def _rolled_load(body: list[str], i: int, d: int, dtype: str, ct: str) -> None:
    """Operand i at column (j + d/2) % d of each row of d: two masked loads, the first half of
    a row reading h ahead and the second h behind. Each is contiguous with a mask constant over
    runs of 16, so both vectorize (one load at the rolled offset ``offs - offs % d + ...`` did
    not: 16 two-byte loads a thread for RoPE's 2048-wide blocks, sm_90 PTX)."""
    h = d // 2
    body.append(f"lo{i} = (offs % {d}) < {h}  # the first half of a row reads the second")
    for tag, sign, m in (("a", "+", f"lo{i}"), ("b", "-", f"(lo{i} == 0)")):
        body += _index_lines(i, {"F": f"offs {sign} {h}", "R": f"col {sign} {h}",
                                 "S": f"offs {sign} {h}"})
        body.append(f"x{i}{tag} = {load_expr(f'P{i}', f'i{i}', f'mask & {m}', dtype, ct)}")
    body.append(f"x{i} = tl.where(lo{i}, x{i}a, x{i}b)")


def _tiled_kernel(spec: PointwiseSpec, kname: str) -> str:
    """The (N, C, S) tiled walk: reads each input at its (N, C, S) strides, writes the outputs
    in the standard layout."""
    n = len(spec.in_dtypes)
    ct = compute_type(spec)
    strides = [f"T{i}_{d}" for i in range(n) for d in range(3)]
    sig = ", ".join([f"P{i}" for i in range(n)] + [f"O{j}" for j in range(len(spec.outputs))]
                    + ["C", "S", "NCT"] + strides
                    + ["I64: tl.constexpr", "BLOCK_C: tl.constexpr", "BLOCK_S: tl.constexpr"])
    body = [
        "t = tl.program_id(0)",
        "n = tl.program_id(1)",
        "if I64:",
        "    n = n.to(tl.int64)",
        "c = (t % NCT) * BLOCK_C + tl.arange(0, BLOCK_C)[:, None]",
        "s = (t // NCT) * BLOCK_S + tl.arange(0, BLOCK_S)[None, :]",
        "mask = (c < C) & (s < S)",
    ]
    for i in range(n):
        body.append(f"x{i} = {load_expr(f'P{i}', f'n * T{i}_0 + c * T{i}_1 + s * T{i}_2', 'mask', spec.in_dtypes[i], ct)}")
    body += stmt_lines(spec.stmts)
    for j, (var, _dt) in enumerate(spec.outputs):
        body.append(f"tl.store(O{j} + (n * C + c) * S + s, ({var}).to(O{j}.dtype.element_ty), mask=mask)")
    return f"@triton.jit\ndef {kname}_t({sig}):\n{indent(body, 4)}\n"
