"""Does each problem's generated file take its kernels for the problem's own call?

    python scripts/admit_scan.py PROBLEM.py|DIR ... [--out OUT.jsonl]

For each problem: compile it (codegen.pipeline.compile_problem, CPU, no kernel runs), import the
emitted file, build ModelNew and the inputs on meta tensors (no memory, any size), and ask the
file's own ``_egg_admit`` whether ``get_inputs()`` (plus the defaults of the forward's other
arguments, as a user's call passes them) takes the kernels, in train() and in eval(). A file
with kernels that admits nothing times the reference against itself (docs/results/level3_h200.md,
"Found on the CPU"). One JSON line per problem; "exc" where something could not be built on meta
tensors (a forward that reads a value with .item()).
"""
from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import pathlib
import signal
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from codegen.pipeline import compile_problem  # noqa: E402
from harness.problem import load_problem  # noqa: E402


def scan(path: pathlib.Path, folder: pathlib.Path, limit_s: int = 180) -> dict:
    def alarm(*_a):
        raise TimeoutError(f"over {limit_s} s")

    signal.signal(signal.SIGALRM, alarm)
    signal.alarm(limit_s)
    try:
        comp = compile_problem(load_problem(path))
        if comp.emitted is None or not comp.emitted.kernels:
            return {"problem": path.name, "kernels": 0, "error": str(comp.error or "")[:120]}
        f = folder / f"c_{path.name}"
        f.write_text(comp.emitted.source)
        spec = importlib.util.spec_from_file_location(f"c_{path.stem}", f)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        mod._EGG_ANY_DEVICE = True  # meta tensors: the device check is not what is asked
        with torch.device("meta"):
            new = mod.ModelNew(*mod.get_init_inputs())
            xs = list(mod.get_inputs())
        params = list(inspect.signature(mod.Model.forward).parameters.values())[1:]
        xs += [p.default for p in params[len(xs):]]
        out = {"problem": path.name, "kernels": len(comp.emitted.kernels)}
        for mode in (True, False):
            new.train(mode)
            guard = mod._EGG_GUARDS[mode]
            key = "train" if mode else "eval"
            if guard is None:  # no kernels in this mode: Model's ops by design
                out[key] = None
                continue
            try:
                out[key] = bool(mod._egg_admit(new, guard, tuple(xs)))
            except Exception as e:  # noqa: BLE001
                out[key] = f"exc {type(e).__name__}: {str(e)[:100]}"
        return out
    except Exception as e:  # noqa: BLE001
        return {"problem": path.name, "exc": f"{type(e).__name__}: {str(e)[:120]}"}
    finally:
        signal.alarm(0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", type=pathlib.Path)
    ap.add_argument("--out", type=pathlib.Path)
    args = ap.parse_args(argv)
    files = [q for p in args.paths for q in (sorted(p.glob("*.py")) if p.is_dir() else [p])]
    folder = pathlib.Path(tempfile.mkdtemp(prefix="egg_admit_"))
    bad = 0
    with (args.out.open("w") if args.out else open(1, "w", closefd=False)) as fh:
        for p in files:
            r = scan(p, folder)
            bad += r.get("kernels", 0) > 0 and (r.get("train") is False or r.get("eval") is False)
            fh.write(json.dumps(r) + "\n")
            fh.flush()
    print(f"{len(files)} problems, {bad} with kernels that admit their own call in neither or one mode",
          file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
