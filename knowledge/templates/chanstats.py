"""Template: per-channel mean and (biased) variance of an (N, C, *S) tensor - the statistics of
batch norm in training mode (principle alg-batchnorm-decompose).

Kernel 1: programs over (channel, split); a split covers a range of batch entries and all of
their spatial positions (contiguous runs of S), Welford per lane. Without spatial dims (an
(N, C) input, batch norm after a linear layer) a channel's values are C apart, so kernel 1 reads
(rows x COLS) tiles instead, coalesced along C, programs over (channel block, split). Kernel 2:
per channel, merge the splits' partials. The normalization itself is left to the pointwise fusion, which fuses it
with whatever elementwise work follows.

A prologue (the elementwise chain that produced the input, e.g. a convolution's bias add and
activation) runs on every loaded element: its other inputs are full-size tensors (loaded like
the main one), per-channel vectors or scalars. The planner gives the statistics a recomputed
copy of the chain when that saves passes (codegen.fusion), so the chain's result need not be
written and read back (principle alg-reduction-prologue).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from knowledge.schema import TemplateInfo
from knowledge.templates import (WELFORD_STEP, Rendered, compute_type, indent, load_expr, recorded_wrapper,
                                 stmt_lines)

INFO = TemplateInfo(
    name="chanstats",
    kind="chanstats",
    tunables={"BLOCK": [512, 1024, 2048, 4096], "num_warps": [4, 8], "SPLITS": [8, 16, 32, 64, 128]},
    defaults={"BLOCK": 1024, "num_warps": 4, "SPLITS": 32},
    principle_ids=["alg-batchnorm-decompose", "tile-split-rows", "alg-fp32-accumulate"],
    description="per-channel mean/var over batch and space, split Welford",
)


#: channels per program of the (N, C) variant: 64 fp32 values are two 128-byte lines per row
COLS = 64


@dataclass
class ChanStatsSpec:
    in_dtype: str  # dtype of the main input
    compute: str = "fp32"
    in_dtypes: list[str] = field(default_factory=list)  # every input; [] = only the main one
    main: int = 0  # the input whose shape is the domain (N, C, *S); it fixes the layout
    pro_patterns: dict[int, str] = field(default_factory=dict)  # others: full | channel | scalar
    pro_stmts: list[tuple[str, str]] = field(default_factory=list)
    red_var: str = ""  # the prologue's value whose statistics are taken ("" = the main input)
    out_dtype: str = ""  # dtype of the statistics ("" = the main input's)
    count: bool = False  # also return the number of values per channel (batch norm's update)


def _values(spec: ChanStatsSpec, full_idx: str, chan_idx: str, zero_idx: str, mask: str, ct: str,
            pad: str) -> list[str]:
    """Loads and prologue statements giving z, the value whose statistics are taken."""
    dts = spec.in_dtypes or [spec.in_dtype]
    if not spec.pro_stmts and not spec.pro_patterns:
        return [f"{pad}z = {load_expr(f'P{spec.main}', full_idx, mask, dts[spec.main], ct)}"]
    lines = [f"{pad}x{spec.main} = {load_expr(f'P{spec.main}', full_idx, mask, dts[spec.main], ct)}"]
    for i, pat in spec.pro_patterns.items():
        idx = {"full": full_idx, "channel": chan_idx, "scalar": zero_idx}[pat]
        lines.append(f"{pad}x{i} = {load_expr(f'P{i}', idx, mask, dts[i], ct)}")
    lines += [pad + ln for ln in stmt_lines(spec.pro_stmts)]
    lines.append(f"{pad}z = {spec.red_var or f'x{spec.main}'}")
    return lines


def render(spec: ChanStatsSpec, cfg: dict, kname: str, gname: str) -> Rendered:
    cfg = {**INFO.defaults, **(cfg or {})}
    ct = compute_type(spec)
    k1 = [
        "pid = tl.program_id(0)",
        "c = (pid // SPLITS).to(tl.int64)",
        "sp = pid % SPLITS",
        f"wm = tl.zeros([BLOCK], {ct})",
        f"w2 = tl.zeros([BLOCK], {ct})",
        f"wn = tl.zeros([BLOCK], {ct})",
        "for n in range(sp * NPER, tl.minimum((sp + 1) * NPER, N)):",
        "    base = (n * C + c) * S",
        "    for off in range(0, S, BLOCK):",
        "        s = off + tl.arange(0, BLOCK)",
        "        m = s < S",
        *_values(spec, "base + s", "c + s * 0", "s * 0", "m", ct, "        "),
        *["        " + ln for ln in WELFORD_STEP],
        "mean_c, m2_c, n_c = tl.reduce((wm, w2, wn), 0, _egg_welford_combine)",
        "tl.store(WMEAN + pid, mean_c)",
        "tl.store(WM2 + pid, m2_c)",
        "tl.store(WCNT + pid, n_c)",
    ]
    k1c = [
        "cs = tl.program_id(0) * COLS + tl.arange(0, COLS)",
        "sp = tl.program_id(1)",
        "mc = cs < C",
        f"wm = tl.zeros([ROWS, COLS], {ct})",
        f"w2 = tl.zeros([ROWS, COLS], {ct})",
        f"wn = tl.zeros([ROWS, COLS], {ct})",
        "hi = tl.minimum((sp + 1) * NPER, N)",
        "for n0 in range(sp * NPER, hi, ROWS):",
        "    rows = n0 + tl.arange(0, ROWS)",
        "    m = (rows[:, None] < hi) & mc[None, :]",
        *_values(spec, "rows[:, None].to(tl.int64) * C + cs[None, :]", "rows[:, None] * 0 + cs[None, :]",
                 "rows[:, None] * 0 + cs[None, :] * 0", "m", ct, "    "),
        *["    " + ln for ln in WELFORD_STEP],
        "mean_c, m2_c, n_c = tl.reduce((wm, w2, wn), 0, _egg_welford_combine)",
        "tl.store(WMEAN + cs * SPLITS + sp, mean_c, mask=mc)",
        "tl.store(WM2 + cs * SPLITS + sp, m2_c, mask=mc)",
        "tl.store(WCNT + cs * SPLITS + sp, n_c, mask=mc)",
    ]
    k2 = [
        "c = tl.program_id(0)",
        "s = tl.arange(0, SPLITS_P2)",
        "ms = s < SPLITS",
        "pm = tl.load(WMEAN + c * SPLITS + s, mask=ms, other=0.0)",
        "p2 = tl.load(WM2 + c * SPLITS + s, mask=ms, other=0.0)",
        "pn = tl.load(WCNT + c * SPLITS + s, mask=ms, other=0.0)",
        "mean, m2, cnt = tl.reduce((pm, p2, pn), 0, _egg_welford_combine)",
        "tl.store(OM + c, mean.to(OM.dtype.element_ty))",
        "tl.store(OV + c, (m2 / cnt).to(OV.dtype.element_ty))",
    ]
    n_in = len(spec.in_dtypes) or 1
    ps = ", ".join(f"P{i}" for i in range(n_in))
    kernel = (f"@triton.jit\ndef {kname}({ps}, WMEAN, WM2, WCNT, N, C, S, NPER, SPLITS, BLOCK: tl.constexpr):\n"
              + indent(k1, 4) + "\n\n\n"
              + f"@triton.jit\ndef {kname}_cols({ps}, WMEAN, WM2, WCNT, N, C, NPER, SPLITS, ROWS: tl.constexpr, COLS: tl.constexpr):\n"
              + indent(k1c, 4) + "\n\n\n"
              + f"@triton.jit\ndef {kname}_fin(WMEAN, WM2, WCNT, OM, OV, SPLITS, SPLITS_P2: tl.constexpr):\n"
              + indent(k2, 4) + "\n")
    args = [f"a{i}" for i in range(n_in)]
    prep = [f"ts = [{', '.join(args)}]", f"x = ts[{spec.main}] = ts[{spec.main}].contiguous()"]
    for i, pat in spec.pro_patterns.items():
        prep.append(f"ts[{i}] = ts[{i}].expand(x.shape).contiguous()" if pat == "full"
                    else f"ts[{i}] = ts[{i}].reshape(-1).contiguous()")
    odt = f"torch.{spec.out_dtype}" if spec.out_dtype else "x.dtype"
    w = prep + [
        "N, C = x.shape[0], x.shape[1]",
        "S = x.numel() // max(1, N * C)",
        "sshape = [1, C] + [1] * (x.dim() - 2)",
        f"om = rec.empty(sshape, {odt}, x.device)",
        f"ov = rec.empty(sshape, {odt}, x.device)",
        f"splits = max(1, min(N, {int(cfg['SPLITS'])}))",
        "nper = _egg_cdiv(N, splits)",
        "splits = _egg_cdiv(N, nper)",
        "pm, p2, pn = (rec.empty(C * splits, torch.float32, x.device) for _ in range(3))",
        "if S == 1:",
        f"    COLS = min({COLS}, _egg_pow2(C))",
        f"    ROWS = max(1, {int(cfg['BLOCK'])} // COLS)",
        f"    rec.launch({kname}_cols, (_egg_cdiv(C, COLS), splits))(*ts, pm, p2, pn, N, C, nper, splits, ROWS=ROWS, COLS=COLS, num_warps={int(cfg['num_warps'])})",
        "else:",
        f"    BLOCK = min({int(cfg['BLOCK'])}, _egg_pow2(max(S, 1)))",
        f"    rec.launch({kname}, (C * splits,))(*ts, pm, p2, pn, N, C, S, nper, splits, BLOCK=BLOCK, num_warps={int(cfg['num_warps'])})",
        f"rec.launch({kname}_fin, (C,))(pm, p2, pn, om, ov, splits, SPLITS_P2=_egg_pow2(splits), num_warps=1)",
        "return rec.done((om, ov, N * S))" if spec.count else "return rec.done((om, ov))",
    ]
    return Rendered(kernel, recorded_wrapper(gname, args, w), kname, gname, cfg)
