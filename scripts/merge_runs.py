"""Merge the records of several bench runs of one problem list into one table (a later run's
record of a problem replaces an earlier one's), for the pages under docs/results/.

    python scripts/merge_runs.py OUT_DIR LABEL=RUN.jsonl [LABEL=RUN.jsonl ...]

Writes OUT_DIR/results.jsonl (the merged records, each with its run label under "run"),
OUT_DIR/report.json (graph.bench.aggregate of them, plus the stage-1 geomean and the count of
problems where stage 2 beat stage 1 beyond 2%) and prints the markdown table: per problem its run,
eager / torch.compile / EGG times, speedups, stage-1 time, stage-2 gain, roofline, templates,
rewrites and why no kernel was kept.
"""
from __future__ import annotations

import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from graph.bench import _f, _geo, aggregate, read_results  # noqa: E402


def merge(runs: list[tuple[str, pathlib.Path]]) -> list[dict]:
    by_name: dict[str, dict] = {}
    for label, path in runs:
        for rec in read_results(path):
            by_name[rec["name"]] = {**rec, "run": label}
    return [by_name[k] for k in sorted(by_name)]


def stage1_speedup(rec: dict) -> float | None:
    """Speedup over eager of the stage-1 answer (the reference when no stage-1 kernel beat it)."""
    if not rec.get("correct") or not rec.get("eager_ms"):
        return None
    s1 = rec.get("stage1_ms")
    return rec["eager_ms"] / min(s1, rec["eager_ms"]) if s1 else 1.0


def stage2_gain(rec: dict) -> float | None:
    s1, egg, eager = rec.get("stage1_ms"), rec.get("egg_ms"), rec.get("eager_ms")
    if not (egg and eager):
        return None
    return min(s1 or eager, eager) / egg


def summary(recs: list[dict]) -> dict:
    rep = aggregate(recs)
    rep["geomean_stage1_speedup_eager"] = _geo([v for v in map(stage1_speedup, recs) if v])
    rep["stage2_gains_over_2pct"] = sum(1 for r in recs if (stage2_gain(r) or 0) > 1.02)
    return rep


def _x(v) -> str:
    return f"{v:.2f}x" if v else "-"


def _ms(v) -> str:
    return _f(v or None)


def table(recs: list[dict]) -> str:
    head = ("| problem | run | eager ms | compile ms | EGG ms | vs eager | vs compile | stage-1 ms | "
            "stage-2 gain | roofline % | templates | rewrites | why no kernel |")
    lines = [head, "|" + "---|" * 13]
    for r in recs:
        g = stage2_gain(r)
        lines.append(" | ".join([
            f"| {r['name']}", r["run"], _ms(r.get("eager_ms")), _ms(r.get("compile_ms")), _ms(r.get("egg_ms")),
            _x(r.get("speedup_eager")), _x(r.get("speedup_compile")), _ms(r.get("stage1_ms")),
            _x(g) if g and abs(g - 1) > 1e-9 else "-",
            f"{r['roofline_pct']:.0f}" if r.get("roofline_pct") else "-",
            ", ".join(r.get("templates") or []) or "-", ", ".join(r.get("rewrites") or []) or "-",
            (r.get("failure") or "").replace("|", "/")[:120]]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2 or any("=" not in a for a in args[1:]):
        print(__doc__)
        return 2
    out = pathlib.Path(args[0])
    runs = [(a.split("=", 1)[0], pathlib.Path(a.split("=", 1)[1])) for a in args[1:]]
    for _label, p in runs:
        if not p.is_file():
            print(f"no such run file: {p}", file=sys.stderr)
            return 2
    recs = merge(runs)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (out / "report.json").write_text(json.dumps(summary(recs), indent=2) + "\n")
    print(table(recs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
