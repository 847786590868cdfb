"""scripts/crosscheck_baselines.py: the comparison table (the GPU timing itself is replaced by
canned child results here; the lead runs the real thing on the H200)."""
import json
import pathlib
import subprocess
from types import SimpleNamespace

from tests.helpers import load_script

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _load():
    return load_script("scripts/crosscheck_baselines.py")


def test_crosscheck_table(tmp_path, monkeypatch):
    xc = _load()
    res = tmp_path / "results.jsonl"
    res.write_text("\n".join(json.dumps(r) for r in [
        {"name": "l1/a.py", "eager_ms": 1.05, "compile_ms": 0.50},
        {"name": "l1/b.py", "eager_ms": 2.00, "compile_ms": None},
        {"name": "l1/cpu.py", "eager_ms": None},  # no GPU timing: skipped
    ]) + "\n")
    canned = {"l1/a.py": {"gpu": "NVIDIA H200", "eager": {"median_ms": 1.0}, "compile": {"median_ms": 0.5}},
              "l1/b.py": {"gpu": "NVIDIA H200", "eager": {"median_ms": 2.5}, "compile_error": "boom"}}

    def fake_run(cmd, **kw):
        name = str(pathlib.Path(cmd[-1]).relative_to(tmp_path / "probs"))
        return SimpleNamespace(returncode=0, stdout=json.dumps(canned[name]) + "\n", stderr="")

    monkeypatch.setattr(subprocess, "run", fake_run)
    out = tmp_path / "x.md"
    assert xc.main([str(res), str(tmp_path / "probs"), "--out", str(out)]) == 0
    md = out.read_text()
    assert "NVIDIA H200" in md
    assert "| l1/a.py | 1.050 | 1.000 | +5.0 | 0.500 | 0.500 | +0.0 |" in md
    assert "| l1/b.py | 2.000 | 2.500 | -20.0 | - | - | - | boom |" in md
    assert "cpu.py" not in md
    assert "over 10%: eager 1" in md  # +5% is not over; -20% is


def test_crosscheck_against_a_stored_reference_table(tmp_path):
    xc = _load()
    res = tmp_path / "results.jsonl"
    res.write_text("\n".join(json.dumps(r) for r in [
        {"name": "level1/a.py", "eager_ms": 1.05, "compile_ms": 0.50},
        {"name": "level1/b.py", "eager_ms": 2.00, "compile_ms": 1.0},
    ]) + "\n")
    ref = tmp_path / "ref.md"
    ref.write_text("# t\n\n| problem | eager ms | torch.compile ms | compile speedup |\n|---|---|---|---|\n"
                   "| level1/a.py | 1.000 | 0.400 | 2.50 |\n")
    out = tmp_path / "x.md"
    assert xc.main([str(res), "--reference", str(ref), "--out", str(out)]) == 0
    md = out.read_text()
    assert "ref.md" in md
    assert "| level1/a.py | 1.050 | 1.000 | +5.0 | 0.500 | 0.400 | +25.0 |" in md
    assert "| level1/b.py | 2.000 | - | - | 1.000 | - | - | not in the reference table |" in md
