"""Plan invariance over a folder of problems: every equivalent variant workloads/variants.py
writes of each problem, planned (capture, canonical forms, rules, fusion: no kernel runs) and
compared with its original's plan (the template kinds and the number of kernels). With
``--values``, eager's outputs of the two are compared too (on the CPU, real tensors: only for
problems of at most --max-elements input and parameter elements).

    python scripts/variant_plans.py DIR [--values] [--max-elements 4000000] [--out OUT.md]

Prints one line per variant (OK / PLAN / VALUES / ERROR) and a summary; exit code 1 when a
variant whose eager values agree gets another plan. Used on the KernelBench dev problems
(../shared/kernelbench/materialize.py writes them out) and on workloads/llm.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "workloads"))

import torch  # noqa: E402

import variants as V  # noqa: E402
from codegen.pipeline import analyze  # noqa: E402
from harness.compare import Tolerance  # noqa: E402
from harness.problem import build_model, describe_problem, load_problem  # noqa: E402


def signature(path) -> list[str] | str:
    try:
        plan, _rw, err = analyze(load_problem(path))
    except Exception as e:  # noqa: BLE001 - a problem the loader rejects
        return f"error: {type(e).__name__}: {str(e)[:120]}"
    return sorted(g.kind for g in plan.groups) if plan is not None else f"no plan: {err}"


def eager(path, seed: int = 0):
    prob = load_problem(path)
    torch.manual_seed(1234)
    model = build_model(prob, prob.init_inputs())
    torch.manual_seed(seed)
    xs = prob.inputs()
    with torch.no_grad():
        out = model(*xs)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def agree(a, b) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if not isinstance(x, torch.Tensor):
            if x != y:
                return False
            continue
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        atol, rtol = Tolerance().for_dtype(x.dtype)
        if x.is_floating_point() and not torch.allclose(x.double(), y.double(), atol=atol, rtol=rtol,
                                                       equal_nan=True):
            return False
        if not x.is_floating_point() and not torch.equal(x, y):
            return False
    return True


def small_enough(path, limit: int) -> bool:
    try:
        _prob, spec = describe_problem(path)
    except Exception:  # noqa: BLE001
        return False
    n = 0
    for t in list(spec.inputs) + list(getattr(spec, "params", []) or []):
        shape = getattr(t, "shape", None)
        if shape:
            k = 1
            for s in shape:
                k *= int(s)
            n += k
    return n <= limit


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--values", action="store_true")
    ap.add_argument("--max-elements", type=int, default=4_000_000)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    lines, counts, bad = [], {}, 0
    with tempfile.TemporaryDirectory() as tmp:
        for p in sorted(pathlib.Path(a.dir).rglob("*.py")):
            try:
                found = V.variants(p.read_text())
            except SyntaxError:
                continue
            if not found:
                continue
            base = signature(p)
            for rule, src in found:
                q = pathlib.Path(tmp) / f"{p.stem}__{rule.name}.py"
                q.write_text(src)
                sig = signature(q)
                verdict = "OK" if sig == base else "PLAN"
                if isinstance(sig, str) and not isinstance(base, str):
                    verdict = "ERROR"
                if a.values and verdict != "ERROR" and small_enough(p, a.max_elements):
                    try:
                        if not agree(eager(p), eager(q)):
                            verdict = "VALUES"  # not an equivalent variant: its plan may differ
                    except Exception as e:  # noqa: BLE001
                        verdict, sig = "ERROR", f"eager: {type(e).__name__}: {str(e)[:100]}"
                counts[verdict] = counts.get(verdict, 0) + 1
                bad += verdict == "PLAN"
                line = f"{verdict:6s} {p.relative_to(a.dir)} {rule.name}: {base} -> {sig}"
                lines.append(line)
                print(line, flush=True)
    summary = f"{sum(counts.values())} variants: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    print(summary)
    if a.out:
        pathlib.Path(a.out).write_text("\n".join(["```"] + lines + ["```", "", summary]) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
