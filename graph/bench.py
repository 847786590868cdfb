"""``egg bench``: every problem of a folder through the graph, one record per problem.

results.jsonl is appended after each problem (so ``--resume`` continues a suite across short GPU
sessions); report.json / report.md / speedups.png aggregate it. One bad problem never stops the
suite: its record says why it failed.
"""
from __future__ import annotations

import fnmatch
import json
import math
import pathlib
import statistics
import time
import traceback

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from state import Settings

FAST_P = (0.0, 1.0, 1.5, 2.0)


class BenchError(Exception):
    pass


def select(folder: pathlib.Path, pattern: str | None, list_file: pathlib.Path | None) -> list[pathlib.Path]:
    if not folder.is_dir():
        raise BenchError(f"{folder}: not a folder")
    probs = sorted(p for p in folder.rglob("*.py") if not p.name.startswith("_"))
    if list_file is not None:
        if not list_file.is_file():
            raise BenchError(f"--list {list_file}: no such file")
        wanted = [ln.strip() for ln in list_file.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
        by_rel = {str(p.relative_to(folder)): p for p in probs}
        missing = [w for w in wanted if w not in by_rel]
        if missing:
            raise BenchError(f"--list names problems not under {folder}: {', '.join(missing[:3])}")
        probs = [by_rel[w] for w in wanted]
    if pattern:
        probs = [p for p in probs if fnmatch.fnmatch(str(p.relative_to(folder)), pattern)]
    if not probs:
        raise BenchError(f"no problem files selected under {folder}")
    return probs


def _done(results: pathlib.Path) -> set[str]:
    if not results.exists():
        return set()
    names = set()
    for ln in results.read_text().splitlines():
        try:
            names.add(json.loads(ln)["name"])
        except (json.JSONDecodeError, KeyError):
            continue
    return names


def run_one(path: pathlib.Path, name: str, out_dir: pathlib.Path, settings: Settings) -> dict:
    from graph import runs as R
    from harness.problem import ProblemError, describe_problem

    t0 = time.time()
    rec = {"name": name, "verified": False, "correct": False, "fallback": True, "kernels": [],
           "eager_ms": None, "compile_ms": None, "egg_ms": None, "speedup_eager": None,
           "speedup_compile": None, "roofline_pct": None, "stage1_ms": None, "failure": None}
    try:
        describe_problem(path)
        run_id = name.replace("/", "__").removesuffix(".py")
        runs_dir = out_dir / "runs"
        if (runs_dir / run_id).exists():
            import shutil

            shutil.rmtree(runs_dir / run_id)
        # a suite runs unattended: no pause for plan review (even with EGG_REVIEW set)
        run = R.create_run(str(path), settings.model_copy(update={"review": False}), runs_dir, run_id)
        for _ in R.stream(run, {"problem_path": str(path.resolve())}):
            pass
        rep = R.final_state(run).report
        if rep.get("status") != "ok":
            rec["failure"] = rep.get("error", "run failed")
        else:
            t = rep["timing"]
            rec.update(
                fallback=rep["fallback"], kernels=rep["kernels"], correct=True,
                verified=not rep["fallback"], eager_ms=t.get("eager_ms"), compile_ms=t.get("compile_ms"),
                egg_ms=t.get("best_ms"), speedup_eager=t.get("speedup_eager"),
                speedup_compile=t.get("speedup_compile"), roofline_pct=t.get("roofline_pct"),
                stage1_ms=rep.get("stage1_best_ms"), interpreter=t.get("interpreter", False),
                bound=(rep.get("analysis") or {}).get("bound"),
                floor_ms=(rep.get("analysis") or {}).get("floor_ms"),
                templates=sorted({g["template"] for g in (rep.get("plan") or {}).get("groups", [])
                                  if g.get("template")}),
                rewrites=(rep.get("plan") or {}).get("rewrites", []))
            if rep["fallback"]:
                fails = [c["failure"] for c in rep["candidates"] if c.get("failure")]
                reasons = [s.get("finish_reason") for s in rep["stages"].values() if s.get("finish_reason")]
                rec["failure"] = (fails[0] if fails else (reasons[0] if reasons else "no kernel"))[:400]
                if rec["speedup_eager"] is None and not rec.get("interpreter"):
                    rec["speedup_eager"] = 1.0
    except ProblemError as e:
        rec["failure"] = str(e)
    except Exception as e:  # noqa: BLE001 - one bad problem never stops the suite
        rec["failure"] = f"{type(e).__name__}: {e} | {traceback.format_exc().splitlines()[-3:]}"[:600]
    rec["wall_s"] = round(time.time() - t0, 1)
    return rec


def run_bench(problems: list[pathlib.Path], folder: pathlib.Path, out_dir: pathlib.Path,
              settings: Settings, resume: bool, console=None) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    results = out_dir / "results.jsonl"
    if not resume and results.exists():
        results.unlink()
    done = _done(results)
    todo = [p for p in problems if str(p.relative_to(folder)) not in done]
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=False) as prog:
        task = prog.add_task("bench", total=len(todo))
        for p in todo:
            name = str(p.relative_to(folder))
            prog.update(task, description=f"{name[:50]:50s}")
            rec = run_one(p, name, out_dir, settings)
            with results.open("a") as f:
                f.write(json.dumps(rec) + "\n")
            prog.advance(task)
    recs = [json.loads(ln) for ln in results.read_text().splitlines() if ln.strip()]
    names = {str(p.relative_to(folder)) for p in problems}
    recs = [r for r in recs if r["name"] in names]
    rep = aggregate(recs)
    (out_dir / "report.json").write_text(json.dumps(rep, indent=2))
    (out_dir / "report.md").write_text(report_markdown(rep, recs))
    try:
        plot(recs, out_dir / "speedups.png")
    except Exception:  # noqa: BLE001 - the plot is a convenience; the tables are the record
        pass
    return rep


def _geo(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def aggregate(recs: list[dict]) -> dict:
    n = len(recs)
    gpu = [r for r in recs if not r.get("interpreter")]
    sp = [r["speedup_eager"] for r in gpu if r["correct"] and r.get("speedup_eager")]
    spc = [r["speedup_compile"] for r in gpu if r["correct"] and r.get("speedup_compile")]
    comp_vs_eager = [r["eager_ms"] / r["compile_ms"] for r in gpu if r.get("compile_ms") and r.get("eager_ms")]
    roof = [r["roofline_pct"] for r in gpu if r.get("roofline_pct") is not None]
    rep = {
        "problems": n,
        "correct": sum(r["correct"] for r in recs),
        "verified_kernels": sum(r["verified"] for r in recs),
        "fallbacks": sum(r["correct"] and r["fallback"] for r in recs),
        "failed": sum(not r["correct"] for r in recs),
        "interpreter": bool(recs) and all(r.get("interpreter") for r in recs),
        "fast_p": {str(p): (sum(1 for r in gpu if r["correct"] and (r.get("speedup_eager") or 0) > p) / n
                            if n and gpu else None) for p in FAST_P},
        "geomean_speedup_eager": _geo(sp),
        "mean_speedup_eager": statistics.mean(sp) if sp else None,
        "geomean_speedup_compile": _geo(spc),
        "mean_speedup_compile": statistics.mean(spc) if spc else None,
        "geomean_compile_vs_eager": _geo(comp_vs_eager),
        "median_roofline_pct": statistics.median(roof) if roof else None,
        "median_wall_s": statistics.median([r["wall_s"] for r in recs]) if recs else None,
    }
    if rep["interpreter"]:
        rep["note"] = "CPU interpreter run: correctness only; timings are not GPU timings"
    return rep


def _f(v, fmt="{:.3f}") -> str:
    return "-" if v is None else fmt.format(v)


def report_markdown(rep: dict, recs: list[dict]) -> str:
    lines = ["# EGG bench report", "",
             f"- problems: {rep['problems']}, correct: {rep['correct']} "
             f"(verified kernels {rep['verified_kernels']}, reference fallbacks {rep['fallbacks']}), "
             f"failed: {rep['failed']}"]
    if rep.get("note"):
        lines.append(f"- {rep['note']}")
    else:
        fp = ", ".join(f"fast_{p}={_f(v, '{:.2f}')}" for p, v in rep["fast_p"].items())
        lines += [f"- {fp}",
                  f"- speedup vs eager: geomean {_f(rep['geomean_speedup_eager'], '{:.2f}x')}, "
                  f"mean {_f(rep['mean_speedup_eager'], '{:.2f}x')}",
                  f"- speedup vs torch.compile: geomean {_f(rep['geomean_speedup_compile'], '{:.2f}x')}, "
                  f"mean {_f(rep['mean_speedup_compile'], '{:.2f}x')}",
                  f"- torch.compile vs eager (same runs): geomean {_f(rep['geomean_compile_vs_eager'], '{:.2f}x')}",
                  f"- median roofline: {_f(rep['median_roofline_pct'], '{:.1f}%')}"]
    lines += [f"- median wall time per problem: {_f(rep['median_wall_s'], '{:.1f} s')}", "",
              "| problem | eager ms | compile ms | EGG ms | vs eager | vs compile | stage-1 ms | roofline % | kernels | note |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in recs:
        note = "" if r["verified"] else (r.get("failure") or "")
        lines.append(
            f"| {r['name']} | {_f(r['eager_ms'])} | {_f(r['compile_ms'])} | {_f(r['egg_ms'])} "
            f"| {_f(r['speedup_eager'], '{:.2f}x')} | {_f(r['speedup_compile'], '{:.2f}x')} "
            f"| {_f(r.get('stage1_ms'))} | {_f(r['roofline_pct'], '{:.1f}')} | {len(r['kernels'])} "
            f"| {note.replace('|', '/')[:140]} |")
    return "\n".join(lines) + "\n"


def plot(recs: list[dict], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rs = [r for r in recs if r.get("speedup_eager")]
    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    names = [r["name"].split("/")[-1][:28] for r in rs]
    axes[0].bar(range(len(rs)), [r["speedup_eager"] for r in rs], label="EGG vs eager")
    axes[0].plot(range(len(rs)), [r["eager_ms"] / r["compile_ms"] if r.get("compile_ms") else float("nan")
                                  for r in rs], "r.", label="torch.compile vs eager")
    axes[0].axhline(1.0, color="k", lw=0.5)
    axes[0].set_yscale("log")
    axes[0].set_xticks(range(len(rs)))
    axes[0].set_xticklabels(names, rotation=90, fontsize=6)
    axes[0].set_title("speedup per problem")
    axes[0].legend()
    rr = [r for r in rs if r.get("roofline_pct") is not None and r.get("floor_ms")]
    axes[1].scatter([r["floor_ms"] for r in rr], [r["egg_ms"] for r in rr], s=12)
    lim = [min([r["floor_ms"] for r in rr] + [1e-3]), max([r["egg_ms"] for r in rr] + [1.0])]
    axes[1].plot(lim, lim, "k--", lw=0.5, label="roofline floor")
    axes[1].set_xscale("log")
    axes[1].set_yscale("log")
    axes[1].set_xlabel("roofline floor ms")
    axes[1].set_ylabel("EGG ms")
    axes[1].set_title("achieved vs roofline")
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary_table(rep: dict) -> Table:
    t = Table(title="EGG bench")
    t.add_column("metric")
    t.add_column("value")
    for k in ("problems", "correct", "verified_kernels", "fallbacks", "failed"):
        t.add_row(k, str(rep[k]))
    if rep.get("note"):
        t.add_row("note", rep["note"])
    else:
        for p, v in rep["fast_p"].items():
            t.add_row(f"fast_{p}", _f(v, "{:.2f}"))
        t.add_row("geomean vs eager", _f(rep["geomean_speedup_eager"], "{:.2f}x"))
        t.add_row("geomean vs torch.compile", _f(rep["geomean_speedup_compile"], "{:.2f}x"))
        t.add_row("median roofline %", _f(rep["median_roofline_pct"], "{:.1f}"))
    t.add_row("median wall s", _f(rep["median_wall_s"], "{:.1f}"))
    return t
