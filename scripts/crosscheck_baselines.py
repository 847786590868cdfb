#!/usr/bin/env python3
"""Cross-check EGG's baseline timings against an independent measurement (GPU only).

For each problem of a bench results.jsonl, a fresh Python process that imports nothing of EGG
(only torch and triton) builds the problem KernelBench-style (``Model(*get_init_inputs()).cuda()``,
``[x.cuda() for x in get_inputs()]``), times eager and then torch.compile (default mode) with
plain ``triton.testing.do_bench`` (median, L2 flushed), and the script compares them with the
``eager_ms`` / ``compile_ms`` that ``egg bench`` recorded. It writes a markdown table:

    problem | EGG eager | independent eager | diff % | EGG compile | independent compile | diff %

Usage (on the GPU machine, after ``egg bench PROBLEMS --out OUT``):

    python scripts/crosscheck_baselines.py OUT/results.jsonl PROBLEMS [--out crosscheck.md]
        [--filter GLOB] [--limit N] [--timeout 600]

or, anywhere, against a stored independent do_bench table of the same problems on the same GPU
model (markdown rows ``| problem | eager ms | torch.compile ms | ... |``):

    python scripts/crosscheck_baselines.py OUT/results.jsonl --reference TABLE.md [--out ...]

Differences of a few percent are expected (different processes, clocks, allocator state); a
difference beyond ~10% on a problem deserves a look at how EGG timed it.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import pathlib
import statistics
import subprocess
import sys


def _one(path: str) -> dict:
    """Child: time eager and torch.compile of one problem with plain do_bench."""
    import importlib.util
    import time

    import torch
    import triton.testing

    spec = importlib.util.spec_from_file_location("xcheck_problem", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(0)
    model = mod.Model(*mod.get_init_inputs()).cuda()
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in mod.get_inputs()]
    out: dict = {"gpu": torch.cuda.get_device_name()}
    with torch.no_grad():
        med, p20, p80 = triton.testing.do_bench(lambda: model(*inputs), quantiles=[0.5, 0.2, 0.8])
        out["eager"] = {"median_ms": med, "p20_ms": p20, "p80_ms": p80}
        try:
            compiled = torch.compile(model)
            t0 = time.perf_counter()
            compiled(*inputs)
            torch.cuda.synchronize()
            out["compile_s"] = round(time.perf_counter() - t0, 2)
            med, p20, p80 = triton.testing.do_bench(lambda: compiled(*inputs), quantiles=[0.5, 0.2, 0.8])
            out["compile"] = {"median_ms": med, "p20_ms": p20, "p80_ms": p80}
        except Exception as e:  # noqa: BLE001
            out["compile_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return out


def _measure(path: pathlib.Path, timeout: float) -> dict:
    try:
        p = subprocess.run([sys.executable, __file__, "--one", str(path)], capture_output=True,
                           text=True, timeout=timeout)
        return json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else \
            {"error": (p.stderr.strip().splitlines() or ["?"])[-1][:200]}
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:g} s"}
    except (json.JSONDecodeError, IndexError):
        return {"error": "no result"}


def _reference_table(path: pathlib.Path) -> dict[str, dict]:
    """Rows ``| problem | eager ms | compile ms | ...`` of a markdown table, in _one's format."""
    out = {}
    for ln in path.read_text().splitlines():
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        if len(cells) < 3:
            continue
        try:
            e, c = float(cells[1]), float(cells[2])
        except ValueError:
            continue
        out[cells[0]] = {"eager": {"median_ms": e}, "compile": {"median_ms": c}}
    return out


def _diff(egg, ind) -> float | None:
    if not egg or not ind:
        return None
    return 100.0 * (egg - ind) / ind


def _f(v, fmt="{:.3f}") -> str:
    return "-" if v is None else fmt.format(v)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="?", help="results.jsonl of egg bench")
    ap.add_argument("problems", nargs="?", help="the folder egg bench was given")
    ap.add_argument("--out", default="crosscheck.md", help="markdown table to write")
    ap.add_argument("--filter", default=None, help="glob on problem names")
    ap.add_argument("--limit", type=int, default=0, help="at most this many problems")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per problem")
    ap.add_argument("--reference", default=None,
                    help="markdown table of independent eager/compile ms to compare with (no GPU)")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one:
        print(json.dumps(_one(a.one)))
        return 0
    if not a.results or not (a.problems or a.reference):
        ap.error("give results.jsonl and the problems folder (or --reference TABLE.md)")
    table = _reference_table(pathlib.Path(a.reference)) if a.reference else None
    folder = pathlib.Path(a.problems or ".")
    recs = []
    for ln in pathlib.Path(a.results).read_text().splitlines():
        try:
            r = json.loads(ln)
        except json.JSONDecodeError:
            continue
        if r.get("eager_ms") and (not a.filter or fnmatch.fnmatch(r["name"], a.filter)):
            recs.append(r)
    if a.limit:
        recs = recs[: a.limit]
    if not recs:
        print("no records with GPU eager timings", file=sys.stderr)
        return 2
    rows, eager_d, comp_d, gpu = [], [], [], None
    for i, r in enumerate(recs, 1):
        path = folder / r["name"]
        print(f"[{i}/{len(recs)}] {r['name']}", file=sys.stderr, flush=True)
        if table is not None:
            res = table.get(r["name"]) or {"error": "not in the reference table"}
        else:
            res = _measure(path, a.timeout)
        gpu = gpu or res.get("gpu")
        ie = (res.get("eager") or {}).get("median_ms")
        ic = (res.get("compile") or {}).get("median_ms")
        de, dc = _diff(r.get("eager_ms"), ie), _diff(r.get("compile_ms"), ic)
        if de is not None:
            eager_d.append(abs(de))
        if dc is not None:
            comp_d.append(abs(dc))
        note = res.get("error") or res.get("compile_error") or ""
        rows.append(f"| {r['name']} | {_f(r.get('eager_ms'))} | {_f(ie)} | {_f(de, '{:+.1f}')} "
                    f"| {_f(r.get('compile_ms'))} | {_f(ic)} | {_f(dc, '{:+.1f}')} | {note.replace('|', '/')[:100]} |")
    lines = [f"# Baseline cross-check ({gpu or 'GPU'})", "",
             "EGG's eager/compile times (egg bench, its profiling process) against "
             + (f"the independent do_bench table {pathlib.Path(a.reference).name} "
                if table is not None else
                "triton.testing.do_bench in a fresh process per problem ") +
             "(scripts/crosscheck_baselines.py). "
             "diff % = (EGG - independent) / independent.", "",
             f"- problems: {len(rows)}; median |diff| eager: {_f(statistics.median(eager_d) if eager_d else None, '{:.1f}%')}, "
             f"compile: {_f(statistics.median(comp_d) if comp_d else None, '{:.1f}%')}; "
             f"over 10%: eager {sum(d > 10 for d in eager_d)}, compile {sum(d > 10 for d in comp_d)}", "",
             "| problem | EGG eager ms | independent eager ms | diff % | EGG compile ms | independent compile ms | diff % | note |",
             "|---|---|---|---|---|---|---|---|"] + rows
    pathlib.Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
