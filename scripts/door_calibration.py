"""Evidence for the deep-net door (harness.compare.DEEP_DOOR_FACTOR): how far from float64 are
honest implementations of the same computation in the same precision class as eager?

    python scripts/door_calibration.py PROBLEMS_DIR --list LIST --out OUT.md [--trials 3]

For each problem: eager (PyTorch's defaults: cuDNN convolutions in TF32 on a GPU), the float64
reference (model and inputs cast), and two honest alternatives of eager's precision class:
torch.compile's output (Inductor: other fusions, other reduction orders) and eager in
channels-last memory format (other cuDNN algorithms) for 4-d inputs. Per trial (fresh inputs) and
output: eager's max error against float64, whether it is outside the tolerance of float64 (the
deep-net regime), and each alternative's max error over eager's. The door admits a candidate in
that regime up to DEEP_DOOR_FACTOR times eager's error; the table shows the ratios honest code
reaches. Needs only torch (and triton for torch.compile on a GPU).
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from harness.compare import DEEP_DOOR_FACTOR, Tolerance, flatten  # noqa: E402
from harness.problem import load_problem  # noqa: E402


def _err(a: torch.Tensor, ref: torch.Tensor) -> float:
    fin = torch.isfinite(ref) & torch.isfinite(a.double())
    return float((a.double() - ref)[fin].abs().max()) if fin.any() else math.nan


def _outside(e: torch.Tensor, ref: torch.Tensor, tol: Tolerance) -> bool:
    atol, rtol = tol.for_dtype(e.dtype)
    fin = torch.isfinite(ref) & torch.isfinite(e.double())
    return bool(((e.double() - ref).abs()[fin] > atol + rtol * ref.abs()[fin]).any())


def run(path: pathlib.Path, dev: str, trials: int, tol: Tolerance) -> list[dict]:
    prob = load_problem(path)
    init = prob.init_inputs()
    torch.manual_seed(0)
    with torch.device(dev):
        model = prob.Model(*init)
    model = model.to(dev).eval()
    m64 = __import__("copy").deepcopy(model).double()
    alts = {}
    if dev == "cuda":
        try:
            alts["compile"] = torch.compile(model)
        except Exception as e:  # noqa: BLE001
            print(f"{path.name}: torch.compile: {e}", file=sys.stderr)
    rows = []
    for t in range(trials):
        torch.manual_seed(1000 + t)
        with torch.device(dev):
            xs = [x.to(dev) if isinstance(x, torch.Tensor) else x for x in prob.inputs()]
        with torch.no_grad():
            eager = flatten(model(*xs))
            ref = flatten(m64(*[x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                                for x in xs]))
            outs = {}
            for name, fn in alts.items():
                try:
                    outs[name] = flatten(fn(*xs))
                except Exception as e:  # noqa: BLE001
                    print(f"{path.name}: {name}: {e}", file=sys.stderr)
            if all(not isinstance(x, torch.Tensor) or x.dim() == 4 for x in xs) and any(
                    isinstance(m, torch.nn.Conv2d) for m in model.modules()):
                cl = model.to(memory_format=torch.channels_last)
                outs["channels_last"] = flatten(cl(*[x.to(memory_format=torch.channels_last)
                                                     if isinstance(x, torch.Tensor) else x for x in xs]))
                model.to(memory_format=torch.contiguous_format)
        for i, (e, r) in enumerate(zip(eager, ref)):
            if not isinstance(e, torch.Tensor) or not e.is_floating_point():
                continue
            ee = _err(e, r)
            row = {"problem": path.name, "trial": t, "output": i, "eager_err": ee,
                   "deep": _outside(e, r, tol)}
            for name, o in outs.items():
                row[f"{name}_ratio"] = _err(o[i], r) / ee if ee > 0 else math.nan
            rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder", type=pathlib.Path)
    ap.add_argument("--list", type=pathlib.Path, help="file of relative paths (default: all .py)")
    ap.add_argument("--out", type=pathlib.Path, required=True)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    names = (args.list.read_text().split() if args.list else
             sorted(str(p.relative_to(args.folder)) for p in args.folder.rglob("*.py")))
    tol = Tolerance()
    rows = []
    for n in names:
        try:
            rows += run(args.folder / n, args.device, args.trials, tol)
        except Exception as e:  # noqa: BLE001 - one broken problem does not stop the survey
            print(f"{n}: {type(e).__name__}: {e}", file=sys.stderr)
        if rows:
            print(json.dumps(rows[-1]), flush=True)
    deep = [r for r in rows if r["deep"]]
    ratios = {k: sorted(r[k] for r in deep if k in r and math.isfinite(r[k]))
              for k in ("compile_ratio", "channels_last_ratio")}
    lines = [f"# Deep-net door calibration ({args.device})", "",
             f"`python scripts/door_calibration.py {args.folder} ...`: {len(names)} problems, "
             f"{args.trials} trials each; {len(deep)} of {len(rows)} outputs with eager outside the "
             f"tolerance of float64 (the deep-net regime). DEEP_DOOR_FACTOR = {DEEP_DOOR_FACTOR:g}.", "",
             "| alternative | outputs | median ratio | p90 | p99 | max | share <= factor |",
             "|---|---|---|---|---|---|---|"]
    for k, xs in ratios.items():
        if not xs:
            continue
        q = lambda p: xs[min(len(xs) - 1, int(p * (len(xs) - 1)))]  # noqa: E731
        share = sum(x <= DEEP_DOOR_FACTOR for x in xs) / len(xs)
        lines.append(f"| {k[:-6]} | {len(xs)} | {statistics.median(xs):.2f} | {q(0.9):.2f} | "
                     f"{q(0.99):.2f} | {xs[-1]:.2f} | {share:.0%} |")
    lines += ["", "| problem | trial | output | eager err | deep | compile ratio | channels-last ratio |",
              "|---|---|---|---|---|---|---|"]
    fmt = lambda v: "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3g}"  # noqa: E731
    for r in rows:
        lines.append(f"| {r['problem']} | {r['trial']} | {r['output']} | {fmt(r['eager_err'])} | "
                     f"{'yes' if r['deep'] else 'no'} | {fmt(r.get('compile_ratio'))} | "
                     f"{fmt(r.get('channels_last_ratio'))} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:12]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
