"""Template: LM head + cross-entropy, chunked over the vocabulary (the full logits never reach
memory; principles alg-linear-cross-entropy, rw-linear-cross-entropy).

loss = cross_entropy(linear(x, W, b).float(), target) for x [T, H], W [V, H], class-index targets
[T] (Gemma-2's final logit soft cap, cap * tanh(logits / cap), applied to each tile first, in
the dtype eager computes it in). Every (BLOCK_M tokens x BLOCK_N vocabulary) tile of logits is reduced where it is made to
three numbers per row: the tile's maximum, its sum of exp(logit - maximum) and, for the one
tile that holds a row's target, the target's logit. A second kernel merges a row's tiles into
logsumexp - target logit (0 for ignored targets, NaN for a target outside the vocabulary, where
eager raises), a third sums the rows (mean: over the targets kept, as torch divides).

Two mappings for the tiles of logits (MODE, measured by the tiler):
- MODE 0 (chunked): cuBLAS computes CHUNK_N vocabulary columns at a time ([T, CHUNK_N] in the
  logits' dtype, sized to stay in L2), eager's product and rounding; a Triton kernel reduces the
  chunk's tiles as it reads them back.
- MODE 1 (fused): one Triton kernel computes each tile on tensor cores (fp32 accumulation over
  H in BLOCK_K steps, grouped program order as the matmul template) and reduces it in
  registers: no logits buffer at all. The fp32 tile is rounded to the logits' dtype first, as
  eager's linear output is.
"""
from __future__ import annotations

from dataclasses import dataclass

from knowledge.schema import TemplateInfo
from knowledge.templates import Rendered, indent
from knowledge.templates.matmul import dot_precision

INFO = TemplateInfo(
    name="linear_ce",
    kind="linear_ce",
    tunables={"MODE": [0, 1], "CHUNK_N": [2048, 4096, 8192, 16384], "BLOCK_M": [32, 64, 128, 256],
              "BLOCK_N": [32, 64, 128, 256], "BLOCK_K": [16, 32, 64, 128], "GROUP_M": [1, 8],
              "num_warps": [4, 8], "num_stages": [2, 3, 4]},
    defaults={"MODE": 0, "CHUNK_N": 8192, "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64,
              "GROUP_M": 8, "num_warps": 8, "num_stages": 3},
    principle_ids=["alg-linear-cross-entropy", "alg-online-softmax", "alg-fp32-accumulate",
                   "alg-no-lower-precision"],
    description="LM head + cross-entropy: logits reduced per vocabulary tile (cuBLAS chunks or a "
                "fused Triton product), never written whole",
)

LOG2E = 1.4426950408889634


@dataclass
class LinearCESpec:
    dtype: str  # of x and W: the logits are made in it (and rounded to it), then upcast
    has_bias: bool
    ignore_index: int
    reduction: str  # mean | sum | none
    #: Gemma-2's final logit soft cap: each logit becomes softcap * tanh(logit / softcap)
    #: before the reduction (None: none), each step rounded to the product's 16-bit dtype where
    #: softcap_16 (eager computes it there, before the upcast), else in fp32
    softcap: float | None = None
    softcap_16: bool = False


def _tile_partials(var: str, spec: LinearCESpec, ety: str) -> list[str]:
    """Reduce a logits tile ``var`` [BLOCK_M, BLOCK_N] (fp32; rows rm, columns rn) to the row
    maximum, the sum of exponentials and the target's logit, stored at tile index ``tn`` (the
    soft cap applied to the tile first, rounded to ``ety`` after each step where spec.softcap_16)."""
    cap = []
    if spec.softcap is not None:
        c = float(spec.softcap)
        rnd = (lambda e: f"({e}).to({ety}).to(tl.float32)") if spec.softcap_16 else (lambda e: e)
        cap = [f"{var} = {rnd(f'{var} / {c!r}')}  # the soft cap",
               f"{var} = {rnd(f'_egg_tanh({var})')}",
               f"{var} = {rnd(f'{var} * {c!r}')}"]
    return cap + [
        "mrow = rm < M",
        "mcol = rn < V",
        f'z = tl.where(mcol[None, :], {var}, float("-inf"))',
        "mt = tl.max(z, 1)",
        f"st = tl.sum(tl.exp2((z - mt[:, None]) * {LOG2E}), 1)",
        "tl.store(PM + tn * M + rm, mt, mask=mrow)",
        "tl.store(PS + tn * M + rm, st, mask=mrow)",
        "tgt = tl.load(T + rm, mask=mrow, other=-1)",
        "hit = rn[None, :] == tgt[:, None]",
        "zt = tl.sum(tl.where(hit, z, 0.0), 1)",
        "mine = mrow & (tgt >= tn * BLOCK_N) & (tgt < tn * BLOCK_N + BLOCK_N)",
        "tl.store(PT + rm, zt, mask=mine)",
    ]


def _fused(spec: LinearCESpec, kname: str) -> str:
    prec = dot_precision(spec.dtype)
    opt = f", input_precision={prec!r}" if prec else ""
    body = [
        "pid = tl.program_id(0)",
        "num_m = tl.cdiv(M, BLOCK_M)",
        "num_n = tl.cdiv(V, BLOCK_N)",
        "width = GROUP_M * num_n",
        "first_m = (pid // width) * GROUP_M",
        "rows = tl.minimum(num_m - first_m, GROUP_M)",
        "pid_m = first_m + (pid % width) % rows",
        "tn = (pid % width) // rows",
        "rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)",
        "rn = (tn * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)",
        "rk = tl.arange(0, BLOCK_K)",
        # rows and columns past the edge read a valid row (masked at the reduction)
        "xp = X + (rm % M)[:, None] * sxm + rk[None, :] * sxk",
        "wp = W + (rn % V)[None, :] * swn + rk[:, None] * swk",
        "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
        "for k0 in range(0, K, BLOCK_K):",
        "    if EVEN_K:",
        "        a = tl.load(xp)",
        "        b = tl.load(wp)",
        "    else:",
        "        a = tl.load(xp, mask=rk[None, :] < K - k0, other=0.0)",
        "        b = tl.load(wp, mask=rk[:, None] < K - k0, other=0.0)",
        "    if DOT_F32:",
        "        a = a.to(tl.float32)",
        "        b = b.to(tl.float32)",
        f"    acc = tl.dot(a, b, acc{opt})",
        "    xp += BLOCK_K * sxk",
        "    wp += BLOCK_K * swk",
    ]
    if spec.has_bias:
        body.append("acc = acc + tl.load(BIAS + rn, mask=rn < V, other=0.0).to(tl.float32)[None, :]")
    if spec.dtype != "float32":  # eager's linear output is rounded to its dtype, then upcast
        body.append("acc = acc.to(X.dtype.element_ty).to(tl.float32)")
    body += _tile_partials("acc", spec, "X.dtype.element_ty")
    params = ["X", "W", "BIAS", "T", "PM", "PS", "PT", "M", "V", "K", "sxm", "sxk", "swn", "swk",
              "EVEN_K: tl.constexpr", "DOT_F32: tl.constexpr", "BLOCK_M: tl.constexpr",
              "BLOCK_N: tl.constexpr", "BLOCK_K: tl.constexpr", "GROUP_M: tl.constexpr"]
    return f"@triton.jit\ndef {kname}_mm({', '.join(params)}):\n{indent(body, 4)}\n"


def _chunk(spec: LinearCESpec, kname: str) -> str:
    """Tiles of one cuBLAS logits chunk L [M, C] (columns n0 .. n0 + C of the vocabulary)."""
    body = [
        "pid_m = tl.program_id(0)",
        "tn = n0 // BLOCK_N + tl.program_id(1)",
        "rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)",
        "rn = (tn * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)",
        "lz = tl.load(L + rm[:, None] * sl + (rn - n0)[None, :],",
        "             mask=(rm < M)[:, None] & (rn < V)[None, :], other=0.0).to(tl.float32)",
    ]
    body += _tile_partials("lz", spec, "L.dtype.element_ty")
    params = ["L", "T", "PM", "PS", "PT", "M", "V", "n0", "sl", "BLOCK_M: tl.constexpr",
              "BLOCK_N: tl.constexpr"]
    return f"@triton.jit\ndef {kname}_lse({', '.join(params)}):\n{indent(body, 4)}\n"


def _rows(spec: LinearCESpec, kname: str) -> str:
    """Per row: logsumexp over the row's tiles minus the target's logit."""
    body = [
        "rm = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)",
        "mrow = rm < M",
        'mx = tl.full([BLOCK_R], float("-inf"), tl.float32)',
        "sx = tl.zeros([BLOCK_R], tl.float32)",
        "for t0 in range(0, NT, BLOCK_T):",
        "    tt = t0 + tl.arange(0, BLOCK_T)",
        "    mk = (tt < NT)[:, None] & mrow[None, :]",
        '    pm = tl.load(PM + tt[:, None] * M + rm[None, :], mask=mk, other=float("-inf"))',
        "    ps = tl.load(PS + tt[:, None] * M + rm[None, :], mask=mk, other=0.0)",
        "    m_new = tl.maximum(mx, tl.max(pm, 0))",
        '    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)',
        f"    sx = sx * tl.exp2((mx - m_use) * {LOG2E})",
        f"    sx += tl.sum(ps * tl.exp2((pm - m_use[None, :]) * {LOG2E}), 0)",
        "    mx = m_new",
        "tgt = tl.load(T + rm, mask=mrow, other=IGNORE)",
        "zt = tl.load(PT + rm, mask=mrow, other=0.0)",
        "loss = mx + tl.log(tl.where(mrow, sx, 1.0)) - zt",
        "kept = tgt != IGNORE",
        "bad = kept & ((tgt < 0) | (tgt >= V))  # eager raises here: NaN, never a number",
        'loss = tl.where(bad, float("nan"), tl.where(kept, loss, 0.0))',
        "tl.store(LOSS + rm, loss, mask=mrow)",
    ]
    params = ["T", "PM", "PS", "PT", "LOSS", "M", "V", "NT", "IGNORE", "BLOCK_R: tl.constexpr",
              "BLOCK_T: tl.constexpr"]
    return f"@triton.jit\ndef {kname}_row({', '.join(params)}):\n{indent(body, 4)}\n"


def _total(kname: str) -> str:
    """One program: the rows' losses summed in a fixed order (and the kept targets counted)."""
    body = [
        "acc = tl.zeros([BLOCK], tl.float32)",
        "cnt = tl.zeros([BLOCK], tl.float32)",
        "for r0 in range(0, M, BLOCK):",
        "    r = r0 + tl.arange(0, BLOCK)",
        "    mr = r < M",
        "    acc += tl.load(LOSS + r, mask=mr, other=0.0)",
        "    cnt += (mr & (tl.load(T + r, mask=mr, other=IGNORE) != IGNORE)).to(tl.float32)",
        "total = tl.sum(acc, 0)",
        "if MEAN:",
        "    total = total / tl.sum(cnt, 0)",
        "tl.store(OUT, total)",
    ]
    params = ["LOSS", "T", "OUT", "M", "IGNORE", "MEAN: tl.constexpr", "BLOCK: tl.constexpr"]
    return f"@triton.jit\ndef {kname}_sum({', '.join(params)}):\n{indent(body, 4)}\n"


def render(spec: LinearCESpec, cfg: dict, kname: str, gname: str) -> Rendered:
    cfg = {**INFO.defaults, **(cfg or {})}
    kernel = "\n\n".join([_fused(spec, kname), _chunk(spec, kname), _rows(spec, kname), _total(kname)])
    bm, bn, bk = int(cfg["BLOCK_M"]), int(cfg["BLOCK_N"]), int(cfg["BLOCK_K"])
    chunk = max(bn, int(cfg["CHUNK_N"]) // bn * bn)
    args = "x, w, t, b" if spec.has_bias else "x, w, t"
    ii = int(spec.ignore_index)
    w = [
        "M, K = x.shape",
        "V = w.shape[0]",
        # the shapes eager refuses are refused here too (the kernels read K from x and walk w,
        # the targets and the bias with their own strides): never a result where torch raises
        "if w.dim() != 2 or w.shape[1] != K:",
        "    raise RuntimeError(f'mat1 and mat2 shapes cannot be multiplied ({M}x{K} and "
        "{w.shape[-1]}x{V})')",
        "if t.dim() != 1 or t.shape[0] != M:",
        "    raise ValueError(f'Expected input batch_size ({M}) to match target batch_size "
        "({t.shape[0] if t.dim() else 0}).')",
        *(["if b.numel() != V:",
           "    raise RuntimeError(f'the bias has {b.numel()} elements, the logits {V}')"]
          if spec.has_bias else []),
        "dev = x.device",
        "if M == 0:",
    ]
    if spec.reduction == "none":
        w.append("    return torch.zeros((0,), device=dev, dtype=torch.float32)")
    else:
        empty = 'float("nan")' if spec.reduction == "mean" else "0.0"  # torch: 0/0, an empty sum
        w.append(f"    return torch.full((), {empty}, device=dev, dtype=torch.float32)")
    w += [
        f"nt = _egg_cdiv(V, {bn})",
        "pm = torch.empty((nt, M), device=dev, dtype=torch.float32)",
        "ps = torch.empty_like(pm)",
        "pt = torch.empty((M,), device=dev, dtype=torch.float32)",
        "t = t.contiguous()",
        f"if {int(cfg['MODE'])} == 1 and V > 0:  # fused: the tiles of logits made in registers",
        # the interpreter (CPU tensors) emulates 16-bit dots wrongly: fp32 copies of the tiles
        f"    grid = (_egg_cdiv(M, {bm}) * nt,)",
        f"    {kname}_mm[grid](x, w, {'b' if spec.has_bias else 'x'}, t, pm, ps, pt, M, V, K,",
        "        x.stride(0), x.stride(1), w.stride(0), w.stride(1),",
        f"        EVEN_K=K % {bk} == 0, DOT_F32=dev.type == 'cpu', BLOCK_M={bm}, BLOCK_N={bn},",
        f"        BLOCK_K={bk}, GROUP_M={int(cfg['GROUP_M'])}, num_warps={int(cfg['num_warps'])},",
        f"        num_stages={int(cfg['num_stages'])})",
        # chunked: cuBLAS makes CHUNK_N columns at a time (the caching allocator hands the
        # freed chunk's memory to the next one); detached: the kernels build no autograd graph
        "else:",
        "    xd, wd = x.detach(), w.detach()",
        f"    for n0 in range(0, V, {chunk}):",
        f"        n1 = min(V, n0 + {chunk})",
    ]
    if spec.has_bias:
        w.append("        out = torch.addmm(b.detach()[n0:n1], xd, wd[n0:n1].t())")
    else:
        w.append("        out = torch.mm(xd, wd[n0:n1].t())")
    w += [
        f"        {kname}_lse[(_egg_cdiv(M, 64), _egg_cdiv(n1 - n0, {bn}))](out, t, pm, ps, pt, M, V,",
        f"            n0, out.stride(0), BLOCK_M=64, BLOCK_N={bn}, num_warps=4)",
        "loss = torch.empty((M,), device=dev, dtype=torch.float32)",
        f"{kname}_row[(_egg_cdiv(M, 16),)](t, pm, ps, pt, loss, M, V, nt, {ii}, BLOCK_R=16,",
        "    BLOCK_T=32, num_warps=4)",
    ]
    if spec.reduction == "none":
        w.append("return loss")
    else:
        w += ["out = torch.empty((), device=dev, dtype=torch.float32)",
              f"{kname}_sum[(1,)](loss, t, out, M, {ii}, MEAN={spec.reduction == 'mean'}, "
              "BLOCK=1024, num_warps=4)",
              "return out"]
    wrapper = f"def {gname}({args}):\n{indent(w, 4)}\n"
    return Rendered(kernel, wrapper, kname + "_mm", gname, cfg)
