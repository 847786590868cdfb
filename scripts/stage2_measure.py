"""Measure the stage-2 pruning and compile check on a folder of problems (no GPU needed; on the
GPU machine it uses its 16 cores).

For every fused kernel of every problem: the tuning space of its template for the target,
the rules' verdicts, the cost model's shortlist, each shortlisted variant emitted as a
candidate and compiled for the device (harness.compile_check). It writes one JSON file with,
per variant, the estimated registers / shared memory next to the measured ones, the compile
time per kernel and the wall time of the whole check with 1 and with N processes.

    python scripts/stage2_measure.py --workloads workloads/llm --hardware h200 --jobs 16 \
        --out docs/results/stage2/compile_check.json
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.pop("TRITON_INTERPRET", None)

import knowledge  # noqa: E402
from codegen import pipeline  # noqa: E402
from codegen.emit import emit_model  # noqa: E402
from codegen.fusion import group_inputs  # noqa: E402
from harness import compile_check as CC  # noqa: E402
from harness.problem import ProblemError, load_problem  # noqa: E402
from knowledge import pruning as R  # noqa: E402
from knowledge.schema import dtype_key  # noqa: E402
from policies.expert import group_config  # noqa: E402
from policies.search import group_dtype  # noqa: E402


def variants_of(path: pathlib.Path, hw, width: int, work: pathlib.Path) -> list[dict]:
    prob = load_problem(path)
    fplan, _rw, err = pipeline.analyze(prob)
    if fplan is None:
        return []
    base = {g.id: group_config(fplan, g, hw.sm_count) for g in fplan.groups}
    out = []
    for g in fplan.groups:
        ins, _, _ = group_inputs(fplan, g)
        geo = pipeline.group_geometry(fplan, g, len(ins))
        dtype, itemsize = group_dtype(g, ins)
        space = knowledge.config_space(g.template, hw.arch, dtype)
        if space is None:
            continue
        dev = R.device_of(hw, dtype_key(dtype))
        inc = R.canonical(g.kind, base[g.id], geo)
        kept, pruned = R.rank_space(space, inc, g.kind, geo, dev, itemsize)
        for i, cfg in enumerate(R.shortlist(kept, inc, width, g.kind, geo)):
            p2, _, _ = pipeline.analyze(prob)
            em = emit_model(prob.source, p2, {**base, g.id: cfg}, "# stage-2 measurement variant")
            f = work / f"{path.stem}_{g.id}_v{i}.py"
            f.write_text(em.source)
            res = R.resources(g.kind, cfg, geo, itemsize)
            out.append({"problem": path.name, "group": g.id, "kind": g.kind, "dtype": dtype,
                        "config": cfg, "file": str(f), "est_regs": res.regs, "est_smem": res.smem,
                        "est_us": R.estimate_us(g.kind, cfg, geo, dev, itemsize),
                        "space": len(kept) + len(pruned), "pruned": len(pruned)})
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default="workloads/llm")
    ap.add_argument("--hardware", default="h200", help="a profile id of knowledge/hardware")
    ap.add_argument("--jobs", type=int, default=CC.default_jobs())
    ap.add_argument("--width", type=int, default=8, help="shortlist per kernel")
    ap.add_argument("--serial", type=int, default=8, help="variants also checked with one process")
    ap.add_argument("--out", default="docs/results/stage2/compile_check.json")
    a = ap.parse_args()
    hw = knowledge.hardware_profiles()[a.hardware]
    work = pathlib.Path(tempfile.mkdtemp(prefix="egg-stage2-"))
    cache = str(work / "triton-cache")
    variants = []
    for p in sorted(pathlib.Path(a.workloads).glob("*.py")):
        try:
            variants += variants_of(p, hw, a.width, work)
        except ProblemError as e:
            print(f"skip {p.name}: {e}")
    print(f"{len(variants)} variants of {len({v['problem'] for v in variants})} problems")
    tgt = {"arch": int(hw.arch.split("_")[1]), "smem_limit": hw.smem_per_block}
    t0 = time.time()
    serial = CC.check_files([v["file"] for v in variants[: a.serial]], jobs=1, cache_dir=cache + "-serial", **tgt)
    t_serial = time.time() - t0
    t0 = time.time()
    res = CC.check_files([v["file"] for v in variants], jobs=a.jobs, cache_dir=cache, **tgt)
    t_par = time.time() - t0
    per_kernel = []
    for v, r in zip(variants, res):
        k = next((k for k in r.kernels if k.kernel == f"_egg_k_{v['group']}"), None)
        v.update(ok=r.ok, category=r.category, reason=r.reason[:200],
                 regs=k.n_regs if k else None, smem=k.shared if k else None,
                 local=k.local_bytes if k else None, compile_s=k.compile_s if k else None)
        if k is not None and k.ok:
            per_kernel.append(k.compile_s)
    summary = {
        "hardware": hw.id, "arch": hw.arch, "jobs": a.jobs, "variants": len(variants),
        "rejected": sum(not v["ok"] for v in variants),
        "serial_files": len(serial), "serial_wall_s": round(t_serial, 2),
        "serial_s_per_file": round(t_serial / max(1, len(serial)), 2),
        "parallel_wall_s": round(t_par, 2),
        "parallel_s_per_file": round(t_par / max(1, len(variants)), 3),
        "median_compile_s_per_kernel": statistics.median(per_kernel) if per_kernel else None,
        "max_compile_s_per_kernel": max(per_kernel) if per_kernel else None,
        "regs_estimate_ratio_median": statistics.median(
            [v["est_regs"] / v["regs"] for v in variants if v.get("regs")]) if any(v.get("regs") for v in variants) else None,
        "command": " ".join(sys.argv),
    }
    out = pathlib.Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for v in variants:
        v.pop("file", None)
    out.write_text(json.dumps({"summary": summary, "variants": variants}, indent=1, default=str))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
