"""Host time the drop-in dispatch of a generated ModelNew adds per call (docs/dropin.md).

For each problem: compile it with EGG, build ModelNew on the device, replace the kernel path
(``_egg_fast*``) by a function returning its first argument, and time ``forward`` (the route
key, the cache lookup, the mode checks) against calling that function directly. Also prints an
empty nn.Module call on the same machine as a yardstick.

    python scripts/dropin_overhead.py examples/row_softmax.py examples/conv_tail.py \
        [--device cuda] [--out $OUT/dropin_overhead.json]

On the CPU set TRITON_INTERPRET=1 (the kernels are not run, but the file imports Triton).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile
import timeit

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from codegen.pipeline import compile_problem  # noqa: E402
from harness.problem import load_module, load_problem  # noqa: E402


def per_call_us(fn, number: int = 20000, repeat: int = 7) -> float:
    return 1e6 * min(timeit.repeat(fn, number=number, repeat=repeat)) / number


def measure(path: str, device: str) -> dict:
    prob = load_problem(path)
    comp = compile_problem(prob)
    if comp.emitted is None:
        return {"problem": path, "error": comp.error}
    out = pathlib.Path(tempfile.mkdtemp()) / "candidate.py"
    out.write_text(comp.emitted.source)
    mod = load_module(out, "candidate")
    with torch.device(device):
        m = mod.ModelNew(*prob.init_inputs())
    xs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in prob.inputs()]

    def stub(*a):
        return a[0]

    for name in ("_egg_fast", "_egg_fast_train", "_egg_fast_eval"):
        if hasattr(m, name):
            setattr(m, name, stub)  # the kernels out of the measurement: the dispatch alone
    with torch.no_grad():
        m(*xs)
        took = m._egg_routes and next(iter(m._egg_routes.values()))
        dispatch = per_call_us(lambda: m.forward(*xs)) - per_call_us(lambda: stub(*xs))
    return {"problem": path, "fast_path": bool(took), "dispatch_us": round(dispatch, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problems", nargs="+")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out")
    a = ap.parse_args()
    rows = [measure(p, a.device) for p in a.problems]

    class Empty(torch.nn.Module):
        def forward(self, x):
            return x

    e, x = Empty(), torch.zeros(4)
    res = {"device": a.device, "empty_module_call_us": round(per_call_us(lambda: e(x)), 3),
           "x_shape_us": round(per_call_us(lambda: x.shape), 3), "problems": rows}
    print(json.dumps(res, indent=1))
    if a.out:
        pathlib.Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
