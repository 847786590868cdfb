"""Launch configurations of one group kind swept on a GPU, kernel by kernel: which tiles, splits and
warps a template wants at a workload's shapes, before a rule in knowledge/heuristics.py changes.

    source scripts/gpu_env.sh
    python scripts/config_probe.py OUT.json PROBLEM.py --kind attention \\
        --grid "BLOCK_N=32,64,128 num_stages=2,3 SPLIT_PROGRAMS=264,528,1056" \\
        [--consts "DECODE_WARPS=4,8"] [--profile 2] [--budget 200]

Every point of the grid (the cartesian product, over the heuristic configuration of stage 1) is
emitted as a ModelNew, its output compared with eager's (allclose at 2e-2: a sanity check, not the
verifier: a rule change is verified by scripts/gpu_llm_kernels.py or egg bench) and timed with
harness.timing.bench (CUDA events, L2 flushed, median). ``--consts`` sets module constants of the
template (knowledge.templates.<template>) that the rendered source reads, e.g. the split-KV
decode kernel's warps. The heuristic configuration comes first, eager after it; the ``--profile``
fastest points get harness.timing.device_time (each kernel's device time per call, L2
flushed). OUT.json is
written after every point, so a call cut short keeps what it measured; ``--budget`` stops the
sweep after that many seconds.
"""
from __future__ import annotations

import argparse
import importlib
import itertools
import json
import pathlib
import sys
import tempfile
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import torch  # noqa: E402

from gpu_llm_kernels import _egg_source, _inputs, _seeded_model, caller  # noqa: E402
from harness import roofline  # noqa: E402
from harness.hardware import detect  # noqa: E402
from harness.problem import load_module, load_problem  # noqa: E402
from harness.timing import bench, device_time  # noqa: E402


def parse_grid(text: str) -> dict[str, list]:
    """``"A=1,2 B=x"`` -> {"A": [1, 2], "B": ["x"]} (numbers where they parse)."""
    out: dict[str, list] = {}
    for item in text.split():
        if "=" not in item:
            raise SystemExit(f"grid item {item!r}: expected NAME=v1,v2")
        name, vals = item.split("=", 1)
        out[name] = [int(v) if v.lstrip("-").isdigit() else v for v in vals.split(",") if v]
    return out


def points(grid: dict[str, list]) -> list[dict]:
    names = sorted(grid)
    return [dict(zip(names, combo)) for combo in itertools.product(*(grid[n] for n in names))]


def _close(got, want) -> float:
    gs, ws = (got, want) if isinstance(want, (tuple, list)) else ((got,), (want,))
    bad = 0.0
    for g, w in zip(gs, ws):
        if isinstance(w, torch.Tensor):
            g, w = g.float(), w.float()
            if not torch.allclose(g, w, atol=2e-2, rtol=2e-2):
                bad = max(bad, float((g - w).abs().max()))
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("problem")
    ap.add_argument("--kind", required=True, help="the group kind the grid applies to (attention, norm, matmul...)")
    ap.add_argument("--template", default="", help="template module of --consts (default: --kind)")
    ap.add_argument("--grid", default="")
    ap.add_argument("--consts", default="")
    ap.add_argument("--profile", type=int, default=1, help="profile the N fastest points")
    ap.add_argument("--budget", type=float, default=1e9, help="seconds for the sweep")
    ap.add_argument("--compile", action="store_true", help="time torch.compile too")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: a smoke test in Triton's interpreter (tiny shapes), no profile")
    a = ap.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (or --device cpu on tiny shapes)")
    t0 = time.time()
    hw = detect(a.device)
    dev = torch.device(a.device)
    path = pathlib.Path(a.problem)
    prob = load_problem(path)
    init = prob.init_inputs()
    ref = _seeded_model(prob, init, a.device)
    xs = _inputs(prob, a.device)
    floor = roofline.floor(roofline.count(prob), hw.peak_tflops, hw.mem_bandwidth_gbs).ms
    tmod = importlib.import_module(f"knowledge.templates.{a.template or a.kind}")
    consts = parse_grid(a.consts)
    saved = {k: getattr(tmod, k) for k in consts}

    def call(m):
        return caller(m, xs)

    with torch.no_grad():
        want = ref(*xs)
    res = {"problem": path.name, "kind": a.kind, "gpu": hw.name, "floor_ms": floor,
           "eager": bench(call(ref), dev), "points": []}
    if a.compile:
        cm = torch.compile(ref)
        call(cm)()
        res["compile"] = bench(call(cm), dev)
        torch._dynamo.reset()
    out = pathlib.Path(a.out)
    pts = [({}, {})] + [(p, c) for c in points(consts) for p in points(parse_grid(a.grid))]
    mods = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (over, cst) in enumerate(pts):
            if time.time() - t0 > a.budget:
                res["cut"] = f"budget reached after {i} of {len(pts)} points"
                break
            row = {"config": over, "consts": cst}
            try:
                for k, v in {**saved, **cst}.items():
                    setattr(tmod, k, v)
                src, kinds, why = _egg_source(prob, hw.sm_count or 132, {a.kind: over} if over else {})
                if src is None:
                    row["why"] = why
                else:
                    f = pathlib.Path(tmp) / f"p{i}.py"
                    f.write_text(src)
                    mod = load_module(f, f"probe{i}")
                    torch.manual_seed(0)
                    with torch.device(a.device):
                        new = mod.ModelNew(*init)
                    new.load_state_dict(ref.state_dict(), strict=False)
                    with torch.no_grad():
                        row["max_err"] = _close(new(*xs), want)
                    row["t"] = bench(call(new), dev)
                    mods[i] = new
            except Exception as e:  # noqa: BLE001 - one point's failure should not lose the rest
                row["why"] = f"{type(e).__name__}: {str(e)[:300]}"
                traceback.print_exc()
            res["points"].append(row)
            ms = row.get("t", {}).get("median_ms")
            print(f"{i}/{len(pts)} {over} {cst}: {ms} ms err {row.get('max_err')} {row.get('why', '')[:100]}",
                  flush=True)
            out.write_text(json.dumps(res, indent=1, default=str))
        for k, v in saved.items():
            setattr(tmod, k, v)
        ok = [(r["t"]["median_ms"], i) for i, r in enumerate(res["points"])
              if "t" in r and not r.get("max_err")]
        for _ms, i in (sorted(ok)[:a.profile] + ([(0, 0)] if 0 in mods else [])) if a.device == "cuda" else []:
            try:
                res["points"][i]["device"] = device_time(call(mods[i]), dev)
            except Exception as e:  # noqa: BLE001
                res["points"][i]["device"] = f"{type(e).__name__}: {e}"
    if a.device == "cuda":
        res["eager_device"] = device_time(call(ref), dev)
    res["s"] = round(time.time() - t0, 1)
    out.write_text(json.dumps(res, indent=1, default=str))
    best = sorted(ok)[:5]
    e = res["eager"]["median_ms"]
    print(f"eager {e} ms, floor {floor} ms; best: " + "; ".join(
        f"{res['points'][i]['config']} {res['points'][i]['consts']} {ms:.4f} ms ({100 * floor / ms if floor else 0:.0f}%)"
        for ms, i in best), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
