"""Template: softmax / log-softmax over one dim with fused prologue and epilogue, and reductions
whose result is broadcast back over the reduced dims (x / sqrt(mean(x**2)), x - mean(x)).

One pass when the reduced dim fits one tile (ONE_PASS); otherwise online softmax
(principle alg-online-softmax): pass 1 keeps a running max and a rescaled running sum per lane,
pass 2 recomputes the prologue and writes the normalized values. A broadcast reduction
(principle alg-reduce-broadcast) is the same two passes: pass 1 reduces, statements on the
reduced value follow, pass 2 re-reads the tile (mostly from L2) and runs the epilogue on it.
"""
from __future__ import annotations

from knowledge.schema import TemplateInfo
from knowledge.templates import Rendered, SoftmaxSpec, indent, stmt_lines
from knowledge.templates.reduction import (launch_line, launch_tail, row_setup, signature,
                                           tile_loads, tile_mask, wrapper_prelude)
from knowledge.templates import compute_type

INFO = TemplateInfo(
    name="softmax",
    kind="softmax",
    # ONE_PASS_MAX: rows up to this many elements are held in registers in one tile (8192 fp32
    # values over 8 warps is 32 registers per thread for the row).
    tunables={"BLOCK_O": [1, 2, 4, 8], "BLOCK_R": [128, 256, 512, 1024, 2048, 4096],
              "BLOCK_I": [16, 32, 64, 128], "num_warps": [1, 2, 4, 8, 16],
              "num_stages": [1, 2, 3], "ONE_PASS_MAX": [2048, 4096, 8192]},
    defaults={"BLOCK_O": 1, "BLOCK_R": 1024, "BLOCK_I": 32, "num_warps": 4, "num_stages": 2,
              "ONE_PASS_MAX": 8192},
    principle_ids=["alg-online-softmax", "alg-reduce-broadcast", "alg-reduction-prologue",
                   "alg-reduction-epilogue", "alg-fp32-accumulate", "tile-grid-mapping"],
    description="softmax/log_softmax and broadcast reductions (x / rms(x), x - mean(x)), one "
                "pass for short rows, two passes for long rows",
)

NEG = 'float("-inf")'
#: a reduction broadcast back over the reduced dims (principle alg-reduce-broadcast): its fill
#: value, the reduction of a tile along an axis, and the running combine of two tiles
BROADCAST = {"sum": ("0.0", "tl.sum", "{a} + {b}"), "mean": ("0.0", "tl.sum", "{a} + {b}"),
             "amax": (NEG, "tl.max", "tl.maximum({a}, {b})"),
             "amin": ('float("inf")', "tl.min", "tl.minimum({a}, {b})")}


def _normalize(op: str, z: str, mx: str, s: str) -> str:
    if op == "softmax":
        return f"tl.exp({z} - {mx}) / {s}"
    return f"({z} - {mx}) - tl.log({s})"


def render(spec: SoftmaxSpec, cfg: dict, kname: str, gname: str) -> Rendered:
    cfg = {**INFO.defaults, **(cfg or {})}
    rows_v = spec.inner
    n_in = len(spec.in_dtypes)
    ct = compute_type(spec)
    bcast = spec.op in BROADCAST
    fill = BROADCAST[spec.op][0] if bcast else NEG
    params, grid, kw = launch_tail(rows_v, cfg)
    params = params + ["ONE_PASS: tl.constexpr"]
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
        lines = [f"acc = {ex(f'{red}({acc}, {ax})')}"]
        if spec.op == "mean":
            lines.append("acc = acc / R")
        return lines + stmt_lines(spec.red_stmts)

    body = row_setup(n_in, rows_v)
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
        two = [f"m2 = tl.full({tile}, {NEG}, {ct})", f"s2 = tl.zeros({tile}, {ct})"] + loop
        two += ["    " + ln for ln in tile_block("r0 + tl.arange(0, BLOCK_R)")]
        two += ["    mn = tl.maximum(m2, z)",
                f"    s2 = s2 * tl.where(mn == {NEG}, 0.0, tl.exp(m2 - mn)) + tl.where(mn == {NEG}, 0.0, tl.exp(z - mn))",
                "    m2 = mn",
                f"mx = tl.max(m2, {ax})",
                f"s = tl.sum(tl.where(m2 == {NEG}, 0.0, s2 * tl.exp(m2 - {ex('mx')})), {ax})"]
    two += loop
    two += ["    " + ln for ln in tile_block("r0 + tl.arange(0, BLOCK_R)") + write_block()]
    body.append("if ONE_PASS:")
    body += ["    " + ln for ln in one]
    body.append("else:")
    body += ["    " + ln for ln in two]
    kernel = head + indent(body, 4) + "\n"

    args = ", ".join(f"a{i}" for i in range(n_in))
    # the epilogue's inputs live on the full domain: no reduced-domain lifting needed
    rdims = [spec.dim] if spec.rdims == [] else spec.rdims  # as written; None: every dim
    w = wrapper_prelude(n_in, spec.pro_inputs + spec.epi_inputs, [], rdims, True, rows_v)
    w += [f"o{j} = torch.empty(shape, device=dev, dtype=torch.{dt})"
          for j, (_v, dt) in enumerate(spec.outputs)]
    ret = ", ".join(f"o{j}" for j in range(len(spec.outputs)))
    one_max = int(cfg["ONE_PASS_MAX"])
    w += [
        "if o0.numel() == 0:",
        f"    return {ret}",
        "BLOCK_R = _egg_pow2(R)",
        f"ONE = BLOCK_R * {int(cfg['BLOCK_O'] if rows_v else cfg['BLOCK_I'])} <= {one_max}",
        f"BLOCK_R = BLOCK_R if ONE else min({int(cfg['BLOCK_R'])}, BLOCK_R)",
        launch_line(kname, len(spec.outputs), grid, kw + ", ONE_PASS=ONE", cfg),
        f"return {ret}",
    ]
    wrapper = f"def {gname}({args}):\n{indent(w, 4)}\n"
    return Rendered(kernel, wrapper, kname, gname, cfg)
