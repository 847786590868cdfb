"""The optional plan review: interrupt after the planner, approve / edit / abort, resume with
Command(resume=...); from Python and from the CLI (interactive and not)."""
import json

import pytest
from langgraph.types import Command
from typer.testing import CliRunner

from graph import cli
from graph import runs as R
from nodes.review import apply_decision
from state import FusionGroup, Plan, Settings
from tests.run_helpers import FAST, write_tiny

PLAN = Plan(groups=[FusionGroup(id="g0", kind="pointwise", nodes=["relu"]),
                    FusionGroup(id="g1", kind="reduction", nodes=["sum"]),
                    FusionGroup(id="lib_mm", kind="library", nodes=["mm"])],
            goals={"algorithm": "fuse", "tiling": "tile", "memory": "mem"})


@pytest.mark.parametrize("decision", ["approve", True, {"action": "approve"}, "A"])
def test_approve_keeps_the_plan(decision):
    assert apply_decision(decision, PLAN) == ("approved", PLAN, "plan approved at review")


def test_edit_by_disable_and_goals():
    action, plan, text = apply_decision({"action": "edit", "disable": ["g1"],
                                         "goals": {"tiling": "leave it"}}, PLAN)
    assert action == "edited" and [g.enabled for g in plan.groups] == [True, False, True]
    assert plan.goals["tiling"] == "leave it" and plan.goals["algorithm"] == "fuse"
    assert "turned off g1" in text and "goal of tiling edited" in text
    assert PLAN.groups[1].enabled  # the original is untouched


def test_edit_by_plan_json():
    edited = PLAN.model_dump(mode="json")
    edited["groups"][0]["enabled"] = False
    del edited["groups"][1]  # a group left out is turned off too
    edited["goals"]["memory"] = "skip"
    action, plan, _ = apply_decision({"plan": edited}, PLAN)
    assert action == "edited"
    assert {g.id: g.enabled for g in plan.groups} == {"g0": False, "g1": False, "lib_mm": True}
    assert plan.goals["memory"] == "skip" and plan.groups[1].nodes == ["sum"]


@pytest.mark.parametrize("decision, msg", [
    ({"action": "edit", "disable": ["g9"]}, "no group(s) ['g9']"),
    ({"action": "edit", "disable": ["lib_mm"]}, "library calls stay library calls"),
    ({"plan": {"groups": [{"id": "g7", "kind": "pointwise"}]}}, "unknown group(s) ['g7']"),
    ({"plan": {"groups": "nope"}}, "not a plan"),
    ({"action": "edit", "goals": {"nowhere": "x"}}, "goals must map stages"),
    ("maybe", "unknown action"),
    (3, "a decision is a string or an object"),
])
def test_unusable_decisions_are_refused(decision, msg):
    with pytest.raises(ValueError, match=msg.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(").replace(")", r"\)")):
        apply_decision(decision, PLAN)


def test_abort():
    action, plan, text = apply_decision({"action": "abort", "reason": "not today"}, PLAN)
    assert action == "aborted" and plan is None and text.endswith("not today")


def _paused_run(tmp_path, run_id="r"):
    prob = write_tiny(tmp_path)
    run = R.create_run(str(prob), Settings(**FAST, review=True), tmp_path / "runs", run_id)
    steps = [n for n, _ in R.stream(run, {"problem_path": str(prob)})]
    assert steps == ["planner", "__interrupt__"]
    return run


def test_python_review_edit_then_bad_decision_then_approve(tmp_path):
    run = _paused_run(tmp_path)
    req = R.pending_review(run)
    assert req["kind"] == "plan_review" and req["plan"]["groups"][0]["id"] == "g0" and req["error"] is None
    # the planner ran once and is not run again on resume
    nodes = [row.node for row in R.history(run)]
    assert nodes.count("planner") == 1 and "review" not in nodes
    # an unusable decision pauses again with the reason
    steps = [n for n, _ in R.stream(run, Command(resume={"action": "edit", "disable": ["g5"]}))]
    assert steps == ["__interrupt__"]
    assert "no group(s) ['g5']" in R.pending_review(run)["error"]
    # turning the only fused group off: the designer declines, the reference is the answer
    st = R.resume_review(run, {"action": "edit", "disable": ["g0"]})
    assert R.pending_review(run) is None
    assert st.report["status"] == "ok" and st.best_id == "c0" and st.report["fallback"]
    assert st.plan.reviewed == "edited" and not st.plan.groups[0].enabled
    assert "turned off at plan review" in st.context("algorithm").finish_reason
    assert [c.id for c in st.candidates] == ["c0"]
    assert [row.node for row in R.history(run)].count("planner") == 1


def test_python_review_abort(tmp_path):
    run = _paused_run(tmp_path)
    st = R.resume_review(run, "abort")
    assert st.error.startswith("aborted at plan review") and st.report["status"] == "error"
    assert [c.id for c in st.candidates] == ["c0"] and not st.verifications
    with pytest.raises(R.RunError, match="not waiting for a plan review"):
        R.resume_review(run, "approve")


def test_cli_review_non_interactive_then_resume_review_with_plan_file(tmp_path):
    prob = write_tiny(tmp_path)
    runs = tmp_path / "runs"
    runner = CliRunner()
    res = runner.invoke(cli.app, ["run", str(prob), "--device", "cpu", "--trials", "1", "--review",
                                  "--runs-dir", str(runs), "--run-id", "rv"])
    assert res.exit_code == 0, res.output
    assert "waits for a plan review" in res.output and "egg resume-review rv --approve" in res.output
    # resuming a run that waits for its review asks again (nothing else runs)
    res = runner.invoke(cli.app, ["run", "--resume", "rv", "--runs-dir", str(runs)])
    assert res.exit_code == 0 and "waits for a plan review" in res.output
    assert "planner" not in res.output and "verifier" not in res.output
    plan_file = runs / "rv" / "plan.json"
    plan = json.loads(plan_file.read_text())
    assert plan["groups"][0]["id"] == "g0"
    plan["groups"][0]["enabled"] = False
    plan_file.write_text(json.dumps(plan))
    res = runner.invoke(cli.app, ["resume-review", "rv", "--plan-file", str(plan_file),
                                  "--runs-dir", str(runs)])
    assert res.exit_code == 0, res.output
    assert "plan edited (off: g0)" in res.output and "reference, no kernel" in res.output
    rep = json.loads((runs / "rv" / "report.json").read_text())
    assert rep["status"] == "ok" and rep["fallback"] and rep["best_id"] == "c0"
    res = runner.invoke(cli.app, ["resume-review", "rv", "--approve", "--runs-dir", str(runs)])
    assert res.exit_code == 2 and "not waiting for a plan review" in res.output


def test_cli_review_interactive_approve(tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "_interactive", lambda: True)
    prob = write_tiny(tmp_path)
    runs = tmp_path / "runs"
    res = CliRunner().invoke(cli.app, ["run", str(prob), "--device", "cpu", "--trials", "1",
                                       "--review", "--runs-dir", str(runs), "--run-id", "ia"],
                             input="x\na\n")
    assert res.exit_code == 0, res.output
    assert "[a]pprove, [e]dit plan.json, a[b]ort" in res.output
    assert "plan approved" in res.output and "verifier: c1 verified" in res.output
    rep = json.loads((runs / "ia" / "report.json").read_text())
    assert rep["status"] == "ok" and rep["best_id"] == "c1" and rep["kernels"] == ["_egg_k_g0"]


def test_cli_review_interactive_edit_and_abort(tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "_interactive", lambda: True)
    monkeypatch.delenv("EDITOR", raising=False)
    monkeypatch.delenv("VISUAL", raising=False)
    prob = write_tiny(tmp_path)
    runs = tmp_path / "runs"
    runner = CliRunner()
    res = runner.invoke(cli.app, ["run", str(prob), "--device", "cpu", "--review", "--runs-dir",
                                  str(runs), "--run-id", "ie"], input="b\n")
    assert res.exit_code == 0, res.output
    assert "aborted at plan review" in res.output
    # edit: the person edits plan.json "by hand" while the prompt waits (here: an $EDITOR script)
    editor = tmp_path / "ed.py"
    editor.write_text("import json, sys\np = sys.argv[1]\nd = json.load(open(p))\n"
                      "d['groups'][0]['enabled'] = False\njson.dump(d, open(p, 'w'))\n")
    import sys
    monkeypatch.setenv("EDITOR", f"{sys.executable} {editor}")
    res = runner.invoke(cli.app, ["run", str(prob), "--device", "cpu", "--review", "--runs-dir",
                                  str(runs), "--run-id", "ie2"], input="e\n")
    assert res.exit_code == 0, res.output
    assert "plan edited (off: g0)" in res.output and "reference, no kernel" in res.output


def test_cli_resume_review_with_disable_and_goal(tmp_path):
    prob = write_tiny(tmp_path)
    runs = tmp_path / "runs"
    runner = CliRunner()
    res = runner.invoke(cli.app, ["run", str(prob), "--device", "cpu", "--review", "--runs-dir",
                                  str(runs), "--run-id", "dg"])
    assert res.exit_code == 0 and "waits for a plan review" in res.output
    res = runner.invoke(cli.app, ["resume-review", "dg", "--approve", "--abort", "--runs-dir", str(runs)])
    assert res.exit_code == 2 and "choose one of" in res.output
    res = runner.invoke(cli.app, ["resume-review", "dg", "--disable", "g9", "--runs-dir", str(runs)])
    assert res.exit_code == 0 and "no group(s) ['g9']" in res.output  # asks again, nothing lost
    assert R.pending_review(R.open_run("dg", runs)) is not None
    res = runner.invoke(cli.app, ["resume-review", "dg", "--disable", "g0", "--goal", "tiling=keep it",
                                  "--runs-dir", str(runs)])
    assert res.exit_code == 0, res.output
    st = R.final_state(R.open_run("dg", runs))
    assert st.plan.goals["tiling"] == "keep it" and st.context("tiling").goal == "keep it"
    assert not st.plan.groups[0].enabled and st.report["status"] == "ok"
