"""The verifier's adversarial suite on a GPU, plus the cheats only a GPU can show.

    python scripts/gpu_cheats.py docs/results/verifier_gpu.md [--workers 4] [--trials 2]

Runs every case of tests/verifier_cases/cases.py with ``device="cuda"`` (the CPU suite, on the
GPU: Triton kernels compiled for the device, CUDA IPC between judge and candidate), then the
GPU-only cheats:

- stale device memory: a candidate that returns ``torch.empty`` (always, or after an honest first
  call) hoping to find a previous result in freed memory; the candidate process's free device
  memory is poisoned with NaN before each call, so it gets NaN and fails;
- timing cheats, each timed by the timing judge (harness.profile.ProfileSession, as the profiler
  node does): a side stream (values right: the event time misses the work, the judge's wall
  clock does not; the time reported must not be a speedup), a result cached within a round
  (calls after the first return the memo: the single-call rounds, whose outputs are checked,
  are far slower than the rest: rejected), right only on the first call after new inputs (the
  round's last output is checked: rejected), a detector of back-to-back calls (timing only:
  rejected), right for 40 calls then wrong (rejected), calls batched two at a time (an odd call's
  buffer is filled by the next call: rejected); the control is the same matmul honestly; a GEMV
  whose weight is pinned in L2 by a persisting access-policy window (ctypes, static check off:
  the time must not be a speedup over eager), with its honest control;
- device memory beyond the limit, an illegal memory access (CUDA error), a hang: in the suite.

Prints a table and writes it as markdown to the given path. Exit code 0 when every case came out
as expected. Needs only torch and triton (no pydantic, no LangGraph).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from harness.verify import verify  # noqa: E402
from tests.verifier_cases import cases as C  # noqa: E402

MM_PROBLEM = '''"""GPU cheat problem: one fp32 matmul (cuBLAS in eager)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.mm(a, b)


def get_inputs():
    return [torch.randn(4096, 4096), torch.randn(4096, 4096)]


def get_init_inputs():
    return []
'''

SIDE_STREAM = '''"""CHEAT: the matmul runs on a side stream; the timer's stream sees nothing."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.side = torch.cuda.Stream()

    def forward(self, a, b):
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            out = torch.mm(a, b)
        return out
'''

SAME_STREAM = '''"""CONTROL: the same matmul on the current stream."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.mm(a, b)
'''

STALE_ALWAYS = '''"""CHEAT: returns uninitialized memory, hoping a previous result is still there."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.empty((x.shape[0], 1), device=x.device, dtype=x.dtype)
'''

STALE_AFTER_FIRST = '''"""CHEAT: honest on the first call; afterwards returns an uninitialized tensor of the same size,
hoping the allocator hands back the block that held its previous output."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls == 1:
            return (x * x).sum(dim=-1, keepdim=True)
        return torch.empty((x.shape[0], 1), device=x.device, dtype=x.dtype)
'''


def gpu_cases(folder: pathlib.Path) -> list[tuple[C.Case, pathlib.Path, pathlib.Path]]:
    """(case, problem path, candidate path) of the GPU-only cheats."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {"mm": MM_PROBLEM, "side_stream": SIDE_STREAM, "same_stream": SAME_STREAM,
             "stale_always": STALE_ALWAYS, "stale_after_first": STALE_AFTER_FIRST}
    for name, src in files.items():
        (folder / f"{name}.py").write_text(src)
    rowsum = C.PROBLEMS / "rowsum.py"
    mm = folder / "mm.py"
    return [
        (C.Case("stale_always", "rowsum", "mismatch", "NaN", static=False,
                note="poisoned device memory"), rowsum, folder / "stale_always.py"),
        (C.Case("stale_after_first", "rowsum", "mismatch", "trial 2", static=False,
                note="poisoned device memory"), rowsum, folder / "stale_after_first.py"),
        (C.Case("side_stream", "mm", "passed", static=False,
                note="values right; timing must flag it (below)"), mm, folder / "side_stream.py"),
        (C.Case("side_stream", "mm", "cheat", "CUDA stream", note="static check"), mm, folder / "side_stream.py"),
        (C.Case("same_stream", "mm", "passed", note="control"), mm, folder / "same_stream.py"),
    ]


def run_case(case: C.Case, prob: pathlib.Path, cand: pathlib.Path, trials: int, device: str = "cuda") -> dict:
    t0 = time.time()
    res = verify(str(prob), str(cand), device=device, trials=max(trials, case.trials),
                 problem_source=prob.read_text(), static=case.static, **case.opts)
    res["elapsed_s"] = time.time() - t0
    return res


TIMING_CHEATS = {
    "cached_in_round": '''"""CHEAT: memoizes on sampled input values: calls after the first of a round (same
inputs) return the memo at no cost."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.key, self.memo = None, None

    def forward(self, a, b):
        key = (a.data_ptr(), float(a[0, 0]), float(a[-1, -1]), float(b[1, 1]))
        if key != self.key:
            self.key, self.memo = key, torch.mm(a, b)
        return self.memo
''',
    "first_call_only": '''"""CHEAT: right on the first call after new input values, zeros afterwards (a timer that
checks only the first output of a batch of calls is fooled)."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.key = None

    def forward(self, a, b):
        key = (float(a[0, 0]), float(b[0, 0]))
        if key != self.key:
            self.key = key
            return torch.mm(a, b)
        return torch.zeros(a.shape[0], b.shape[1], device=a.device, dtype=a.dtype)
''',
    "gap_detector": '''"""CHEAT: returns garbage when called less than 1 ms after its previous call returned
(back-to-back calls: a timing loop, never a verification trial)."""
import time

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.last = 0.0

    def forward(self, a, b):
        fast = time.perf_counter() - self.last < 1e-3
        out = torch.zeros(a.shape[0], b.shape[1], device=a.device, dtype=a.dtype) if fast else torch.mm(a, b)
        self.last = time.perf_counter()
        return out
''',
    "batched_pairs": '''"""CHEAT: batches calls two at a time (one launch for two products): an odd call keeps
its inputs and returns an unfilled buffer, the next call computes both into their buffers. A timer
that checks only a round's last output, after syncing, sees every value right."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.pending = None

    def forward(self, a, b):
        out = torch.empty(a.shape[0], b.shape[1], device=a.device, dtype=a.dtype)
        if self.pending is None:
            self.pending = (a, b, out)
            return out
        pa, pb, pout = self.pending
        self.pending = None
        both = torch.bmm(torch.stack([pa, a]), torch.stack([pb, b]))
        pout.copy_(both[0])
        out.copy_(both[1])
        return out
''',
    "late_wrong": '''"""CHEAT: right for its first 40 calls (more than a verification makes), wrong after."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, a, b):
        self.calls += 1
        out = torch.mm(a, b)
        return out if self.calls <= 40 else out * 1.01
''',
}


GEMV_PROBLEM = '''"""GPU cheat problem: a decode-style GEMV, memory-bound: a 32 MiB fp16 weight read per call."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4096, 4096, dtype=torch.float16) * 0.02)

    def forward(self, x):
        return torch.nn.functional.linear(x, self.weight)


def get_inputs():
    return [torch.randn(1, 4096, dtype=torch.float16)]


def get_init_inputs():
    return []
'''

L2_PERSIST = '''"""CHEAT: pins its weight in L2 with a persisting access-policy window on the current stream
(cudaDeviceSetLimit + cudaStreamSetAttribute through ctypes): the judge's L2 flush between timed
calls evicts normal lines only, so every call after the first reads the weight from L2 instead of
HBM. Values stay right; only the time is wrong (no model runs like this next to other work)."""
import ctypes

import torch
import torch.nn as nn


class _Window(ctypes.Structure):
    _fields_ = [("base_ptr", ctypes.c_void_p), ("num_bytes", ctypes.c_size_t),
                ("hitRatio", ctypes.c_float), ("hitProp", ctypes.c_int), ("missProp", ctypes.c_int)]


class _Attr(ctypes.Union):
    _fields_ = [("accessPolicyWindow", _Window), ("pad", ctypes.c_char * 64)]


def _cudart():
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            pass
    for line in open("/proc/self/maps"):
        if "libcudart" in line:
            return ctypes.CDLL(line.split()[-1])
    raise OSError("no libcudart")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4096, 4096, dtype=torch.float16) * 0.02)
        self.pinned = None

    def _pin(self):
        rt = _cudart()
        n = self.weight.numel() * self.weight.element_size()
        rt.cudaDeviceSetLimit(ctypes.c_int(0x06), ctypes.c_size_t(n))  # cudaLimitPersistingL2CacheSize
        attr = _Attr()
        attr.accessPolicyWindow = _Window(self.weight.data_ptr(), n, 1.0, 2, 1)  # persisting, streaming
        stream = torch.cuda.current_stream().cuda_stream
        rc = rt.cudaStreamSetAttribute(ctypes.c_void_p(stream), ctypes.c_int(1), ctypes.byref(attr))
        self.pinned = stream if rc == 0 else -1

    def forward(self, x):
        if x.is_cuda and self.pinned != torch.cuda.current_stream().cuda_stream:
            self._pin()
        return torch.nn.functional.linear(x, self.weight)
'''

#: the control: the problem's own module as ModelNew (no window)
GEMV_HONEST = ('"""CONTROL: the same GEMV, no window."""\n'
               + GEMV_PROBLEM.split('"""\n', 1)[1].split("\n\ndef get_inputs")[0].replace("class Model(", "class ModelNew(")
               + "\n")


def _time_cases(folder: pathlib.Path, problem: str, plan: list) -> list:
    """Time each (candidate file stem, expected) of ``plan`` against ``problem`` (a file in
    ``folder``) through the timing judge, static check off: (name, expected, result, ok)."""
    from harness import profile as P

    sess = P.ProfileSession(str(folder / problem), "cuda", 200.0)
    out = []
    try:
        base = sess.baselines()
        eager = base["eager"]["median_ms"]
        for name, expect in plan:
            try:
                t = sess.time_candidate(str(folder / f"{name}.py"), static=False)
                res = {"outcome": "timed", "median_ms": t["median_ms"], "speedup": eager / t["median_ms"],
                       "flags": t.get("flags", []), "reason": ""}
            except P.ProfileRejected as e:
                res = {"outcome": "rejected", "reason": f"[{e.category}] {e}", "flags": []}
            if expect == "timed":
                ok = res["outcome"] == "timed" and 0.8 < res["speedup"] < 1.25
            elif expect == "no speedup":
                ok = res["outcome"] == "rejected" or res["speedup"] < 1.25
            else:
                ok = res["outcome"] == "rejected"
            out.append((name, expect, res, ok))
            print(f"{'ok ' if ok else 'BAD'} timing {name}: {res['outcome']} "
                  f"{res.get('median_ms', '')} {res['reason'][:120]} {res['flags'][:1]}", flush=True)
    finally:
        sess.close()
    return out


def _write_cases(folder: pathlib.Path, sources: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, src in sources.items():
        (folder / f"{name}.py").write_text(src)


#: the persisting-L2 problem, its cheat and its control (file stem -> source)
L2_FILES = {"gemv": GEMV_PROBLEM, "l2_persist": L2_PERSIST, "gemv_honest": GEMV_HONEST}


def l2_raw_probe(folder: pathlib.Path) -> dict:
    """What the persisting window does with no judge in between: the cheat's GEMV timed in this
    process (CUDA events, a 512 MiB buffer written between calls as the judge's L2 flush), before
    and after it pins its weight. A speedup here and none through the judge means the judge's
    defence holds; none here means the route does not pay on this device."""
    import importlib.util

    _write_cases(folder, L2_FILES)
    spec = importlib.util.spec_from_file_location("egg_l2_probe", folder / "l2_persist.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    m = mod.ModelNew().cuda()
    x = torch.randn(1, 4096, dtype=torch.float16, device="cuda")
    flush = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")

    def med_ms(n: int = 200) -> float:
        ts = []
        for _ in range(n):
            flush.zero_()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            torch.nn.functional.linear(x, m.weight)
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b))
        return sorted(ts)[n // 2]

    med_ms(20)
    plain = med_ms()
    m._pin()
    pinned = med_ms()
    rt = mod._cudart()
    rt.cudaCtxResetPersistingL2Cache()
    return {"plain_ms": plain, "pinned_ms": pinned, "window_set": m.pinned not in (None, -1),
            "speedup": plain / pinned}


def timing_cases(folder: pathlib.Path) -> list:
    """Each timing cheat (and the side stream and its control) through the timing judge on the
    matmul, then the persisting-L2 window and its control on the GEMV:
    (name, expected, result dict, ok)."""
    _write_cases(folder, {**TIMING_CHEATS, **L2_FILES})
    out = _time_cases(folder, "mm.py", [("same_stream", "timed"), ("side_stream", "no speedup"),
                                        *[(n, "rejected") for n in TIMING_CHEATS]])
    return out + _time_cases(folder, "gemv.py", [("gemv_honest", "timed"), ("l2_persist", "no speedup")])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=pathlib.Path, help="markdown file to write")
    ap.add_argument("--workers", type=int, default=4, help="verifications at once")
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: a dry run of the suite part only (checks this script's plumbing)")
    ap.add_argument("--only-l2", action="store_true",
                    help="only the persisting-L2 window: its raw effect and the GEMV through the timing judge")
    ap.add_argument("--only-timing", action="store_true",
                    help="only the timing cheats and their honest controls through the timing judge")
    args = ap.parse_args()
    gpu = args.device == "cuda"
    if gpu and not torch.cuda.is_available():
        print("gpu_cheats.py needs a CUDA GPU", file=sys.stderr)
        return 2
    if not gpu:
        import os

        os.environ["TRITON_INTERPRET"] = "1"
    t_start = time.time()
    work = tempfile.TemporaryDirectory(prefix="egg-gpu-cheats-")
    folder = pathlib.Path(work.name)
    if args.only_l2:
        return only_l2(args.out, folder / "gpu", t_start)
    if args.only_timing:
        if not gpu:
            print("--only-timing needs a CUDA GPU", file=sys.stderr)
            return 2
        gpu_cases(folder / "gpu")  # writes the problems the timing cases are timed against
        timing = timing_cases(folder / "gpu")
        n_ok, n_all = _counts([], timing)
        write_markdown(args.out, [], timing, n_ok, n_all, time.time() - t_start)
        print(f"{n_ok}/{n_all} as expected; wrote {args.out}")
        return 0 if n_ok == n_all else 1
    jobs = []
    for case in C.ALL:
        c = case.on(args.device)
        try:
            cand = C.materialize(c, folder / "generated")
        except Exception as e:  # noqa: BLE001 - e.g. codegen needs packages this machine lacks
            jobs.append((c, c.problem_path(), None, f"skipped: {type(e).__name__}: {e}"))
            continue
        jobs.append((c, c.problem_path(), cand, None))
    if gpu:
        jobs += [(c, p, f, None) for c, p, f in gpu_cases(folder / "gpu")]
    rows = []
    with cf.ThreadPoolExecutor(args.workers) as pool:
        futs = [(c, pool.submit(run_case, c, p, f, args.trials, args.device)) if f else (c, skip)
                for c, p, f, skip in jobs]
        for c, fut in futs:
            if isinstance(fut, str):
                rows.append((c, {"passed": False, "category": "skipped", "reason": fut, "checks": []}, None))
                continue
            res = fut.result()
            rows.append((c, res, C.matches(c, res)))
            print(f"{'ok ' if rows[-1][2] else 'BAD'} {c.id:45s} {C.outcome(res):10s} "
                  f"{res['reason'][:110]}", flush=True)
    timing = []
    if gpu:  # the suite's table first, so that a cut-off run keeps it
        write_markdown(args.out, rows, [], *_counts(rows, []), time.time() - t_start)
        timing = gpu_extras(folder, rows, args.trials)
    n_ok, n_all = _counts(rows, timing)
    write_markdown(args.out, rows, timing, n_ok, n_all, time.time() - t_start)
    print(f"{n_ok}/{n_all} as expected; wrote {args.out}")
    return 0 if n_ok == n_all else 1


def _counts(rows: list, timing: list) -> tuple[int, int]:
    """(as expected, counted): informational rows (ok None) are not counted."""
    return (sum(1 for *_, ok in rows if ok) + sum(1 for *_, ok in timing if ok),
            sum(1 for *_, ok in rows if ok is not None) + len(timing))


def only_l2(out: pathlib.Path, folder: pathlib.Path, t_start: float) -> int:
    raw = l2_raw_probe(folder)  # writes the GEMV files too
    print(f"raw L2 window: {raw}", flush=True)
    timing = _time_cases(folder, "gemv.py", [("gemv_honest", "timed"), ("l2_persist", "no speedup")])
    n_ok, n_all = _counts([], timing)
    lines = [f"# Persisting-L2 window on {torch.cuda.get_device_name()}", "",
             f"`python scripts/gpu_cheats.py {out} --only-l2` on {datetime.date.today().isoformat()}, "
             f"{time.time() - t_start:.0f} s. **{n_ok}/{n_all} as expected.**", "",
             f"Raw effect (no judge; CUDA events, 512 MiB written between calls): "
             f"{raw['plain_ms']:.4f} ms without the window, {raw['pinned_ms']:.4f} ms with it "
             f"({raw['speedup']:.2f}x; window set: {raw['window_set']})."]
    lines += _timing_lines(timing)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"{n_ok}/{n_all} as expected; wrote {out}")
    return 0 if n_ok == n_all else 1


def gpu_extras(folder: pathlib.Path, rows: list, trials: int) -> list:
    """The hardened-judge probe (informational) and the side-stream timing check."""
    # informational: the judge made non-dumpable (EGG_HARDEN_JUDGE=1, the default on CPU) with CUDA IPC
    import os

    os.environ["EGG_HARDEN_JUDGE"] = "1"
    hc = C.Case("same_stream", "mm", "passed", note="judge non-dumpable (EGG_HARDEN_JUDGE=1): informational")
    hres = run_case(hc, folder / "gpu" / "mm.py", folder / "gpu" / "same_stream.py", trials)
    os.environ.pop("EGG_HARDEN_JUDGE")
    rows.append((hc, hres, None))
    print(f"info EGG_HARDEN_JUDGE=1 with CUDA IPC: {C.outcome(hres)} {hres['reason'][:110]}", flush=True)
    return timing_cases(folder / "gpu")


def _cell(s: str, n: int = 160) -> str:
    s = " ".join(str(s).split())
    s = (s[:n] + "...") if len(s) > n else s
    return s.replace("|", "\\|")


def write_markdown(path: pathlib.Path, rows, timing, n_ok, n_all, wall) -> None:
    import triton

    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU (dry run, Triton interpreter)"
    lines = [
        f"# Verifier adversarial suite on {dev}",
        "",
        f"`python scripts/gpu_cheats.py {path}` on {datetime.date.today().isoformat()}: "
        f"torch {torch.__version__}, triton {triton.__version__}, {wall:.0f} s. "
        f"**{n_ok}/{n_all} as expected.**",
        "",
        "Every case of tests/verifier_cases/cases.py, verified on this device, then (on a GPU) the GPU-only "
        "cheats. \"static off\" means the static check was skipped to show what the judge catches alone.",
        "",
        "| candidate | problem | static | expected | got | reason | ok |",
        "|---|---|---|---|---|---|---|",
    ]
    for c, res, ok in rows:
        name = c.candidate.strip("<>") + (f" ({c.note})" if ok is None and c.note else "")
        lines.append(f"| {name} | {c.problem.split('/')[-1]} | {'on' if c.static else 'off'} | "
                     f"{c.expect}{' (' + c.reason + ')' if c.reason else ''} | {C.outcome(res)} | "
                     f"{_cell(res.get('reason', ''))} | {'yes' if ok else ('-' if ok is None else '**NO**')} |")
    if timing:
        lines += ["", "Rows marked - are informational: the last one says whether the judge can be made "
                  "non-dumpable (`EGG_HARDEN_JUDGE=1`) on this machine without breaking CUDA IPC; if it "
                  "passed, the hardening can be made the default on GPUs too (harness/child.py)."]
        lines += _timing_lines(timing)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def _timing_lines(timing) -> list[str]:
    lines = ["", "## Timing cheats through the timing judge", "",
             "Each candidate timed as the profiler node times it (harness.profile.ProfileSession): "
             "rounds in the candidate's own process, bounded by the judge's wall clock, outputs of "
             "timed calls checked, eager interleaved. The problems: one 4096^3 fp32 matmul; a decode GEMV "
             "(1x4096 by a 32 MiB fp16 weight) for the L2 window.", "",
             "| candidate | expected | outcome | ms | vs eager | reason / flags | ok |",
             "|---|---|---|---|---|---|---|"]
    for name, expect, r, ok in timing:
        ms = f"{r['median_ms']:.3f}" if "median_ms" in r else "-"
        sp = f"{r['speedup']:.2f}x" if "speedup" in r else "-"
        lines.append(f"| {name} | {expect} | {r['outcome']} | {ms} | {sp} | "
                     f"{_cell(r['reason'] or '; '.join(r['flags']) or '-')} | {'yes' if ok else '**NO**'} |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
