"""LangGraph time travel on a run's SQLite checkpoints: history (which node made each
checkpoint, across branches), show, replay and fork, from Python and from the CLI."""
import json
import shutil

import pytest
from typer.testing import CliRunner

from graph import cli
from graph import runs as R
from state import EggState, Settings
from tests.run_helpers import FAST, write_tiny

MAIN_LINE = ["input", "__start__", "planner", "review", "algorithm_designer", "verifier", "profiler",
             "tiler", "memory_optimizer", "reporter"]


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """One finished run of the tiny problem; tests work on copies of its folder."""
    root = tmp_path_factory.mktemp("tt")
    prob = write_tiny(root)
    run = R.create_run(str(prob), Settings(**FAST), root / "runs", "base")
    list(R.stream(run, {"problem_path": str(prob)}))
    assert R.final_state(run).report["status"] == "ok"
    return run


@pytest.fixture
def run(base_run, tmp_path):
    shutil.copytree(base_run.dir, tmp_path / "runs" / "base")  # thread id = run id
    return R.open_run("base", tmp_path / "runs")


def ck(run, node, on_head=True):
    rows = [r for r in R.history(run) if r.node == node and (r.on_head or not on_head)]
    assert rows, node
    return rows[0].checkpoint_id


def egg(*args):
    res = CliRunner().invoke(cli.app, [*map(str, args)], env={"COLUMNS": "250"})
    return res


def test_history_names_the_node_that_made_each_checkpoint(run):
    rows = R.history(run)
    assert [r.node for r in rows] == MAIN_LINE
    assert all(r.on_head for r in rows) and [r.source for r in rows[:2]] == ["input", "loop"]
    for a, b in zip(rows, rows[1:]):  # each checkpoint's next is what made the following one
        assert a.next == (b.node,) and b.parent_id == a.checkpoint_id
    by = {r.node: r for r in rows}
    assert by["algorithm_designer"].candidate == "c1" and by["algorithm_designer"].verdict == "pending"
    assert by["verifier"].verdict == "passed" and by["profiler"].verdict == "unmeasured"
    assert by["verifier"].seconds > 0.5 > by["tiler"].seconds >= 0  # the verifier runs a child
    assert by["reporter"].next == () and by["reporter"].stage == "done"


def test_cli_history_and_show(run):
    res = egg("history", "base", "--runs-dir", run.dir.parent)
    assert res.exit_code == 0, res.output
    for node in MAIN_LINE:
        assert node in res.output
    assert ck(run, "verifier") in res.output  # whole ids, ready to copy
    res = egg("history", "base", "--runs-dir", run.dir.parent, "--json")
    assert [json.loads(line)["node"] for line in res.output.splitlines()] == MAIN_LINE

    designer = ck(run, "algorithm_designer")
    res = egg("show", "base", "--checkpoint", designer, "--runs-dir", run.dir.parent)
    assert res.exit_code == 0, res.output
    assert "made by algorithm_designer, next: verifier" in res.output
    assert "current: c1" in res.output and "best: c0" in res.output and "_egg_k_g0" in res.output
    res = egg("show", "base", "--runs-dir", run.dir.parent)  # the latest checkpoint
    assert "made by reporter" in res.output and "best: c1" in res.output and "unmeasured" in res.output
    res = egg("show", "base", "--checkpoint", designer[:18], "--runs-dir", run.dir.parent, "--source")
    assert res.exit_code == 0 and "@triton.jit" in res.output and "class ModelNew" in res.output
    res = egg("show", "base", "--checkpoint", ck(run, "verifier"), "--runs-dir", run.dir.parent, "--json")
    st = EggState.model_validate_json(res.output)
    assert st.verification("c1").passed and st.timing("c1") is None
    res = egg("show", "base", "--checkpoint", "nope", "--runs-dir", run.dir.parent)
    assert res.exit_code == 2 and "has no checkpoint 'nope'" in res.output


def test_replay_reruns_the_scheduled_nodes_on_a_new_branch(run):
    old = R.history(run)
    designer = ck(run, "algorithm_designer")
    seen = []
    st = R.replay(run, designer, lambda n, u: seen.append(n))
    assert seen == ["verifier", "profiler", "tiler", "memory_optimizer", "reporter"]
    assert st.report["status"] == "ok" and [c.id for c in st.candidates] == ["c0", "c1"]
    assert len(st.verifications) == 1 and st.best_id == "c1"
    rows = R.history(run)
    assert {r.checkpoint_id for r in old} <= {r.checkpoint_id for r in rows}  # the old branch stays
    head = [r.node for r in rows if r.on_head]
    assert head == MAIN_LINE[:5] + ["replay"] + MAIN_LINE[5:]
    replay_row = next(r for r in rows if r.node == "replay")
    assert replay_row.parent_id == designer and replay_row.next == ("verifier",)
    assert [r.node for r in rows].count("verifier") == 2
    assert not next(r for r in rows if r.checkpoint_id == old[-1].checkpoint_id).on_head


def test_cli_replay(run):
    res = egg("replay", "base", "--checkpoint", ck(run, "profiler"), "--runs-dir", run.dir.parent)
    assert res.exit_code == 0, res.output
    assert "tiler" in res.output and "reporter" in res.output and "verifier" not in res.output
    assert "EGG result: tiny" in res.output
    assert (run.dir / "branches" / "replay-1" / "report.json").is_file()


def test_fork_is_applied_as_the_node_that_made_the_checkpoint(run):
    """A failed verification written at the verifier's checkpoint: the verifier's router runs
    on the edited state and sends the candidate back to its author instead of the profiler."""
    verifier = ck(run, "verifier")
    assert R.fork_as_node(run, verifier) == "verifier"
    bad = json.dumps([{"candidate_id": "c1", "passed": False, "reason": "forced by a fork",
                       "category": "mismatch"}])
    seen = []
    st = R.fork(run, verifier, [f"verifications={bad}"], lambda n, u: seen.append(n))
    assert seen[0] == "algorithm_designer"  # not "profiler": the router saw the edit
    assert st.verification("c1").reason == "forced by a fork" and len(st.verifications) == 2
    assert st.best_id == "c0" and st.report["fallback"]
    # the designer read the failure and backed the group out: nothing left to fuse
    assert st.context("algorithm").finish_reason == "no fused group left"
    head = [r for r in R.history(run) if r.on_head]
    upd = next(r for r in head if r.node == "update_state")
    assert upd.parent_id == verifier and upd.next == ("algorithm_designer",)


def test_cli_fork_of_the_plan_at_the_planner_checkpoint(run):
    planner = ck(run, "planner")
    st0 = R.state_at(run, planner)
    plan = st0.plan.model_dump(mode="json")
    plan["groups"][0]["enabled"] = False
    res = egg("fork", "base", "--checkpoint", planner, "--set", f"plan={json.dumps(plan)}",
              "--runs-dir", run.dir.parent)
    assert res.exit_code == 0, res.output
    assert "reference, no kernel" in res.output
    # the run folder keeps its own answer; the branch's (the reference) is beside it
    assert "@triton.jit" in (run.dir / "best.py").read_text()
    assert json.loads((run.dir / "report.json").read_text())["best_id"] == "c1"
    branch = run.dir / "branches" / "fork-1"
    assert "@triton.jit" not in (branch / "best.py").read_text()
    assert json.loads((branch / "report.json").read_text())["best_id"] == "c0"
    assert f"forking run base at step {R.history(run)[2].step} (checkpoint {planner}" in res.output
    head = [r.node for r in R.history(run) if r.on_head]
    assert head == ["input", "__start__", "planner", "update_state", "review", "algorithm_designer",
                    "tiler", "memory_optimizer", "reporter"]
    st = R.final_state(run)
    assert not st.plan.groups[0].enabled and [c.id for c in st.candidates] == ["c0"]
    # the original branch is intact and still readable
    assert R.state_at(run, ck(run, "reporter", on_head=False)).best_id == "c1"


def test_fork_at_the_start_checkpoint_changes_the_problem(run, tmp_path):
    other = write_tiny(tmp_path, "other")
    other.write_text(other.read_text().replace("torch.relu(x) * 2.0 + 1.0", "torch.sigmoid(x) - 0.5"))
    start = ck(run, "__start__")
    assert R.fork_as_node(run, start) == "__start__"
    st = R.fork(run, start, [f"problem_path={other}"])
    assert st.problem.name == "other" and st.report["status"] == "ok"
    assert "sigmoid" in st.candidate(st.best_id).source and st.best_id == "c1"


def test_fork_errors_are_one_line(run):
    with pytest.raises(R.RunError, match="nothing has run at the input checkpoint"):
        R.fork(run, ck(run, "input"), ["stage=tiling"])
    with pytest.raises(R.RunError, match="the state has no field 'nope'"):
        R.fork(run, ck(run, "planner"), ["nope=1"])
    with pytest.raises(R.RunError, match="--set caps"):
        R.fork(run, ck(run, "planner"), ['caps={"algorithm": "many"}'])
    with pytest.raises(R.RunError, match="field=value"):
        R.fork(run, ck(run, "planner"), ["stage"])
    with pytest.raises(R.RunError, match="no checkpoint"):
        R.fork(run, "0000", ["stage=tiling"])
    res = egg("fork", "base", "--checkpoint", ck(run, "planner"), "--set", "attempts=[1]",
              "--runs-dir", run.dir.parent)
    assert res.exit_code == 2 and "--set attempts" in res.output and "Traceback" not in res.output
    assert [r.node for r in R.history(run)] == MAIN_LINE  # nothing was written
