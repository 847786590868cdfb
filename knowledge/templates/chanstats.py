"""Template: per-channel mean and (biased) variance of an (N, C, *S) tensor - the statistics of
batch norm in training mode (principle alg-batchnorm-decompose).

Kernel 1: programs over (channel, split); a split covers a range of batch entries and all of
their spatial positions (contiguous runs of S), Welford per lane. Without spatial dims (an
(N, C) input, batch norm after a linear layer) a channel's values are C apart, so kernel 1 reads
(rows x COLS) tiles instead, coalesced along C, programs over (channel block, split). Kernel 2:
per channel, merge the splits' partials. The normalization itself is left to the pointwise fusion, which fuses it
with whatever elementwise work follows.
"""
from __future__ import annotations

from dataclasses import dataclass

from knowledge.schema import TemplateInfo
from knowledge.templates import WELFORD_STEP, Rendered, compute_type, indent, load_expr

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
    in_dtype: str
    compute: str = "fp32"


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
        f"        z = {load_expr('X', 'base + s', 'm', spec.in_dtype, ct)}",
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
        f"    z = {load_expr('X', 'rows[:, None].to(tl.int64) * C + cs[None, :]', 'm', spec.in_dtype, ct)}",
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
    kernel = (f"@triton.jit\ndef {kname}(X, WMEAN, WM2, WCNT, N, C, S, NPER, SPLITS, BLOCK: tl.constexpr):\n"
              + indent(k1, 4) + "\n\n\n"
              + f"@triton.jit\ndef {kname}_cols(X, WMEAN, WM2, WCNT, N, C, NPER, SPLITS, ROWS: tl.constexpr, COLS: tl.constexpr):\n"
              + indent(k1c, 4) + "\n\n\n"
              + f"@triton.jit\ndef {kname}_fin(WMEAN, WM2, WCNT, OM, OV, SPLITS, SPLITS_P2: tl.constexpr):\n"
              + indent(k2, 4) + "\n")
    w = [
        "x = a0.contiguous()",
        "N, C = x.shape[0], x.shape[1]",
        "S = x.numel() // max(1, N * C)",
        "sshape = [1, C] + [1] * (x.dim() - 2)",
        "om = torch.empty(sshape, device=x.device, dtype=x.dtype)",
        "ov = torch.empty(sshape, device=x.device, dtype=x.dtype)",
        f"splits = max(1, min(N, {int(cfg['SPLITS'])}))",
        "nper = triton.cdiv(N, splits)",
        "splits = triton.cdiv(N, nper)",
        "pm = torch.empty(C * splits, device=x.device, dtype=torch.float32)",
        "p2 = torch.empty_like(pm)",
        "pn = torch.empty_like(pm)",
        "if S == 1:",
        f"    COLS = min({COLS}, triton.next_power_of_2(C))",
        f"    ROWS = max(1, {int(cfg['BLOCK'])} // COLS)",
        f"    {kname}_cols[(triton.cdiv(C, COLS), splits)](x, pm, p2, pn, N, C, nper, splits, ROWS=ROWS, COLS=COLS, num_warps={int(cfg['num_warps'])})",
        "else:",
        f"    BLOCK = min({int(cfg['BLOCK'])}, triton.next_power_of_2(max(S, 1)))",
        f"    {kname}[(C * splits,)](x, pm, p2, pn, N, C, S, nper, splits, BLOCK=BLOCK, num_warps={int(cfg['num_warps'])})",
        f"{kname}_fin[(C,)](pm, p2, pn, om, ov, splits, SPLITS_P2=triton.next_power_of_2(splits), num_warps=1)",
        "return om, ov",
    ]
    wrapper = f"def {gname}(a0):\n{indent(w, 4)}\n"
    return Rendered(kernel, wrapper, kname, gname, cfg)
