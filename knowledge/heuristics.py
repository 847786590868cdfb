"""Named formulas of the knowledge base: launch configurations from shapes.

Each threshold says where it came from. These give the tiler its starting point and the CPU
path its choice; on a GPU the tiler measures a shortlist around them.
"""
from __future__ import annotations

import math


def next_pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, n))))


def pointwise_config(numel: int, n_inputs: int, sm_count: int = 132) -> dict:
    """Elements per program: 4 KB-16 KB of each input in flight per program keeps a Hopper SM's
    memory pipeline full (principle mem-block-count); small tensors use small blocks so the grid
    still covers every SM at least twice."""
    block = 2048 if numel >= (1 << 22) else 1024
    while block > 256 and math.ceil(numel / block) < 2 * sm_count:
        block //= 2
    warps = 8 if block >= 2048 and n_inputs <= 3 else 4
    return {"BLOCK": block, "num_warps": warps}


def pool_config(numel: int, sm_count: int = 132) -> dict:
    """Like pointwise_config, but at most 8 outputs per thread: every output keeps its window's
    index math (od, oh, ow, channel) live across the unrolled window loads, and 16 outputs per
    thread (2048 x 4 warps) ran an avg_pool3d + bias + scale 24x slower than eager's pooling on
    the H200 (16.4 vs 0.68 ms, 64-bit indices), a register-spill signature."""
    block = 1024 if numel >= (1 << 22) else 512
    while block > 128 and math.ceil(numel / block) < 2 * sm_count:
        block //= 2
    return {"BLOCK": block, "num_warps": 4}


def split_chunk(programs: int, r: int, block: int, sm_count: int) -> int:
    """Elements of a long reduced dim per program when ``programs`` independent reductions (rows,
    or row x inner-block tiles) would leave SMs idle (tile-split-rows): enough chunks for >= 4
    programs per SM, each at least 4 blocks long (>= r: no split)."""
    want = max(1, math.ceil(4 * sm_count / max(1, programs)))
    return max(4 * block, math.ceil(r / want))


def reduction_config(nrows: int, r: int, inner: int, rows_variant: bool, sm_count: int = 132) -> dict:
    """Tile ~2K-4K elements per loop step (tile-block-size): short rows pack several rows per
    program (BLOCK_O), long rows take one row and a wide BLOCK_R with more warps."""
    if rows_variant:
        block_r = min(next_pow2(r), 4096 if r >= 4096 else 2048)
        block_o = max(1, min(64, 2048 // block_r))
        while block_o > 1 and math.ceil(nrows / block_o) < 2 * sm_count:
            block_o //= 2
        warps = 8 if block_r * block_o >= 4096 else 4
        # few long rows are split across programs (tile-split-rows): >= 4 programs per SM
        chunk = split_chunk(nrows, r, block_r, sm_count)
        return {"BLOCK_O": block_o, "BLOCK_R": block_r, "BLOCK_I": 64, "num_warps": warps,
                "num_stages": 2, "SPLIT_ROWS": 2 * sm_count, "SPLIT_CHUNK": chunk}
    # a short reduced dim (an MoE combine's top-k, a mean over a few heads) widens the inner
    # block instead, up to 1024 columns, so that a tile still holds ~2K elements
    # (tile-block-size), as long as the (outer index x inner block) tiles fill the SMs twice
    block_i = min(next_pow2(inner), max(128, min(1024, 2048 // next_pow2(r))))
    while block_i > 128 and nrows * math.ceil(inner / block_i) < 2 * sm_count:
        block_i //= 2
    block_r = max(8, min(next_pow2(r), 4096 // block_i))
    warps = 4 if block_i * min(block_r, next_pow2(r)) <= 4096 else 8  # the tile the launch runs
    # few (outer index x inner block) tiles over a long reduced dim (a channels-last image
    # reduced over its pixels): the reduced dim is split too, >= 4 programs per SM
    chunk = split_chunk(nrows * math.ceil(inner / block_i), r, block_r, sm_count)
    return {"BLOCK_O": 1, "BLOCK_R": block_r, "BLOCK_I": block_i, "num_warps": warps,
            "num_stages": 2, "SPLIT_ROWS": 2 * sm_count, "SPLIT_CHUNK": chunk}


def softmax_config(nrows: int, r: int, inner: int, rows_variant: bool, sm_count: int = 132) -> dict:
    """One pass while the row fits 8K fp32 values in registers (alg-online-softmax). Longer rows
    take two passes; where they are too few to give every SM >= 4 programs (a sampling softmax
    over a vocabulary: 64 rows of 128k), each row is cut into chunks of SPLIT_CHUNK, at least
    4 tiles of BLOCK_R long (tile-split-rows)."""
    if rows_variant:
        p = next_pow2(r)
        if p <= 8192:
            block_o = max(1, min(16, 2048 // p))
            warps = 4 if p * block_o <= 2048 else (8 if p <= 4096 else 16)
            return {"BLOCK_O": block_o, "BLOCK_R": p, "BLOCK_I": 32, "num_warps": warps,
                    "num_stages": 1, "ONE_PASS_MAX": max(8192, p * block_o)}
        chunk = split_chunk(nrows, r, 4096, sm_count) if nrows < 4 * sm_count else 1 << 62
        return {"BLOCK_O": 1, "BLOCK_R": 4096, "BLOCK_I": 32, "num_warps": 16, "num_stages": 2,
                "ONE_PASS_MAX": 8192, "SPLIT_CHUNK": chunk}
    block_i = min(64, next_pow2(inner))
    return {"BLOCK_O": 1, "BLOCK_R": max(8, min(next_pow2(r), 4096 // block_i)), "BLOCK_I": block_i,
            "num_warps": 4, "num_stages": 2, "ONE_PASS_MAX": 4096}


def pipeline_stages(iterations: int) -> int:
    """Software pipelining depth (mem-pipelining): loops of >= 4 iterations prefetch 3 deep."""
    if iterations >= 4:
        return 3
    return 2 if iterations >= 2 else 1


def norm_config(rows: int, r: int, sm_count: int = 132) -> dict:
    """Rows that fit 4K fp32 values stay in registers (one read, one write); longer rows are
    split so the statistics kernel has >= 4 programs per SM (tile-split-rows), in chunks of at
    least 4 blocks so per-chunk overhead stays small."""
    p = next_pow2(r)
    if p <= 4096:
        block_o = max(1, min(32, 4096 // p))
        while block_o > 1 and math.ceil(rows / block_o) < 2 * sm_count:
            block_o //= 2
        return {"BLOCK_O": block_o, "BLOCK": 2048, "num_warps": 4 if p * block_o <= 2048 else 8,
                "ONE_MAX": 4096, "SPLIT_CHUNK": 16384}
    block = 2048
    chunk = math.ceil(split_chunk(rows, r, block, sm_count) / block) * block
    return {"BLOCK_O": 1, "BLOCK": block, "num_warps": 8, "ONE_MAX": 4096, "SPLIT_CHUNK": chunk}


def scan_config(rows: int, r: int, sm_count: int = 132) -> dict:
    """One row per program, 1K-4K-element chunks; short rows pack several per program."""
    block_r = min(next_pow2(r), 2048)
    block_o = max(1, min(16, 2048 // block_r))
    while block_o > 1 and math.ceil(rows / block_o) < 2 * sm_count:
        block_o //= 2
    return {"BLOCK_O": block_o, "BLOCK_R": block_r, "num_warps": 8 if block_r * block_o >= 2048 else 4}


def chanstats_config(channels: int, batch: int, sm_count: int = 132) -> dict:
    """Channel x batch-chunk programs: at least 4 per SM when the batch allows it."""
    splits = max(1, min(batch, math.ceil(4 * sm_count / max(1, channels)), 256))
    return {"BLOCK": 1024, "num_warps": 4, "SPLITS": splits}


def matmul_config(m: int, n: int, k: int, batch: int, sm_count: int = 132,
                  computed_b: bool = False) -> dict:
    """Tensor-core tiles from the Triton matmul tutorials (03-matrix-multiplication, Hopper
    configs): 128x128x64 tiles, 8 warps, 3 stages, whatever the dtype. For fp32 (3xTF32): the
    tiler's measured search on the H200 picked 128x128x64 / 8 warps / 3 stages for every large
    fp32 product of dev40 (10 of 10, 1.14-1.20x over 128x128x32; docs/results/dev40_h200.md).
    Tiles halve along M and N while the grid would leave SMs idle (tile-grid-mapping), down to
    64 (the smallest warpgroup-wide tile); GROUP_M 8 for L2 reuse; SPLIT_K for few tiles over a
    long K (not yet measured on a GPU: the profiler backs a losing split out)."""
    def tiles() -> int:
        return math.ceil(m / bm) * math.ceil(n / bn) * batch

    if m <= 16 and batch == 1 and n * k >= 1 << 20:
        # a decode GEMV (principle alg-decode-gemv): 16-row tiles (tl.dot's least M), 128 output
        # columns and 128-deep K steps per program, 4 warps, 4 stages in flight. Measured on the
        # H200 (4 x 4096 x 14336 bf16, scripts/gemv_probe.py, L2 flushed): 128 columns without
        # a split (112 programs) 0.0409 ms a call, split 2 0.0563, 64 columns split 2 (~4
        # programs per SM, the former rule) 0.0494 (cuBLAS 0.0416): K is split only to reach
        # about one program per SM (a weight with few column tiles), each over >= 4 K steps
        # A weight computed in registers (rw-dequant-program) takes 64 columns whatever N: the
        # unpacking is ALU work and registers per tile, not bytes, so half the columns and twice
        # the programs. Measured on an H100 (int4 4 x 4096 x 14336, workload 37,
        # harness.timing.bench, thirtieth session): 64 columns 0.039 ms a call against 0.076 for
        # 128; split 4 on top of 64 columns: the same median and calls of up to 0.075 ms (its
        # second kernel's launch)
        wide = n >= 128 * sm_count // 2 and not computed_b
        bm, bn, bk = 16, 128 if wide else 64, min(128, next_pow2(k))
        split = max(1, min(64, sm_count // tiles(), k // (4 * bk)))
        split = 1 << (split.bit_length() - 1)
        return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 1, "num_warps": 4,
                "num_stages": 4, "SPLIT_K": split}
    bm = 128 if m > 64 else 64
    bn = 128 if n > 64 else 64
    while bm > 64 or bn > 64:
        if tiles() >= sm_count:
            break
        if bn >= bm and bn > 64:
            bn //= 2
        else:
            bm //= 2
    bk = 64
    while bk > 16 and bk > next_pow2(k):
        bk //= 2
    warps = 8 if bm * bn >= 128 * 128 else 4
    # few output tiles and a long K loop: split K so that every SM gets about two programs,
    # each running at least 4 BLOCK_K steps (the partials cost 8 bytes per output per split)
    split = 1
    if tiles() < sm_count:
        split = max(1, min(64, math.ceil(2 * sm_count / tiles()), k // (4 * bk)))
        split = 1 << (split.bit_length() - 1)
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "num_warps": warps,
            "num_stages": 3 if k > 2 * bk else 2, "SPLIT_K": split}


def attention_config(m: int, n: int, head_dim: int, batch_heads: int, sm_count: int = 132,
                     itemsize: int = 4) -> dict:
    """Flash-attention tiles: 64 query rows x 64 keys, 4 warps (one warpgroup), 3 stages for
    16-bit operands up to head dim 128; 32 keys per step above head dim 128 (registers), and 2
    stages there (3 stages of 256-wide key and value tiles leave one program per SM); 2 stages
    for fp32 operands (3xTF32); fewer query rows when the grid would leave SMs idle. Measured on
    an H100 (docs/results/workloads_h200.md, twenty-first session, 36 configurations of a
    Llama-3 causal prefill, head dim 128: 64 x 64 x 4 warps 0.182 ms against 0.201 for the
    128 x 64 x 8 warps of Triton's tutorial; head dim 256 soft-capped: 64 x 32, 2 stages 0.327
    against 0.396 with 3). Decode (at most DECODE_ROWS packed query rows per
    key/value head, principle alg-split-kv-decode) splits the keys so that about
    SPLIT_PROGRAMS = 4 programs per SM run (the flash-decoding rule: enough splits to fill the
    GPU, each split long enough to amortize its partial)."""
    bm = 64
    while bm > 16 and math.ceil(m / bm) * batch_heads < sm_count:
        bm //= 2
    bn = 32 if head_dim > 128 else 64
    return {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": 4,
            "num_stages": 3 if itemsize <= 2 and head_dim <= 128 else 2, "DECODE_ROWS": 64,
            "SPLIT_PROGRAMS": 4 * sm_count}


#: bytes of one logits chunk of the chunked LM-head cross-entropy: half the L2 of an H100/H200
#: (50-60 MB), so cuBLAS's write of a chunk is still in L2 when the reducing kernel reads it
LOGITS_CHUNK_BYTES = 24 * 1024 * 1024


def linear_ce_config(m: int, n: int, k: int, itemsize: int = 2, sm_count: int = 132) -> dict:
    """LM head + cross-entropy (principle alg-linear-cross-entropy). Stage 1 takes the chunked
    mapping (MODE 0): cuBLAS's product in chunks of CHUNK_N vocabulary columns (LOGITS_CHUNK_BYTES
    of logits, a multiple of BLOCK_N), reduced by a Triton kernel, because the matmul template's
    default tiles lost to cuBLAS on the LM head's bf16 product on the H200 (its candidate with the
    logits cast fused took 4.97 ms against eager's 4.48 ms, docs/results/workloads_h200.md); the
    tiler also times the fused mapping (MODE 1) with tensor-core tiles of 128 x 128 x 64, 8 warps,
    3 stages."""
    chunk = LOGITS_CHUNK_BYTES // max(1, m * itemsize)
    chunk = max(2048, min(16384, 1 << max(0, chunk.bit_length() - 1)))
    cfg = matmul_config(m, n, k, 1, sm_count)
    return {"MODE": 0, "CHUNK_N": chunk, "BLOCK_M": cfg["BLOCK_M"], "BLOCK_N": 128,
            "BLOCK_K": cfg["BLOCK_K"], "GROUP_M": 8, "num_warps": 8, "num_stages": 3}


# ---- run budget (policies.expert: which groups stage 1 spends a time-limited run on) ----------
#: seconds one kernel adds to a verification: Triton compiles each kernel in the candidate
#: process and every trial runs it. Not measured yet: an estimate to calibrate on the GPU from the
#: level-3 bench's per-problem wall times (docs/capture.md); the interpreter runs kernels program
#: by program in Python.
KERNEL_VERIFY_S = {"cuda": 3.0, "cpu": 4.0}
#: ... and a group whose kernels another group of the candidate already has (codegen.emit.
#: share_kernels): no compile (the same functions; ~0.4 s a compile of ResNet-18's kernels for
#: sm_90 on the CPU machine, shared ones cost none), only its launches in every trial
SHARED_KERNEL_VERIFY_S = {"cuda": 0.5, "cpu": 4.0}
#: share of the time left that the first stage-1 candidate's kernels may take to verify: the
#: rest is for its timing, the backing-out of a failed group, and stage 2
STAGE1_BUDGET_SHARE = 0.3
#: a time-limited run still tries at least this many groups
MIN_BUDGET_GROUPS = 4


def stage1_group_budget(seconds_left: float, device: str, kernel_keys: list[str] | None = None) -> int:
    """How many fused groups the first stage-1 candidate of a run with ``seconds_left`` may hold:
    the first groups of ``kernel_keys`` (in the order they are kept: largest saving first), a
    group whose key an earlier one has costing SHARED_KERNEL_VERIFY_S instead of KERNEL_VERIFY_S
    (an empty key is a kernel of its own). Without keys, every group counts as its own."""
    per = KERNEL_VERIFY_S.get(device, KERNEL_VERIFY_S["cuda"])
    shared = SHARED_KERNEL_VERIFY_S.get(device, SHARED_KERNEL_VERIFY_S["cuda"])
    budget = STAGE1_BUDGET_SHARE * max(0.0, seconds_left)
    if kernel_keys is None:
        return max(MIN_BUDGET_GROUPS, int(budget / per))
    seen: set[str] = set()
    n, spent = 0, 0.0
    for key in kernel_keys:
        cost = shared if key and key in seen else per
        if n >= MIN_BUDGET_GROUPS and spent + cost > budget:
            break
        n, spent = n + 1, spent + cost
        seen.add(key)
    return n


# ---- CUDA graphs (principle alg-cuda-graph: policies.expert decides, _egg_graphed replays) ----
#: host time of one fused group's call from the generated forward (its wrapper's layout and
#: stride helpers, output allocation, Triton's launcher): ResNet-101's fast path with its kernels
#: and convolutions stubbed out spent 30 ms of Python per call on 128 groups (310 launches) on
#: the CPU machine, ~230 us a group, ~95 us a launch (docs/results/level3_h200.md); the lower
#: figure, so that a graph is chosen where launches clearly dominate
HOST_US_PER_GROUP = 95.0
#: the kernel path is replayed from a CUDA graph when its estimated host time is above this share
#: of eager's time on the GPU (measured per region on a GPU, else the planner's estimate): the
#: host, not the GPU, would set the call's time (ResNet-101 on the H200: 33.9 ms against eager's
#: 8.7 ms, candidates that verified and regressed)
GRAPH_HOST_SHARE = 0.5
#: ... unless copying the inputs into the graph's static buffers and cloning its outputs (two
#: passes over each) costs more than this share of that time (a memory-bound operator: the copy
#: would be a third of its work)
GRAPH_COPY_SHARE = 0.1


def use_cuda_graph(groups: int, gpu_ms: float | None, io_bytes: float,
                   bandwidth_gbs: float | None) -> tuple[bool, str]:
    """Replay the kernel path of a candidate with ``groups`` fused groups from a CUDA graph?
    (decision, why)."""
    if groups <= 0 or not gpu_ms or gpu_ms <= 0:
        return False, "no estimate of the GPU time"
    host_ms = groups * HOST_US_PER_GROUP / 1e3
    if host_ms <= GRAPH_HOST_SHARE * gpu_ms:
        return False, f"host ~{host_ms:.2f} ms against {gpu_ms:.2f} ms on the GPU"
    copy_ms = 2 * io_bytes / (bandwidth_gbs * 1e6) if bandwidth_gbs else 0.0
    if copy_ms > GRAPH_COPY_SHARE * gpu_ms:
        return False, f"copies in and out ~{copy_ms:.3f} ms against {gpu_ms:.3f} ms on the GPU"
    return True, (f"{groups} groups cost the host ~{host_ms:.1f} ms a call against ~{gpu_ms:.2f} ms "
                  "on the GPU: the kernel path is replayed from a CUDA graph")


# ---- library products with fused tails (principle alg-library-tail-fusion) ----
#: a stage-1 candidate that *improved* on eager is still measured once more with its 16-bit Triton
#: matrix products as cuBLAS calls (epilogues as fused tails) when their roofline floor is at
#: least this share of its measured time: a GEMM-bound model, where the template's tiles may lose
#: to cuBLAS more than the epilogues saved (the Llama-3-8B layer with eager attention on the H200:
#: the flash kernel made c1 a 1.71x win, and its four Triton products' floor (the plan's est_ms,
#: epilogues included), 1.16 ms, was 57% of its 2.05 ms; the cuBLAS try then took 1.43 ms).
#: Level 1-2 GEMM + epilogue problems sit far below (a 128x1024x512 product's floor is under 1%
#: of a 20 us call): their first candidate stands.
LIBRARY_PRODUCTS_SHARE = 0.25
