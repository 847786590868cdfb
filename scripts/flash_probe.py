"""Probe of the causal prefill's flash loop (workloads/llm/07's shapes: Llama-3-8B GQA, 2048
tokens, bf16): the kernel the attention template emits for it (stage 1's file) against a rewrite
with three switches: Triton's automatic warp specialization of the key loop (``tl.range(...,
warp_specialize=True)``), Q/K/V/O through TMA tensor descriptors, and the softmax scale folded
into one multiply-add before exp2. Each kernel's device time per call (harness.timing.device_time,
the L2 emptied by a read), against eager's SDPA; OUT/flash_probe.json after every point.

    source scripts/gpu_env.sh
    OUT=DIR python scripts/flash_probe.py

docs/results/workloads_h200.md (twenty-fourth session) has what it found."""
import json
import math
import os
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from harness.timing import device_time  # noqa: E402


def emitted_kernel():
    """The flash kernel of stage 1's file for workload 07, as the template emits it now."""
    from gpu_llm_kernels import _egg_source
    from harness.problem import load_module, load_problem

    p = load_problem(ROOT / "workloads/llm/07_causal_prefill_attention.py")
    src, kinds, _why = _egg_source(p, 132, {})
    if kinds != ["attention"]:
        raise SystemExit(f"07 planned as {kinds}, not one attention kernel")
    path = pathlib.Path(tempfile.mkdtemp()) / "flash_probe_07.py"
    path.write_text(src)
    return load_module(path, "flash_probe_07")._egg_k_g0


@triton.jit
def k_new(Q, K, V, O, H, HKV, M, N, QK_SCALE, Qd, Kd, Vd, Od,
          TMA: tl.constexpr, WS: tl.constexpr, FMA: tl.constexpr,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    # q/k/v/o contiguous [B, H(KV), S, D]; TMA: 2-d descriptors over [B*H*S, D]
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // (H // HKV)
    qrow = bh * M + pid_m * BLOCK_M
    krow = (b * HKV + hk) * N
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rd = tl.arange(0, D)
    if TMA:
        q = Qd.load([qrow, 0])
    else:
        q = tl.load(Q + (qrow + tl.arange(0, BLOCK_M))[:, None].to(tl.int64) * D + rd[None, :])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    full = pid_m * BLOCK_M
    for n0 in tl.range(0, full, BLOCK_N, warp_specialize=WS):
        if TMA:
            kt = Kd.load([krow + n0, 0]).T
        else:
            rn = krow + n0 + tl.arange(0, BLOCK_N)
            kt = tl.load(K + rn[None, :].to(tl.int64) * D + rd[:, None])
        s = tl.dot(q, kt)
        if FMA:
            m_new = tl.maximum(m_i, tl.max(s, 1) * QK_SCALE)
            p = tl.exp2(s * QK_SCALE - m_new[:, None])
        else:
            s = s * QK_SCALE
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if TMA:
            v = Vd.load([krow + n0, 0])
        else:
            rn2 = krow + n0 + tl.arange(0, BLOCK_N)
            v = tl.load(V + rn2[:, None].to(tl.int64) * D + rd[None, :])
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    for n0 in range(full, (pid_m + 1) * BLOCK_M, BLOCK_N):
        rn = n0 + tl.arange(0, BLOCK_N)
        if TMA:
            kt = Kd.load([krow + n0, 0]).T
        else:
            kt = tl.load(K + (krow + rn)[None, :].to(tl.int64) * D + rd[:, None])
        s = tl.dot(q, kt) * QK_SCALE
        s = tl.where(rn[None, :] <= rm[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if TMA:
            v = Vd.load([krow + n0, 0])
        else:
            v = tl.load(V + (krow + rn)[:, None].to(tl.int64) * D + rd[None, :])
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    out = (acc / l_i[:, None]).to(O.dtype.element_ty)
    if TMA:
        Od.store([qrow, 0], out)
    else:
        tl.store(O + (qrow + tl.arange(0, BLOCK_M))[:, None].to(tl.int64) * D + rd[None, :], out)


def main():
    out_dir = pathlib.Path(os.environ.get("OUT", "."))
    k_emit_fn = emitted_kernel()
    dev = torch.device("cuda")
    B, H, HKV, D, S = 2, 32, 8, 128, 2048
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, HKV, S, D, device=dev, dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, HKV, S, D, device=dev, dtype=torch.bfloat16, generator=g)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    scale = 1.0 / math.sqrt(D) * 1.4426950408889634
    flops = 4 * B * H * S * S * D / 2
    res = {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "points": []}
    from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

    def save():
        (out_dir / "flash_probe.json").write_text(json.dumps(res, indent=1))

    def record(name, fn):
        t0 = time.time()
        try:
            o = fn()
            torch.cuda.synchronize()
            err = (o.float() - ref.float()).abs().max().item()
            dt = device_time(fn, dev, iters=20, flush="read")
            ms = dt["device_ms"]
            pt = {"name": name, "ms": ms, "tflops": flops / ms / 1e9, "maxerr": err,
                  "wall_s": round(time.time() - t0, 1)}
        except Exception as e:
            pt = {"name": name, "error": f"{type(e).__name__}: {str(e)[:400]}"}
        res["points"].append(pt)
        print(json.dumps(pt), flush=True)
        save()

    record("eager_sdpa", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
    o = torch.empty_like(q)
    def emit(bm, bn, w, s):
        def f():
            k_emit_fn[(triton.cdiv(S, bm), B * H)](q, k, v, o, *q.stride(), *k.stride(), *v.stride(),
                H, HKV, S, S, D, scale, CAUSAL=True, DOT_F32=False, EVEN_D=True, BLOCK_M=bm,
                BLOCK_N=bn, BLOCK_D=D, num_warps=w, num_stages=s)
            return o
        return f
    for bm, bn, w, s in [(64, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 2)]:
        record(f"emitted {bm}x{bn} w{w} s{s}", emit(bm, bn, w, s))

    q2, k2, v2, o2 = (t.view(-1, D) for t in (q, k, v, o))
    def new(bm, bn, w, s, tma, ws, fma):
        if tma:
            qd = TensorDescriptor.from_tensor(q2, [bm, D]); od = TensorDescriptor.from_tensor(o2, [bm, D])
            kd = TensorDescriptor.from_tensor(k2, [bn, D]); vd = TensorDescriptor.from_tensor(v2, [bn, D])
        else:
            qd = kd = vd = od = 0
        def f():
            k_new[(triton.cdiv(S, bm), B * H)](q, k, v, o, H, HKV, S, S, scale, qd, kd, vd, od,
                TMA=tma, WS=ws, FMA=fma, BLOCK_M=bm, BLOCK_N=bn, D=D, num_warps=w, num_stages=s)
            return o
        return f
    tiles = [(64, 64, 4, 3), (128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 128, 8, 2)]
    for tma in (False, True):
        for ws in (False, True):
            for (bm, bn, w, s) in tiles:
                record(f"new tma={int(tma)} ws={int(ws)} fma=1 {bm}x{bn} w{w} s{s}",
                       new(bm, bn, w, s, tma, ws, True))
    # the FMA alone, on the emitted best tile
    record("new tma=0 ws=0 fma=0 64x64 w4 s3", new(64, 64, 4, 3, False, False, False))
    record("eager_sdpa (again)", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
    save()


if __name__ == "__main__":
    main()
