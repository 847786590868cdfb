"""Compare two bench runs of the same problems: the same verdicts, and eager / torch.compile /
EGG figures that agree within the noise model; with --scaling, the suite's wall time and the
scaling efficiency from one side's workers to the other's (docs/cluster.md).

    python scripts/compare_bench.py A B [--labels local,cluster] [--out compare.md] [--scaling]

A and B: bench OUT folders (results.jsonl, report.json) or results.jsonl files. Writes the
markdown (stdout, or --out) and exits 1 when a verdict differs or a figure disagrees beyond
noise (so a script can act on it), 0 when everything agrees.

Agreement of one figure (a per-problem time of A and of B): harness.timing.noise_verdict, the
verdict the routers use (a difference within the larger 20-80% spread of the two timings, or
under 2%, is noise), on the records' p20 / p80 (eager_p20_ms ..., egg_p20_ms ...). torch.compile
has no recorded spread: its medians get the same problem's eager spread, labelled "eager spread"
in the table. Each row also shows whether the ratio is inside the repeatability band measured
between two runs of the same commit (docs/results/levels12_h200.md, "Repeatability": eager 9%,
torch.compile 27%, EGG 8% at most): a second, looser reading, for the judgment of a person.

Scaling (--scaling): each side's wall time is report.json's ``elapsed_s`` summed over its
slices (``slices`` in report.json when the slice script wrote it, else the one value), its GPU
count ``workers`` (1 for a local bench); efficiency = (T_A / T_B) / (G_B / G_A).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from graph.bench import read_results  # noqa: E402
from harness.timing import noise_verdict  # noqa: E402

#: the largest run-to-run differences of one commit (docs/results/levels12_h200.md, Repeatability)
REPEAT_BAND = {"eager": 0.09, "compile": 0.27, "egg": 0.08}


def verdict(r: dict | None) -> str:
    if r is None:
        return "missing"
    if r.get("correct"):
        return "kernel" if r.get("verified") else "fallback"
    return "unverified" if r.get("reference_nondeterministic") else "failed"


def _timing(r: dict, kind: str) -> dict | None:
    med = r.get(f"{kind}_ms")
    if med is None:
        return None
    spread_of = "eager" if kind == "compile" else kind
    return {"median_ms": med, "p20_ms": r.get(f"{spread_of}_p20_ms"), "p80_ms": r.get(f"{spread_of}_p80_ms")}


def agree(a: dict, b: dict, kind: str) -> dict | None:
    """One figure of one problem on both sides: ratio, noise verdict, inside the band."""
    if a.get("interpreter") or b.get("interpreter"):
        return None  # CPU interpreter times are no GPU timings: nothing to compare
    ta, tb = _timing(a, kind), _timing(b, kind)
    if ta is None or tb is None:
        return None
    if kind == "compile" and ta["p20_ms"] is not None:  # the eager spread, scaled to compile's median
        for t, r in ((ta, a), (tb, b)):
            e = r.get("eager_ms")
            if e and t["p20_ms"] is not None:
                t["p20_ms"], t["p80_ms"] = (t["p20_ms"] / e * t["median_ms"], t["p80_ms"] / e * t["median_ms"])
    ratio = tb["median_ms"] / ta["median_ms"]
    return {"ratio": ratio, "noise": noise_verdict(tb, ta) == "noise",
            "band": abs(ratio - 1.0) <= REPEAT_BAND[kind]}


def _load(p: pathlib.Path) -> tuple[list[dict], dict]:
    if p.is_dir():
        rep = p / "report.json"
        return read_results(p / "results.jsonl"), (json.loads(rep.read_text()) if rep.exists() else {})
    rep = p.with_name("report.json")
    return read_results(p), (json.loads(rep.read_text()) if rep.exists() else {})


def wall(rep: dict) -> float | None:
    sl = rep.get("slices")
    if sl:
        return float(sum(sl))
    return rep.get("elapsed_s")


def gpus(rep: dict) -> int:
    return int(rep.get("workers") or 1)


def compare(a_recs: list[dict], b_recs: list[dict], labels=("A", "B"), rep_a: dict | None = None,
            rep_b: dict | None = None, scaling: bool = False) -> tuple[str, dict]:
    A = {r["name"]: r for r in a_recs}
    B = {r["name"]: r for r in b_recs}
    names = sorted(set(A) | set(B))
    la, lb = labels
    out = [f"| problem | {la} | {lb} | eager {la} ms | eager {lb}/{la} | compile {la} ms | compile {lb}/{la} "
           f"| EGG {la} ms | EGG {lb}/{la} | agree |", "|---|---|---|---|---|---|---|---|---|---|"]
    summ = {"problems": len(names), "both": 0, "same_verdict": 0,
            **{f"{k}_{w}": 0 for k in ("eager", "compile", "egg") for w in ("n", "noise", "band")}}
    for n in names:
        a, b = A.get(n), B.get(n)
        va, vb = verdict(a), verdict(b)
        cells, ok = [], va == vb
        if a is not None and b is not None:
            summ["both"] += 1
            summ["same_verdict"] += va == vb
        for kind in ("eager", "compile", "egg"):
            g = agree(a, b, kind) if a is not None and b is not None else None
            base = (a or {}).get(f"{kind}_ms")
            cells.append("-" if base is None else f"{base:.4f}")
            if g is None:
                cells.append("-")
                continue
            summ[f"{kind}_n"] += 1
            summ[f"{kind}_noise"] += g["noise"]
            summ[f"{kind}_band"] += g["band"]
            ok = ok and g["noise"]
            mark = "noise" if g["noise"] else ("outside noise, in band" if g["band"] else "OUTSIDE")
            cells.append(f"{g['ratio']:.3f} ({mark}{', eager spread' if kind == 'compile' else ''})")
        out.append(f"| {n} | {va} | {vb} | " + " | ".join(cells) + f" | {'yes' if ok else 'NO'} |")
    head = [f"- problems: {summ['problems']}, on both sides: {summ['both']}, same verdict: "
            f"{summ['same_verdict']}/{summ['both']}"]
    for kind in ("eager", "compile", "egg"):
        if summ[f"{kind}_n"]:
            head.append(f"- {kind}: within noise {summ[f'{kind}_noise']}/{summ[f'{kind}_n']}, inside the "
                        f"repeatability band ({REPEAT_BAND[kind]:.0%}) {summ[f'{kind}_band']}/{summ[f'{kind}_n']}")
    if scaling and rep_a and rep_b and wall(rep_a) and wall(rep_b):
        ta, tb, ga, gb = wall(rep_a), wall(rep_b), gpus(rep_a), gpus(rep_b)
        eff = (ta / tb) / (gb / ga)
        summ.update(wall_a=ta, wall_b=tb, gpus_a=ga, gpus_b=gb, speedup=ta / tb, efficiency=eff)
        head.append(f"- suite wall time: {la} {ta:.0f} s on {ga} GPU(s), {lb} {tb:.0f} s on {gb} GPU(s): "
                    f"{ta / tb:.2f}x, scaling efficiency {eff:.0%}")
        for lab, recs, g in ((la, a_recs, ga), (lb, b_recs, gb)):
            ws = [r["wall_s"] for r in recs if r.get("wall_s")]
            if ws:
                head.append(f"- {lab}: mean wall per problem {sum(ws) / len(ws):.1f} s, suite wall per "
                            f"problem {(ta if lab == la else tb) / len(ws):.1f} s")
    summ["agree"] = (summ["same_verdict"] == summ["both"] == summ["problems"]
                     and all(summ[f"{k}_noise"] == summ[f"{k}_n"] for k in ("eager", "compile", "egg")))
    return "\n".join(head + [""] + out) + "\n", summ


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", type=pathlib.Path)
    ap.add_argument("b", type=pathlib.Path)
    ap.add_argument("--labels", default="A,B")
    ap.add_argument("--out", type=pathlib.Path)
    ap.add_argument("--scaling", action="store_true")
    args = ap.parse_args(argv)
    (ra, pa), (rb, pb) = _load(args.a), _load(args.b)
    labels = tuple((args.labels.split(",") + ["A", "B"])[:2])
    md, summ = compare(ra, rb, labels, pa, pb, args.scaling)
    if args.out:
        args.out.write_text(md)
        (args.out.with_suffix(".json")).write_text(json.dumps(summ, indent=2))
    print(md)
    return 0 if summ["agree"] else 1


if __name__ == "__main__":
    sys.exit(main())
