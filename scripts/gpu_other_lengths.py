"""Does a generated module take its kernels, and stay right, at shapes other than the traced one?
For each workload file, EGG compiles it once at its own shapes (template default launch
configurations: no tuning), then Model and ModelNew (same state) run at the traced shapes and at
each override of the file's shape constants (``CACHE_LEN=2048``: the problem's get_inputs()
read with that value); per shape: whether the kernels ran (or Model's ops), the max error and the
time of both (triton.testing.do_bench, ms).

    source scripts/gpu_env.sh
    python scripts/gpu_other_lengths.py workloads/llm/12_gqa_decode_attention_manual.py \\
        --set CACHE_LEN=2048 --set CACHE_LEN=3001 --set BATCH=3 --out $OUT/other_lengths.json
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from codegen.pipeline import compile_problem  # noqa: E402
from harness.problem import load_module, load_problem  # noqa: E402


def run(path: pathlib.Path, sets: list[dict], dev: str) -> list[dict]:
    from triton.testing import do_bench

    comp = compile_problem(load_problem(path))
    if comp.emitted is None:
        return [{"problem": path.stem, "error": comp.error}]
    tmp = pathlib.Path(tempfile.mkdtemp()) / f"new_{path.stem}.py"
    tmp.write_text(comp.emitted.source)
    ref_mod, new_mod = load_module(path, f"ref_{path.stem}"), load_module(tmp, f"new_{path.stem}")
    init = ref_mod.get_init_inputs()
    torch.manual_seed(0)
    ref = ref_mod.Model(*init).to(dev).eval()
    new = new_mod.ModelNew(*init)
    new.load_state_dict(ref.state_dict(), strict=False)
    new = new.to(dev).eval()
    fell_back: list[int] = []
    slow = new._egg_reference
    new._egg_reference = lambda *a: (fell_back.append(1), slow(*a))[1]
    rows = []
    for over in [{}] + sets:
        saved = {k: getattr(ref_mod, k) for k in over}
        for k, v in over.items():
            setattr(ref_mod, k, v)
        try:
            torch.manual_seed(1)
            xs = [x.to(dev) if isinstance(x, torch.Tensor) else x for x in ref_mod.get_inputs()]
        finally:
            for k, v in saved.items():
                setattr(ref_mod, k, v)
        with torch.no_grad():
            a = ref(*xs)
            fell_back.clear()
            b = new(*xs)
            took = not fell_back
            err = max(float((x.float() - y.float()).abs().max()) for x, y in
                      zip(a if isinstance(a, (tuple, list)) else [a], b if isinstance(b, (tuple, list)) else [b]))
            timed = dev == "cuda"  # (the interpreter's times mean nothing)
            t_ref = do_bench(lambda: ref(*xs)) if timed else float("nan")
            t_new = do_bench(lambda: new(*xs)) if timed else float("nan")
        rows.append({"problem": path.stem, "set": over or "traced", "kernels": took, "max_err": err,
                     "eager_ms": round(t_ref, 4), "egg_ms": round(t_new, 4)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problems", nargs="+", type=pathlib.Path)
    ap.add_argument("--set", action="append", default=[], help="NAME=INT (repeatable: one shape each)")
    ap.add_argument("--out", type=pathlib.Path)
    a = ap.parse_args()
    sets = [{k: int(v)} for k, v in (s.split("=", 1) for s in a.set)]
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    for p in a.problems:
        names = set(vars(load_module(p, f"names_{p.stem}")))
        rows += run(p, [s for s in sets if set(s) <= names], dev)
    if a.out:
        a.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
