"""The whole loop on the CPU through the CLI: egg run, history, replay (issue: foundation)."""
import json
import os
import re
import subprocess
import sys

import torch

from harness.problem import load_module, load_problem
from tests.conftest import EXAMPLES, ROOT


def egg(*args, cwd=None, timeout=600):
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT), COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "graph.cli", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=timeout)


def test_run_history_replay(tmp_path):
    runs = tmp_path / "runs"
    r = egg("run", str(EXAMPLES / "bias_gelu_scale.py"), "--device", "cpu", "--runs-dir", str(runs),
            "--run-id", "demo")
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = runs / "demo"
    best = run_dir / "best.py"
    assert best.exists() and "@triton.jit" in best.read_text()
    rep = json.loads((run_dir / "report.json").read_text())
    assert rep["status"] == "ok" and not rep["fallback"] and rep["kernels"]
    assert rep["timing"]["interpreter"] is True and "speedup_eager" not in rep["timing"]
    assert (run_dir / "candidates" / "c1.py").exists() and (run_dir / "checkpoints.sqlite").exists()

    # best.py is a KernelBench-format ModelNew that matches Model on new random inputs
    prob = load_problem(EXAMPLES / "bias_gelu_scale.py")
    mod = load_module(best, "candidate")
    init = prob.init_inputs()
    torch.manual_seed(7)
    ref = prob.Model(*init)
    torch.manual_seed(7)
    new = mod.ModelNew(*init)
    assert [n for n, _ in ref.named_parameters()] == [n for n, _ in new.named_parameters()]
    x = torch.randn(3, 16, 13, 29)
    torch.testing.assert_close(new(x), ref(x), atol=1e-4, rtol=1e-4)

    h = egg("history", "demo", "--runs-dir", str(runs))
    assert h.returncode == 0, h.stderr
    for role in ("planner", "algorithm_designer", "verifier", "profiler", "tiler", "memory_optimizer"):
        assert role in h.stdout, role
    ids = re.findall(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", h.stdout)
    assert len(ids) >= 6
    middle = ids[len(ids) // 2]
    rp = egg("replay", "demo", "--checkpoint", middle, "--runs-dir", str(runs))
    assert rp.returncode == 0, rp.stdout + rp.stderr
    assert "reporter" in rp.stdout


def test_bad_problem_exits_2_without_run_folder(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nclass Model(torch.nn.Module):\n    pass\n")
    runs = tmp_path / "runs"
    r = egg("run", str(bad), "--device", "cpu", "--runs-dir", str(runs))
    assert r.returncode == 2
    assert "lacks get_inputs, get_init_inputs" in r.stderr and "Traceback" not in r.stderr
    assert not runs.exists() or not any(runs.iterdir())


def test_spent_time_limit_keeps_the_reference_and_says_why(tmp_path):
    from tests.run_helpers import write_tiny

    prob = write_tiny(tmp_path)
    r = egg("run", str(prob), "--device", "cpu", "--runs-dir", str(tmp_path / "runs"),
            "--run-id", "late", "--time-limit", "0.001", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads((tmp_path / "runs" / "late" / "report.json").read_text())
    assert rep["status"] == "ok" and rep["fallback"] and rep["best_id"] == "c0"
    assert [c["id"] for c in rep["candidates"]] == ["c0"]  # no author started anything
    for stage in ("algorithm", "tiling", "memory"):
        assert "time limit (0.001 s) reached" in rep["stages"][stage]["finish_reason"], stage
