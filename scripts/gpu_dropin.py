"""Generated modules as drop-ins on the GPU (docs/dropin.md): every template family's problem of
tests/dropin_cases.py (and any problem files given), compiled by EGG with its GPU launch
configurations, checked by tests/dropin.check_dropin on CUDA: built on the CPU, random state
loaded, moved with .to("cuda"), then train() and eval(), other sizes and ranks, scaled inputs,
grad mode, float64 and back.

    source scripts/gpu_env.sh
    python scripts/gpu_dropin.py [PROBLEM.py ...] [--filter GLOB] --out $OUT/gpu_dropin.json
    python scripts/dropin_overhead.py examples/*.py --out $OUT/dropin_overhead.json

Prints one line per problem (PASS / FAIL with the trial that failed, and which trials ran the
kernels) and writes the same as JSON.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from codegen.pipeline import compile_problem  # noqa: E402
from harness.problem import load_problem  # noqa: E402
from tests.dropin import check_dropin  # noqa: E402


def problems(extra: list[str]) -> list[tuple[str, str]]:
    from tests import dropin_cases as T

    out = [(f"family:{k}", src) for k, (src, _kinds, _fast) in sorted(T.FAMILIES.items())]
    out += [("issue16:conv_bn_relu", T.CONV_BN_RELU), ("issue16:layer_norm", T.LAYER_NORM),
            ("issue16:log_softmax", T.LOG_SOFTMAX)]
    out += [(p, pathlib.Path(p).read_text()) for p in extra]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problems", nargs="*")
    ap.add_argument("--out")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--filter", default="*", help="names to run (fnmatch), e.g. 'family:*'")
    a = ap.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="egg-gpu-dropin-"))
    rows = []
    for name, src in [(n, s) for n, s in problems(a.problems) if fnmatch.fnmatch(n, a.filter)]:
        path = work / (name.replace(":", "_").replace("/", "_") + ("" if name.endswith(".py") else ".py"))
        path.write_text(src)
        row = {"problem": name}
        t0 = time.time()
        try:
            comp = compile_problem(load_problem(path))
            row["compile_s"] = round(time.time() - t0, 2)
            if comp.emitted is None:
                row.update(ok=False, error=comp.error)
            else:
                rep = check_dropin(src, comp.emitted.source, device=a.device)
                row.update(ok=True, kernels=len(comp.emitted.kernels),
                           fast=sorted({f"{t.mode}:{t.name}" for t in rep.trials if t.fast}),
                           reference=sorted({f"{t.mode}:{t.name}" for t in rep.trials
                                             if not t.fast}))
        except AssertionError as e:
            row.update(ok=False, error=str(e)[:500])
        except Exception as e:  # noqa: BLE001 - reported, the next problem runs
            row.update(ok=False, error=f"{type(e).__name__}: {str(e)[:400]}")
        row["s"] = round(time.time() - t0, 2)
        rows.append(row)
        print(("PASS " if row.get("ok") else "FAIL ") + name, row.get("error", "")
              or f"fast: {len(row.get('fast', []))} trials, reference: {row.get('reference')}",
              flush=True)
    res = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else a.device,
           "passed": sum(r.get("ok", False) for r in rows), "total": len(rows), "problems": rows}
    print(f"{res['passed']}/{res['total']} drop-in")
    if a.out:
        pathlib.Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
