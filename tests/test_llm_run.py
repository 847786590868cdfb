"""Whole ``egg run --policy llm`` runs against a local scripted OpenAI-compatible server, through
the real CLI, graph, verifier and profiler: a failed kernel repaired from the verifier's message,
offline replay of the recorded run with no server, and a dead endpoint (exit code 3, run folder
intact) resumed once the server is up."""
from __future__ import annotations

import json
import pathlib
import socket

import pytest
from typer.testing import CliRunner

from tests.llm_fake_server import FakeOpenAI
from tests.llm_scripts import BAD, GOOD, PLAN, PROBLEM

from graph.cli import app

pytestmark = pytest.mark.timeout(300)

KEY = "sk-egg-test-key-never-stored"


def dead_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def egg(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("llm-run")
    (d / "relu_scale.py").write_text(PROBLEM)
    return d


@pytest.fixture(scope="module")
def recorded(workdir):
    """One llm run: plan, a kernel that fails verification, its repair."""
    mp = pytest.MonkeyPatch()
    mp.setenv("EGG_TEST_LLM_KEY", KEY)
    with FakeOpenAI([{"tool_args": PLAN}, {"content": BAD}, {"content": GOOD}]) as srv:
        res = egg("run", str(workdir / "relu_scale.py"), "--device", "cpu", "--policy", "llm",
                  "--model", "fake-model", "--base-url", srv.base_url, "--api-key-env", "EGG_TEST_LLM_KEY",
                  "--runs-dir", str(workdir / "runs"), "--run-id", "recorded", "--trials", "2")
        requests = list(srv.requests)
    mp.undo()
    return res, requests, workdir / "runs" / "recorded"


def test_llm_run_repairs_a_failed_kernel(recorded):
    res, requests, run = recorded
    assert res.exit_code == 0, res.output
    assert "c1 rejected [mismatch]" in res.output and "c2 verified" in res.output
    rep = json.loads((run / "report.json").read_text())
    assert rep["policy"] == "llm" and rep["best_id"] == "c2" and rep["kernels"] == ["_egg_k_g0"]
    cands = {c["id"]: c for c in rep["candidates"]}
    assert cands["c1"]["verified"] is False and "[mismatch]" in cands["c1"]["failure"]
    assert cands["c2"]["verified"] is True and cands["c2"]["parent"] == "c0"
    assert rep["plan"]["groups"][0]["nodes"] == ["relu", "mul", "add"]
    # the repair prompt carried the verifier's own message and the failed code
    repair = requests[2]["messages"][-1]["content"]
    assert "Candidate c1 FAILED verification [mismatch]" in repair and "max abs error" in repair
    assert "* SCALE\n" in repair
    # accounting per role, in the state, report.json and report.md
    u = rep["llm_usage"]
    assert u["planner"]["calls"] == 1 and u["algorithm_designer"]["calls"] == 2
    assert u["algorithm_designer"]["prompt_tokens"] > u["planner"]["prompt_tokens"] > 0
    assert rep["llm"]["total"]["calls"] == 3 and rep["llm"]["model"] == "fake-model"
    assert u["total"]["calls"] == 3 and u["total"]["prompt_tokens"] == (
        u["planner"]["prompt_tokens"] + u["algorithm_designer"]["prompt_tokens"])
    md = (run / "report.md").read_text()
    assert "## LLM usage" in md and "| algorithm_designer | 2 |" in md and "| total | 3 |" in md
    assert "LLM: 3 call(s)" in res.output
    # every exchange recorded; the key is sent but stored nowhere
    assert sorted(p.name for p in (run / "llm").glob("*.json")) == [
        "000_planner.json", "001_algorithm_designer.json", "002_algorithm_designer.json"]
    for f in run.rglob("*"):
        if f.is_file() and f.suffix in (".json", ".md", ".py", ".txt", ".log", ".sqlite"):
            assert KEY.encode() not in f.read_bytes(), f


def test_replay_reproduces_the_run_offline(recorded, workdir):
    _res, _requests, run = recorded
    res = egg("run", str(workdir / "relu_scale.py"), "--device", "cpu", "--replay-llm", str(run),
              "--base-url", f"http://127.0.0.1:{dead_port()}/v1",
              "--runs-dir", str(workdir / "runs"), "--run-id", "replayed", "--trials", "2")
    assert res.exit_code == 0, res.output
    again = workdir / "runs" / "replayed"
    assert (again / "best.py").read_text() == (run / "best.py").read_text()
    a, b = (json.loads((d / "report.json").read_text()) for d in (run, again))
    assert [(c["id"], c["verified"]) for c in a["candidates"]] == [(c["id"], c["verified"]) for c in b["candidates"]]
    assert b["policy"] == "llm" and b["llm"]["replayed_from"] == str(run.resolve())
    assert b["llm_usage"] == a["llm_usage"]  # the recorded usage, replayed
    rec = json.loads((again / "llm" / "002_algorithm_designer.json").read_text())
    assert rec["replayed_from"] == str(run / "llm")


def test_dead_endpoint_exits_3_and_the_run_resumes(workdir):
    port = dead_port()
    res = egg("run", str(workdir / "relu_scale.py"), "--device", "cpu", "--policy", "llm",
              "--base-url", f"http://127.0.0.1:{port}/v1", "--runs-dir", str(workdir / "runs"),
              "--run-id", "dead", "--trials", "1")
    assert res.exit_code == 3, res.output
    assert isinstance(res.exception, SystemExit)  # a clean exit, no traceback
    assert "Traceback" not in res.output
    assert f"cannot reach the LLM endpoint http://127.0.0.1:{port}/v1" in res.output
    assert "egg run --resume dead" in res.output
    run = workdir / "runs" / "dead"
    assert (run / "checkpoints.sqlite").is_file() and (run / "settings.json").is_file()
    assert not (run / "report.json").exists()
    # the server is up (elsewhere): resume with its URL, the run completes
    with FakeOpenAI([{"tool_args": PLAN}, {"content": GOOD}]) as srv:
        url = srv.base_url
        res = egg("run", "--resume", "dead", "--base-url", url, "--runs-dir", str(workdir / "runs"))
    assert res.exit_code == 0, res.output
    rep = json.loads((run / "report.json").read_text())
    assert rep["best_id"] == "c1" and rep["kernels"] == ["_egg_k_g0"]
    assert json.loads((run / "settings.json").read_text())["llm_base_url"] == url


def test_hybrid_run_expert_fills_in_for_unusable_code(workdir, monkeypatch):
    """--policy hybrid: the model plans; its stage-1 replies hold no usable code, so the expert's
    draft is used, verified and kept."""
    monkeypatch.setenv("EGG_LLM_RETRIES", "1")
    junk = {"content": "Here is my idea: fuse everything. (no code)"}
    with FakeOpenAI([{"tool_args": PLAN}, junk, junk]) as srv:
        res = egg("run", str(workdir / "relu_scale.py"), "--device", "cpu", "--policy", "hybrid",
                  "--model", "fake-model", "--base-url", srv.base_url, "--runs-dir", str(workdir / "runs"),
                  "--run-id", "hybrid", "--trials", "1")
        assert len(srv.requests) == 3
    assert res.exit_code == 0, res.output
    rep = json.loads((workdir / "runs" / "hybrid" / "report.json").read_text())
    assert rep["policy"] == "hybrid" and rep["best_id"] == "c1" and not rep["fallback"]
    assert rep["plan"]["groups"][0]["reason"] == "one pass over x"  # the model's plan
    assert "expert fills in" in rep["stages"]["algorithm"]["decisions"][0]
    assert rep["llm_usage"]["algorithm_designer"]["calls"] == 2
