"""What disturbs a timing on a shared machine: the same functions timed alone and next to
background load of one kind at a time (``egg bench --jobs N`` runs 4 problems beside each other:
while one problem holds the GPU lock to time, the others compile kernels on every core, hold
device memory, or copy to the device).

    source scripts/gpu_env.sh
    python scripts/interference_probe.py OUT.json [--procs 32] [--seconds 4]

Functions (fixed sizes, nothing from a benchmark problem): a short memory-bound kernel
(``x * 2`` over 64M floats, ~0.13 ms on an H200), a host-heavy chain of 8 small kernels, an fp32
4096^3 matmul (~2.7 ms). Each is timed two ways: harness.timing.bench (the tiler's search) and
timed rounds with the judge's wall-clock bound (harness.timing.run_round + summarize_rounds, as
the profiler's timing judge does, in-process).

Conditions: alone; ``--procs`` CPU-bound Python processes at nice 0; the same at nice 10 (what
lowering the priority of everything but the timing would give); one process holding most of the
device memory and idle; one process launching small kernels without pause (GPU work outside the
lock). Prints a table and writes OUT.json.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from harness import timing  # noqa: E402

BURN = "import os,sys; os.nice(int(sys.argv[1]))\nwhile True: pass"
HOG = ("import torch,time; f,t=torch.cuda.mem_get_info(); x=torch.empty(int(f*0.6)//4, device='cuda');"
       "x.fill_(1); torch.cuda.synchronize(); print('ready', flush=True); time.sleep(3600)")
BUSY = ("import torch; x=torch.randn(1<<22, device='cuda'); print('ready', flush=True)\n"
        "while True:\n  x.mul_(1.0000001); torch.cuda.synchronize()")


def functions(dev):
    a = torch.randn(64 << 20, device=dev)
    b = torch.empty_like(a)
    s = torch.randn(1 << 20, device=dev)
    m1, m2 = torch.randn(4096, 4096, device=dev), torch.randn(4096, 4096, device=dev)

    def chain():
        y = s
        for _ in range(8):
            y = y * 1.0001 + 0.5
        return y

    return {"short (x*2, 256 MB)": lambda: torch.mul(a, 2, out=b),
            "chain (8 small kernels)": chain,
            "matmul fp32 4096^3": lambda: m1 @ m2}


def rounds_timing(fn, dev, rep_ms: float) -> dict:
    flush = timing.flush_buffer(dev)
    flush_ms = timing.measure_flush(dev)
    fn()
    torch.cuda.synchronize()
    est = statistics.median(timing.run_round(fn, dev, 3, flush)[0])
    out = []
    for k in timing.round_sizes(est, rep_ms, random.Random(0)):
        t0 = time.perf_counter()
        times, _ = timing.run_round(fn, dev, k, flush)
        out.append({"times": times, "wall_ms": (time.perf_counter() - t0) * 1e3})
    return timing.summarize_rounds(out, flush_ms, 0.0)


def measure(dev, fns, rep_ms: float) -> dict:
    res = {}
    for name, fn in fns.items():
        b = timing.bench(fn, dev, rep_ms=rep_ms)
        r = rounds_timing(fn, dev, rep_ms)
        res[name] = {"bench_ms": b["median_ms"], "bench_spread": timing.relative_spread(b),
                     "rounds_ms": r["median_ms"], "rounds_bound_ms": r.get("wall_bound_ms"),
                     "rounds_flags": r["flags"]}
    return res


def start(kind: str, procs: int) -> list[subprocess.Popen]:
    py = sys.executable
    if kind.startswith("cpu"):
        nice = kind.split("nice")[-1]
        return [subprocess.Popen([py, "-c", BURN, nice]) for _ in range(procs)]
    code = HOG if kind == "memory" else BUSY
    p = subprocess.Popen([py, "-c", code], stdout=subprocess.PIPE, text=True)
    p.stdout.readline()  # 'ready'
    return [p]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--procs", type=int, default=2 * (os.cpu_count() or 8))
    ap.add_argument("--rep-ms", type=float, default=200.0)
    args = ap.parse_args()
    os.environ["EGG_GPU_LOCK"] = "off"  # the background processes do not take it either
    dev = torch.device("cuda")
    fns = functions(dev)
    measure(dev, fns, 50.0)  # warm-up: cuBLAS handles, the flush buffer
    result = {"device": torch.cuda.get_device_name(), "procs": args.procs, "conditions": {}}
    for kind in ("alone", "cpu nice0", "cpu nice10", "memory", "gpu busy", "alone again"):
        bg = [] if kind.startswith("alone") else start(kind, args.procs)
        time.sleep(1.0)
        try:
            result["conditions"][kind] = measure(dev, fns, args.rep_ms)
        finally:
            for p in bg:
                p.kill()
                p.wait()
        print(kind, json.dumps(result["conditions"][kind]), flush=True)
    pathlib.Path(args.out).write_text(json.dumps(result, indent=1))
    base = result["conditions"]["alone"]
    print(f"\n| condition | {' | '.join(f'{n}: bench / rounds (x alone)' for n in fns)} |")
    for kind, res in result["conditions"].items():
        cells = [f"{res[n]['bench_ms']:.3f} ({res[n]['bench_ms'] / base[n]['bench_ms']:.2f}x) / "
                 f"{res[n]['rounds_ms']:.3f} ({res[n]['rounds_ms'] / base[n]['rounds_ms']:.2f}x)" for n in fns]
        print(f"| {kind} | {' | '.join(cells)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
