"""Measure what convolution layout and precision choices would buy, before building them.

    python scripts/conv_layout_probe.py PROBLEMS_DIR LIST_FILE OUT.json [--seeds 3]

For every problem in LIST_FILE whose Model holds an nn.Conv*/nn.ConvTranspose* module, times the
whole forward (triton.testing.do_bench, L2 flushed, median) and measures its max error against a
float64 run of the same model, under these variants:

  eager        the problem as written (NCHW, PyTorch's default cuDNN flags: TF32 allowed)
  cl           model and inputs channels-last (channels_last_3d for 5-d), TF32 allowed
  cl_fp32      channels-last with cuDNN TF32 off (full fp32 convolutions)
  fp32         NCHW with cuDNN TF32 off
  cl_bench     channels-last with cudnn.benchmark on (algorithm search), TF32 allowed

The question it answers: can a layout change pass the precision contract (error against float64
no larger than eager's, on every seed) and at what speed? Needs torch and triton only.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

import torch
import torch.nn as nn

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.problem import build_model, load_problem  # noqa: E402

CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
VARIANTS = {
    "eager": dict(cl=False, tf32=True, bench=False),
    "cl": dict(cl=True, tf32=True, bench=False),
    "cl_fp32": dict(cl=True, tf32=False, bench=False),
    "fp32": dict(cl=False, tf32=False, bench=False),
    "cl_bench": dict(cl=True, tf32=True, bench=True),
}


def _fmt(x: torch.Tensor) -> torch.memory_format | None:
    return {4: torch.channels_last, 5: torch.channels_last_3d}.get(x.dim())


def _to_layout(model: nn.Module, args: list, cl: bool):
    if not cl:
        return model, args
    m = model
    for mod in m.modules():
        if isinstance(mod, CONV) and mod.weight.dim() in (4, 5):
            mod.weight.data = mod.weight.data.contiguous(memory_format=_fmt(mod.weight))
    return m, [a.contiguous(memory_format=_fmt(a)) if isinstance(a, torch.Tensor) and _fmt(a) else a
               for a in args]


def _err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref).abs().max())


def probe(path: pathlib.Path, seeds: int) -> dict | None:
    import triton.testing as tt
    prob = load_problem(path)
    torch.manual_seed(0)
    init = prob.init_inputs() if hasattr(prob, "init_inputs") else prob.module.get_init_inputs()
    model = build_model(prob, list(init), "cuda").eval()
    if not any(isinstance(m, CONV) for m in model.modules()):
        return None
    m64 = build_model(prob, list(init), "cuda").eval()
    m64.load_state_dict(model.state_dict())
    m64 = m64.double()
    rec: dict = {"problem": str(path), "variants": {}}
    inputs = []
    for s in range(seeds):
        torch.manual_seed(1000 + s)
        args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in prob.module.get_inputs()]
        with torch.no_grad():
            ref = m64(*[a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                        for a in args])
        inputs.append((args, ref))
    for name, v in VARIANTS.items():
        mv = build_model(prob, list(init), "cuda").eval()
        mv.load_state_dict(model.state_dict())
        errs = []
        with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, benchmark=v["bench"],
                                                         deterministic=False, allow_tf32=v["tf32"]):
            mv, _ = _to_layout(mv, [], v["cl"])
            for args, ref in inputs:
                _, a2 = _to_layout(mv, args, v["cl"])
                errs.append(_err(mv(*a2), ref))
            _, a2 = _to_layout(mv, inputs[0][0], v["cl"])
            ms = tt.do_bench(lambda: mv(*a2), warmup=50, rep=300, return_mode="median")
        rec["variants"][name] = {"ms": round(ms, 4), "err": errs}
        del mv
        torch.cuda.empty_cache()
    e = rec["variants"]["eager"]["err"]
    for name, r in rec["variants"].items():
        r["passes_fp64_door"] = all(c <= ee for c, ee in zip(r["err"], e))
        r["speedup"] = round(rec["variants"]["eager"]["ms"] / r["ms"], 3)
    return rec


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("problems")
    ap.add_argument("list")
    ap.add_argument("out")
    ap.add_argument("--seeds", type=int, default=3)
    a = ap.parse_args()
    names = [ln.strip() for ln in pathlib.Path(a.list).read_text().splitlines() if ln.strip()]
    outp = pathlib.Path(a.out)
    done = json.loads(outp.read_text()) if outp.exists() else []
    seen = {d["problem"] for d in done}
    for n in names:
        p = pathlib.Path(a.problems) / n
        if str(p) in seen:
            continue
        try:
            rec = probe(p, a.seeds)
        except Exception as e:  # noqa: BLE001
            rec = {"problem": str(p), "error": f"{type(e).__name__}: {e}"[:300]}
        if rec is None:
            continue
        done.append(rec)
        outp.write_text(json.dumps(done, indent=1))
        v = rec.get("variants", {})
        print(n, {k: (r["ms"], r["speedup"], r["passes_fp64_door"]) for k, r in v.items()}
              or rec.get("error"), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
