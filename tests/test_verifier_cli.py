"""`egg verify` exit codes and verdict output, and unusable problems across every command: one
line naming the file, exit code 2, no traceback, no run folder (bench records the failure)."""
from __future__ import annotations

import json
import pathlib

import pytest
from typer.testing import CliRunner

from graph.cli import app
from tests.verifier_cases import cases as C

BAD_PROBLEMS = {
    "noparse": ("import torch\nclass Model(torch.nn.Module)\n    pass\n", "does not parse"),
    "nomodel": ("import torch\ndef get_inputs():\n    return [torch.randn(4)]\n"
                "def get_init_inputs():\n    return []\n", "lacks Model"),
    "noinputs": ("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
                 "def get_init_inputs():\n    return []\n", "lacks get_inputs"),
    "import_raises": ("import torch\nraise ImportError('no such kernel library')\n", "importing it raised"),
    "inputs_raise": ("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
                     "def get_inputs():\n    raise ValueError('boom')\ndef get_init_inputs():\n    return []\n",
                     "get_inputs() raised"),
    "init_inputs_raise": ("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
                          "def get_inputs():\n    return [torch.randn(4)]\n"
                          "def get_init_inputs():\n    return 1 / 0\n", "get_init_inputs() raised"),
    "non_tensors": ("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
                    "def get_inputs():\n    return ['text']\ndef get_init_inputs():\n    return []\n",
                    "non-tensors"),
    "model_raises": ("import torch\nclass Model(torch.nn.Module):\n    def __init__(self, n):\n"
                     "        super().__init__()\n        raise RuntimeError('bad size')\n"
                     "    def forward(self, x):\n        return x\n"
                     "def get_inputs():\n    return [torch.randn(4)]\ndef get_init_inputs():\n    return [3]\n",
                     "Model(*get_init_inputs()) raised"),
    "forward_raises": ("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
                       "        return x @ torch.ones(3, 3)\n"
                       "def get_inputs():\n    return [torch.randn(4, 5)]\ndef get_init_inputs():\n    return []\n",
                       "Model.forward raised"),
}


@pytest.fixture
def runner():
    return CliRunner()


def _one_line_error(res, path: pathlib.Path, why: str) -> None:
    text = res.output.strip()
    assert res.exit_code == 2, text
    assert "Traceback" not in text and why in text and path.name in text
    assert len([ln for ln in text.splitlines() if ln.strip()]) <= 3  # one line, wrapped at most


@pytest.mark.parametrize("kind", sorted(BAD_PROBLEMS))
def test_unusable_problem_every_command(kind, tmp_path, runner):
    src, why = BAD_PROBLEMS[kind]
    prob = tmp_path / f"{kind}.py"
    prob.write_text(src)
    cand = C.CANDIDATES / "honest_triton_reduction.py"
    _one_line_error(runner.invoke(app, ["verify", str(prob), str(cand), "--device", "cpu"]), prob, why)
    _one_line_error(runner.invoke(app, ["profile", str(prob), "--device", "cpu"]), prob, why)
    runs = tmp_path / "runs"
    _one_line_error(runner.invoke(app, ["run", str(prob), "--device", "cpu", "--runs-dir", str(runs)]), prob, why)
    assert not runs.exists() or not any(runs.iterdir()), "a run folder was written"


def test_bench_records_unusable_problems(tmp_path, runner):
    folder = tmp_path / "suite"
    folder.mkdir()
    for kind in ("noparse", "non_tensors", "forward_raises"):
        (folder / f"{kind}.py").write_text(BAD_PROBLEMS[kind][0])
    out = tmp_path / "out"
    res = runner.invoke(app, ["bench", str(folder), "--out", str(out), "--device", "cpu"])
    assert res.exit_code == 1, res.output  # the suite ran; no problem has a correct answer (docs/bench.md)
    recs = {r["name"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    for kind in ("noparse", "non_tensors", "forward_raises"):
        rec = recs[f"{kind}.py"]
        assert not rec["verified"] and f"{kind}.py" in rec["failure"] and BAD_PROBLEMS[kind][1] in rec["failure"]


def test_verify_exit_codes_and_json(tmp_path, runner):
    prob = C.PROBLEMS / "rowsum.py"
    ok = runner.invoke(app, ["verify", str(prob), str(C.CANDIDATES / "honest_triton_reduction.py"),
                             "--device", "cpu", "--trials", "2", "--json"])
    assert ok.exit_code == 0, ok.output
    res = json.loads(ok.output)
    from harness.trials import plan

    assert res["passed"] and res["trials"] >= len(plan(2)) - 2 and res["category"] == "" and res["launches"] >= 1
    assert set(res) >= {"reason", "checks", "outputs", "flags", "device", "wall_s", "trial_log",
                        "sandbox", "candidate_sha256"}
    assert len(res["trial_log"]) == res["trials"] and all(t["passed"] for t in res["trial_log"])
    o = res["outputs"][0]
    assert set(o) == {"index", "max_abs", "max_rel", "eager_err_fp64", "cand_err_fp64", "passed_by"}

    bad = runner.invoke(app, ["verify", str(prob), str(C.CANDIDATES / "cheat_threads.py"), "--device", "cpu"])
    assert bad.exit_code == 1 and "REJECTED" in bad.output and "[cheat]" in bad.output
    assert "line 3" in bad.output  # the offending line

    nomodel = tmp_path / "nomodel.py"
    nomodel.write_text("import torch\n")
    _one_line_error(runner.invoke(app, ["verify", str(prob), str(nomodel), "--device", "cpu"]),
                    nomodel, "defines no ModelNew")
    broken = tmp_path / "broken.py"
    broken.write_text("class ModelNew(:\n")
    _one_line_error(runner.invoke(app, ["verify", str(prob), str(broken), "--device", "cpu"]),
                    broken, "does not parse")


def test_candidate_code_never_runs_in_the_cli(tmp_path, runner):
    """Top-level code of a candidate runs only in the candidate process, never in `egg verify`:
    a candidate that exits at import is a rejected candidate (compile), not an exiting CLI."""
    cand = tmp_path / "exits.py"
    cand.write_text("raise SystemExit(3)\n\nclass ModelNew:\n    pass\n")
    res = runner.invoke(app, ["verify", str(C.PROBLEMS / "rowsum.py"), str(cand), "--device", "cpu",
                              "--trials", "1"])
    assert res.exit_code == 1, res.output
    assert "[compile]" in res.output and "SystemExit" in res.output
