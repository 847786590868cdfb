"""Template: layer / RMS / group / instance normalization with fused prologue and epilogue.

The (contiguous) input is viewed as ROWS x R: one normalization group per row (layer: leading
dims x normalized dims; group: (N*G) x (C/G * spatial); instance: (N*C) x spatial). Affine
parameters are indexed by aidx = (row % AG) * ACPG + r // ASP.

Two mappings (principles alg-norm-one-pass, tile-split-rows):
- ONE: a program holds BLOCK_O whole rows in registers: one read, one write, exact two-pass
  statistics on the registers. For short rows.
- SPLIT: kernel 1 computes Welford partials (mean, M2, count) of SPLITS chunks per row in
  parallel; kernel 2 combines a row's partials and normalizes one chunk per program. Reads the
  input twice, but every SM has work even with a handful of rows (layer norm over a whole
  image, group norm with few groups).

Aux inputs of the prologue/epilogue follow one of four patterns: full (same shape as the
domain), scalar (one element), affine (indexed like the weight), row (layer / RMS norm: one value
per row, broadcast over the normalized dims; expanded to ROWS values on the host).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from knowledge.schema import TemplateInfo
from knowledge.templates import (WELFORD_STEP, Rendered, compute_type, indent, load_expr,
                                 recorded_return, recorded_wrapper, stmt_lines)

INFO = TemplateInfo(
    name="norm",
    kind="norm",
    tunables={"BLOCK_O": [1, 2, 4, 8], "BLOCK": [512, 1024, 2048, 4096], "num_warps": [2, 4, 8, 16],
              "ONE_MAX": [2048, 4096, 8192], "SPLIT_CHUNK": [8192, 16384, 32768, 65536]},
    defaults={"BLOCK_O": 1, "BLOCK": 2048, "num_warps": 8, "ONE_MAX": 4096, "SPLIT_CHUNK": 16384},
    principle_ids=["alg-norm-fusion", "alg-reduction-prologue", "alg-reduction-epilogue",
                   "alg-fp32-accumulate", "tile-split-rows"],
    description="layer/rms/group/instance norm; one-pass rows or split statistics + normalize",
)


@dataclass
class NormSpec:
    op: str  # layer | rms | group | instance
    in_dtypes: list[str]
    patterns: list[str]  # per input: full | scalar | affine | row
    pro_inputs: list[int]
    epi_inputs: list[int]
    pro_stmts: list[tuple[str, str]]
    red_var: str
    epi_stmts: list[tuple[str, str]]  # the normalized value is `nv`
    outputs: list[tuple[str, str]]
    weight: int | None
    bias: int | None
    eps: float
    rows_div: tuple[str, str]  # python expressions (of shape) for (ROWS, R)
    affine: tuple[str, str, str]  # python expressions for (AG, ACPG, ASP)
    compute: str = "fp32"
    norm_k: int = 0  # layer / RMS: the number of normalized (trailing) dims, for row inputs
    #: host lines run once the domain's ``shape`` is known: torch's own checks of it (a
    #: normalized shape that does not match raises, as torch does, before any load)
    checks: list[str] = field(default_factory=list)


def _loads(spec: NormSpec, inputs: list[int], row: str, r: str, mask: str) -> list[str]:
    ct = compute_type(spec)
    out = []
    for i in inputs:
        pat = spec.patterns[i]
        if pat == "full":
            idx = f"{row} * R + {r}"
        elif pat == "scalar":
            idx = f"({row} * 0 + {r} * 0)"
        elif pat == "row":
            idx = f"({row} + {r} * 0)"
        else:
            idx = "aidx"
        out.append(f"x{i} = {load_expr(f'P{i}', idx, mask, spec.in_dtypes[i], ct)}")
    return out


def _normalize_lines(spec: NormSpec) -> list[str]:
    ct = compute_type(spec)
    lines = []
    if spec.op == "rms":
        lines.append("nv = z * rstd")
    else:
        lines.append("nv = (z - mean) * rstd")
    if spec.weight is not None:
        lines.append(f"nv = nv * {load_expr(f'P{spec.weight}', 'aidx', 'm', spec.in_dtypes[spec.weight], ct)}")
    if spec.bias is not None:
        lines.append(f"nv = nv + {load_expr(f'P{spec.bias}', 'aidx', 'm', spec.in_dtypes[spec.bias], ct)}")
    return lines


def _needs_aidx(spec: NormSpec) -> bool:
    return (spec.weight is not None or spec.bias is not None
            or any(spec.patterns[i] == "affine" for i in spec.pro_inputs + spec.epi_inputs))


def render(spec: NormSpec, cfg: dict, kname: str, gname: str) -> Rendered:
    cfg = {**INFO.defaults, **(cfg or {})}
    n_in = len(spec.in_dtypes)
    ct = compute_type(spec)
    ins = [f"P{i}" for i in range(n_in)]
    outs = [f"O{j}" for j in range(len(spec.outputs))]
    common = ins + outs + ["ROWS", "R", "AG", "ACPG", "ASP", "eps"]
    aidx = "aidx = (row % AG) * ACPG + r // ASP" if _needs_aidx(spec) else None

    def body_tile(row: str, r: str, mask: str) -> list[str]:
        lines = [f"r = {r}", f"m = {mask}"]
        if aidx:
            lines.append(aidx.replace("row", row) if row != "row" else aidx)
        lines += _loads(spec, spec.pro_inputs, row, "r", "m")
        lines += stmt_lines(spec.pro_stmts)
        lines.append(f"z = tl.where(m, {spec.red_var}, 0.0)")
        return lines

    def write(row: str) -> list[str]:
        lines = _normalize_lines(spec)
        lines += _loads(spec, spec.epi_inputs, row, "r", "m")
        lines += stmt_lines(spec.epi_stmts)
        for j, (var, _dt) in enumerate(spec.outputs):
            lines.append(f"tl.store(O{j} + {row} * R + r, ({var}).to(O{j}.dtype.element_ty), mask=m)")
        return lines

    # ---- ONE: BLOCK_O rows x BLOCK_R per program, statistics from registers
    one = [
        "pid = tl.program_id(0)",
        "row = (pid * BLOCK_O + tl.arange(0, BLOCK_O)).to(tl.int64)[:, None]",
    ]
    one += body_tile("row", "tl.arange(0, BLOCK_R)[None, :]", "(row < ROWS) & (r < R)")
    if spec.op == "rms":
        one += ["mean = 0.0", "var = tl.sum(z * z, 1)[:, None] / R"]
    else:
        one += ["mean = tl.sum(z, 1)[:, None] / R",
                "dz = tl.where(m, z - mean, 0.0)",
                "var = tl.sum(dz * dz, 1)[:, None] / R"]
    one.append("rstd = 1.0 / tl.sqrt(var + eps)")
    one += write("row")
    k_one = (f"@triton.jit\ndef {kname}_one({', '.join(common)}, BLOCK_O: tl.constexpr, "
             f"BLOCK_R: tl.constexpr):\n" + indent(one, 4) + "\n")

    # ---- SPLIT kernel 1: Welford partials of one chunk of one row
    st = [
        "pid = tl.program_id(0)",
        "row = (pid // SPLITS).to(tl.int64)",
        "sp = pid % SPLITS",
        "start = sp * CHUNK",
        f"wm = tl.zeros([BLOCK], {ct})",
        f"w2 = tl.zeros([BLOCK], {ct})",
        f"wn = tl.zeros([BLOCK], {ct})",
        "for off in range(0, CHUNK, BLOCK):",
    ]
    loop = body_tile("row", "start + off + tl.arange(0, BLOCK)", "(r < R) & (r < start + CHUNK)")
    if spec.op == "rms":
        loop += ["wm = wm + z * z", "wn = wn + m.to(tl.float32)"]
    else:
        loop += WELFORD_STEP
    st += ["    " + ln for ln in loop]
    if spec.op == "rms":
        st += ["tl.store(WMEAN + pid, tl.sum(wm, 0))", "tl.store(WCNT + pid, tl.sum(wn, 0))"]
    else:
        st += ["mean_c, m2_c, n_c = tl.reduce((wm, w2, wn), 0, _egg_welford_combine)",
               "tl.store(WMEAN + pid, mean_c)", "tl.store(WM2 + pid, m2_c)", "tl.store(WCNT + pid, n_c)"]
    k_stats = (f"@triton.jit\ndef {kname}_stats({', '.join(common)}, WMEAN, WM2, WCNT, SPLITS, CHUNK, "
               f"BLOCK: tl.constexpr):\n" + indent(st, 4) + "\n")

    # ---- SPLIT kernel 2: combine the row's partials, normalize one chunk
    nm = [
        "pid = tl.program_id(0)",
        "nch = tl.cdiv(R, BLOCK)",
        "row = (pid // nch).to(tl.int64)",
        "ch = pid % nch",
        "s = tl.arange(0, SPLITS_P2)",
        "smask = s < SPLITS",
    ]
    if spec.op == "rms":
        nm += ["mean = 0.0",
               "var = tl.sum(tl.load(WMEAN + row * SPLITS + s, mask=smask, other=0.0), 0) / R"]
    else:
        nm += ["pm = tl.load(WMEAN + row * SPLITS + s, mask=smask, other=0.0)",
               "p2 = tl.load(WM2 + row * SPLITS + s, mask=smask, other=0.0)",
               "pn = tl.load(WCNT + row * SPLITS + s, mask=smask, other=0.0)",
               "mean, m2, cnt = tl.reduce((pm, p2, pn), 0, _egg_welford_combine)",
               "var = m2 / R"]
    nm.append("rstd = 1.0 / tl.sqrt(var + eps)")
    nm += body_tile("row", "ch * BLOCK + tl.arange(0, BLOCK)", "r < R")
    nm += write("row")
    k_norm = (f"@triton.jit\ndef {kname}_apply({', '.join(common)}, WMEAN, WM2, WCNT, SPLITS, "
              f"SPLITS_P2: tl.constexpr, BLOCK: tl.constexpr):\n" + indent(nm, 4) + "\n")
    kernel = "\n\n".join([k_one, k_stats, k_norm])

    args = ", ".join(f"a{i}" for i in range(n_in))
    nw = int(cfg["num_warps"])
    launch_common = ("*ts, " + "".join(f"o{j}, " for j in range(len(spec.outputs)))
                     + "rows, R, AG, ACPG, ASP, EPS")
    w = [
        f"ts = [{args}]",
        f"x = ts[{spec.pro_inputs[0] if spec.pro_inputs else 0}]",
        "shape = list(_egg_broadcast_shape([ts[i] for i in "
        f"{[i for i in range(n_in) if spec.patterns[i] == 'full']}]))",
        *spec.checks,
        f"for i, pat in enumerate({spec.patterns}):",
        "    if pat == 'full':",
        "        if list(ts[i].shape) != shape:",
        "            raise RuntimeError('EGG: normalization input of another shape than its domain')",
        "        ts[i] = ts[i].contiguous()",
        "    elif pat == 'row':",
        f"        ts[i] = ts[i].expand(shape[:len(shape) - {spec.norm_k}] + [1] * {spec.norm_k}).reshape(-1)",
        "    else:",
        "        ts[i] = ts[i].reshape(-1).contiguous()",
        f"rows, R = {spec.rows_div[0]}, {spec.rows_div[1]}",
        f"AG, ACPG, ASP = {spec.affine[0]}, {spec.affine[1]}, {spec.affine[2]}",
        f"EPS = {float(spec.eps)!r}",
        "dev = x.device",
    ]
    w += [f"o{j} = rec.empty(shape, torch.{dt}, dev)" for j, (_v, dt) in enumerate(spec.outputs)]
    ret = recorded_return(len(spec.outputs))
    w += [
        "if rows * R == 0:",
        f"    return {ret}",
        "BR = _egg_pow2(R)",
        f"if BR <= {int(cfg['ONE_MAX'])}:",
        f"    BO = max(1, min({int(cfg['BLOCK_O'])}, {int(cfg['ONE_MAX'])} // BR))",
        f"    rec.launch({kname}_one, (_egg_cdiv(rows, BO),))({launch_common}, BLOCK_O=BO, BLOCK_R=BR, num_warps={nw})",
        f"    return {ret}",
        f"BLOCK = min({int(cfg['BLOCK'])}, BR)",
        f"splits = max(1, min(_egg_cdiv(R, {int(cfg['SPLIT_CHUNK'])}), 1024))",
        "chunk = _egg_cdiv(_egg_cdiv(R, splits), BLOCK) * BLOCK",
        "splits = _egg_cdiv(R, chunk)",
        "pm, p2, pn = (rec.empty(rows * splits, torch.float32, dev) for _ in range(3))",
        f"rec.launch({kname}_stats, (rows * splits,))({launch_common}, pm, p2, pn, splits, chunk, BLOCK=BLOCK, num_warps={nw})",
        f"rec.launch({kname}_apply, (rows * _egg_cdiv(R, BLOCK),))({launch_common}, pm, p2, pn, splits, "
        f"SPLITS_P2=_egg_pow2(splits), BLOCK=BLOCK, num_warps={nw})",
        f"return {ret}",
    ]
    return Rendered(kernel, recorded_wrapper(gname, n_in, w), kname + "_one", gname, cfg)
