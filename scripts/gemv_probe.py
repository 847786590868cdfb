"""Decode GEMV kernel designs on a GPU: y = x @ W.T for a few rows x (M <= 16) and a large bf16
weight W (N, K), against cuBLAS (F.linear). Two kernel shapes, each with and without split-K:

- ``dot``: tl.dot on a 16-row tile (rows past M load row M-1 again, masked at the store), as the
  matmul template does for decode (alg-decode-gemv);
- ``fma``: no tensor cores: a (M_PAD, BLOCK_N, BLOCK_K) broadcast product summed over K in fp32.

Split-K writes fp32 partials that a second kernel adds. Each variant is checked against F.linear
in fp32 and timed two ways: triton.testing.do_bench (L2 flushed, host launches included: what a
module call costs) and do_bench_cudagraph (no host launches, but L2 is not flushed between
replays: optimistic for a weight that partly fits in L2).

    python scripts/gemv_probe.py OUT.json [--shapes 4x4096x14336,1x4096x4096]
"""
from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.testing import do_bench, do_bench_cudagraph


@triton.jit
def gemv_dot(X, W, P, M, N, K, K_SPLIT, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             SPLIT: tl.constexpr):
    pid_n = tl.program_id(0)
    sk = tl.program_id(1)
    rm = tl.arange(0, 16)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    ram = tl.minimum(rm, M - 1)
    k_lo = sk * K_SPLIT
    a_ptrs = X + ram[:, None] * K + (k_lo + rk[None, :])
    b_ptrs = W + (rn % N)[None, :] * K + (k_lo + rk[:, None])
    acc = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    for _k in range(0, K_SPLIT, BLOCK_K):
        a = tl.load(a_ptrs)
        b = tl.load(b_ptrs)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    if SPLIT == 1:
        tl.store(P + rm[:, None] * N + rn[None, :], acc.to(P.dtype.element_ty), mask=mask)
    else:
        tl.store(P + (sk * M + rm[:, None]) * N + rn[None, :], acc, mask=mask)


@triton.jit
def gemv_fma(X, W, P, M, N, K, K_SPLIT, M_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_K: tl.constexpr, SPLIT: tl.constexpr):
    pid_n = tl.program_id(0)
    sk = tl.program_id(1)
    rm = tl.arange(0, M_PAD)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    ram = tl.minimum(rm, M - 1)
    k_lo = sk * K_SPLIT
    a_ptrs = X + ram[:, None] * K + (k_lo + rk[None, :])
    b_ptrs = W + (rn % N)[:, None] * K + (k_lo + rk[None, :])
    acc = tl.zeros((M_PAD, BLOCK_N), dtype=tl.float32)
    for _k in range(0, K_SPLIT, BLOCK_K):
        a = tl.load(a_ptrs).to(tl.float32)
        b = tl.load(b_ptrs).to(tl.float32)
        acc += tl.sum(a[:, None, :] * b[None, :, :], axis=2)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    if SPLIT == 1:
        tl.store(P + rm[:, None] * N + rn[None, :], acc.to(P.dtype.element_ty), mask=mask)
    else:
        tl.store(P + (sk * M + rm[:, None]) * N + rn[None, :], acc, mask=mask)


@triton.jit
def split_sum(P, O, TOTAL, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < TOTAL
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(0, SPLIT):
        acc += tl.load(P + s * TOTAL + offs, mask=mask, other=0.0)
    tl.store(O + offs, acc.to(O.dtype.element_ty), mask=mask)


def make(kind, x, w, bn, bk, split, warps, stages):
    M, K = x.shape
    N = w.shape[0]
    ks = K // split
    if K % split or ks % bk:
        return None
    out = torch.empty(M, N, device=x.device, dtype=x.dtype)
    part = torch.empty(split, M, N, device=x.device, dtype=torch.float32) if split > 1 else out
    grid = (triton.cdiv(N, bn), split)
    mp = max(2, triton.next_power_of_2(M))

    def call():
        if kind == "dot":
            gemv_dot[grid](x, w, part, M, N, K, ks, BLOCK_N=bn, BLOCK_K=bk, SPLIT=split,
                           num_warps=warps, num_stages=stages)
        else:
            gemv_fma[grid](x, w, part, M, N, K, ks, M_PAD=mp, BLOCK_N=bn, BLOCK_K=bk, SPLIT=split,
                           num_warps=warps, num_stages=stages)
        if split > 1:
            split_sum[(triton.cdiv(M * N, 1024),)](part, out, M * N, SPLIT=split, BLOCK=1024)
        return out
    return call


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--shapes", default="4x4096x14336,1x4096x14336,8x4096x4096,16x14336x4096")
    ap.add_argument("--quick", action="store_true", help="a few variants only")
    args = ap.parse_args()
    res = []
    for shp in args.shapes.split(","):
        M, K, N = (int(v) for v in shp.split("x"))
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5
        ref = F.linear(x.float(), w.float())
        floor_ms = (N * K + M * K + M * N) * 2 / 4.8e12 * 1e3
        row = {"shape": shp, "floor_ms": floor_ms, "variants": []}
        lib = lambda: F.linear(x, w)  # noqa: E731
        row["cublas_ms"] = do_bench(lib, rep=200)
        row["cublas_graph_ms"] = do_bench_cudagraph(lib, rep=200)
        print(shp, "cublas", row["cublas_ms"], row["cublas_graph_ms"], "floor", floor_ms, flush=True)
        space = [("dot", bn, bk, sp, 4, 4) for bn in (32, 64, 128) for bk in (128, 256)
                 for sp in (1, 2, 4, 8)]
        space += [("fma", bn, bk, sp, 4, 4) for bn in (16, 32, 64) for bk in (64, 128)
                  for sp in (1, 2, 4)]
        if not args.quick:
            space += [(k, bn, bk, sp, w_, st) for (k, bn, bk, sp, _w, _s) in list(space)
                      for w_, st in ((8, 4), (4, 3), (4, 6))]
        for kind, bn, bk, split, warps, stages in space:
            if kind == "fma" and max(2, M) * bn * bk > 32768:
                continue
            try:
                call = make(kind, x, w, bn, bk, split, warps, stages)
                if call is None:
                    continue
                y = call()
                err = (y.float() - ref).abs().max().item()
                if err > 0.05:
                    row["variants"].append({"v": [kind, bn, bk, split, warps, stages], "error": err})
                    continue
                t = do_bench(call, rep=100)
                tg = do_bench_cudagraph(call, rep=100)
                row["variants"].append({"v": [kind, bn, bk, split, warps, stages], "ms": t,
                                        "graph_ms": tg, "err": err})
            except Exception as e:  # noqa: BLE001
                row["variants"].append({"v": [kind, bn, bk, split, warps, stages], "fail": str(e)[:120]})
        ok = sorted((v for v in row["variants"] if "ms" in v), key=lambda v: v["graph_ms"])
        for v in ok[:8]:
            print(" ", v, f"{floor_ms / v['graph_ms']:.0%} of floor (graph, L2 warm)", flush=True)
        res.append(row)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
