"""The host cost of one Triton launch and its pieces, on a GPU, for a generated file's first
launch: the module's call, ``kernel[grid](...)`` (JITFunction.run), Triton's binder, the
CompiledKernel's runner called directly (what _egg_Launcher calls), and the stream and device
lookups (us per call, 300 calls without synchronize). Also writes the installed Triton's JITFunction.run and
CompiledKernel source next to OUT (what _egg_Launcher relies on).

    source scripts/gpu_env.sh
    python scripts/launch_cost.py OUT.txt GENERATED.py WORKLOAD.py
    # GENERATED.py: e.g. a file emitted for workloads/llm/03_rope.py (gpu_llm_kernels._egg_source)
"""
from __future__ import annotations

import inspect
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.runtime import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from ab_files import host_us  # noqa: E402
from gpu_llm_kernels import _inputs, _seeded_model  # noqa: E402
from harness.problem import load_module, load_problem  # noqa: E402


def per_call(f, n: int = 300) -> float:
    """us per call to issue n calls (ab_files.host_us, without its rounding)."""
    return host_us(f, n, digits=3)[0]


def main(argv: list[str]) -> int:
    if len(argv) != 3 or not torch.cuda.is_available():
        print(__doc__)
        return 2
    out, gen, wl = pathlib.Path(argv[0]), pathlib.Path(argv[1]), pathlib.Path(argv[2])
    from triton.compiler import compiler as C
    out.with_suffix(".src.txt").write_text(
        f"triton {triton.__version__} torch {torch.__version__}\n\n" + inspect.getsource(JITFunction.run)
        + "\n\n" + inspect.getsource(C.CompiledKernel))
    prob = load_problem(wl)
    init = prob.init_inputs()
    ref = _seeded_model(prob, init, "cuda")
    xs = _inputs(prob, "cuda")
    mod = load_module(gen, "gen")
    with torch.device("cuda"):
        m = mod.ModelNew(*init)
    m.load_state_dict(ref.state_dict(), strict=False)
    seen = {}
    orig = JITFunction.run

    def record(self, *a, grid, warmup, **kw):
        seen.setdefault("launch", (self, a, kw, grid))
        return orig(self, *a, grid=grid, warmup=warmup, **kw)

    res = {}
    with torch.no_grad():
        res["module call"] = per_call(lambda: m(*xs))
        JITFunction.run = record
        try:
            for v in vars(mod).values():  # a fresh signature: the first launch goes through run
                if hasattr(v, "cache") and hasattr(v, "fn"):
                    v.cache.clear()
            m(*xs)
        finally:
            JITFunction.run = orig
        fn, a, kw, grid = seen["launch"]
        res["kernel[grid](...) (JITFunction.run)"] = per_call(lambda: fn[grid](*a, **kw))
        ck = fn[grid](*a, **kw)
        dev = driver.active.get_current_device()
        binder = fn.device_caches[dev][4]
        res["binder"] = per_call(lambda: binder(*a, **kw))
        vals = tuple(binder(*a, **kw)[0].values())
        runner = ck[tuple(grid) + (1,) * (3 - len(grid))]
        res["CompiledKernel runner"] = per_call(lambda: runner(*vals))
        res["driver get_current_stream"] = per_call(lambda: driver.active.get_current_stream(dev))
        res["torch.cuda.current_device"] = per_call(torch.cuda.current_device)
        res["torch.cuda.current_stream().cuda_stream"] = per_call(lambda: torch.cuda.current_stream().cuda_stream)
        res["arguments"] = len(vals)
    lines = [f"{k}: {v:.2f}" if isinstance(v, float) else f"{k}: {v}" for k, v in res.items()]
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
