"""Where the host's time goes in a call of EGG's generated module (stage 1, heuristic
configurations), on a GPU: calls issued back to back (no flush, one synchronize), per call the
wall time of the module, of eager, and of a bare Triton launch with as many arguments; then
cProfile over the module's calls, the functions that take the host's time.

    source scripts/gpu_env.sh
    python scripts/host_profile.py OUT.txt PROBLEM.py [PROBLEM.py ...] [--calls 300]

A decoding loop without CUDA graphs pays max(host, device) per call: where the host's share is
above the kernels' device time (harness.timing.device_time), the launch path is the bottleneck.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pathlib
import pstats
import re
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from gpu_llm_kernels import _back_to_back, _egg_source, _inputs, _seeded_model  # noqa: E402
from harness.problem import load_module, load_problem  # noqa: E402


@triton.jit
def _empty8(A, B, C, D, n0, n1, n2, n3):
    pass


@triton.jit
def _empty40(A, B, C, D, E, F, G, H, i0, i1, i2, i3, i4, i5, i6, i7, i8, i9, j0, j1, j2, j3, j4,
             j5, j6, j7, j8, j9, k0, k1, k2, k3, k4, k5, k6, k7, k8, k9, X: tl.constexpr,
             Y: tl.constexpr):
    pass


def per_call_us(fn, calls: int) -> float:
    return _back_to_back(fn, torch.device("cuda"), calls) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("problems", nargs="+")
    ap.add_argument("--calls", type=int, default=300)
    a = ap.parse_args()
    lines = [f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}"]
    t = torch.empty(16, device="cuda")
    ints = list(range(1, 31))
    lines.append(f"bare launch, 4 pointers + 4 ints: {per_call_us(lambda: _empty8[(1,)](t, t, t, t, 3, 5, 7, 9), a.calls):.1f} us")
    lines.append("bare launch, 8 pointers + 30 ints + 2 constexpr: "
                 f"{per_call_us(lambda: _empty40[(1,)](*[t] * 8, *ints, X=1, Y=2), a.calls):.1f} us")
    lines.append(f"torch.empty: {per_call_us(lambda: torch.empty(1024, device='cuda'), a.calls):.1f} us")
    with tempfile.TemporaryDirectory() as tmp:
        for p in a.problems:
            prob = load_problem(pathlib.Path(p))
            init = prob.init_inputs()
            ref = _seeded_model(prob, init, "cuda")
            xs = _inputs(prob, "cuda")
            src, kinds, why = _egg_source(prob, torch.cuda.get_device_properties(0).multi_processor_count, {})
            if src is None:
                lines.append(f"{p}: no kernel ({why})")
                continue
            f = pathlib.Path(tmp) / pathlib.Path(p).name
            f.write_text(src)
            mod = load_module(f, "hp_" + f.stem)
            with torch.device("cuda"):
                new = mod.ModelNew(*init)
            new.load_state_dict(ref.state_dict(), strict=False)
            egg = per_call_us(lambda: new(*xs), a.calls)
            eager = per_call_us(lambda: ref(*xs), a.calls)
            lines.append(f"\n## {pathlib.Path(p).name} ({', '.join(kinds)}): back to back, EGG {egg:.1f} us "
                         f"per call, eager {eager:.1f} us")
            prof = cProfile.Profile()
            with torch.no_grad():
                prof.enable()
                for _ in range(a.calls):
                    new(*xs)
                prof.disable()
                torch.cuda.synchronize()
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(18)
            # no machine's paths in the report: packages and the temporary folder by name only
            text = re.sub(r"\S*/site-packages/", "site-packages/", s.getvalue())
            lines.append(text.replace(tmp + "/", ""))
    text = "\n".join(lines)
    pathlib.Path(a.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
