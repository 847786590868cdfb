"""Template: matrix product with a fused epilogue (linear, mm, bmm, matmul).

One program computes a BLOCK_M x BLOCK_N tile of the product, accumulating in fp32 over K in
BLOCK_K steps on tensor cores; the epilogue (a linear layer's bias, then any pointwise chain over
the product, reading further inputs broadcast to the output) runs on the tile in registers before
the one store (principles alg-matmul-epilogue, alg-library-tail-fusion). Programs are numbered in
groups of GROUP_M tile rows so that consecutive programs share B panels in L2
(tile-grid-mapping); batched products put the batch on grid axis 1. Products with few output
tiles and a long K loop split K (SPLIT_K > 1): each program sums one range of K into an fp32
partial, and a second kernel adds the partials in a fixed order and applies the epilogue.

fp32 operands use 3xTF32 (``input_precision="tf32x3"``): each operand is split into a TF32 part
and a TF32 remainder and three tensor-core products are summed, which keeps the error near fp32's
(principle alg-no-lower-precision; the verifier's float64 guard checks it per problem). fp16 and
bf16 operands use the tensor cores directly, as cuBLAS does.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from knowledge.schema import TemplateInfo
from knowledge.templates import (Rendered, Stmt, compute_type, indent, recorded_return, recorded_wrapper,
                                 stmt_lines)
from knowledge.templates import program as P

INFO = TemplateInfo(
    name="matmul",
    kind="matmul",
    tunables={"BLOCK_M": [32, 64, 128, 256], "BLOCK_N": [32, 64, 128, 256],
              "BLOCK_K": [16, 32, 64, 128], "GROUP_M": [1, 8], "num_warps": [4, 8],
              "num_stages": [2, 3, 4, 5], "SPLIT_K": [1, 2, 4, 8, 16, 32, 64]},
    defaults={"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8,
              "num_stages": 3, "SPLIT_K": 1},
    principle_ids=["alg-matmul-epilogue", "alg-no-lower-precision", "alg-fp32-accumulate",
                   "tile-grid-mapping"],
    description="tiled matrix product (linear/mm/bmm/matmul) with bias and pointwise epilogue",
)


@dataclass
class MatmulSpec:
    """C = A @ B (B given as [N, K] when ``b_nk``: a linear layer's weight), then the epilogue.

    ``batched``: A is [..., M, K] and B [..., K, N] with equal leading dims; otherwise A's leading
    dims fold into M and B is 2-d. The product is ``acc``; epilogue inputs are broadcast to the
    output's shape.
    """

    in_dtypes: list[str]
    a: int
    b: int
    b_nk: bool
    batched: bool
    bias: int | None
    epi_inputs: list[int]
    epi_stmts: list[Stmt]
    outputs: list[tuple[str, str]]
    compute: str = "fp32"
    #: rw-dequant-program: B's instructions (knowledge/templates/program.py) and the slot of
    #: each stored tensor it reads (``b`` is the first); B itself is never in memory
    program: tuple | None = None
    leaves: list[int] = field(default_factory=list)


def dot_precision(dtype: str) -> str | None:
    """The tl.dot input precision for operands of this dtype (None: the dtype's own)."""
    return "tf32x3" if dtype == "float32" else None


def _epilogue(spec: MatmulSpec, ct: str, rm: str, rn: str, bias_row: str) -> list[str]:
    """Bias, epilogue loads and statements and the stores, on output indices ``bid``, ``rm``,
    ``rn`` (tile-shaped in the product kernel, flat in the split-K sum) under ``mask``."""
    lines = []
    if ct != "tl.float32":
        lines.append(f"acc = acc.to({ct})")
    if spec.bias is not None:
        lines.append(f"acc = acc + tl.load(X{spec.bias} + rn * s_bias, mask=rn < N, other=0.0)"
                     f".to({ct}){bias_row}")
    for i in spec.epi_inputs:
        idx = f"bid * E{i}_b + {rm} * E{i}_m + {rn} * E{i}_n"
        ld = f"tl.load(X{i} + {idx}, mask=mask, other=0)"
        lines.append(f"x{i} = {ld}" if spec.in_dtypes[i] == "bool" else f"x{i} = {ld}.to({ct})")
    lines += stmt_lines(spec.epi_stmts)
    lines.append(f"out_idx = bid * M * N + {rm} * N + {rn}")
    for j, (var, _dt) in enumerate(spec.outputs):
        lines.append(f"tl.store(O{j} + out_idx, ({var}).to(O{j}.dtype.element_ty), mask=mask)")
    return lines


def _loop(spec: MatmulSpec) -> list[str]:
    """The K loop's head: A's and B's tiles loaded."""
    return [f"b_ptrs = X{spec.b} + bid * sbb + (k_lo + rk[:, None]) * sbk + rbn[None, :] * sbn",
            "for k0 in range(k_lo, k_hi, BLOCK_K):",
            "    if EVEN_K:",
            "        a = tl.load(a_ptrs)",
            "        b = tl.load(b_ptrs)",
            "    else:",
            "        kr = k_hi - k0",
            "        a = tl.load(a_ptrs, mask=rk[None, :] < kr, other=0.0)",
            "        b = tl.load(b_ptrs, mask=rk[:, None] < kr, other=0.0)"]


def _leaves(program) -> list[tuple]:
    """The program's stored tensors, in its leaf order."""
    return sorted((ins for ins in program or () if ins[0] == "leaf"), key=lambda ins: ins[3])


def _program_loop(spec: MatmulSpec, bk: int) -> list[str]:
    """The K loop's head when B is computed (rw-dequant-program): A's tile loaded, B's tile
    computed from the stored tensors as a [BLOCK_N, BLOCK_K] tile (k along the tile's rows of
    registers: a weight stored row-major over K loads contiguous bytes), transposed for the dot.
    Whole steps (EVEN_K) write k as kb * BLOCK_K + rk, so what is constant over a step (a
    group's scale where BLOCK_K divides the group) is computed once per column, and two nibbles
    stacked and merged along K are tl.interleave of their pieces, loaded at half the columns;
    a partial step clamps k (every load stays inside its tensor) and zeroes the rows past K."""
    prog = spec.program
    k_dim, n_dim = (prog[-1][1][1], prog[-1][1][0]) if spec.b_nk else tuple(prog[-1][1])
    nv = P.var("rbn[:, None]", n_dim)
    kblocks = -(-k_dim // bk)

    def tile(kv, prefix, steps=None):
        lines, name = P.lower(prog, [nv, kv] if spec.b_nk else [kv, nv],
                              lambda j: f"X{spec.leaves[j]}", lambda j, d: f"L{j}_{d}",
                              prefix=prefix, steps=steps)
        return ["        " + ln for ln in lines] + [
            f"        b = tl.trans(tl.broadcast_to({name}, (BLOCK_N, BLOCK_K)))"]

    kb = P.var("kb", kblocks)
    return ["for k0 in range(k_lo, k_hi, BLOCK_K):",
            "    if EVEN_K:",
            "        a = tl.load(a_ptrs)",
            "        kb = k0 // BLOCK_K",
            *tile(P.step_k(kb, "rk[None, :]", bk), "pg", (nv, kb, "rk[None, :]", bk)),
            "    else:",
            "        kr = k_hi - k0",
            "        a = tl.load(a_ptrs, mask=rk[None, :] < kr, other=0.0)",
            "        kk = tl.minimum(k0 + rk, K - 1)",
            "        if I64:",
            "            kk = kk.to(tl.int64)",
            *tile(P.var("kk[None, :]", k_dim), "pt"),
            "        b = tl.where(rk[:, None] < kr, b, 0.0)"]


def render(spec: MatmulSpec, cfg: dict, kname: str, gname: str) -> Rendered:
    cfg = {**INFO.defaults, **(cfg or {})}
    n_in = len(spec.in_dtypes)
    ct = compute_type(spec)
    epi = list(spec.epi_inputs)
    common = [f"X{i}" for i in range(n_in)] + [f"O{j}" for j in range(len(spec.outputs))]
    common += ["M", "N", "s_bias"]
    for i in epi:
        common += [f"E{i}_b", f"E{i}_m", f"E{i}_n"]
    prog = spec.program
    lstr = [f"L{j}_{d}" for j, ins in enumerate(_leaves(prog)) for d in range(len(ins[1]))]
    params = common + ["P", "K", "sab", "sam", "sak", "sbb", "sbk", "sbn", *lstr, "K_SPLIT",
                       "I64: tl.constexpr", "EVEN_K: tl.constexpr", "DOT_F32: tl.constexpr",
                       "SPLIT_K: tl.constexpr",
                       "BLOCK_M: tl.constexpr", "BLOCK_N: tl.constexpr", "BLOCK_K: tl.constexpr",
                       "GROUP_M: tl.constexpr"]
    prec = dot_precision(spec.in_dtypes[spec.a])
    dot = f"tl.dot(a, b, acc, input_precision={prec!r})" if prec else "tl.dot(a, b, acc)"
    body = [
        "pid = tl.program_id(0)",
        "bid = tl.program_id(1) // SPLIT_K",
        "sk = tl.program_id(1) % SPLIT_K",
        "num_m = tl.cdiv(M, BLOCK_M)",
        "num_n = tl.cdiv(N, BLOCK_N)",
        "width = GROUP_M * num_n",
        "first_m = (pid // width) * GROUP_M",
        "rows = tl.minimum(num_m - first_m, GROUP_M)",
        "pid_m = first_m + (pid % width) % rows",
        "pid_n = (pid % width) // rows",
        "rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
        "rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
        "rk = tl.arange(0, BLOCK_K)",
        "if I64:",
        "    rm = rm.to(tl.int64)",
        "    rn = rn.to(tl.int64)",
        "    bid = bid.to(tl.int64)",
        # rows and columns past the edge load a valid row (the result is masked at the store),
        # so the K loop needs no M/N masks
        "ram = rm % M",
        "rbn = rn % N",
        # split-K: this program sums K_SPLIT values of K (a multiple of BLOCK_K) from sk * K_SPLIT
        "k_lo = sk * K_SPLIT",
        "k_hi = tl.minimum(k_lo + K_SPLIT, K)",
        f"a_ptrs = X{spec.a} + bid * sab + ram[:, None] * sam + (k_lo + rk[None, :]) * sak",
        "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
        *(_program_loop(spec, int(cfg["BLOCK_K"])) if prog else _loop(spec)),
        "    if DOT_F32:  # the interpreter emulates 16-bit dots wrongly: fp32 copies of the tiles",
        "        a = a.to(tl.float32)",
        "        b = b.to(tl.float32)",
        *(["    else:  # integer weight tiles (rw-dequant-linear) converted in registers",
           "        b = b.to(a.dtype)"] if spec.in_dtypes[spec.b] != spec.in_dtypes[spec.a] and not prog else []),
        f"    acc = {dot}",
        "    a_ptrs += BLOCK_K * sak",
        *([] if prog else ["    b_ptrs += BLOCK_K * sbk"]),
        "mask = (rm[:, None] < M) & (rn[None, :] < N)",
        "if SPLIT_K == 1:",
    ]
    body += ["    " + ln for ln in _epilogue(spec, ct, "rm[:, None]", "rn[None, :]", "[None, :]")]
    body += ["else:  # fp32 partial sums, added up (and the epilogue applied) by the _sum kernel",
             "    nbt = tl.num_programs(1) // SPLIT_K",
             "    p_idx = ((sk * nbt + bid) * M + rm[:, None]) * N + rn[None, :]",
             "    tl.store(P + p_idx, acc, mask=mask)"]
    kernel = f"@triton.jit\ndef {kname}({', '.join(params)}):\n{indent(body, 4)}\n"
    sbody = [
        "offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)",
        "if I64:",
        "    offs = offs.to(tl.int64)",
        "mask = offs < TOTAL",
        "acc = tl.zeros([BLOCK], dtype=tl.float32)",
        "for s in range(0, SPLITS):",
        "    acc += tl.load(P + s * TOTAL + offs, mask=mask, other=0.0)",
        "bid = offs // (M * N)",
        "rm = (offs // N) % M",
        "rn = offs % N",
    ] + _epilogue(spec, ct, "rm", "rn", "")
    sparams = common + ["P", "TOTAL", "SPLITS", "I64: tl.constexpr", "BLOCK: tl.constexpr"]
    kernel += (f"\n\n@triton.jit\ndef {kname}_sum({', '.join(sparams)}):\n{indent(sbody, 4)}\n")

    ret = recorded_return(len(spec.outputs))
    # A3 is (BT, M, K) and B3 (BT, K, N) (views: a linear weight is read through its transpose)
    bias = f"a{spec.bias}" if spec.bias is not None else "None"
    w = [f"A, B = a{spec.a}, a{spec.b}"]
    check = [f"_egg_mm_check(A, B, {bias}, {bool(spec.b_nk)}, {bool(spec.batched)})", "K = A.shape[-1]"]
    if prog:  # B is computed: the stored tensors checked against the program, B3 the first
        kdim, ndim = (prog[-1][1][1], prog[-1][1][0]) if spec.b_nk else prog[-1][1]
        leaves = ", ".join(f"a{i}" for i in spec.leaves)
        w += [f"_egg_leaves_fit(_EGG_LEAVES_{gname}, ({leaves},))", "K = A.shape[-1]",
              f"N = {ndim}",
              "A3 = A.reshape(-1, K).unsqueeze(0)", "B3 = B", "M = A3.shape[1]",
              f"if K != {kdim}:",
              f"    raise RuntimeError(f'mat1 and mat2 shapes cannot be multiplied ({{M}}x{{K}} and {kdim}x{ndim})')"]
    elif spec.batched:
        w += check + ["M, N = A.shape[-2], B.shape[-1]",
              "A3, B3 = A.reshape(-1, M, K), B.reshape(-1, K, N)"]
    else:
        w += check + ["N = B.shape[0]" if spec.b_nk else "N = B.shape[1]",
              "A3 = A.reshape(-1, K).unsqueeze(0)",
              "B3 = (B.t() if B.dim() == 2 else B).unsqueeze(0)" if spec.b_nk else "B3 = B.unsqueeze(0)",
              "M = A3.shape[1]"]
    w += ["shape = tuple(A.shape[:-1]) + (N,)", "BT = A3.shape[0]"]
    if prec == "tf32x3":
        # Hopper's TF32 tensor-core instructions read both operands K-major from shared memory,
        # and its asynchronous copies want 16-byte aligned rows; other layouts make Triton fall
        # back to slower instructions (measured on the H200: 2x on a transposed A). One copy of
        # an operand (2 x its bytes) is small next to the product's K-fold reuse of it.
        w += ["if K > 1:",
              "    A3 = _egg_k_major(A3)",
              "    B3 = _egg_k_major(B3.transpose(1, 2)).transpose(1, 2)"]
    w += ["sab, sam, sak = A3.stride()",
          "sbb, sbk, sbn = 0, 0, 0" if prog else "sbb, sbk, sbn = B3.stride()"]
    if not spec.batched:
        w += ["sab, sbb = 0, 0"]
    w += [f"o{j} = rec.empty(shape, torch.{dt}, A.device)" for j, (_v, dt) in enumerate(spec.outputs)]
    w += ["if o0.numel() == 0:", f"    return {ret}"]
    launch = [f"a{i}" for i in range(n_in)]
    launch[spec.a], launch[spec.b] = "A3", "B3"
    estr = []
    for i in epi:
        w.append(f"e{i} = _egg_mm_operand(a{i}, shape, BT, M, N)")
        launch[i] = f"e{i}"
        estr.append(f"*e{i}.stride()")
    bias_stride = f"a{spec.bias}.stride(0)" if spec.bias is not None else "0"
    bm, bn, bk = (int(cfg[k]) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
    head = ", ".join(launch + [f"o{j}" for j in range(len(spec.outputs))]
                     + ["M", "N", bias_stride] + estr)
    w += [
        # split-K: K cut into SPLIT_K ranges of whole BLOCK_K steps (principle alg-matmul-epilogue)
        f"steps = _egg_cdiv(K, {bk})",
        f"split = max(1, min({int(cfg.get('SPLIT_K', 1))}, steps))",
        f"k_split = _egg_cdiv(steps, split) * {bk}",
        "split = _egg_cdiv(K, k_split) if K else 1",
        "part = rec.empty((split, BT, M, N), torch.float32, A.device) if split > 1 else o0",
        # offsets, not element counts: a column slice of a tall matrix spans far more than it holds
        "big = max(_egg_span(A3), _egg_span(B3), part.numel()"
        + "".join(f", _egg_span(e{i})" for i in epi)
        + "".join(f", _egg_span(a{i})" for i in spec.leaves[1:]) + ") >= _EGG_FAR",
        f"grid = (_egg_cdiv(M, {bm}) * _egg_cdiv(N, {bn}), BT * split)",
        f"rec.launch({kname}, grid)({head}, part, K, sab, sam, sak, sbb, sbk, sbn, "
        + "".join(f"*a{i}.stride(), " for i in spec.leaves) + "k_split, I64=big, "
        f"EVEN_K=K % {bk} == 0, DOT_F32=A.device.type == 'cpu' and A.dtype != torch.float32, "
        f"SPLIT_K=split, BLOCK_M={bm}, BLOCK_N={bn}, BLOCK_K={bk}, "
        f"GROUP_M={int(cfg['GROUP_M'])}, num_warps={int(cfg['num_warps'])}, "
        f"num_stages={int(cfg['num_stages'])})",
        "if split > 1:",
        "    total = BT * M * N",
        f"    rec.launch({kname}_sum, (_egg_cdiv(total, 1024),))({head}, part, total, split, "
        "I64=part.numel() >= 2**31 - 1, BLOCK=1024, num_warps=4)",
        f"return {ret}",
    ]
    wrapper = recorded_wrapper(gname, n_in, w)
    if prog:
        want = ", ".join(f"({tuple(ins[1])!r}, torch.{ins[2]})" for ins in _leaves(prog))
        wrapper = f"_EGG_LEAVES_{gname} = ({want},)\n\n\n" + wrapper
    return Rendered(kernel, wrapper, kname, gname, cfg)
