"""scripts/compare_bench.py: two bench runs of the same problems (one GPU vs a Dask cluster, one
GPU vs N): verdicts, figures within the noise model, scaling efficiency."""
import json

from tests.helpers import load_script


def _mod():
    return load_script("scripts/compare_bench.py")


def _rec(name, eager=2.0, egg=1.0, comp=1.5, spread=0.02, verified=True, correct=True, wall=40.0):
    h = spread / 2
    return {"name": name, "correct": correct, "verified": verified and correct, "fallback": not verified,
            "interpreter": False, "eager_ms": eager, "compile_ms": comp, "egg_ms": egg,
            "eager_p20_ms": eager * (1 - h), "eager_p80_ms": eager * (1 + h),
            "egg_p20_ms": egg * (1 - h), "egg_p80_ms": egg * (1 + h), "wall_s": wall}


def test_runs_that_agree_within_noise(tmp_path):
    m = _mod()
    a = [_rec("p1"), _rec("p2", verified=False, egg=2.0)]
    b = [_rec("p1", eager=2.01, egg=1.01, comp=1.52), _rec("p2", verified=False, egg=2.0, eager=1.99)]
    md, s = m.compare(a, b, ("local", "cluster"))
    assert s["agree"] and s["same_verdict"] == 2 and s["eager_noise"] == 2 and s["egg_noise"] == 2
    assert "| p1 | kernel | kernel |" in md and "NO" not in md
    for i, recs in enumerate((a, b)):
        d = tmp_path / f"r{i}"
        d.mkdir()
        (d / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert m.main([str(tmp_path / "r0"), str(tmp_path / "r1"), "--out", str(tmp_path / "c.md")]) == 0
    assert json.loads((tmp_path / "c.json").read_text())["agree"] is True


def test_a_difference_beyond_noise_or_another_verdict_is_flagged(tmp_path):
    m = _mod()
    # EGG 30% slower on one side with 2% spreads: outside noise and outside the 8% band
    md, s = m.compare([_rec("p1")], [_rec("p1", egg=1.3)])
    assert not s["agree"] and s["egg_noise"] == 0 and s["egg_band"] == 0 and s["eager_noise"] == 1
    assert "OUTSIDE" in md and "| NO |" in md
    # a 5% difference: outside a 2% noise model, inside the 8% repeatability band: still not "noise"
    md, s = m.compare([_rec("p1")], [_rec("p1", egg=1.05)])
    assert not s["agree"] and s["egg_band"] == 1 and "outside noise, in band" in md
    # the same figures but a kernel on one side and a failure on the other
    md, s = m.compare([_rec("p1")], [_rec("p1", correct=False)])
    assert not s["agree"] and s["same_verdict"] == 0 and "| p1 | kernel | failed |" in md
    # a problem missing on one side
    _, s = m.compare([_rec("p1"), _rec("p2")], [_rec("p1")])
    assert not s["agree"] and s["both"] == 1
    # CPU interpreter records: verdicts only, their times are not compared
    _, s = m.compare([{**_rec("p1"), "interpreter": True}], [{**_rec("p1", egg=1.3), "interpreter": True}])
    assert s["agree"] and s["egg_n"] == 0 and s["same_verdict"] == 1
    (tmp_path / "a.jsonl").write_text(json.dumps(_rec("p1")) + "\n")
    (tmp_path / "b.jsonl").write_text(json.dumps(_rec("p1", egg=1.3)) + "\n")
    assert m.main([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]) == 1


def test_scaling_efficiency_from_wall_times():
    m = _mod()
    recs = [_rec(f"p{i}") for i in range(8)]
    md, s = m.compare(recs, recs, ("1 GPU", "4 GPUs"), {"elapsed_s": 400.0, "workers": 1},
                      {"slices": [60.0, 50.0], "workers": 4}, scaling=True)
    assert s["speedup"] == 400 / 110 and abs(s["efficiency"] - 400 / 110 / 4) < 1e-12
    assert "scaling efficiency 91%" in md and s["gpus_a"] == 1 and s["gpus_b"] == 4
