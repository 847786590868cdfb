"""Template: cumulative sum / product along the innermost dim, forward or reverse, inclusive or
exclusive (the prologue reads one element back), with fused elementwise prologue and epilogue
(principle alg-scan-carry).

One program scans BLOCK_O rows chunk by chunk: a block scan (tl.cumsum / tl.cumprod) per chunk
plus the running carry of the chunks before it. Reverse scans walk the chunks from the end.
"""
from __future__ import annotations

from dataclasses import dataclass

from knowledge.schema import TemplateInfo
from knowledge.templates import (Rendered, compute_type, indent, load_expr, recorded_return, recorded_wrapper,
                                 stmt_lines)
from knowledge.templates.reduction import row_setup, signature, tile_loads, wrapper_prelude

INFO = TemplateInfo(
    name="scan",
    kind="scan",
    tunables={"BLOCK_O": [1, 2, 4, 8], "BLOCK_R": [256, 512, 1024, 2048, 4096], "num_warps": [2, 4, 8, 16]},
    defaults={"BLOCK_O": 1, "BLOCK_R": 2048, "num_warps": 8},
    principle_ids=["alg-scan-carry", "alg-reduction-prologue", "alg-reduction-epilogue"],
    description="cumsum/cumprod along the innermost dim, forward or reverse, chunked with a carry",
)


@dataclass
class ScanSpec:
    op: str  # cumsum | cumprod
    reverse: bool
    in_dtypes: list[str]
    pro_inputs: list[int]
    pro_stmts: list[tuple[str, str]]
    red_var: str
    epi_stmts: list[tuple[str, str]]  # the scanned value is `sc`; epilogue inputs load like the prologue's
    epi_inputs: list[int]
    outputs: list[tuple[str, str]]
    dim: int
    compute: str = "fp32"
    exclusive: bool = False  # position i scans the elements before it (the identity first)


def render(spec: ScanSpec, cfg: dict, kname: str, gname: str) -> Rendered:
    cfg = {**INFO.defaults, **(cfg or {})}
    n_in = len(spec.in_dtypes)
    ct = compute_type(spec)
    head = signature(kname, n_in, len(spec.outputs),
                     ["I64: tl.constexpr", "BLOCK_O: tl.constexpr", "BLOCK_R: tl.constexpr"])
    b = row_setup(n_in, True)
    prod = spec.op == "cumprod"
    b.append(f"carry = tl.full([BLOCK_O], {'1.0' if prod else '0.0'}, {ct})")
    b.append("nchunks = tl.cdiv(R, BLOCK_R)")
    b.append("for c in range(0, nchunks):")
    start = "(nchunks - 1 - c) * BLOCK_R" if spec.reverse else "c * BLOCK_R"
    loop = [f"rr = {start} + tl.arange(0, BLOCK_R)", "m = rmask[:, None] & (rr < R)[None, :]"]
    if spec.exclusive:  # the prologue reads one element back (forward) or ahead (reverse)
        loop += ["rl = rr + 1" if spec.reverse else "rl = rr - 1",
                 "ml = m & (rl < R)[None, :]" if spec.reverse else "ml = m & (rl >= 0)[None, :]"]
        loop += tile_loads(spec, spec.pro_inputs, True, "rl", "ml")
    else:
        loop += tile_loads(spec, spec.pro_inputs, True, "rr", "m")
    loop += stmt_lines(spec.pro_stmts)
    ident = "1.0" if prod else "0.0"
    loop.append(f"v = tl.where({'ml' if spec.exclusive else 'm'}, {spec.red_var}, {ident})")
    rev = ", reverse=True" if spec.reverse else ""
    if prod:
        loop += [f"sc = tl.cumprod(v, 1{rev}) * carry[:, None]",
                 "carry = carry * tl.reduce(v, 1, _egg_mul)"]
    else:
        loop += [f"sc = tl.cumsum(v, 1{rev}) + carry[:, None]", "carry = carry + tl.sum(v, 1)"]
    loop += tile_loads(spec, spec.epi_inputs, True, "rr", "m")
    loop += stmt_lines(spec.epi_stmts)
    for j, (var, _dt) in enumerate(spec.outputs):
        loop.append(f"tl.store(O{j} + rows[:, None] * R + rr[None, :], ({var}).to(O{j}.dtype.element_ty), mask=m)")
    b += ["    " + ln for ln in loop]
    kernel = head + indent(b, 4) + "\n"

    w = wrapper_prelude(n_in, spec.pro_inputs + spec.epi_inputs, [], [spec.dim], True, True)
    w += [f"o{j} = rec.empty(shape, torch.{dt}, dev)" for j, (_v, dt) in enumerate(spec.outputs)]
    ret = recorded_return(len(spec.outputs))
    w += [
        "if o0.numel() == 0:",
        f"    return {ret}",
        f"BLOCK_R = min({int(cfg['BLOCK_R'])}, _egg_pow2(R))",
        f"rec.launch({kname}, (_egg_cdiv(nrows, {int(cfg['BLOCK_O'])}),))(*ts, "
        + "".join(f"o{j}, " for j in range(len(spec.outputs)))
        + "nrows, outer[1], outer[2], R, inner, *[s for st in sts for s in st], "
        + f"I64=nrows * R >= 2**31 or far, BLOCK_O={int(cfg['BLOCK_O'])}, BLOCK_R=BLOCK_R, "
        + f"num_warps={int(cfg['num_warps'])})",
        f"return {ret}",
    ]
    return Rendered(kernel, recorded_wrapper(gname, n_in, w), kname, gname, cfg)
