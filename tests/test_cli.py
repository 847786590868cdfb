"""The CLI a new user can rely on (issue 18): one test (or a few) per item, each asserting the
behaviour (exit code, output, files present or absent). Most drive one piece; the runs they need
are time-limited (no verification, no timing: a couple of seconds)."""
from __future__ import annotations

import io
import json
import os
import re
import shutil
import time

import pytest
import typer
from typer.testing import CliRunner

from graph import cli
from graph import output as O
from graph import runs as R
from harness.problem import ProblemError, probe_problem
from state import EggState, Settings
from tests.conftest import ROOT
from tests.run_helpers import FAST, TINY, write_tiny

UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


def egg(*args, env=None, input=None):
    return CliRunner().invoke(cli.app, [*map(str, args)], env={"COLUMNS": "100", **(env or {})},
                              input=input)


def lines(res) -> list[str]:
    return [ln for ln in res.output.splitlines() if ln.strip()]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """A finished run with no search (its time limit is spent at once): planner, the stages
    ending at once, reporter. Tests work on copies of its folder."""
    root = tmp_path_factory.mktemp("cli")
    prob = write_tiny(root)
    run = R.create_run(str(prob), Settings(**FAST, time_limit_s=0.001), root / "runs", "base")
    list(R.stream(run, {"problem_path": str(prob)}))
    assert R.final_state(run).report["status"] == "ok"
    return run


@pytest.fixture
def runs(quick_run, tmp_path):
    shutil.copytree(quick_run.dir, tmp_path / "runs" / "base")
    return tmp_path / "runs"


# ------------------------------------------------------------------ 1: the problem probe
HANG = '''import os
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        with open({pidfile!r}, "w") as f:
            f.write(str(os.getpid()))
        while True:
            pass


def get_inputs():
    return [torch.randn(4, 4)]


def get_init_inputs():
    return []
'''


def test_a_forward_that_never_ends_is_refused_in_time(tmp_path):
    pidfile = tmp_path / "pid"
    prob = tmp_path / "hang.py"
    prob.write_text(HANG.format(pidfile=str(pidfile)))
    runs = tmp_path / "runs"
    t0 = time.time()
    res = egg("run", prob, "--device", "cpu", "--runs-dir", runs, "--probe-timeout", "2")
    assert res.exit_code == 2, res.output
    assert "hang.py: did not finish within 2 s" in res.output and "Traceback" not in res.output
    assert time.time() - t0 < 60 and not runs.exists()  # no run folder
    pid = int(pidfile.read_text())  # the forward ran, in another process ...
    assert pid != os.getpid()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # ... which was killed
    cand = tmp_path / "cand.py"
    cand.write_text("class ModelNew:\n    pass\n")
    res = egg("verify", prob, cand, "--device", "cpu", "--probe-timeout", "1")
    assert res.exit_code == 2 and "did not finish within 1 s" in res.output
    res = egg("profile", prob, "--device", "cpu", env={"EGG_PROBE_TIMEOUT_S": "1"})  # the setting
    assert res.exit_code == 2 and "did not finish within 1 s" in res.output


def test_the_probe_runs_the_problem_in_a_child_process(tmp_path):
    dies = tmp_path / "dies.py"
    dies.write_text(TINY.replace("    def forward(self, x):\n", "    def forward(self, x):\n"
                                 "        import os\n        os._exit(7)\n"))
    with pytest.raises(ProblemError, match=r"dies.py: the process checking it died \(exit code 7\)"):
        probe_problem(dies)  # in this process, os._exit would have ended the tests
    spec = probe_problem(write_tiny(tmp_path))
    assert spec.name == "tiny" and spec.inputs[0].shape == [8, 33] and spec.outputs[0].shape == [8, 33]
    raises = tmp_path / "raises.py"
    raises.write_text(TINY.replace("return torch.relu(x) * 2.0 + 1.0", "return x @ torch.ones(3, 3)"))
    with pytest.raises(ProblemError, match="raises.py: Model.forward raised"):
        probe_problem(raises)
    assert Settings(probe_timeout_s=5).probe_timeout_s == 5 and Settings().probe_timeout_s == 120


# ------------------------------------------------------------------ 2: a run by id or by path
def test_a_run_by_id_or_by_folder_path_everywhere(runs, tmp_path, monkeypatch):
    by_id = egg("history", "base", "--runs-dir", runs, "--json")
    assert by_id.exit_code == 0 and len(lines(by_id)) >= 8
    by_abs = egg("history", runs / "base", "--json")
    monkeypatch.chdir(tmp_path)
    by_rel = egg("history", "runs/base", "--json")  # the path egg run prints, from its folder
    assert by_id.output == by_abs.output == by_rel.output
    res = egg("show", "runs/base", "--checkpoint", "1")
    assert res.exit_code == 0 and "made by planner" in res.output
    res = egg("run", "--resume", str(runs / "base"))
    assert res.exit_code == 0 and "run base is finished" in res.output
    res = egg("resume-review", "runs/base")
    assert res.exit_code == 2 and "run base is not waiting for a plan review" in res.output
    res = egg("replay", "runs/base", "--checkpoint", _step_of(runs, "reporter") - 1)
    assert res.exit_code == 0, res.output
    res = egg("fork", str(runs / "base"), "--checkpoint", "1", "--set", "trials_note=1")
    assert res.exit_code == 2 and "no field 'trials_note'" in res.output  # reached the run
    # a renamed folder keeps working (its thread is read from the checkpoints)
    shutil.copytree(runs / "base", runs / "renamed")
    res = egg("history", runs / "renamed", "--json")
    assert [json.loads(x)["checkpoint_id"] for x in lines(res)][:8] == \
        [json.loads(x)["checkpoint_id"] for x in lines(by_id)][:8]
    res = egg("history", "nope", "--runs-dir", runs)
    assert res.exit_code == 2 and "no run 'nope'" in res.output and "latest there:" in res.output
    res = egg("history", tmp_path)
    assert res.exit_code == 2 and "is not a run folder" in res.output


def test_resume_by_path_continues_the_same_thread(tmp_path):
    """It used to start over on a second thread named by the path."""
    prob = write_tiny(tmp_path)
    run = R.create_run(str(prob), Settings(**FAST, review=True), tmp_path / "runs", "paused")
    list(R.stream(run, {"problem_path": str(prob)}))  # planner, then the review pause
    before = R.history(run)
    res = egg("run", "--resume", (tmp_path / "runs" / "paused").resolve())
    assert res.exit_code == 0 and "resuming run paused" in res.output
    assert "waits for a plan review" in res.output and "planner:" not in res.output
    assert R.history(R.open_run("paused", tmp_path / "runs")) == before  # nothing new, one thread
    assert R._thread_id(tmp_path / "runs" / "paused") == "paused"


def _step_of(runs, node) -> int:
    return next(r.step for r in R.history(R.open_run("base", runs)) if r.node == node)


# ------------------------------------------------------------------ 3: --checkpoint
def test_checkpoint_by_step_number_or_unique_id_prefix(runs):
    run = R.open_run("base", runs)
    rows = R.history(run)
    planner = next(r for r in rows if r.node == "planner")
    assert R.find_checkpoint(run, str(planner.step)) == planner.checkpoint_id
    assert R.find_checkpoint(run, planner.checkpoint_id[:20]) == planner.checkpoint_id
    res = egg("show", "base", "--runs-dir", runs, "--checkpoint", planner.step)
    assert res.exit_code == 0 and f"step {planner.step}, made by planner" in res.output
    # an id's end is not a reference (it used to match: "--checkpoint 3" showed step 0); the
    # end taken across the id's last hyphen, so it never reads as a step number (the last 12 hex
    # digits alone are all decimal digits in ~0.4% of ids: CI once read one as "step 753197345196")
    res = egg("show", "base", "--runs-dir", runs, "--checkpoint", planner.checkpoint_id[-17:])
    assert res.exit_code == 2 and "has no checkpoint" in res.output
    assert "step   1  planner" in res.output  # the candidates are listed
    res = egg("show", "base", "--runs-dir", runs, "--checkpoint", "99")
    assert res.exit_code == 2 and "has no step 99" in res.output and planner.checkpoint_id in res.output
    prefix = os.path.commonprefix([r.checkpoint_id for r in rows])
    res = egg("replay", "base", "--runs-dir", runs, "--checkpoint", prefix)
    assert res.exit_code == 2 and f"ambiguous in run base ({len(rows)} ids start with it)" in res.output
    assert not (runs / "base" / "branches").exists()  # nothing was started
    step = _step_of(runs, "memory_optimizer")
    res = egg("replay", "base", "--runs-dir", runs, "--checkpoint", step)
    ck = next(r.checkpoint_id for r in rows if r.step == step)
    assert res.exit_code == 0 and f"replaying run base from step {step} (checkpoint {ck}, made by memory_optimizer)" in res.output


def test_an_ambiguous_step_lists_the_candidates(monkeypatch):
    def row(step, node, ck, head, branch=""):
        return R.HistoryRow(step=step, node=node, source="loop", stage="", candidate="", verdict="",
                            checkpoint_id=ck, parent_id=None, next=(), created_at="", seconds=None,
                            on_head=head, branch=branch)

    rows = [row(1, "planner", "a1", True), row(2, "review", "a2", True),
            row(3, "tiler", "b3", False, "replay-1"), row(3, "tiler", "c3", False, "replay-2"),
            row(4, "reporter", "b4", False, "replay-1")]
    monkeypatch.setattr(R, "history", lambda run: rows)
    run = R.Run("x", None, Settings(), "x")
    assert R.find_checkpoint(run, "2") == "a2"  # on the latest line
    assert R.find_checkpoint(run, "4") == "b4"  # the only one of any branch
    with pytest.raises(R.RunError) as e:
        R.find_checkpoint(run, "3")
    msg = str(e.value)
    assert "step 3 of run x is ambiguous" in msg and "b3  (branch replay-1)" in msg and "c3  (branch replay-2)" in msg
    with pytest.raises(R.RunError, match="has no checkpoint 'zz'"):
        R.find_checkpoint(run, "zz")
    assert R.find_checkpoint(run, "c") == "c3"  # a unique prefix, off the latest line
    with pytest.raises(R.RunError, match="'a' is ambiguous"):
        R.find_checkpoint(run, "a")
    rows.append(row(5, "x", "0000abc", True))
    assert R.find_checkpoint(run, "0000") == "0000abc"  # not a step number: a prefix


# ------------------------------------------------------------------ 4: branches never overwrite
def test_replay_and_fork_write_beside_the_run_never_over_it(runs):
    base = runs / "base"
    own = {f: (base / f).read_bytes() for f in ("best.py", "report.json")}
    (base / "report.md").write_text("the original report\n")
    step = _step_of(runs, "memory_optimizer")
    res = egg("replay", "base", "--runs-dir", runs, "--checkpoint", step)
    assert res.exit_code == 0, res.output
    b1 = base / "branches" / "replay-1"
    assert f"results in {b1}" in res.output and f"best: {b1 / 'best.py'}" in res.output
    assert (b1 / "best.py").is_file() and json.loads((b1 / "report.json").read_text())["status"] == "ok"
    assert "the original report" not in (b1 / "report.md").read_text()
    info = json.loads((b1 / "branch.json").read_text())
    assert info["kind"] == "replay" and info["from_step"] == step and info["from_node"] == "memory_optimizer"
    res = egg("fork", "base", "--runs-dir", runs, "--checkpoint", "1", "--set", 'attempts={"algorithm": 9}')
    assert res.exit_code == 0, res.output
    f1 = base / "branches" / "fork-1"
    assert (f1 / "report.json").is_file() and json.loads((f1 / "branch.json").read_text())["set"] == [
        'attempts={"algorithm": 9}']
    assert {f: (base / f).read_bytes() for f in own} == own  # the run folder's own, untouched
    assert (base / "report.md").read_text() == "the original report\n"
    # the branch's checkpoints carry its name; the run continues on its latest line
    rows = R.history(R.open_run("base", runs))
    assert {r.branch for r in rows} == {"", "replay-1", "fork-1"}
    assert [r.branch for r in rows if r.on_head][-1] == "fork-1"
    opened = R.open_run("base", runs)
    assert opened.branch == "fork-1" and opened.results_dir == f1
    res = egg("history", "base", "--runs-dir", runs)
    assert any("fork-1 from step 1" in ln for ln in lines(res))


# ------------------------------------------------------------------ 5: tables
def _terminal(width: int) -> tuple[O.EggConsole, io.StringIO]:
    buf = io.StringIO()
    return O.EggConsole(file=buf, force_terminal=True, width=width, color_system=None), buf


def test_history_fits_the_terminal_without_splitting_words(runs):
    rows = R.history(R.open_run("base", runs))
    cols, cells = cli.history_rows(rows)
    for width in (60, 100, 250):
        con, buf = _terminal(width)
        O.print_table(con, "history of base", cols, cells)
        text = buf.getvalue().splitlines()
        assert max(len(ln) for ln in text) <= width, width
        for r in rows:  # every node name whole, on its own row
            assert any(re.search(rf"\s{r.step}\s+{re.escape(r.node)}(\s|$)", ln) for ln in text), (width, r.node)
        ids = re.findall(r"\b[0-9a-f]{8}-[0-9a-f-]+", "\n".join(text))
        if width >= 250:
            assert len(ids) == len(rows) and all(re.fullmatch(UUID, i) for i in ids)  # whole ids
        elif width == 100:  # shortened to unique prefixes, never cut into the same text
            assert len(set(ids)) == len(rows) and all(len(i) < 36 for i in ids)
        assert "…" not in "\n".join(text)


def test_piped_output_is_plain_and_unwrapped(runs):
    res = egg("history", "base", "--runs-dir", runs, env={"COLUMNS": "40"})
    assert res.exit_code == 0
    rows = R.history(R.open_run("base", runs))
    planner = next(r for r in rows if r.node == "planner")
    hits = [ln for ln in lines(res) if re.search(r"\splanner\s", ln)]  # egg history | grep planner
    assert any(planner.checkpoint_id in ln and ln.split()[1] == str(planner.step) for ln in hits)
    assert len(lines(res)) == 2 + len(rows) and "━" not in res.output and "│" not in res.output
    assert all(re.search(UUID + "$", ln) for ln in lines(res)[2:])  # whole ids, one row a line
    head = lines(res)[1].split()
    assert head[:3] == ["-", "step", "node"] and head[-1] == "checkpoint"
    # long lines of text are not wrapped either
    con = O.EggConsole(file=io.StringIO(), width=40)
    con.print("word " * 30)
    assert con.file.getvalue().count("\n") == 1


def test_fit_columns_shortens_then_drops_in_order():
    cols = [O.Col("id"), O.Col("a", drop=2), O.Col("b", drop=1), O.Col("ck", drop=3, short=O.unique_prefixes)]
    rows = [["x", "a" * 10, "b" * 10, "abcdefgh-1234-0000-zzzz"], ["y", "a" * 10, "b" * 10, "abcdefgh-5678-0000-zzzz"]]
    kept, cells = O.fit_columns(cols, rows, 200)
    assert [c.name for c in kept] == ["id", "a", "b", "ck"] and cells[0][3] == rows[0][3]
    kept, cells = O.fit_columns(cols, rows, 45)
    assert [c.name for c in kept] == ["id", "a", "b", "ck"] and cells[0][3] == "abcdefgh-1"  # shortened
    kept, cells = O.fit_columns(cols, rows, 35)
    assert [c.name for c in kept] == ["id", "a", "ck"]  # b went first
    kept, _ = O.fit_columns(cols, rows, 5)
    assert [c.name for c in kept] == ["id"]
    assert O.unique_prefixes(["1f1e-aa", "1f1e-ab"], least=2) == ["1f1e-aa", "1f1e-ab"]


def test_history_and_show_json_for_scripts(runs):
    res = egg("history", "base", "--runs-dir", runs, "--json")
    recs = [json.loads(x) for x in lines(res)]
    assert recs[0]["node"] == "input" and {"step", "checkpoint_id", "branch", "on_head"} <= set(recs[0])
    res = egg("show", "base", "--runs-dir", runs, "--json")
    assert EggState.model_validate_json(res.output).report["status"] == "ok"


# ------------------------------------------------------------------ 6: the live status line
def test_status_line_on_a_terminal_only_with_progress(tmp_path, monkeypatch):
    from harness.runner import PROGRESS_ENV, read_progress, report_progress

    assert O.doing("verifier", {"current_id": "c2"}) == "verifying c2"
    assert O.doing("profiler", EggState(current_id="c3")) == "timing c3"
    prog = tmp_path / "progress.json"
    con, buf = _terminal(120)
    with O.StatusLine(con, prog) as st:
        st.set("step 4 verifier: verifying c2")
        report_progress("trial 3/8", prog)
        assert "step 4 verifier: verifying c2, trial 3/8" in st.render_text()
        time.sleep(0.4)
        st.set("step 5 profiler: timing c2")  # older progress is not shown for a new step
        assert "trial 3/8" not in st.render_text()
    assert "step 4 verifier: verifying c2, trial 3/8" in buf.getvalue()
    con, buf = _terminal(30)  # one line however long the text: never wrapped onto the next
    with O.StatusLine(con) as st:
        st.set("verifying " + "c2 " * 40)
        time.sleep(0.3)
    frames = [f for f in re.split(r"[\r\n]", re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buf.getvalue())) if f]
    assert frames and max(len(f) for f in frames) <= 30 and any("verifying c2" in f for f in frames)
    assert buf.getvalue().count("\n") <= 1  # a wrapped line would add one per frame
    piped = io.StringIO()
    with O.StatusLine(O.EggConsole(file=piped), prog) as st:
        st.set("step 4 verifier: verifying c2")
        time.sleep(0.3)
    assert piped.getvalue() == ""
    # the progress file: written only where asked, read only when fresh
    monkeypatch.delenv(PROGRESS_ENV, raising=False)
    report_progress("nowhere")  # no file named: nothing happens
    assert read_progress(prog, since=time.time() + 60) is None and read_progress(prog) == "trial 3/8"
    assert read_progress(tmp_path / "missing.json") is None


def test_stream_says_which_node_starts_with_its_state(runs):
    run = R.open_run("base", runs)
    started = []
    R.replay(run, str(_step_of(runs, "memory_optimizer")), on_start=lambda n, s: started.append((n, s)))
    assert [n for n, _ in started] == ["reporter"]
    assert EggState.model_validate(started[0][1]).best_id == "c0"


def test_piped_run_output_has_no_status_line(runs):
    res = egg("replay", "base", "--runs-dir", runs, "--checkpoint", _step_of(runs, "memory_optimizer"))
    assert res.exit_code == 0 and "\r" not in res.output and "writing best.py" not in res.output


# ------------------------------------------------------------------ 7 and 13: reports
def _evidence_state(trial_log: bool) -> EggState:
    from state import Candidate, OutputError, TrialRecord, VerificationRecord

    trials = [TrialRecord(index=0, mode="train", grad=True, inputs="own", shapes=[[8, 33]], calls=2,
                          max_abs=1.5e-7),
              TrialRecord(index=1, mode="eval", inputs="x3", shapes=[[7, 33]], shape_variant="batch 7",
                          passed=False, max_abs=0.25, note="output 0 differs")] if trial_log else []
    v = VerificationRecord(candidate_id="c1", passed=True, trials=2, device="cpu", wall_s=1.25,
                           checks=["static", "tolerance"], trial_log=trials,
                           sandbox=["own process group", "no new privileges"] if trial_log else [],
                           outputs=[OutputError(index=0, max_abs=1.5e-7, max_rel=2e-7, eager_err_fp64=1e-7,
                                                cand_err_fp64=1.2e-7, passed_by="fp64")])
    from state import HardwareInfo, ProblemSpec

    st = EggState(problem_path="p.py")

    return st.model_copy(update={
        "problem": ProblemSpec(path="p.py", name="p", source="", sha256="0"),
        "hardware": HardwareInfo(device="cpu", name="cpu", profile_id="cpu", interpreter=True),
        "candidates": [Candidate(id="c0", stage="plan", author="planner", source="", fallback=True),
                       Candidate(id="c1", stage="algorithm", author="algorithm_designer", source="",
                                 kernels=["k"])],
        "verifications": [v], "best_id": "c1", "stage": "done"})


def test_reports_carry_the_verification_evidence():
    from nodes.reporter import build_report, report_markdown

    rep = build_report(_evidence_state(True), Settings())
    ev = rep["candidates"][1]["verification"]
    assert [t["inputs"] for t in ev["trial_log"]] == ["own", "x3"] and ev["trial_log"][1]["shape_variant"] == "batch 7"
    assert ev["sandbox"] == ["own process group", "no new privileges"] and ev["outputs"][0]["passed_by"] == "fp64"
    assert rep["candidates"][0]["verification"] is None
    md = report_markdown(rep)
    assert "## Verification of c1 (the answer)" in md
    assert "| 1 | eval | off | x3 | 7x33 | batch 7 | 1 | no | 0.25 | output 0 differs |" in md
    assert "| 0 | train | on | own | 8x33 | own | 2 | yes | 1.5e-07 | - |" in md
    assert "| 0 | 1.5e-07 | 2e-07 | 1e-07 | 1.2e-07 | fp64 |" in md
    assert "Candidate process: own process group, no new privileges." in md
    bare = report_markdown(build_report(_evidence_state(False), Settings()))  # nothing recorded yet
    assert "| trial |" not in bare and "Candidate process" not in bare and "| fp64 |" in bare


def test_report_md_says_no_none_and_agrees_with_report_json(runs):
    from nodes.reporter import build_report, report_markdown

    st = R.final_state(R.open_run("base", runs))
    rep = build_report(st, Settings())
    md = report_markdown(rep)
    assert "None" not in md and "| c0 | plan | reference |" in md
    for s, ctx in rep["stages"].items():
        assert f"- {s}: {ctx['outcome']}" in md
        assert ctx["outcome"].startswith("finished") == ctx["finished"]
    # a stage that moved on after a candidate says so (it used to say "done", finished: false)
    st2 = _evidence_state(True)
    from state import Attempt, StageContext

    st2 = st2.model_copy(update={"stage_context": {"algorithm": StageContext(
        stage="algorithm", attempts=[Attempt(candidate_id="c1", outcome="improved")], best_id="c1")}})
    rep2 = build_report(st2, Settings())
    assert rep2["stages"]["algorithm"]["outcome"] == "moved on after 1 candidate(s) (c1); best c1"
    assert not rep2["stages"]["algorithm"]["finished"] and rep2["stages"]["tiling"]["outcome"] == "not reached"
    assert "- algorithm: moved on after 1 candidate(s) (c1); best c1" in report_markdown(rep2)


def test_show_prints_the_evidence(monkeypatch):
    from nodes.reporter import verification_evidence

    buf = io.StringIO()
    monkeypatch.setattr(cli, "out", O.EggConsole(file=buf))
    cli.print_evidence(verification_evidence(_evidence_state(True).verification("c1")))
    text = buf.getvalue()
    assert "verification of c1: passed; 2 trial(s) on cpu, 1.2 s" in text
    assert "sandbox: own process group, no new privileges" in text
    row = next(ln for ln in text.splitlines() if ln.split()[:2] == ["1", "eval"])
    assert row.split() == ["1", "eval", "off", "x3", "7x33", "batch", "7", "1", "no", "0.25", "output", "0", "differs"]
    assert any(ln.split() == ["0", "1.5e-07", "2e-07", "1e-07", "1.2e-07", "fp64"] for ln in text.splitlines())


# ------------------------------------------------------------------ 8: Ctrl-C and resume
def test_ctrl_c_says_how_to_continue(runs, monkeypatch, tmp_path):
    prob = write_tiny(tmp_path, "again")

    def interrupted(*a, **kw):
        yield "planner", {}
        raise KeyboardInterrupt

    monkeypatch.setattr(R, "stream", interrupted)
    res = egg("run", prob, "--device", "cpu", "--runs-dir", runs, "--run-id", "cc")
    assert res.exit_code == cli.EXIT_INTERRUPTED == 130, res.output
    assert "interrupted: run cc keeps its checkpoints; continue with egg run --resume cc" in res.output
    assert (runs / "cc" / "settings.json").is_file()


def test_resume_refuses_another_problem_and_says_finished(runs, tmp_path):
    other = write_tiny(tmp_path, "other")
    res = egg("run", other, "--resume", "base", "--runs-dir", runs)
    assert res.exit_code == 2 and "run base optimizes" in res.output and "not " + str(other) in res.output
    before = len(R.history(R.open_run("base", runs)))
    res = egg("run", "--resume", "base", "--runs-dir", runs)
    assert res.exit_code == 0 and "run base is finished: nothing to resume" in res.output
    assert "EGG result: tiny" in res.output and len(R.history(R.open_run("base", runs))) == before
    own = R.problem_file(R.open_run("base", runs))
    res = egg("run", own, "--resume", "base", "--runs-dir", runs)  # its own problem: fine
    assert res.exit_code == 0 and "is finished" in res.output
    # a problem file changed since the run started, or gone
    prob = write_tiny(tmp_path / "p")
    run = R.create_run(str(prob), Settings(**FAST, time_limit_s=0.001), runs, "edit")
    list(R.stream(run, {"problem_path": str(prob)}))
    R.check_problem(R.open_run("edit", runs))  # unchanged: fine
    prob.write_text(prob.read_text().replace("2.0", "3.0"))
    res = egg("run", "--resume", "edit", "--runs-dir", runs)
    assert res.exit_code == 2 and "has changed since the run started" in res.output
    prob.unlink()
    with pytest.raises(R.RunError, match="no longer exists"):
        R.check_problem(R.open_run("edit", runs))


# ------------------------------------------------------------------ 9: policies
def test_policy_errors_are_one_line_and_no_key_has_its_own_code(tmp_path, monkeypatch):
    prob = write_tiny(tmp_path)
    runs = tmp_path / "runs"
    res = egg("run", prob, "--device", "cpu", "--runs-dir", runs, "--policy", "magic")
    assert res.exit_code == 2 and lines(res) == ["egg: --policy must be expert, llm or hybrid, not 'magic'"]
    res = egg("run", prob, "--device", "cpu", "--runs-dir", runs, env={"EGG_POLICY": "magic"})
    assert res.exit_code == 2 and len(lines(res)) == 1 and "EGG_POLICY 'magic'" in res.output
    assert "'expert', 'llm' or 'hybrid'" in res.output and "pydantic" not in res.output
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    res = egg("run", prob, "--device", "cpu", "--runs-dir", runs, "--policy", "llm")
    assert res.exit_code == cli.EXIT_NO_KEY == 4 and "needs an API key" in res.output
    assert "OPENAI_API_KEY" in res.output and not runs.exists()
    from types import SimpleNamespace as NS

    ok = dict(policy="llm", llm_replay_dir="", llm_base_url="http://127.0.0.1:9/v1", llm_api_key_env="NOPE")
    cli._check_llm_ready(NS(**ok))  # a local server needs no key
    cli._check_llm_ready(NS(**{**ok, "llm_base_url": "", "llm_replay_dir": "/r"}))  # nor a replay
    with pytest.raises(typer.Exit):
        cli._check_llm_ready(NS(**{**ok, "llm_base_url": ""}))
    line = cli._llm_line(Settings(policy="hybrid", llm_base_url="http://h/v1"))
    assert line == f"policy hybrid: model {Settings().llm_model} at http://h/v1"
    assert cli._llm_line(Settings()) is None
    assert f"default {Settings().llm_model}" in " ".join(egg("run", "--help").output.split())


# ------------------------------------------------------------------ 10: folders and run ids
def test_a_folder_as_problem_and_escaping_run_ids(tmp_path):
    runs = tmp_path / "runs"
    res = egg("run", tmp_path, "--device", "cpu", "--runs-dir", runs)
    assert res.exit_code == 2 and "is a directory, not a Python file" in res.output and "egg bench" in res.output
    prob = write_tiny(tmp_path)
    for bad in ("../escape", "a/b", "..", ".hidden", ""):
        res = egg("run", prob, "--device", "cpu", "--runs-dir", runs, "--run-id", bad)
        assert res.exit_code == 2 and "cannot be used" in res.output, bad
    assert not (tmp_path / "escape").exists() and not runs.exists()
    assert R.check_run_id("level1__19_ReLU") == "level1__19_ReLU"
    with pytest.raises(R.RunError):
        R.create_run(str(prob), Settings(**FAST), runs, "../x")


# ------------------------------------------------------------------ 11: profile is not cut
def test_profile_numbers_are_not_cut_when_piped(tmp_path):
    prob = write_tiny(tmp_path)
    res = egg("profile", prob, "--device", "cpu", "--rep-ms", "5", env={"COLUMNS": "40"})
    assert res.exit_code == 0, res.output
    assert "…" not in res.output and "not GPU timings" in res.output
    eager = next(ln for ln in lines(res) if ln.startswith("eager "))
    assert re.fullmatch(r"eager\s+\d+\.\d{4}\s+\d+\.\d{4}\s+\d+\.\d{4}\s+\d+\s+-\s+-\s+-", eager), eager


# ------------------------------------------------------------------ 12: help, version, exit codes
def _commands() -> dict:
    return typer.main.get_command(cli.app).commands


def _is_option(p) -> bool:
    return p.param_type_name == "option"  # typer carries its own click: no isinstance


def test_every_option_is_described_and_help_is_plain():
    seen = 0
    for name, cmd in _commands().items():
        for p in cmd.params:
            if _is_option(p):
                seen += 1
                assert p.help and p.help.strip(), f"egg {name} {p.opts[0]} has no description"
        res = egg(name, "-h")
        assert res.exit_code == 0 and "<bool>" not in res.output and "Usage:" in res.output, name
        assert "-h, --help" in res.output
    assert seen > 50
    top = egg("-h")
    assert top.exit_code == 0 and "Exit codes: 0 ok" in " ".join(top.output.split())
    from importlib.metadata import version

    res = egg("--version")
    assert res.exit_code == 0 and res.output.strip() == f"egg {version('egg-kernels')}"


def _readme_table(title: str) -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    block = text[text.index(title):]
    rows = []
    for ln in block.splitlines()[1:]:
        if ln.startswith("## ") or ln.startswith("### ") and rows:
            break
        if ln.startswith("|") and not ln.startswith("|---"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", ln)[1:-1]]
            rows.append(cells)
    return rows[1:]  # without the header


def test_readme_command_table_matches_the_help_option_by_option():
    rows = {}
    for cells in _readme_table("## Commands"):
        m = re.fullmatch(r"`egg ([a-z-]+)(.*)`", cells[0])
        assert m, cells[0]
        rows[m.group(1)] = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", m.group(2)))
    cmds = _commands()
    assert set(rows) == set(cmds)
    for name, cmd in cmds.items():
        opts = set()
        for p in cmd.params:
            if _is_option(p):
                opts |= {o for o in p.opts + p.secondary_opts if o.startswith("--")}
        assert rows[name] == opts, (name, sorted(rows[name] ^ opts))


def test_exit_codes_are_one_table():
    rows = _readme_table("### Exit codes")
    codes = {int(r[0]) for r in rows}
    assert codes == {cli.EXIT_OK, cli.EXIT_REJECTED, cli.EXIT_UNUSABLE, cli.EXIT_LLM, cli.EXIT_NO_KEY,
                     cli.EXIT_INTERRUPTED}
    from policies.llm_io import EXIT_LLM

    assert cli.EXIT_LLM == EXIT_LLM
    for code in codes:
        assert f"- {code}:" in cli.__doc__
