"""A/B of generated files on one workload, on a GPU: eager, torch.compile and each file's ModelNew,
each timed as a call (harness.timing.bench: CUDA events, L2 flushed), by its kernels' device time
after a write flush and after a read flush (harness.timing.device_time), and by its host time per
call (200 calls issued without synchronize: the host's dispatch; then with the final
synchronize: back to back). Two rounds in turn, so a drift of the machine shows. For
before/after comparisons of a template or runtime change on one machine: emit the workload's file
at both commits (scripts/gpu_llm_kernels.py's _egg_source) and pass both.

    source scripts/gpu_env.sh
    python scripts/ab_files.py OUT.json workloads/llm/03_rope.py,OLD.py,NEW.py [WORKLOAD,FILE,... ...]

Each file's largest difference from eager's output is reported (a sanity check, not the
verifier)."""
from __future__ import annotations

import json
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import torch  # noqa: E402

from gpu_llm_kernels import _inputs, _seeded_model, caller  # noqa: E402
from harness.problem import load_module, load_problem  # noqa: E402
from harness.timing import bench, device_time  # noqa: E402


def host_us(f, n: int = 200, digits: int = 1) -> tuple[float, float]:
    """(us per call to issue n calls, us per call until they finished)."""
    f()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return round((t1 - t0) * 1e6 / n, digits), round((t2 - t0) * 1e6 / n, digits)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not torch.cuda.is_available():
        print(__doc__)
        return 2
    out, res = pathlib.Path(argv[0]), {}
    dev = torch.device("cuda")
    for spec in argv[1:]:
        wl, *files = spec.split(",")
        prob = load_problem(pathlib.Path(wl))
        init = prob.init_inputs()
        ref = _seeded_model(prob, init, "cuda")
        xs = _inputs(prob, "cuda")

        def call(m):
            return caller(m, xs)

        with torch.no_grad():
            want = ref(*xs)
        r = res[wl] = {"max_err": {}, "host_us": {}, "rounds": {}}
        mods = {"eager": ref}
        cm = torch.compile(ref)
        call(cm)()
        mods["compile"] = cm
        for f in files:
            mod = load_module(pathlib.Path(f), pathlib.Path(f).stem)
            torch.manual_seed(0)
            with torch.device("cuda"):
                new = mod.ModelNew(*init)
            new.load_state_dict(ref.state_dict(), strict=False)
            with torch.no_grad():
                got = new(*xs)
            gs, ws = (got, want) if isinstance(want, (tuple, list)) else ((got,), (want,))
            r["max_err"][f] = max(float((g.float() - w.float()).abs().max()) for g, w in zip(gs, ws))
            mods[f] = new
        for name, m in mods.items():
            r["host_us"][name] = host_us(call(m))
        for _ in range(2):
            for name, m in mods.items():
                row = (bench(call(m), dev)["median_ms"], device_time(call(m), dev)["device_ms"],
                       device_time(call(m), dev, flush="read")["device_ms"])
                r["rounds"].setdefault(name, []).append([round(x, 4) for x in row])
                print(wl, name, "call / device / clean-L2 device ms:", r["rounds"][name][-1],
                      "host us (issue, back to back):", r["host_us"][name], flush=True)
        torch._dynamo.reset()
        out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
