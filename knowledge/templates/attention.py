"""Template: flash attention (forward), for F.scaled_dot_product_attention.

One program computes BLOCK_M query rows of one (batch, head): it walks the keys in BLOCK_N
blocks, keeping a running row maximum and sum (online softmax, principle alg-online-softmax) and
an fp32 accumulator of P V, so the S x S score matrix never reaches memory (principle
alg-flash-attention). Causal masking (top-left, as torch's ``is_causal``) stops the key walk at
the block's last row. Grouped-query attention maps query head h to key/value head
h // (H / H_kv). fp32 operands use 3xTF32 dots as the matmul template does.
"""
from __future__ import annotations

from dataclasses import dataclass

from knowledge.schema import TemplateInfo
from knowledge.templates import Rendered, indent
from knowledge.templates.matmul import dot_precision

INFO = TemplateInfo(
    name="attention",
    kind="attention",
    tunables={"BLOCK_M": [16, 32, 64, 128], "BLOCK_N": [16, 32, 64, 128], "num_warps": [4, 8],
              "num_stages": [1, 2, 3, 4]},
    defaults={"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2},
    principle_ids=["alg-flash-attention", "alg-online-softmax", "alg-no-lower-precision"],
    description="flash-attention forward: online softmax over key blocks, optional causal, GQA",
)


@dataclass
class AttentionSpec:
    dtype: str  # of q, k, v and the output
    causal: bool
    scale: float | None  # None: 1 / sqrt(head_dim)
    gqa: bool  # key/value heads may divide the query heads


def render(spec: AttentionSpec, cfg: dict, kname: str, gname: str) -> Rendered:
    cfg = {**INFO.defaults, **(cfg or {})}
    prec = dot_precision(spec.dtype)
    opt = f", input_precision={prec!r}" if prec else ""
    p_cast = "p" if spec.dtype == "float32" else "p.to(v.dtype)"
    body = [
        "pid_m = tl.program_id(0)",
        "bh = tl.program_id(1).to(tl.int64)",
        "b = bh // H",
        "h = bh % H",
        "hk = h // (H // HKV)",
        "rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
        "rd = tl.arange(0, BLOCK_D)",
        "md = rd < D",
        "q = tl.load(Q + b * sqb + h * sqh + rm[:, None] * sqm + rd[None, :] * sqd,",
        "            mask=(rm[:, None] < M) & md[None, :], other=0.0)",
        'm_i = tl.full([BLOCK_M], float("-inf"), tl.float32)',
        "l_i = tl.zeros([BLOCK_M], tl.float32)",
        "acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)",
        "hi = tl.minimum(N, (pid_m + 1) * BLOCK_M) if CAUSAL else N",
        "for n0 in range(0, hi, BLOCK_N):",
        "    rn = n0 + tl.arange(0, BLOCK_N)",
        "    mn = rn < N",
        "    kt = tl.load(K + b * skb + hk * skh + rn[None, :] * skn + rd[:, None] * skd,",
        "                 mask=mn[None, :] & md[:, None], other=0.0)",
        f"    s = tl.dot(q, kt{opt}) * QK_SCALE",  # scores in log2 units
        "    keep = mn[None, :]",
        "    if CAUSAL:",
        "        keep = keep & (rn[None, :] <= rm[:, None])",
        '    s = tl.where(keep, s, float("-inf"))',
        "    m_new = tl.maximum(m_i, tl.max(s, 1))",
        "    p = tl.exp2(s - m_new[:, None])",
        "    alpha = tl.exp2(m_i - m_new)",
        "    l_i = l_i * alpha + tl.sum(p, 1)",
        "    v = tl.load(V + b * svb + hk * svh + rn[:, None] * svn + rd[None, :] * svd,",
        "                mask=mn[:, None] & md[None, :], other=0.0)",
        f"    acc = tl.dot({p_cast}, v, acc * alpha[:, None]{opt})",
        "    m_i = m_new",
        "out = acc / l_i[:, None]",
        "tl.store(O + bh * M * D + rm[:, None] * D + rd[None, :], out.to(O.dtype.element_ty),",
        "         mask=(rm[:, None] < M) & md[None, :])",
    ]
    params = ["Q", "K", "V", "O", "sqb", "sqh", "sqm", "sqd", "skb", "skh", "skn", "skd",
              "svb", "svh", "svn", "svd", "H", "HKV", "M", "N", "D", "QK_SCALE",
              "CAUSAL: tl.constexpr", "BLOCK_M: tl.constexpr", "BLOCK_N: tl.constexpr",
              "BLOCK_D: tl.constexpr"]
    kernel = f"@triton.jit\ndef {kname}({', '.join(params)}):\n{indent(body, 4)}\n"
    scale = "1.0 / math.sqrt(D)" if spec.scale is None else repr(float(spec.scale))
    bm, bn = int(cfg["BLOCK_M"]), int(cfg["BLOCK_N"])
    w = [
        "q4, k4, v4 = (t if t.dim() == 4 else t.unsqueeze(1) for t in (q, k, v))",
        "B, H, M, D = q4.shape",
        "HKV, N = k4.shape[1], k4.shape[2]",
        "o = torch.empty(q4.shape, device=q.device, dtype=q.dtype)",
        "if o.numel() == 0:",
        "    return o if q.dim() == 4 else o.squeeze(1)",
        f"qk_scale = ({scale}) * 1.4426950408889634  # log2(e): the kernel uses exp2",
        f"grid = (triton.cdiv(M, {bm}), B * H)",
        f"{kname}[grid](q4, k4, v4, o, *q4.stride(), *k4.stride(), *v4.stride(), H, HKV, M, N, D,",
        f"    qk_scale, CAUSAL={spec.causal}, BLOCK_M={bm}, BLOCK_N={bn},",
        "    BLOCK_D=max(16, triton.next_power_of_2(D)),",
        f"    num_warps={int(cfg['num_warps'])}, num_stages={int(cfg['num_stages'])})",
        "return o if q.dim() == 4 else o.squeeze(1)",
    ]
    wrapper = f"def {gname}(q, k, v):\n{indent(w, 4)}\n"
    return Rendered(kernel, wrapper, kname, gname, cfg)
