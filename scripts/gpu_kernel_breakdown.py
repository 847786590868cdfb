"""Where the time goes: the GPU kernels of eager, torch.compile and EGG's stage-1 source (and its
channels-last variant for convolutions), per problem, from torch.profiler.

    python scripts/gpu_kernel_breakdown.py OUT_DIR PROBLEM.py [PROBLEM.py ...] [--iters 10]

For each problem writes OUT_DIR/<stem>.md (per variant: median time of one call by CUDA events,
and every kernel's mean device time per call, largest first) and OUT_DIR/<stem>.inductor.py
(the code torch.compile generated). EGG's sources use the heuristic configurations of stage 1
(no search) and are not verified here: this is a diagnostic, not a benchmark (egg bench is).
Needs only torch and triton (no LangGraph).
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import traceback

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from codegen import pipeline  # noqa: E402
from codegen.emit import emit_model  # noqa: E402
from harness.problem import build_model, load_module, load_problem, problem_from_source  # noqa: E402
from harness.timing import profiled_kernels  # noqa: E402
from policies.expert import group_config  # noqa: E402


def _egg_source(prob, channels_last: bool) -> str | None:
    plan, _rw, err = pipeline.analyze(prob, None, channels_last=channels_last)
    if plan is None:
        print(f"  no plan: {err}")
        return None
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    configs = {g.id: group_config(plan, g, sm) for g in plan.groups}
    return emit_model(prob.source, plan, configs, "# gpu_kernel_breakdown").source


def _median_ms(fn, n: int = 20) -> float:
    times = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def _kernels(fn, iters: int) -> list[tuple[str, float, int]]:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    return profiled_kernels(prof, iters)


def one(path: pathlib.Path, out: pathlib.Path, iters: int) -> None:
    prob = load_problem(path)
    init = prob.init_inputs()
    torch.manual_seed(0)
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in prob.inputs()]
    ref = build_model(prob, init, "cuda")
    variants = {"eager": ref}
    from torch._inductor.utils import run_and_get_code

    comp = torch.compile(ref)
    with torch.no_grad():
        _res, codes = run_and_get_code(comp, *inputs)
    (out / f"{path.stem}.inductor.py").write_text("\n\n# ----\n\n".join(codes))
    variants["compile"] = comp
    layouts = [False, True] if pipeline.has_convolution(prob) else [False]
    for cl in layouts:
        src = _egg_source(prob, cl)
        if src is None:
            continue
        f = problem_from_source(src, out / "src", f"{path.stem}_{'cl' if cl else 'std'}")
        mod = load_module(f, "candidate")
        with torch.device("cuda"):
            m = mod.ModelNew(*init)
        m.load_state_dict(ref.state_dict(), strict=False)
        variants["egg_cl" if cl else "egg"] = m
    lines = [f"# {path.parent.name}/{path.name}", ""]
    with torch.no_grad():
        want = ref(*inputs)
    for name, m in variants.items():
        def call(m=m):
            with torch.no_grad():
                return m(*inputs)
        try:
            for _ in range(3):
                call()
            torch.cuda.synchronize()
            ms = _median_ms(call)
            rows = _kernels(call, iters)
        except Exception as e:  # noqa: BLE001 - one variant's failure should not lose the rest
            lines += [f"## {name}: failed: {type(e).__name__}: {str(e)[:300]}", ""]
            continue
        with torch.no_grad():
            got = call()
        gs, ws = (got, want) if isinstance(want, (tuple, list)) else ((got,), (want,))
        err = max(float((g.float() - w.float()).abs().max()) for g, w in zip(gs, ws))
        lines += [f"## {name}: {ms:.3f} ms per call (median of 20, CUDA events; L2 not flushed); "
                  f"max abs diff vs eager {err:.2e}",
                  "", "| kernel | ms per call | launches per call |", "|---|---|---|"]
        lines += [f"| `{k[:110]}` | {t:.3f} | {c} |" for k, t, c in rows]
        lines.append("")
    (out / f"{path.stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("problems", nargs="+")
    ap.add_argument("--iters", type=int, default=10)
    a = ap.parse_args()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for p in a.problems:
        try:
            one(pathlib.Path(p), out, a.iters)
        except Exception:  # noqa: BLE001
            (out / f"{pathlib.Path(p).stem}.error.txt").write_text(traceback.format_exc())
            traceback.print_exc()
        torch._dynamo.reset()
    return 0


if __name__ == "__main__":
    sys.exit(main())
