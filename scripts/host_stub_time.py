"""Host time of generated files' kernel paths on a CPU-only machine: each launched kernel behind
the file's own _egg_Launcher, with a stand-in for Triton's function whose launches do nothing,
the problem's inputs as CPU tensors; ``_egg_fast`` (the kernel path) called back to back. What
it measures is the Python a call runs (wrappers, plans, the launcher's keys) plus CPU
allocations; the GPU's own launch cost and the CUDA allocator are not in it (on a GPU:
scripts/host_profile.py, scripts/ab_files.py).

    python scripts/host_stub_time.py FILE.py [FILE.py ...] [--profile]

FILE.py: a generated file with its problem (scripts/gpu_llm_kernels.py's _egg_source writes
one); best of 5 rounds of 500 calls."""
from __future__ import annotations

import cProfile
import importlib.util
import pstats
import sys
import time

import torch


class _Compiled:  # what _egg_launchable takes for a compiled kernel; its runner does nothing
    packed_metadata = function = None

    def __getitem__(self, grid):
        return lambda *a: None


class _Stub:
    def __init__(self, fn):
        self.params, self.pre_run_hooks, self.compiled = fn.params, [], _Compiled()

    def __getitem__(self, grid):
        return lambda *a, **k: self.compiled


def stub_time(path: str, profile: bool = False) -> float:
    spec = importlib.util.spec_from_file_location("stubbed", path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    for name, v in list(vars(m).items()):
        if type(v) is getattr(m, "_egg_Launcher", None):
            setattr(m, name, m._egg_Launcher(_Stub(v.fn)))
    torch.cuda.current_device = lambda: 0  # the launcher's key reads it
    mod = m.ModelNew(*m.get_init_inputs())
    xs = m.get_inputs()
    for _ in range(3):
        mod._egg_fast(*xs)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(500):
            mod._egg_fast(*xs)
        best = min(best, (time.perf_counter() - t0) / 500 * 1e6)
    if profile:
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(500):
            mod._egg_fast(*xs)
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(15)
    return best


if __name__ == "__main__":
    files = [a for a in sys.argv[1:] if not a.startswith("--")]
    for f in files:
        print(f"{f}: {stub_time(f, '--profile' in sys.argv):.1f} us a call (best of 5 x 500)", flush=True)
