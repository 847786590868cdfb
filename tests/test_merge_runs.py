"""scripts/merge_runs.py: a later run's record replaces an earlier one's; stage-1 and stage-2
figures come from each record."""
import json

from tests.helpers import load_script


def _mod():
    return load_script("scripts/merge_runs.py")


def _rec(name, eager, egg, stage1, compile_ms=2.0, fallback=False):
    return {"name": name, "correct": True, "verified": not fallback, "fallback": fallback,
            "interpreter": False, "eager_ms": eager, "compile_ms": compile_ms, "egg_ms": egg,
            "speedup_eager": eager / egg, "speedup_compile": compile_ms / egg, "stage1_ms": stage1,
            "roofline_pct": 50.0, "templates": ["pointwise"], "rewrites": [], "failure": None,
            "wall_s": 10.0}


def test_later_runs_replace_earlier_records_and_summary_counts_stages(tmp_path, capsys):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(json.dumps(_rec("p1", 4.0, 4.0, None, fallback=True)) + "\n"
                 + json.dumps(_rec("p2", 4.0, 2.0, 2.0)) + "\n")
    b.write_text(json.dumps(_rec("p1", 4.0, 1.0, 2.0)) + "\n")
    out = tmp_path / "m"
    assert _mod().main([str(out), f"A={a}", f"B={b}"]) == 0
    recs = [json.loads(ln) for ln in (out / "results.jsonl").read_text().splitlines()]
    assert [(r["name"], r["run"]) for r in recs] == [("p1", "B"), ("p2", "A")]
    rep = json.loads((out / "report.json").read_text())
    assert abs(rep["geomean_speedup_eager"] - (4.0 * 2.0) ** 0.5) < 1e-9
    assert abs(rep["geomean_stage1_speedup_eager"] - 2.0) < 1e-9  # 4/2 for both
    assert rep["stage2_gains_over_2pct"] == 1  # p1: stage 1 2.0 ms, final 1.0 ms
    table = capsys.readouterr().out
    assert "| p1 | B | 4.000 | 2.000 | 1.000 | 4.00x | 2.00x | 2.000 | 2.00x |" in table
    assert _mod().main([str(out), "A=" + str(tmp_path / "missing.jsonl")]) == 2
