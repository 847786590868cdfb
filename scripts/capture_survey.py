"""How each graph-capture method does on a set of problems (docs/capture.md).

For every problem and every method, in a child process with a time limit, on meta tensors:
- ``fx``: ``torch.fx.symbolic_trace`` of Model and shape propagation (EGG before graph breaks);
- ``egg``: ``harness.capture.capture`` (fx, else buffers traced and graph breaks): whole,
  regions (with the number of graph breaks) or none;
- ``export-strict`` / ``export-nonstrict``: ``torch.export.export(model, inputs, strict=...)``;
- ``dynamo``: ``torch._dynamo.explain`` (what torch.compile captures): graphs and graph breaks.
For ``fx`` and ``egg`` it also plans the problem (codegen.pipeline.analyze) and counts the
fused kernel groups. One JSON line per (problem, method) goes to OUT/survey.jsonl (resumable);
the summary table is printed.

    python scripts/capture_survey.py --out OUT PROBLEM_OR_DIR ... [--timeout S] [--methods a,b]
"""
from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import time
from collections import Counter

ROOT = pathlib.Path(__file__).resolve().parent.parent
METHODS = ("fx", "egg", "export-strict", "export-nonstrict", "dynamo")


def _one(path: str, method: str) -> dict:
    """Run one method on one problem (in this process); a dict of what happened."""
    sys.path.insert(0, str(ROOT))
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    from harness import capture as C
    from harness.problem import load_problem, meta_inputs, meta_model, one_line

    import torch._dynamo  # noqa: F401 - one-time imports out of every method's time
    import torch.export  # noqa: F401
    from codegen import pipeline  # noqa: F401

    torch.cat([torch.ones(2, device="meta")] * 2)  # meta decompositions import lazily
    prob = load_problem(path)
    out: dict = {"problem": path, "method": method}
    t0 = time.time()
    if method in ("fx", "egg"):
        from codegen import pipeline

        real = C.capture_with_breaks
        if method == "fx":  # EGG before graph breaks: symbolic tracing alone
            C.capture_with_breaks = lambda model, inputs, *a: C.Captured(None, inputs, "off", "none")
        try:
            cap = C.capture(prob)
        finally:
            C.capture_with_breaks = real
        out["capture_s"] = round(time.time() - t0, 3)
        if cap.gm is None:
            out.update(outcome="none", error=(cap.error or "")[:300])
        else:
            out.update(outcome="whole" if not cap.breaks else "regions", breaks=len(cap.breaks),
                       break_reasons=[b.describe()[:200] for b in cap.breaks][:8],
                       attr_buffers=len(cap.attr_buffers))
            if method == "fx":
                C.capture_with_breaks = lambda model, inputs, *a: C.Captured(None, inputs, "off", "none")
            try:
                plan, _rw, err = pipeline.analyze(prob)
            finally:
                C.capture_with_breaks = real
            out["groups"] = len(plan.groups) if plan else 0
            out["group_kinds"] = dict(Counter(g.kind for g in (plan.groups if plan else [])))
            out["plan_error"] = (err or "")[:300] or None
        out["seconds"] = round(time.time() - t0, 3)
        return out
    inputs = meta_inputs(prob)
    model = meta_model(prob, prob.init_inputs())
    try:
        if method.startswith("export"):
            ep = torch.export.export(model, tuple(inputs), strict=method == "export-strict")
            out.update(outcome="whole", nodes=len(ep.graph.nodes))
        else:
            ex = torch._dynamo.explain(model)(*inputs)
            out.update(outcome="whole" if ex.graph_break_count == 0 and ex.graph_count == 1 else
                       ("regions" if ex.graph_count else "none"),
                       graphs=ex.graph_count, breaks=ex.graph_break_count,
                       break_reasons=[str(r.reason).splitlines()[0][:200] for r in ex.break_reasons][:8])
    except Exception as e:  # noqa: BLE001
        out.update(outcome="none", error=one_line(e)[:300])
    finally:
        torch._dynamo.reset()
    out["seconds"] = round(time.time() - t0, 3)
    return out


def _problems(args: list[str]) -> list[pathlib.Path]:
    out = []
    for a in args:
        p = pathlib.Path(a)
        out += sorted(p.glob("*.py"), key=lambda q: (len(q.name.split("_")[0]), q.name)) if p.is_dir() else [p]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problems", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # child: PATH METHODS
    a = ap.parse_args(argv)
    if a.one:
        for m in a.one[1].split(","):
            try:
                res = _one(a.one[0], m)
            except Exception as e:  # noqa: BLE001 - e.g. the problem does not import
                res = {"problem": a.one[0], "method": m, "outcome": "error", "error": str(e)[:300]}
            print("SURVEY " + json.dumps(res), flush=True)
        return 0
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "survey.jsonl"
    done = set()
    if log.exists():
        for ln in log.read_text().splitlines():
            r = json.loads(ln)
            done.add((r["problem"], r["method"]))
    methods = [m for m in a.methods.split(",") if m]
    for p in _problems(a.problems):
        todo = [m for m in methods if (str(p), m) not in done]
        while todo:  # one child for the problem's methods; after a timeout, the rest go on
            t0 = time.time()
            got = []
            try:
                r = subprocess.run([sys.executable, __file__, "--out", str(out), "--one", str(p),
                                    ",".join(todo), "x"], capture_output=True, text=True,
                                   timeout=a.timeout * len(todo), cwd=ROOT)
                got = [json.loads(ln[7:]) for ln in r.stdout.splitlines() if ln.startswith("SURVEY ")]
                if not got:
                    tail = (r.stderr or "").strip().splitlines()[-1:] or [""]
                    got = [{"problem": str(p), "method": todo[0], "outcome": "error", "error": tail[0][:300]}]
            except subprocess.TimeoutExpired as e:
                out_txt = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
                got = [json.loads(ln[7:]) for ln in out_txt.splitlines() if ln.startswith("SURVEY ")]
                missing = todo[len(got)]
                got.append({"problem": str(p), "method": missing, "outcome": "timeout",
                            "seconds": round(time.time() - t0, 1)})
            for res in got:
                with log.open("a") as f:
                    f.write(json.dumps(res) + "\n")
                print(f"{p.name:45s} {res['method']:16s} {res['outcome']:8s} {res.get('seconds', 0):7.1f}s "
                      f"{res.get('breaks', '')!s:3s} {res.get('groups', '')!s:4s} {res.get('error', '')[:80]}",
                      flush=True)
                todo = [m for m in todo if m != res["method"]]
    print(summary([json.loads(ln) for ln in log.read_text().splitlines()]))
    return 0


def summary(rows: list[dict]) -> str:
    """Markdown table: per method, how many capture whole / in regions / not at all, median
    and max seconds, and (fx, egg) how many plans hold at least one kernel group."""
    import statistics

    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["method"], []).append(r)
    lines = ["| method | problems | whole | regions | none | error / timeout | median s | max s | plans with a kernel |",
             "|---|---|---|---|---|---|---|---|---|"]
    for m in METHODS:
        rs = by.get(m)
        if not rs:
            continue
        c = {k: sum(1 for r in rs if r["outcome"] == k) for k in ("whole", "regions", "none", "error", "timeout")}
        secs = [r.get("seconds", 0) for r in rs if r["outcome"] != "timeout"]
        kern = sum(1 for r in rs if (r.get("groups") or 0) > 0) if m in ("fx", "egg") else "-"
        lines.append(f"| {m} | {len(rs)} | {c['whole']} | {c['regions']} | {c['none']} | "
                     f"{c['error']} / {c['timeout']} | {statistics.median(secs) if secs else 0:.2f} | "
                     f"{max(secs) if secs else 0:.1f} | {kern} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
