"""Template: attention forward, for F.scaled_dot_product_attention (and hand-written attention
the canonical forms turn into it: codegen.rewrites attention_pattern).

Two mappings, chosen by the wrapper from the shapes (principles alg-flash-attention,
alg-split-kv-decode):
- FLASH (prefill): one program computes BLOCK_M query rows of one (batch, head): it walks the
  keys in BLOCK_N blocks, keeping a running row maximum and sum (online softmax, principle
  alg-online-softmax) and an fp32 accumulator of P V, so the S x S score matrix never reaches
  memory. Causal masking (top-left, as torch's ``is_causal``) is computed from the row and key
  indices: the key blocks wholly below the diagonal run without any mask, the ones the diagonal
  crosses with it, and the ones above it are never read. Causal programs start with the longest
  rows (the last query blocks) so the short ones fill the tail.
- SPLIT (decode: few query rows per key/value head): the query rows of the G = H / H_kv heads
  that share one key/value head are packed into one tile (GQA read through indexing: each key
  block is loaded once for all of them, never copied per head), and the key range is cut into
  SPLITS chunks walked by programs of their own (split-KV, flash-decoding), so that a handful of
  (batch, head) pairs still spread over every SM. Each chunk writes its unnormalized fp32 partial
  output with its row maximum and sum; a second kernel merges the chunks.

A mask tensor (scaled_dot_product_attention's attn_mask, Hugging Face's additive padding mask)
is read per [BLOCK_M, BLOCK_N] tile through the strides of its view broadcast to the scores
(stride 0 where it is broadcast over batch or heads): a bool mask sets -inf where False, an
additive one (or a bias: ALiBi's slopes) is added to the scaled scores in fp32. Soft capping
(Gemma's ``cap * tanh(scores)``) comes before any mask. With either, the scores stay in natural
units and the softmax takes exp of their difference to the row maximum (rounding s * log2(e)
of a large score would add an error eager does not make, and finfo.min * log2(e) would overflow
to -inf, where a row of finfo.min is uniform in eager, not NaN); otherwise log2(e) is folded into
the scale and the softmax uses exp2. A row with every score -inf gives 0 for
scaled_dot_product_attention (its safe softmax) and NaN for a softmax written out.

Key blocks a mask hides from every row of a tile are not read (principle mem-mask-skip-blocks):
before its key loop a program reads the mask tiles from each end of its key range until one
shows a key (a padded batch's cache past its sequence's length, a causal mask given as a
tensor: the blocks above the diagonal), and walks only the blocks between. A block hidden
whole changes neither the running maximum, the sum nor the accumulator (its P is 0), so the
result is the same, except where K or V hold NaN or inf in hidden positions: eager multiplies
them by 0 (NaN), the kernel never reads them.

Grouped-query attention maps query head h to key/value head h // (H / H_kv). Products of 16-bit
operands run on tensor cores with fp32 accumulation (P cast to the value dtype for P V, as
FlashAttention does); fp32 operands use 3xTF32 dots as the matmul template does.
"""
from __future__ import annotations

from dataclasses import dataclass

from knowledge.schema import TemplateInfo
from knowledge.templates import Rendered, indent, recorded_wrapper
from knowledge.templates.matmul import dot_precision

INFO = TemplateInfo(
    name="attention",
    kind="attention",
    tunables={"BLOCK_M": [16, 32, 64, 128], "BLOCK_N": [16, 32, 64, 128], "num_warps": [4, 8],
              "num_stages": [1, 2, 3, 4], "DECODE_ROWS": [16, 32, 64, 128],
              "SPLIT_PROGRAMS": [132, 264, 528, 1056]},
    defaults={"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "DECODE_ROWS": 64,
              "SPLIT_PROGRAMS": 528},
    principle_ids=["alg-flash-attention", "alg-split-kv-decode", "alg-online-softmax",
                   "alg-no-lower-precision", "mem-mask-skip-blocks"],
    description="attention forward: flash (online softmax over key blocks, causal from indices) "
                "or split-KV decode with GQA heads packed per key/value head",
)


#: warps of a split-KV program: its query tile is 16-64 packed rows (too short for Hopper's
#: warpgroup products), so it streams keys with 4 warps as flash-decoding kernels do
DECODE_WARPS = 4

#: query rows per head up to which attention takes the split-KV decode kernel whatever the group
#: size (speculative decoding's few tokens, a query head group wider than DECODE_ROWS): a flash
#: tile of 64 or 128 rows would hold this few, and each query head would read the cache alone
DECODE_QUERIES = 16


@dataclass
class AttentionSpec:
    dtype: str  # of q, k, v and the output
    causal: bool
    scale: float | None  # None: 1 / sqrt(head_dim)
    gqa: bool  # key/value heads may divide the query heads
    #: softmax (flash: online softmax) | relu (ReLU attention: relu of the scores, no
    #: normalization; masked scores are 0, partial sums simply add up)
    score: str = "softmax"
    #: a mask tensor the kernels read per [BLOCK_M, BLOCK_N] tile, broadcast over batch and
    #: heads by its strides: "" none | "add" (added to the scores) | "bool" (True: attend,
    #: False: -inf, as scaled_dot_product_attention reads a bool mask)
    mask: str = ""
    #: what a row whose every score is -inf gives: "nan" (softmax written out: 0 / 0) | "zero"
    #: (scaled_dot_product_attention's safe softmax)
    empty: str = "nan"
    #: soft capping (Gemma): the scaled scores S become ``softcap * tanh(S)`` before any mask
    #: (None: none); the 1/cap inside the tanh is part of ``scale``
    softcap: float | None = None
    #: where scale is None: the scale is factor / sqrt(head_dim)
    factor: float = 1.0
    #: mask "drop": the scores where the bool mask is True become this number (a padding mask's
    #: masked_fill: -inf, or a finite fill that a row masked whole makes uniform, as in eager)
    fill: float | None = None

    @property
    def natural(self) -> bool:
        """Are the kernels' scaled scores in natural units (an additive mask or a tanh comes
        first), brought to log2 units afterwards, rather than scaled by log2(e) at once?"""
        return self.mask in ("add", "drop") or self.softcap is not None


def _dots(spec: AttentionSpec) -> tuple[str, list[str]]:
    """The tl.dot options, and the lines that make ``pv``, the P of P V: P rounded to the value
    dtype for 16-bit operands (as FlashAttention does), back in fp32 where the dots run on fp32
    copies (the interpreter)."""
    prec = dot_precision(spec.dtype)
    opt = f", input_precision={prec!r}" if prec else ""
    if spec.dtype == "float32":
        return opt, ["pv = p"]
    return opt, ["pv = p.to(V.dtype.element_ty)", "if DOT_F32:", "    pv = pv.to(tl.float32)"]


def _exp(spec: AttentionSpec) -> str:
    """The softmax's exponential: exp2 of scores in log2 units, exp of natural ones."""
    return "tl.exp" if spec.natural else "tl.exp2"


def _softmax_step(spec: AttentionSpec) -> list[str]:
    """The online-softmax step on a score tile ``s`` (-inf where masked): a row that has seen no
    key yet keeps max -inf, so the exponent is taken against 0 there (no -inf - -inf)."""
    e = _exp(spec)
    return ["m_new = tl.maximum(m_i, tl.max(s, 1))",
            'm_use = tl.where(m_new == float("-inf"), 0.0, m_new)',
            f"p = {e}(s - m_use[:, None])",
            f"alpha = {e}(m_i - m_use)",
            "l_i = l_i * alpha + tl.sum(p, 1)"]


#: ReLU attention's step: the scores' positive part (masked scores are -inf: 0), no running
#: maximum or sum, so a tile's product adds to the accumulator as it is
RELU_STEP = ["p = tl.maximum(s, 0.0)"]


def _step(spec: AttentionSpec) -> tuple[list[str], str, list[str]]:
    """The score step, the accumulator the next product adds to, and the lines after it."""
    if spec.score == "relu":
        return RELU_STEP, "acc", []
    return _softmax_step(spec), "acc * alpha[:, None]", ["m_i = m_new"]


def _score_lines(spec: AttentionSpec, masked: bool) -> list[str]:
    """What the key block does to the scaled scores ``s`` before the softmax step: the soft cap
    (``SOFTCAP * tanh(s)``), then the mask tile (pointers ``arow``, rows ``amr`` made before
    the key loop): an additive mask is added in fp32 (natural units: QK_SCALE is natural then,
    spec.natural), a bool mask sets -inf where it is False."""
    lines = [f"s = {spec.softcap!r} * _egg_tanh(s)"] if spec.softcap is not None else []
    am = "amr & mn[None, :]" if masked else "amr"
    ap = "arow + rn[None, :] * san"
    if spec.mask == "add":
        lines.append(f"s = s + tl.load({ap}, mask={am}, other=0.0).to(tl.float32)")
    if spec.mask == "bool":
        lines += [f"am_t = tl.load({ap}, mask={am}, other=0)",
                  's = tl.where(am_t != 0, s, float("-inf"))']
    if spec.mask == "drop":
        fill = 'float("-inf")' if spec.fill == float("-inf") else repr(float(spec.fill))
        lines += [f"am_t = tl.load({ap}, mask={am}, other=0)",
                  f"s = tl.where(am_t != 0, {fill}, s)"]
    return lines


def _key_block(spec: AttentionSpec, masked: bool, bound: str, rows: str) -> list[str]:
    """One step over the key block at n0: scores, online softmax, P V. ``masked``: keys past
    ``bound`` and (causal) keys after the query row ``rows`` are masked; whole blocks load
    without a key mask, and without any mask when the head dim fills BLOCK_D (EVEN_D: a mask on
    a runtime D keeps the loads from being vectorized). A mask tensor (spec.mask) is read for
    every block."""
    opt, p_cast = _dots(spec)
    step, carry, after = _step(spec)
    kmask = "mn[None, :] & md[:, None]" if masked else "md[:, None]"
    vmask = "mn[:, None] & md[None, :]" if masked else "md[None, :]"
    kp = "K + kb + rn[None, :] * skn + rd[:, None] * skd"
    vp = "V + vb + rn[:, None] * svn + rd[None, :] * svd"
    def load(name: str, ptr: str, mask: str) -> list[str]:
        if masked:
            return [f"{name} = tl.load({ptr}, mask={mask}, other=0.0)"]
        return ["if EVEN_D:", f"    {name} = tl.load({ptr})", "else:",
                f"    {name} = tl.load({ptr}, mask={mask}, other=0.0)"]

    lines = ["rn = n0 + tl.arange(0, BLOCK_N)", f"mn = rn < {bound}", *load("kt", kp, kmask)]
    lines += [
        "if DOT_F32:",
        "    kt = kt.to(tl.float32)",
        f"s = tl.dot(q, kt{opt}) * QK_SCALE",  # scores in log2 units (natural: spec.natural)
    ]
    lines += _score_lines(spec, masked)
    if masked:
        lines += ["keep = mn[None, :]",
                  "if CAUSAL:",
                  f"    keep = keep & (rn[None, :] <= {rows}[:, None])",
                  's = tl.where(keep, s, float("-inf"))']
    lines += step
    lines += load("v", vp, vmask)
    lines += [
        "if DOT_F32:",
        "    v = v.to(tl.float32)",
        *p_cast,
        f"acc = tl.dot(pv, v, {carry}{opt})",
        *after,
    ]
    return lines


#: the mask tensor and its strides (batch, head, query row, key): kernel parameters when
#: spec.mask
MASK_PARAMS = ["A", "sab", "sah", "sam", "san"]


def _hidden(spec: AttentionSpec) -> tuple[str, str] | None:
    """(the value a masked-out entry of the mask tensor reads as, the test of an entry that
    shows its key) where a mask can hide a key: -inf added, False in a bool mask, True in a
    mask whose fill is -inf; None otherwise (no mask, a finite fill: every key counts)."""
    if spec.mask == "add":
        return 'float("-inf")', 'sa != float("-inf")'  # NaN shows (eager's NaN is kept)
    if spec.mask == "bool":
        return "0", "sa != 0"
    if spec.mask == "drop" and spec.fill == float("-inf"):
        return "1", "sa == 0"
    return None


def _loops(spec: AttentionSpec, lo: str, hi: str) -> tuple[list[str], str, str]:
    """The lines before the key loops over [lo, hi) and the loops' headers: whole blocks (up to
    ``full``) without a key mask, then the rest with it; where a mask can hide keys, the scan
    first (_scan_lines) and only the blocks between the first and the last a tile's rows see."""
    if _hidden(spec) is None:
        return [], f"for n0 in range({lo}, full, BLOCK_N):", f"for n0 in range(full, {hi}, BLOCK_N):"
    return (_scan_lines(spec, lo, hi), "for n0 in range(vlo, tl.minimum(full, vhi), BLOCK_N):",
            "for n0 in range(tl.maximum(full, vlo), vhi, BLOCK_N):")


def _scan_lines(spec: AttentionSpec, lo: str, hi: str) -> list[str]:
    """``vlo``, ``vhi``: the key range [lo, hi) without the blocks at either end that the mask
    hides from every row of the tile (rows ``amr``, mask rows ``arow``); blocks start at lo
    every BLOCK_N. Each end is read tile by tile until a tile shows a key (a tile outside
    [lo, hi) shows none). Only for a mask that can hide keys (_hidden)."""
    other, shows = _hidden(spec)

    def tile(at: str) -> list[str]:
        return ["sk = " + at + " + tl.arange(0, BLOCK_N)",
                f"sa = tl.load(arow + sk[None, :] * san, mask=amr & (sk[None, :] >= {lo}) & (sk[None, :] < {hi}), "
                f"other={other})",
                f"nv = tl.sum(({shows}).to(tl.int32))"]

    return [f"vlo = {lo} + tl.zeros([], tl.int32)", *tile("vlo"),
            f"while (vlo < {hi}) & (nv == 0):", "    vlo += BLOCK_N", *["    " + ln for ln in tile("vlo")],
            # the last block's start (a tile past the range shows nothing: the loop steps back)
            f"vt = vlo + (({hi} - vlo - 1) // BLOCK_N) * BLOCK_N", *tile("vt"),
            "while (vt >= vlo) & (nv == 0):", "    vt -= BLOCK_N", *["    " + ln for ln in tile("vt")],
            f"vhi = tl.minimum({hi}, vt + BLOCK_N)"]


def _normalize(spec: AttentionSpec, acc: str, l: str) -> str:
    """out = acc / l (ReLU attention: acc); a row with no key left (every score -inf, l = 0)
    gives 0 where spec.empty says so (scaled_dot_product_attention), else 0 / 0 = NaN as the
    softmax written out does."""
    if spec.score == "relu":
        return f"out = {acc}"
    if spec.empty == "zero":
        return f"out = tl.where({l} == 0.0, 0.0, {acc} / {l})"
    return f"out = {acc} / {l}"


def _flash(spec: AttentionSpec, kname: str) -> str:
    body = [
        "pid_m = tl.program_id(0)",
        "if CAUSAL:  # the longest rows first: the short ones fill the tail",
        "    pid_m = tl.num_programs(0) - 1 - pid_m",
        "bh = tl.program_id(1).to(tl.int64)",
        "b = bh // H",
        "h = bh % H",
        "hk = h // (H // HKV)",
        "kb = b * skb + hk * skh",
        "vb = b * svb + hk * svh",
        "rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
        "rd = tl.arange(0, BLOCK_D)",
        "md = rd < D",
        "q = tl.load(Q + b * sqb + h * sqh + rm[:, None] * sqm + rd[None, :] * sqd,",
        "            mask=(rm[:, None] < M) & md[None, :], other=0.0)",
        "if DOT_F32:",
        "    q = q.to(tl.float32)",
        'm_i = tl.full([BLOCK_M], float("-inf"), tl.float32)',
        "l_i = tl.zeros([BLOCK_M], tl.float32)",
        "acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)",
    ]
    if spec.mask:  # the mask's rows of this block (stride 0 where it is broadcast)
        body += ["arow = A + b * sab + h * sah + rm[:, None] * sam", "amr = rm[:, None] < M"]
    body += [
        # key blocks wholly visible to every row of this block and inside N: no mask
        "full = (N // BLOCK_N) * BLOCK_N",
        "if CAUSAL:",
        "    full = tl.minimum(full, pid_m * BLOCK_M)",
        "    hi = tl.minimum(N, (pid_m + 1) * BLOCK_M)",
        "else:",
        "    hi = N",
    ]
    scan, whole, edge = _loops(spec, "0", "hi")
    body += [*scan, whole]
    body += ["    " + ln for ln in _key_block(spec, False, "N", "rm")]
    body.append(edge + "  # the diagonal and the edge: masked")
    body += ["    " + ln for ln in _key_block(spec, True, "N", "rm")]
    body += [
        _normalize(spec, "acc", "l_i[:, None]"),
        "tl.store(O + bh * M * D + rm[:, None] * D + rd[None, :], out.to(O.dtype.element_ty),",
        "         mask=(rm[:, None] < M) & md[None, :])",
    ]
    params = ["Q", "K", "V", "O", "sqb", "sqh", "sqm", "sqd", "skb", "skh", "skn", "skd",
              "svb", "svh", "svn", "svd", *MASK_PARAMS[:5 if spec.mask else 0], "H", "HKV", "M", "N", "D", "QK_SCALE",
              "CAUSAL: tl.constexpr", "DOT_F32: tl.constexpr", "EVEN_D: tl.constexpr",
              "BLOCK_M: tl.constexpr", "BLOCK_N: tl.constexpr", "BLOCK_D: tl.constexpr"]
    return f"@triton.jit\ndef {kname}({', '.join(params)}):\n{indent(body, 4)}\n"


def _split(spec: AttentionSpec, kname: str) -> str:
    """Split-KV decode: the G * M query rows of key/value head hk packed as rows r (head
    hk * G + r // M, query r % M), BLOCK_M of them a tile; program ((b * HKV + hk) * RT + t, s)
    holds tile t of the RT = cdiv(G * M, BLOCK_M) and walks keys [s * CHUNK, (s + 1) * CHUNK)
    (Falcon's 71 query heads on one cache: two tiles of 64, the cache read twice, the second
    time mostly from L2, where one program per query head would read it 71 times)."""
    body = [
        "G = H // HKV",
        "RT = tl.cdiv(G * M, BLOCK_M)",
        "pid = tl.program_id(0).to(tl.int64)",
        "bhk = pid // RT",
        "sp = tl.program_id(1)",
        "b = bhk // HKV",
        "hk = bhk % HKV",
        "r = (pid % RT) * BLOCK_M + tl.arange(0, BLOCK_M)",
        "mr = r < G * M",
        "hq = hk * G + r // M",
        "mq = r % M",
        "rd = tl.arange(0, BLOCK_D)",
        "md = rd < D",
        "q = tl.load(Q + b * sqb + hq[:, None] * sqh + mq[:, None] * sqm + rd[None, :] * sqd,",
        "            mask=mr[:, None] & md[None, :], other=0.0)",
        "if DOT_F32:",
        "    q = q.to(tl.float32)",
        "kb = b * skb + hk * skh",
        "vb = b * svb + hk * svh",
        'm_i = tl.full([BLOCK_M], float("-inf"), tl.float32)',
        "l_i = tl.zeros([BLOCK_M], tl.float32)",
        "acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)",
    ]
    if spec.mask:  # each packed row's head and query row of the mask
        body += ["arow = A + b * sab + hq[:, None] * sah + mq[:, None] * sam", "amr = mr[:, None]"]
    body += [
        "lo = sp * CHUNK",
        "hi = tl.minimum(NE, lo + CHUNK)",
        # whole key blocks of the chunk need no key mask (causal decode rows: always masked)
        "full = lo if CAUSAL else lo + ((hi - lo) // BLOCK_N) * BLOCK_N",
    ]
    scan, whole, edge = _loops(spec, "lo", "hi")
    body += [*scan, whole]
    body += ["    " + ln for ln in _key_block(spec, False, "hi", "mq")]
    body.append(edge + "  # the chunk's last, partial block: masked")
    body += ["    " + ln for ln in _key_block(spec, True, "hi", "mq")]
    body += [
        "om = mr[:, None] & md[None, :]",
        "if SPLITS == 1:  # one chunk: normalize and store the output directly",
        "    " + _normalize(spec, "acc", "l_i[:, None]"),
        "    tl.store(O + ((b * H + hq[:, None]) * M + mq[:, None]) * D + rd[None, :],",
        "             out.to(O.dtype.element_ty), mask=om)",
        "else:",
        "    row = (bhk * SPLITS + sp) * (G * M) + r",
        "    tl.store(OP + row[:, None] * D + rd[None, :], acc, mask=om)",
        "    tl.store(MP + row, m_i, mask=mr)",
        "    tl.store(LP + row, l_i, mask=mr)",
    ]
    params = ["Q", "K", "V", "O", "OP", "MP", "LP", "sqb", "sqh", "sqm", "sqd", "skb", "skh",
              "skn", "skd", "svb", "svh", "svn", "svd", *MASK_PARAMS[:5 if spec.mask else 0], "H", "HKV", "M", "NE", "D", "QK_SCALE",
              "CHUNK", "SPLITS: tl.constexpr", "CAUSAL: tl.constexpr", "DOT_F32: tl.constexpr",
              "EVEN_D: tl.constexpr", "BLOCK_M: tl.constexpr", "BLOCK_N: tl.constexpr", "BLOCK_D: tl.constexpr"]
    return f"@triton.jit\ndef {kname}_split({', '.join(params)}):\n{indent(body, 4)}\n"


def _merge(kname: str, spec: AttentionSpec) -> str:
    """One query row per program: the chunks' partials rescaled to their common maximum (ReLU
    attention: added up)."""
    body = [
        "pid = tl.program_id(0).to(tl.int64)",
        "rows = G * M",
        "bhk = pid // rows",
        "r = pid % rows",
        "b = bhk // HKV",
        "h = (bhk % HKV) * G + r // M",
        "m = r % M",
        "s = tl.arange(0, SPLITS_P2)",
        "ms = s < SPLITS",
        "row = (bhk * SPLITS + s) * rows + r",
        'mp = tl.load(MP + row, mask=ms, other=float("-inf"))',
        "lp = tl.load(LP + row, mask=ms, other=0.0)",
        "mx = tl.max(mp, 0)",
        'mx = tl.where(mx == float("-inf"), 0.0, mx)',
        f"w = {_exp(spec)}(mp - mx)",
        "l = tl.sum(lp * w, 0)",
        "rd = tl.arange(0, BLOCK_D)",
        "md = rd < D",
        "op = tl.load(OP + row[:, None] * D + rd[None, :], mask=ms[:, None] & md[None, :], other=0.0)",
        "out = tl.sum(op, 0)" if spec.score == "relu" else _normalize(spec, "tl.sum(op * w[:, None], 0)", "l"),
        "tl.store(O + ((b * H + h) * M + m) * D + rd, out.to(O.dtype.element_ty), mask=md)",
    ]
    params = ["O", "OP", "MP", "LP", "H", "HKV", "G", "M", "D", "SPLITS",
              "SPLITS_P2: tl.constexpr", "BLOCK_D: tl.constexpr"]
    return f"@triton.jit\ndef {kname}_merge({', '.join(params)}):\n{indent(body, 4)}\n"


def render(spec: AttentionSpec, cfg: dict, kname: str, gname: str) -> Rendered:
    cfg = {**INFO.defaults, **(cfg or {})}
    kernel = "\n\n".join([_flash(spec, kname), _split(spec, kname), _merge(kname, spec)])
    scale = f"{float(spec.factor)!r} / math.sqrt(D)" if spec.scale is None else repr(float(spec.scale))
    bm, bn = int(cfg["BLOCK_M"]), int(cfg["BLOCK_N"])
    nw, ns = int(cfg["num_warps"]), int(cfg["num_stages"])
    causal = bool(spec.causal)
    ma = "am, *am.stride(), " if spec.mask else ""  # the mask and its strides
    w = [
        "q4, k4, v4 = (t if t.dim() == 4 else t.unsqueeze(1) for t in (q, k, v))",
        "B, H, M, D = q4.shape",
        "HKV, N = k4.shape[1], k4.shape[2]",
        # the shapes scaled_dot_product_attention refuses are refused here too (a drop-in never
        # returns a result where PyTorch raises): heads that do not divide, mismatched operands
        f"if HKV == 0 or H % HKV{'' if spec.gqa else ' or H != HKV'}:",
        "    raise RuntimeError(f'Number of heads in key and value must divide the number of heads "
        "in query (query {H}, key/value {HKV})')",
        "if k4.shape[0] != B or k4.shape[3] != D or tuple(v4.shape) != tuple(k4.shape):",
        "    raise RuntimeError(f'scaled_dot_product_attention: query {tuple(q.shape)}, key "
        "{tuple(k.shape)} and value {tuple(v.shape)} do not match')",
    ]
    if spec.mask:
        # the mask broadcast to the scores' shape as PyTorch broadcasts it (a view: size-1 dims
        # of stride 0, never a copy), raising where it does not broadcast as PyTorch raises
        w += ["am = torch.broadcast_to(mask, tuple(q.shape[:-1]) + (k.shape[-2],))",
              "am = am if am.dim() == 4 else am.unsqueeze(1)"]
    w += [
        "o = rec.empty(q4.shape, q.dtype, q.device)",
        "if o.numel() == 0:",
        "    return rec.done(o if q.dim() == 4 else o.squeeze(1))",
        f"qk_scale = {scale}  # natural units: the kernels use exp (a cap or an additive mask)"
        if spec.natural else
        f"qk_scale = ({scale}) * 1.4426950408889634  # log2(e): the kernels use exp2"
        if spec.score == "softmax" else f"qk_scale = {scale}  # ReLU attention: the scores themselves",
        # the interpreter (CPU tensors) emulates 16-bit dots wrongly: they run on fp32 copies of
        # the loaded tiles there, which a tensor core's fp32-accumulated product equals
        "f32 = q.device.type == 'cpu'",
        "BD = max(16, _egg_pow2(D))",
        "G = H // HKV",
        # decode: GQA rows packed (in tiles of DECODE_ROWS), keys split; also where a flash
        # tile's rows would be mostly empty (each query head would read the cache on its own)
        f"if G * M <= {int(cfg['DECODE_ROWS'])} or M <= {DECODE_QUERIES}:",
        f"    ne = min(N, M) if {causal} else N  # top-left causal: row m sees keys <= m",
        f"    BR = max(16, min(_egg_pow2(G * M), {int(cfg['DECODE_ROWS'])}))",
        "    rt = _egg_cdiv(G * M, BR)  # row tiles per (b, kv head)",
        f"    want = _egg_cdiv({int(cfg['SPLIT_PROGRAMS'])}, B * HKV * rt)  # splits per row tile",
        f"    splits = max(1, min(_egg_cdiv(ne, {bn}), want))",
        f"    chunk = max(1, _egg_cdiv(_egg_cdiv(ne, splits), {bn})) * {bn}",
        "    splits = max(1, _egg_cdiv(ne, chunk))",
        "    if splits > 1:",
        "        op = rec.empty((B * HKV * splits * G * M, D), torch.float32, q.device)",
        "        mp = rec.empty((B * HKV * splits * G * M,), torch.float32, q.device)",
        "        lp = rec.empty((B * HKV * splits * G * M,), torch.float32, q.device)",
        "    else:",
        "        op = mp = lp = o",
        f"    rec.launch({kname}_split, (B * HKV * rt, splits))(q4, k4, v4, o, op, mp, lp, *q4.stride(), *k4.stride(),",
        f"        *v4.stride(), {ma}H, HKV, M, ne, D, qk_scale, chunk, SPLITS=splits,",
        f"        CAUSAL={causal}, DOT_F32=f32, EVEN_D=D == BD, BLOCK_M=BR, BLOCK_N={bn}, BLOCK_D=BD,",
        f"        num_warps={min(nw, DECODE_WARPS)}, num_stages={ns})",
        "    if splits > 1:",
        f"        rec.launch({kname}_merge, (B * HKV * G * M,))(o, op, mp, lp, H, HKV, G, M, D, splits,",
        "            SPLITS_P2=_egg_pow2(splits), BLOCK_D=BD, num_warps=4)",
        "    return rec.done(o if q.dim() == 4 else o.squeeze(1))",
        # causal blocks: BLOCK_N divides BLOCK_M, so the unmasked key blocks end on a row block
        f"BN = min({bn}, {bm}) if {causal} else {bn}",
        f"grid = (_egg_cdiv(M, {bm}), B * H)",
        f"rec.launch({kname}, grid)(q4, k4, v4, o, *q4.stride(), *k4.stride(), *v4.stride(), {ma}H, HKV, M, N, D,",
        f"    qk_scale, CAUSAL={causal}, DOT_F32=f32, EVEN_D=D == BD, BLOCK_M={bm}, BLOCK_N=BN,",
        "    BLOCK_D=BD,",
        f"    num_warps={nw}, num_stages={ns})",
        "return rec.done(o if q.dim() == 4 else o.squeeze(1))",
    ]
    params = ["q", "k", "v"] + (["mask"] if spec.mask else [])
    return Rendered(kernel, recorded_wrapper(gname, params, w), kname, gname, cfg)
