"""A run killed with SIGKILL continues from its last checkpoint with `egg run --resume RUN`,
without redoing the steps that had finished."""
import signal
import subprocess
import time

from typer.testing import CliRunner

from graph import cli
from graph import runs as R
from tests.run_helpers import egg_cmd, egg_env, write_tiny


def _wait_for(run_dir, pred, proc, timeout=120):
    """Poll the run's checkpoints (read by a second connection while the run writes)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, "the run ended before it could be killed"
        if (run_dir / "checkpoints.sqlite").exists():
            try:
                rows = R.history(R.open_run(run_dir.name, run_dir.parent))
            except Exception:  # noqa: BLE001 - the writer may hold the lock for a moment
                rows = []
            if pred(rows):
                return rows
        time.sleep(0.05)
    raise AssertionError("timed out waiting for the checkpoint")


def test_kill_9_then_resume(tmp_path):
    prob = write_tiny(tmp_path)
    runs = tmp_path / "runs"
    proc = subprocess.Popen(egg_cmd("run", prob, "--device", "cpu", "--trials", "2", "--runs-dir", runs,
                                    "--run-id", "k"), env=egg_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        # the designer's checkpoint is written: the verifier is running now
        _wait_for(runs / "k", lambda rows: rows and rows[-1].next == ("verifier",), proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    killed_out = proc.stdout.read()
    assert "algorithm_designer" in killed_out and "reporter" not in killed_out

    run = R.open_run("k", runs)
    before = R.history(run)
    assert [r.node for r in before][-1] == "algorithm_designer" and before[-1].next == ("verifier",)
    assert not (runs / "k" / "report.json").exists()

    res = CliRunner().invoke(cli.app, ["run", "--resume", "k", "--runs-dir", str(runs)],
                             env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    steps = [ln.split("]", 1)[1].split(":")[0].strip() for ln in res.output.splitlines()
             if ln.startswith("[") and "s]" in ln]
    assert steps == ["verifier", "profiler", "tiler", "memory_optimizer", "reporter"], res.output

    rows = R.history(run)
    nodes = [r.node for r in rows]
    assert rows[:len(before)] == before  # the checkpoints before the kill are kept as they were
    for node in ("planner", "review", "algorithm_designer", "verifier", "profiler", "reporter"):
        assert nodes.count(node) == 1, (node, nodes)
    assert all(r.on_head for r in rows)
    st = R.final_state(run)
    assert [c.id for c in st.candidates] == ["c0", "c1"] and len(st.verifications) == 1
    assert st.report["status"] == "ok" and st.best_id == "c1"
    assert (runs / "k" / "report.json").exists() and "@triton.jit" in (runs / "k" / "best.py").read_text()


def test_resume_of_a_run_killed_before_its_first_checkpoint(tmp_path):
    """The run folder exists but no step was checkpointed: resume starts from the problem."""
    prob = write_tiny(tmp_path)
    from state import Settings
    from tests.run_helpers import FAST

    run = R.create_run(str(prob), Settings(**FAST), tmp_path / "runs", "early")
    run.graph()  # the checkpoint DB exists, empty, as after a kill during startup
    assert R.resume_input(run) == {"problem_path": str(prob.resolve())}
    upto_verifier = run.graph(interrupt_before=["verifier"])
    steps = [n for n, _ in R.stream(run, R.resume_input(run), graph=upto_verifier)]
    assert steps == ["planner", "review", "algorithm_designer", "__interrupt__"]
    assert R.resume_input(run) is None  # from now on resuming continues from the checkpoint
