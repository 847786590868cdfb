"""Template: max / average pooling over 1-3 spatial dims with fused prologue and epilogue.

One program computes BLOCK outputs of the flattened (N*C, OD, OH, OW) output; the window loops
are unrolled (kernel sizes are compile-time constants), neighbouring outputs share their input
lines through L1/L2 so the input is read from memory about once (principle alg-pool-direct).
The prologue runs on every loaded element (elementwise producers of the pooled tensor, whose
other inputs are scalars or per-channel vectors); the epilogue runs on the pooled value with
broadcast inputs of the output domain.
"""
from __future__ import annotations

from dataclasses import dataclass

from knowledge.schema import TemplateInfo
from knowledge.templates import (Rendered, compute_type, indent, load_expr, nan_max, recorded_return,
                                 recorded_wrapper, stmt_lines)

INFO = TemplateInfo(
    name="pool",
    kind="pool",
    tunables={"BLOCK": [256, 512, 1024, 2048], "num_warps": [2, 4, 8]},
    defaults={"BLOCK": 1024, "num_warps": 4},
    principle_ids=["alg-pool-direct", "alg-reduction-prologue", "alg-reduction-epilogue"],
    description="max/avg pool 1d-3d, window unrolled, prologue and epilogue fused",
)


@dataclass
class PoolSpec:
    op: str  # max | avg
    nd: int
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    ceil_mode: bool
    count_include_pad: bool
    divisor_override: int | None
    in_dtypes: list[str]
    main: int
    pro_inputs: list[int]  # besides main: scalars or per-channel vectors (pattern below)
    pro_patterns: dict[int, str]  # scalar | channel
    epi_inputs: list[int]
    pro_stmts: list[tuple[str, str]]
    red_var: str
    epi_stmts: list[tuple[str, str]]  # the pooled value is `acc`
    outputs: list[tuple[str, str]]
    compute: str = "fp32"


def _pad3(t: tuple[int, ...], fill: int) -> tuple[int, int, int]:
    return tuple([fill] * (3 - len(t)) + list(t))  # type: ignore[return-value]


def render(spec: PoolSpec, cfg: dict, kname: str, gname: str) -> Rendered:
    cfg = {**INFO.defaults, **(cfg or {})}
    n_in = len(spec.in_dtypes)
    ct = compute_type(spec)
    K = _pad3(spec.kernel, 1)
    S = _pad3(spec.stride, 1)
    Pd = _pad3(spec.padding, 0)
    D = _pad3(spec.dilation, 1)
    ins = [f"P{i}" for i in range(n_in)]
    outs = [f"O{j}" for j in range(len(spec.outputs))]
    epi_strides = [f"E{i}_{d}" for i in spec.epi_inputs for d in range(4)]
    epi_flags = [f"F{i}: tl.constexpr" for i in spec.epi_inputs]
    sig = ", ".join(ins + outs + ["N_OUT", "C", "ID", "IH", "IW", "OD", "OH", "OW", "D1", "D2", "D3",
                                  "MD", "SD", "MH", "SH", "MW", "SW"]
                    + epi_strides + epi_flags + ["I64: tl.constexpr", "BLOCK: tl.constexpr"])
    ident = 'float("-inf")' if spec.op == "max" else "0.0"
    b = [
        "pid = tl.program_id(0)",
        "if I64:",  # 64-bit index math only where offsets can pass 2**31 (it costs registers)
        "    pid = pid.to(tl.int64)",
        "offs = pid * BLOCK + tl.arange(0, BLOCK)",
        "mask = offs < N_OUT",
        "t = offs",
    ]
    # only the pooled dims are decomposed and bounds-checked: a 1-d pool's output index costs
    # one division, not three by runtime sizes of 1; in 32 bits a division is a multiply-high
    # by the divisor's magic number (_egg_magic, computed on the host)
    used = list(range(3 - spec.nd, 3))
    for dim in reversed(used):
        o, n, ax = ["od", "oh", "ow"][dim], ["OD", "OH", "OW"][dim], "DHW"[dim]
        b += ["if I64:", f"    {o} = t % {n}", f"    t = t // {n}", "else:",
              f"    q = _egg_fdiv(t, {n}, M{ax}, S{ax})", f"    {o} = t - q * {n}", "    t = q"]
    b += [
        "nc = t",
        f"base = nc * ({' * '.join(['ID', 'IH', 'IW'][d] for d in used)})",
        f"acc = tl.full([BLOCK], {ident}, {ct})",
        f"cnt = tl.zeros([BLOCK], {ct})",
    ]
    for i, pat in spec.pro_patterns.items():  # loop-invariant prologue inputs
        idx = "offs * 0" if pat == "scalar" else "nc % C"
        b.append(f"x{i} = {load_expr(f'P{i}', idx, 'mask', spec.in_dtypes[i], ct)}")
    loop = []
    ind = ""
    for dim in used:
        k, s, p, d = K[dim], S[dim], Pd[dim], D[dim]
        ax = "dhw"[dim]
        o = ["od", "oh", "ow"][dim]
        loop.append(f"{ind}for k{ax} in tl.static_range({k}):")
        ind += "    "
        loop.append(f"{ind}q{ax} = {o} * {s} - {p} + k{ax} * {d}")
    sizes = {"d": "ID", "h": "IH", "w": "IW"}
    bounds = " & ".join(f"(q{ax} >= 0) & (q{ax} < {sizes[ax]})" for ax in ("dhw"[d] for d in used))
    loop.append(f"{ind}ok = mask & {bounds}")
    addr = "q" + "dhw"[used[0]]
    for dim in used[1:]:
        ax = "dhw"[dim]
        addr = f"({addr}) * {sizes[ax]} + q{ax}"
    m = spec.main
    loop.append(f"{ind}x{m} = {load_expr(f'P{m}', f'base + {addr}', 'ok', spec.in_dtypes[m], ct)}")
    loop += [ind + ln for ln in stmt_lines(spec.pro_stmts)]
    if spec.op == "max":
        # NaN wins, as in torch's max pooling (tl.maximum would give the other operand)
        loop.append(f"{ind}acc = {nan_max('acc', f'tl.where(ok, {spec.red_var}, {ident})')}")
    else:
        loop.append(f"{ind}acc = acc + tl.where(ok, {spec.red_var}, 0.0)")
        loop.append(f"{ind}cnt = cnt + ok.to({ct})")
    b += loop
    if spec.op == "avg":
        if spec.divisor_override:
            b.append(f"acc = acc / {float(spec.divisor_override)!r}")
        elif spec.count_include_pad:
            # window clipped to the padded extent, as torch counts it
            size = []
            for dim in used:
                k, s, p = K[dim], S[dim], Pd[dim]
                o = ["od", "oh", "ow"][dim]
                n = ["ID", "IH", "IW"][dim]
                b.append(f"st{dim} = {o} * {s} - {p}")
                b.append(f"en{dim} = tl.minimum(st{dim} + {k}, {n} + {p})")
                size.append(f"(en{dim} - st{dim})")
            b.append(f"acc = acc / ({' * '.join(size)}).to({ct})")
        else:
            b.append("acc = acc / tl.maximum(cnt, 1.0)")
    for i in spec.epi_inputs:
        b += [f"if F{i}:", f"    e{i} = offs", "else:",
              f"    e{i} = _egg_index4(offs, D1, D2, D3, E{i}_0, E{i}_1, E{i}_2, E{i}_3)",
              f"x{i} = {load_expr(f'P{i}', f'e{i}', 'mask', spec.in_dtypes[i], ct)}"]
    b += stmt_lines(spec.epi_stmts)
    for j, (var, _dt) in enumerate(spec.outputs):
        b.append(f"tl.store(O{j} + offs, ({var}).to(O{j}.dtype.element_ty), mask=mask)")
    kernel = f"@triton.jit\ndef {kname}({sig}):\n{indent(b, 4)}\n"

    args = ", ".join(f"a{i}" for i in range(n_in))
    kk, ss, pp, dd = list(spec.kernel), list(spec.stride), list(spec.padding), list(spec.dilation)
    w = [
        f"ts = [{args}]",
        f"x = ts[{m}].contiguous()",
        f"ts[{m}] = x",
        f"nd = {spec.nd}",
        "sp_in = list(x.shape[2:])",
        f"sp_out = [_egg_pool_out(i, k, s, p, d, {bool(spec.ceil_mode)}) for i, k, s, p, d in "
        f"zip(sp_in, {kk}, {ss}, {pp}, {dd})]",
        "oshape = list(x.shape[:2]) + sp_out",
        "I3 = [1] * (3 - nd) + sp_in",
        "O3 = [1] * (3 - nd) + sp_out",
    ]
    for i, pat in spec.pro_patterns.items():
        w.append(f"ts[{i}] = ts[{i}].reshape(-1).contiguous()")
    w += [f"o{j} = rec.empty(oshape, torch.{dt}, x.device)" for j, (_v, dt) in enumerate(spec.outputs)]
    ret = recorded_return(len(spec.outputs))
    epi_ts = ", ".join(f"ts[{i}]" for i in spec.epi_inputs)
    w += [
        "n_out = o0.numel()",
        "if n_out == 0:",
        f"    return {ret}",
        *([f"lay = _egg_pointwise_layout(oshape, [{epi_ts}], False)",
           "if lay is None:  # strides that do not collapse to 4 dims: contiguous copies do",
           f"    for i in {list(spec.epi_inputs)}:",
           "        ts[i] = ts[i].contiguous()",
           f"    lay = _egg_pointwise_layout(oshape, [{epi_ts}], False)",
           "dims, sts, flat, _, far = lay"]
          if spec.epi_inputs else ["dims, sts, flat, far = [1, 1, 1, 1], [], [], False"]),
        f"BLOCK = {int(cfg['BLOCK'])}",
        f"rec.launch({kname}, (_egg_cdiv(n_out, BLOCK),))(*ts, "
        + "".join(f"o{j}, " for j in range(len(spec.outputs)))
        + "n_out, x.shape[1], I3[0], I3[1], I3[2], O3[0], O3[1], O3[2], dims[1], dims[2], dims[3], "
        + "*_egg_magic(O3[0]), *_egg_magic(O3[1]), *_egg_magic(O3[2]), "
        + "*[s for st in sts for s in st], *flat, I64=max(x.numel(), n_out + BLOCK) >= 2**31 or far, BLOCK=BLOCK, "
        + f"num_warps={int(cfg['num_warps'])})",
        f"return {ret}",
    ]
    return Rendered(kernel, recorded_wrapper(gname, n_in, w), kname, gname, cfg)
