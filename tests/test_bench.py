"""egg bench on the CPU: tiny problems in subprocesses, results.jsonl/report.json fields,
--resume, a broken problem, a hang and a crash recorded as failures without stopping the suite;
aggregation (fast_p, means) on injected GPU records; egg profile on the CPU; the CLI's exit code
when nothing is correct, what --resume says, no empty plot; a non-deterministic reference kept
apart from "correct"; a problem's processes dying with the process that started them."""
import json
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

from graph import bench as B
from state import Settings

ROOT = pathlib.Path(__file__).resolve().parent.parent
HEADER = "import torch\nimport torch.nn as nn\n\n\n"
ADD_RELU = HEADER + """class Model(nn.Module):
    def forward(self, x, y):
        return torch.relu(x + y) * 0.5


def get_inputs():
    return [torch.randn(8, 33), torch.randn(8, 33)]


def get_init_inputs():
    return []
"""
LIB_ONLY = HEADER + """class Model(nn.Module):
    def forward(self, a, b):
        return torch.mv(a, b)


def get_inputs():
    return [torch.randn(16, 24), torch.randn(24)]


def get_init_inputs():
    return []
"""
BROKEN = HEADER + """class Model(nn.Module):
    def forward(self, x):
        return x


def get_init_inputs():
    return []
"""
HANG = "import time\n" + HEADER + """class Model(nn.Module):
    def forward(self, x):
        return x * 2


def get_inputs():
    time.sleep(300)
    return [torch.randn(4)]


def get_init_inputs():
    return []
"""
CRASH = "import os, signal\n" + HEADER + """class Model(nn.Module):
    def forward(self, x):
        return x * 2


def get_inputs():
    os.kill(os.getpid(), signal.SIGKILL)
    return [torch.randn(4)]


def get_init_inputs():
    return []
"""
# runs out of memory in every process of the first bench job that loads it (the job's marker in
# the environment, kept in a file next to it), fine in any later job
OOM_ONCE = "import os, pathlib\n" + HEADER + """class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 3.0


def get_inputs():
    first = pathlib.Path(__file__).with_suffix(".first_job")
    if not first.exists():
        first.write_text(os.environ["EGG_BENCH_JOB"])
    if first.read_text() == os.environ["EGG_BENCH_JOB"]:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 6.00 GiB (simulated)")
    return [torch.randn(8, 17)]


def get_init_inputs():
    return []
"""
OOM_ALWAYS = HEADER + """class Model(nn.Module):
    def forward(self, x):
        return x * 2


def get_inputs():
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 99.00 GiB (simulated)")


def get_init_inputs():
    return []
"""

RECORD_FIELDS = {"name", "verified", "correct", "fallback", "kernels", "eager_ms", "compile_ms",
                 "egg_ms", "speedup_eager", "speedup_compile", "roofline_pct", "wall_s", "failure",
                 "interpreter", "device"}
REPORT_FIELDS = {"problems", "correct", "fast_p", "fast_p_compile", "geomean_speedup_eager",
                 "mean_speedup_eager", "geomean_speedup_compile", "mean_speedup_compile",
                 "median_roofline_pct", "median_wall_s", "failed", "verified_kernels"}


def _folder(tmp_path, files: dict):
    root = tmp_path / "problems"
    for rel, src in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(src)
    return root


def _results(out):
    return [json.loads(ln) for ln in (out / "results.jsonl").read_text().splitlines() if ln.strip()]


def test_bench_cpu_suite_resume_and_broken_problem(tmp_path):
    folder = _folder(tmp_path, {"add_relu.py": ADD_RELU, "sub/lib_only.py": LIB_ONLY, "broken.py": BROKEN})
    out = tmp_path / "out"
    settings = Settings(device="cpu", trials=1)
    probs = B.select(folder, None, None)
    rep = B.run_bench(probs, folder, out, settings, resume=False, jobs=2, problem_timeout_s=300)
    recs = {r["name"]: r for r in _results(out)}
    assert set(recs) == {"add_relu.py", "sub/lib_only.py", "broken.py"}
    for r in recs.values():
        assert RECORD_FIELDS <= set(r), RECORD_FIELDS - set(r)
        assert r["interpreter"] is True and r["speedup_eager"] is None  # CPU: nothing claimed
    ok, lib, bad = recs["add_relu.py"], recs["sub/lib_only.py"], recs["broken.py"]
    assert ok["verified"] and ok["correct"] and not ok["fallback"] and ok["kernels"]
    assert ok["eager_ms"] is not None and ok["egg_ms"] is not None  # labelled CPU/interpreter times
    assert lib["correct"] and lib["fallback"] and not lib["verified"] and lib["failure"]
    assert not bad["correct"] and "get_inputs" in bad["failure"]
    saved = json.loads((out / "report.json").read_text())
    assert REPORT_FIELDS <= set(saved) and saved == rep
    assert rep["problems"] == 3 and rep["correct"] == 2 and rep["failed"] == 1
    assert rep["interpreter"] and "not GPU timings" in rep["note"]
    assert set(rep["fast_p"]) == {"0.0", "1.0", "1.5", "2.0"}
    assert rep["fast_p"]["0.0"] == pytest.approx(2 / 3) and rep["fast_p"]["1.0"] is None
    md = (out / "report.md").read_text()
    assert "add_relu.py" in md and "not GPU timings" in md
    assert (out / "runs" / "add_relu" / "report.json").exists()
    # the problem's log says when each role started and ended, and what it did (a problem cut
    # off by its timeout keeps its verdicts: its checkpoints do not come back from a GPU slice)
    log = (out / "logs" / "add_relu.log").read_text()
    for node in ("planner", "algorithm_designer", "verifier", "profiler"):
        assert re.search(rf"\[ *[0-9.]+ s\] {node}: start", log), log[-2000:]
        assert re.search(rf"\[ *[0-9.]+ s\] {node}: (?!start)", log), log[-2000:]
    assert re.search(r"verifier: c\d+ verified \(\d+ trials\)", log), log[-2000:]
    assert re.search(r"planner: .*\d+ fused group\(s\)", log) and "[green]" not in log, log[-2000:]

    # --resume: nothing left to do, nothing re-run
    before = (out / "results.jsonl").read_text()
    B.run_bench(probs, folder, out, settings, resume=True, jobs=2, problem_timeout_s=300)
    assert (out / "results.jsonl").read_text() == before
    # drop one record: --resume runs that problem alone
    lines = [ln for ln in before.splitlines() if '"broken.py"' not in ln]
    (out / "results.jsonl").write_text("\n".join(lines) + "\n")
    rep = B.run_bench(probs, folder, out, settings, resume=True, jobs=2, problem_timeout_s=300)
    names = [r["name"] for r in _results(out)]
    assert sorted(names) == sorted(recs) and names[-1] == "broken.py"
    assert rep["problems"] == 3 and rep["resumed"]


def test_bench_hang_and_crash_are_failures(tmp_path):
    folder = _folder(tmp_path, {"hang.py": HANG, "crash.py": CRASH, "sub/ok.py": BROKEN})
    out = tmp_path / "out"
    rep = B.run_bench(B.select(folder, "*.py", None), folder, out, Settings(device="cpu", trials=1),
                      resume=False, jobs=3, problem_timeout_s=20)
    recs = {r["name"]: r for r in _results(out)}
    assert recs["hang.py"]["failure"].startswith("timeout") and not recs["hang.py"]["correct"]
    assert recs["crash.py"]["failure"].startswith("crash") and "SIGKILL" in recs["crash.py"]["failure"]
    assert "get_inputs" in recs["sub/ok.py"]["failure"]  # the suite went on
    assert rep["timeouts"] == 1 and rep["failed"] == 3
    # nothing of the suite lives on: the hung problem's process and the judge it started (its
    # own session) were killed, found by the marker in their environment
    assert _bench_processes() == []


def _bench_processes() -> list[int]:
    """Live processes of problems this test process started (their environment carries the
    bench's job marker with our pid in its token); any found are killed so nothing lingers."""
    import os
    import pathlib
    import signal

    marker = f"{B.JOB_ENV}=".encode()
    mine = f"-{os.getpid()}-".encode()
    found = []
    for d in pathlib.Path("/proc").glob("[0-9]*"):
        try:
            env = (d / "environ").read_bytes().split(b"\0")
            stat = (d / "stat").read_text()
        except OSError:
            continue
        if stat.rsplit(")", 1)[-1].split()[0] == "Z":
            continue  # a zombie is dead: it waits for its parent to reap it
        if any(e.startswith(marker) and mine in e for e in env):
            found.append(int(d.name))
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return found


def test_leftover_check_sees_a_live_job_process():
    """The check above can fail: a process carrying this test's job marker is found (then killed)."""
    import os

    token = f"probe-{os.getpid()}-0"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            env={**os.environ, B.JOB_ENV: token})
    try:
        assert _bench_processes() == [proc.pid]
        assert proc.wait(10) == -9
    finally:
        proc.kill()
        proc.wait()


def test_out_of_memory_next_to_others_runs_again_alone(tmp_path):
    folder = _folder(tmp_path, {"a_add_relu.py": ADD_RELU, "b_oom_once.py": OOM_ONCE,
                                "c_oom_always.py": OOM_ALWAYS})
    out = tmp_path / "out"
    rep = B.run_bench(B.select(folder, None, None), folder, out, Settings(device="cpu", trials=1),
                      resume=False, jobs=2, problem_timeout_s=300)
    recs = _results(out)
    # each problem recorded once; the two that ran out of memory next to another come last
    assert [r["name"] for r in recs] == ["a_add_relu.py", "b_oom_once.py", "c_oom_always.py"]
    add, once, always = recs
    assert add["verified"] and not add.get("ran_alone")
    assert once["ran_alone"] and once["verified"] and once["correct"] and once["failure"] is None
    # still out of memory alone: recorded as it is, not retried again
    assert always["ran_alone"] and not always["correct"] and B.ran_out_of_memory(always)
    assert rep["problems"] == 3 and rep["failed"] == 1
    # a resumed suite starts the problems that needed it alone at once (no shared attempt first)
    assert (out / B.ALONE_FILE).read_text().split() == ["b_oom_once.py", "c_oom_always.py"]
    kept = [ln for ln in (out / "results.jsonl").read_text().splitlines() if "c_oom_always" not in ln]
    (out / "results.jsonl").write_text("\n".join(kept) + "\n")
    B.run_bench(B.select(folder, None, None), folder, out, Settings(device="cpu", trials=1),
                resume=True, jobs=2, problem_timeout_s=300)
    (again,) = [r for r in _results(out) if r["name"] == "c_oom_always.py"]
    assert again["ran_alone"] and (out / B.ALONE_FILE).read_text().split().count("c_oom_always.py") == 1


def test_out_of_memory_alone_is_not_retried(tmp_path):
    folder = _folder(tmp_path, {"oom.py": OOM_ALWAYS})
    out = tmp_path / "out"
    B.run_bench(B.select(folder, None, None), folder, out, Settings(device="cpu", trials=1),
                resume=False, jobs=2, problem_timeout_s=120)
    (rec,) = _results(out)
    assert B.ran_out_of_memory(rec) and not rec.get("ran_alone")


def test_next_startable_admits_by_estimated_memory():
    """With a memory budget: a problem whose estimate does not fit next to the running ones waits
    (a smaller one behind it starts), starts once nothing runs even when larger than the budget,
    and a problem queued alone still keeps its place."""
    import collections

    class J:
        def __init__(self, path, alone=False):
            self.path, self.alone = path, alone

    foot = {"big": 70, "huge": 200, "s1": 10, "s2": 10, "s3": 10}
    q = collections.deque([("big", False), ("huge", False), ("s1", False), ("s2", False)])
    assert B.next_startable(q, [], 4, 100, foot) == ("big", False)
    run = [J("big")]
    assert B.next_startable(q, run, 4, 100, foot) == ("s1", False)  # huge waits, s1 passes it
    run.append(J("s1"))
    assert B.next_startable(q, run, 4, 100, foot) == ("s2", False)
    run.append(J("s2"))
    assert B.next_startable(q, run, 4, 100, foot) is None  # only huge left: does not fit
    assert B.next_startable(q, [], 4, 100, foot) == ("huge", False)  # alone, above the budget
    q = collections.deque([("big", False), ("p", True), ("s3", False)])
    assert B.next_startable(q, [J("big")], 4, 100, foot) is None  # big does not fit twice; p alone
    assert B.next_startable(q, [], 4, 100, foot) == ("big", False)
    assert B.next_startable(q, [J("big")], 4, 100, foot) is None  # s3 may not pass the alone p
    # without estimates: the old rule
    q = collections.deque([("s1", False), ("s2", False)])
    assert B.next_startable(q, [J("x")], 2, 100, {}) == ("s1", False)


def test_footprint_is_estimated_on_meta_tensors(tmp_path):
    """The estimate reads shapes only: a problem whose inputs would take 1 TiB is estimated
    without allocating them; a get_inputs that builds real tensors anyway counts as unknown."""
    big = tmp_path / "big.py"
    big.write_text(HEADER + """class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.w = nn.Parameter(torch.ones(n))

    def forward(self, x):
        return x * 2, torch.cat([x, x]).double()


def get_inputs():
    return [torch.randn(2 ** 38)]


def get_init_inputs():
    return [1000]
""")
    # outputs from the forward run on meta: 1x and 4x the input's bytes
    assert B.footprint_bytes(big) == (B.FOOTPRINT_PER_INPUT_BYTE * 4 * 2 ** 38 + B.FOOTPRINT_PER_OUTPUT_BYTE * 5 * 4 * 2 ** 38
                                      + B.FOOTPRINT_PER_PARAM_BYTE * 4000)
    real = tmp_path / "real.py"
    real.write_text(HEADER + """class Model(nn.Module):
    def forward(self, x):
        return x


def get_inputs():
    return [torch.randn(8, device="cpu")]


def get_init_inputs():
    return []
""")
    assert B.footprint_bytes(real) == 0
    from harness.runner import child_env

    got, dev = B.estimate_footprints([big, real], child_env("cpu"))
    assert got == {big: B.footprint_bytes(big), real: 0} and dev == 0  # no GPU here


def test_next_startable_keeps_an_alone_problem_alone():
    import collections

    class J:
        def __init__(self, alone=False):
            self.alone = alone

    q = collections.deque([("p1", False), ("p2", True), ("p3", False)])
    assert B.next_startable(q, [J()], 2) == ("p1", False)
    assert B.next_startable(q, [J(), J()], 2) is None  # full
    assert B.next_startable(q, [J()], 2) is None  # p2 waits until nothing runs
    assert B.next_startable(q, [], 2) == ("p2", True)
    assert B.next_startable(q, [J(alone=True)], 2) is None  # nothing joins it
    assert B.next_startable(q, [], 2) == ("p3", False)
    assert B.next_startable(q, [], 2) is None  # empty
    assert B.ran_out_of_memory({"failure": "[memory] forward ran out of memory (69.90 GiB device limit)"})
    assert B.ran_out_of_memory({"failure": "x | torch.OutOfMemoryError: CUDA error"})
    assert not B.ran_out_of_memory({"failure": "[precision] max abs error"}) and not B.ran_out_of_memory({})
    # a verified answer whose run lost a candidate to memory (a group was backed out after it)
    rec = B.empty_record("p.py", "cuda")
    B._fill(rec, {"timing": {"eager_ms": 2.0, "best_ms": 1.0}, "fallback": False, "kernels": ["k"],
                  "stages": {}, "candidates": [
                      {"id": "c1", "failure": "[problem] get_inputs() raised OutOfMemoryError: CUDA out of memory"},
                      {"id": "c2", "failure": None}]})
    assert rec["verified"] and rec["memory_failures"] == 1 and B.ran_out_of_memory(rec)
    B._fill(rec, {"timing": {}, "fallback": False, "kernels": ["k"], "stages": {},
                  "candidates": [{"id": "c1", "failure": "[precision] max abs error 0.1"}]})
    assert rec["memory_failures"] == 0 and not B.ran_out_of_memory(rec)
    # run F on the H200: a verified candidate rejected by the timing judge for memory (a stage's
    # attempt, not the candidate's failure), then a retry whose process could not open the judge's
    # CUDA tensors on the full device: two memory failures, so the problem runs again alone
    B._fill(rec, {"timing": {}, "fallback": True, "kernels": [], "stages": {"algorithm": {"attempts": [
        {"candidate_id": "c1", "outcome": "failed", "summary": "rejected by the timing judge [memory]: "
         "the first timed call: forward ran out of memory (69.90 GiB device limit)"},
        {"candidate_id": "c2", "outcome": "failed", "summary": "[memory] receiving the judge's tensors "
         "ran out of memory: AcceleratorError: CUDA error: mapping of buffer object failed"},
        {"candidate_id": "c3", "outcome": "failed", "summary": "[precision] max abs error 0.1"}]}},
        "candidates": [{"id": "c1", "failure": None}, {"id": "c2", "failure": "[memory] receiving the "
                        "judge's tensors ran out of memory: CUDA error: mapping of buffer object failed"}]})
    assert rec["memory_failures"] == 2 and B.ran_out_of_memory(rec)


def _rec(name, correct=True, fallback=False, se=None, sc=None, roof=None, wall=10.0, eager=1.0, comp=None):
    return {"name": name, "correct": correct, "verified": correct and not fallback, "fallback": fallback,
            "interpreter": False, "speedup_eager": se, "speedup_compile": sc, "roofline_pct": roof,
            "wall_s": wall, "eager_ms": eager, "compile_ms": comp, "egg_ms": eager / (se or 1.0),
            "kernels": [], "failure": None}


def test_aggregate_gpu_records():
    recs = [_rec("a", se=2.5, sc=1.2, roof=40.0, comp=0.5), _rec("b", se=1.2, sc=0.8, roof=20.0, wall=30.0),
            _rec("c", fallback=True, se=1.0, sc=0.5, roof=10.0, comp=2.0),
            _rec("d", correct=False, wall=50.0)]
    rep = B.aggregate(recs)
    assert rep["problems"] == 4 and rep["correct"] == 3 and rep["failed"] == 1 and rep["fallbacks"] == 1
    assert rep["fast_p"] == {"0.0": 0.75, "1.0": 0.5, "1.5": 0.25, "2.0": 0.25}
    assert rep["fast_p_compile"] == {"0.0": 0.75, "1.0": 0.25, "1.5": 0.0, "2.0": 0.0}
    assert rep["geomean_speedup_eager"] == pytest.approx((2.5 * 1.2 * 1.0) ** (1 / 3))
    assert rep["mean_speedup_eager"] == pytest.approx((2.5 + 1.2 + 1.0) / 3)
    assert rep["geomean_speedup_compile"] == pytest.approx((1.2 * 0.8 * 0.5) ** (1 / 3))
    assert rep["geomean_compile_vs_eager"] == pytest.approx((2.0 * 0.5) ** 0.5)
    assert rep["median_roofline_pct"] == 20.0 and rep["median_wall_s"] == 20.0
    assert not rep["interpreter"] and "note" not in rep
    md = B.report_markdown(rep, recs)
    assert "fast_1.0=0.50" in md and "| a |" in md
    assert "0 of 0 checked pass" in md


def test_torch_compiles_own_output_is_reported_under_the_contract():
    """Issue 21: per problem, whether the baseline we compare against passes our contract."""
    recs = [_rec("a", se=2.0, sc=1.1, comp=0.5), _rec("b", se=1.5, sc=0.9, comp=0.6),
            _rec("c", se=1.0, sc=1.0, comp=1.0)]
    recs[0]["compile_contract"] = "passes"
    recs[1]["compile_contract"] = "output 0: max abs error 0.3 exceeds atol=0.0001, rtol=0.0001"
    rep = B.aggregate(recs)
    assert rep["compile_contract_checked"] == 2 and rep["compile_contract_failed"] == ["b"]
    md = B.report_markdown(rep, recs)
    assert "1 of 2 checked pass; fails: b" in md
    row = next(ln for ln in md.splitlines() if ln.startswith("| b |"))
    assert "torch.compile fails the contract: output 0: max abs error 0.3" in row


def test_select_filter_and_list(tmp_path):
    folder = _folder(tmp_path, {"l1/a.py": BROKEN, "l1/b.py": BROKEN, "l2/c.py": BROKEN, "l2/_skip.py": BROKEN})
    assert [p.name for p in B.select(folder, None, None)] == ["a.py", "b.py", "c.py"]
    assert [p.name for p in B.select(folder, "l2/*", None)] == ["c.py"]
    lst = tmp_path / "list.txt"
    lst.write_text("# a comment\nl2/c.py\nl1/a.py\n")
    assert [p.name for p in B.select(folder, None, lst)] == ["c.py", "a.py"]
    lst.write_text("l3/x.py\n")
    with pytest.raises(B.BenchError):
        B.select(folder, None, lst)


def test_egg_profile_on_cpu_is_labelled(tmp_path):
    from typer.testing import CliRunner

    from graph.cli import app

    prob = tmp_path / "p.py"
    prob.write_text(ADD_RELU)
    cand = tmp_path / "cand.py"
    cand.write_text(ADD_RELU + "\n\nclass ModelNew(Model):\n    pass\n")
    r = CliRunner().invoke(app, ["profile", str(prob), str(cand), "--device", "cpu", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["interpreter"] and res["bound"] == "unknown" and res["floor_ms"] is None
    assert set(res["timings"]) == {"eager", "candidate"}  # torch.compile is not timed on the CPU
    assert all("speedup_eager" not in t for t in res["timings"].values())
    assert res["flops_estimated"] == 3 * 8 * 33 and res["bytes"] == 4 * 3 * 8 * 33
    r = CliRunner().invoke(app, ["profile", str(prob), "--device", "cpu"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "not GPU timings" in r.stdout
    r = CliRunner().invoke(app, ["profile", str(tmp_path / "missing.py"), "--device", "cpu"])
    assert r.exit_code == 2


def test_reports_are_rewritten_from_merged_records(tmp_path):
    """`python -m graph.bench report DIR` (used by the GPU slice scripts after merging parts)."""
    import json
    import subprocess
    import sys

    recs = [{"name": "a.py", "correct": True, "verified": True, "fallback": False, "eager_ms": 2.0,
             "compile_ms": 1.0, "egg_ms": 1.0, "speedup_eager": 2.0, "speedup_compile": 1.0,
             "roofline_pct": 50.0, "wall_s": 10.0, "kernels": ["k"]},
            {"name": "b.py", "correct": True, "verified": False, "fallback": True, "eager_ms": 1.0,
             "compile_ms": 1.0, "egg_ms": 1.0, "speedup_eager": 1.0, "speedup_compile": 1.0,
             "roofline_pct": 90.0, "wall_s": 20.0, "kernels": []}]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    subprocess.run([sys.executable, "-m", "graph.bench", "report", str(tmp_path)], check=True)
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["problems"] == 2 and abs(rep["geomean_speedup_eager"] - 2 ** 0.5) < 1e-9
    assert "a.py" in (tmp_path / "report.md").read_text()


NONDET = HEADER + """class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1  # a Python counter: two calls from one state and one seed still differ
        return torch.relu(x) * 2.0 + self.calls


def get_inputs():
    return [torch.randn(8, 33)]


def get_init_inputs():
    return []
"""


def test_bench_cli_no_correct_answer_resume_and_no_plot(tmp_path):
    """Issue 18 item 11 and issue 22: exit 1 when no problem is correct, --resume says what was
    done and what is left, no empty plot on the CPU; a non-deterministic reference is reported
    apart from "correct" (records, report.json, report.md)."""
    folder = _folder(tmp_path, {"broken.py": BROKEN, "nondet.py": NONDET})
    out = tmp_path / "out"
    (out / "bench.png").parent.mkdir(parents=True)
    (out / "bench.png").write_bytes(b"a plot of an earlier run")
    argv = [sys.executable, "-m", "graph.cli", "bench", str(folder), "--out", str(out), "--device", "cpu",
            "--trials", "1", "--problem-timeout", "300"]
    env = {**os.environ, "COLUMNS": "200", "EGG_TUNING_CACHE": "off"}
    r = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=600)
    assert r.returncode == B.EXIT_NO_CORRECT == 1, (r.stdout, r.stderr)
    assert "no problem of the suite has a correct answer" in r.stderr
    recs = {x["name"]: x for x in _results(out)}
    nd, bad = recs["nondet.py"], recs["broken.py"]
    assert nd["reference_nondeterministic"] and not nd["correct"] and nd["fallback"]
    assert nd["failure"].startswith("[reference]")
    assert not bad["reference_nondeterministic"] and not bad["correct"]
    rep = json.loads((out / "report.json").read_text())
    assert (rep["correct"], rep["reference_nondeterministic"], rep["failed"]) == (0, 1, 1)
    assert rep["fast_p"]["0.0"] == 0.0
    md = (out / "report.md").read_text()
    assert "reference not deterministic (answer = the reference, unverified): 1, failed: 1" in md
    assert "| nondet.py |" in md and "the answer is the reference, unverified" in md
    assert "unverified (the reference is not deterministic" in r.stdout
    # the CPU has no GPU timings: no plot (the stale one removed), and the reports say why
    assert not (out / "bench.png").exists() and rep["plot"] is None
    assert "no GPU timings" in rep["plot_note"] and "no plot: CPU interpreter run" in md
    assert "no plot: CPU interpreter run" in r.stdout and "bench.png" not in r.stdout

    r = subprocess.run(argv + ["--resume"], capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=300)
    assert "resume: all 2 problem(s) are already in" in r.stdout and "nothing left to run" in r.stdout
    assert "0/0" not in r.stdout and r.returncode == 1
    assert len(_results(out)) == 2


def test_resume_says_what_is_done_and_left(tmp_path):
    from rich.console import Console

    folder = _folder(tmp_path, {"a.py": BROKEN, "b.py": BROKEN, "c.py": BROKEN})
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.jsonl").write_text(json.dumps(B.empty_record("b.py", "cpu")) + "\n"
                                       + json.dumps(B.empty_record("gone.py", "cpu")) + "\n")
    con = Console(record=True, width=200)
    _, todo, done, _ = B.start_suite(B.select(folder, None, None), folder, out, Settings(device="cpu"),
                                     resume=True, problem_timeout_s=100, console=con)
    assert [p.name for p in todo] == ["a.py", "c.py"] and done == {"b.py", "gone.py"}
    said = con.export_text()
    assert "resume: 1 of 3 problem(s) already in" in said and "2 left to run" in said
    # without --resume the records go, and nothing is said
    con = Console(record=True, width=200)
    _, todo, _, _ = B.start_suite(B.select(folder, None, None), folder, out, Settings(device="cpu"),
                                  resume=False, problem_timeout_s=100, console=con)
    assert len(todo) == 3 and not (out / "results.jsonl").exists() and con.export_text() == ""


def test_nondeterministic_reference_is_not_counted_correct():
    def report(failures, fallback=True):
        return {"timing": {"eager_ms": 2.0, "best_ms": 2.0, "compile_ms": 1.0}, "fallback": fallback,
                "kernels": [], "stages": {}, "candidates": [{"id": f"c{i}", "failure": f}
                                                            for i, f in enumerate(failures, 1)]}

    nondet = B.empty_record("nd.py", "cuda")
    B._fill(nondet, report(["[reference] the reference is not deterministic: two eager runs differ"]))
    plain = B.empty_record("fb.py", "cuda")
    B._fill(plain, report(["[precision] max abs error 0.1"]))
    nothing = B.empty_record("lib.py", "cuda")
    B._fill(nothing, report([]))  # nothing to fuse: no verification ran, the reference stands
    assert nondet["reference_nondeterministic"] and not nondet["correct"] and nondet["fallback"]
    assert plain["correct"] and not plain["reference_nondeterministic"]
    assert nothing["correct"] and not nothing["reference_nondeterministic"]
    kernel = _rec("k.py", se=2.0, sc=1.5)
    rep = B.aggregate([nondet, plain, nothing, kernel, _rec("x.py", correct=False)])
    assert (rep["correct"], rep["fallbacks"], rep["reference_nondeterministic"], rep["failed"]) == (3, 2, 1, 1)
    assert rep["fast_p"]["0.0"] == 0.6 and rep["fast_p"]["1.0"] == 0.2
    assert rep["geomean_speedup_eager"] == pytest.approx(2.0 ** (1 / 3))  # over the correct three
    assert B.record_line(nondet).startswith("nd.py: unverified (the reference is not deterministic")
    assert B.record_line(plain).startswith("fb.py: fallback") and B.record_line(_rec("x.py", correct=False)).startswith("x.py: FAILED")
    md = B.report_markdown(rep, [nondet, plain])
    assert "reference not deterministic (answer = the reference, unverified): 1" in md
    row = [ln for ln in md.splitlines() if ln.startswith("| nd.py |")][0]
    assert "the answer is the reference, unverified" in row


def test_plot_written_only_when_there_is_something_to_plot(tmp_path):
    gpu = [_rec("a", se=2.0, sc=1.2, comp=0.5), _rec("b", fallback=True, se=1.0)]
    rep = B.write_reports(tmp_path, B.aggregate(gpu), gpu)
    assert rep["plot"] == "bench.png" and rep["plot_note"] is None
    assert (tmp_path / "bench.png").stat().st_size > 1000
    assert "- plot: bench.png" in (tmp_path / "report.md").read_text()
    failed = [_rec("a", correct=False), _rec("b", correct=False)]
    rep = B.write_reports(tmp_path, B.aggregate(failed), failed)
    assert rep["plot"] is None and "no problem has a GPU speedup" in rep["plot_note"]
    assert not (tmp_path / "bench.png").exists()
    cpu = [{**_rec("a"), "interpreter": True, "speedup_eager": None}]
    assert "CPU interpreter" in B.plot_skip_reason(cpu)
    assert B.written_files(rep, tmp_path).endswith("no plot: no problem has a GPU speedup to plot")


def test_problem_processes_die_with_the_process_that_started_them(tmp_path):
    """A bench job's process watches its parent (the suite, or a Dask worker): when that dies,
    it kills the processes carrying its job marker and exits, so nothing of it keeps the GPU."""
    pids = tmp_path / "pids.json"
    job = f"""
import json, os, subprocess, sys, time
from graph.bench import _watch_parent
_watch_parent(os.getppid(), poll_s=0.1)
g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
open({str(pids)!r}, "w").write(json.dumps([os.getpid(), g.pid]))
time.sleep(120)
"""
    parent = f"""
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", {job!r}], start_new_session=True)
time.sleep(120)
"""
    env = {**os.environ, B.JOB_ENV: f"test-{os.getpid()}-{tmp_path.name}",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.Popen([sys.executable, "-c", parent], env=env)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not (pids.exists() and pids.read_text()):
            time.sleep(0.1)
        child, grandchild = json.loads(pids.read_text())
        assert pathlib.Path(f"/proc/{grandchild}").exists()
        time.sleep(0.5)
        assert pathlib.Path(f"/proc/{child}").exists()  # the parent lives: the job goes on
    finally:
        p.kill()
        p.wait()
    deadline = time.time() + 10
    while time.time() < deadline and any(_alive(x) for x in (child, grandchild)):
        time.sleep(0.1)
    assert not _alive(child) and not _alive(grandchild)


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie (an exited orphan waits for init to reap it)."""
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_baselines_after_a_run_that_timed_nothing_respect_the_problem_limit(tmp_path, monkeypatch):
    """A GPU run that verified nothing still gets eager and torch.compile timed, but not past the
    problem's limit: with too little time left the record says so (and keeps the reference's
    'correct') instead of the whole problem being killed without a record (ResNet-101 on the H200);
    with time left the session's timeout is what is left."""
    from harness import profile as P

    (tmp_path / "problem.txt").write_text("p.py")
    started = []

    class Session:
        def __init__(self, problem, device, rep_ms, timeout_s, log_dir):
            started.append(timeout_s)
            self.timeout_s = timeout_s

        def baselines(self):
            started.append(self.timeout_s)
            raise P.ProfileError("profiling process timed out")

        def close(self):
            pass

    monkeypatch.setattr(P, "ProfileSession", Session)
    rec = {"failure": "", "correct": True, "eager_ms": None}
    B._baselines_only(rec, tmp_path, Settings(device="cuda"), time.time() + 5)
    assert started == [] and rec["correct"] and rec["eager_ms"] is None
    assert "baselines: not timed" in rec["failure"] and "time limit" in rec["failure"]
    rec = {"failure": "", "correct": True, "eager_ms": None}
    B._baselines_only(rec, tmp_path, Settings(device="cuda"), time.time() + 100)
    assert len(started) == 2 and all(50 < t <= 100 for t in started)
    assert "timed out" in rec["failure"] and rec["correct"]


def _killed_job(tmp_path, report: dict | None):
    """A _Job as the suite holds one when it kills the problem at its limit (no process run)."""
    job = B._Job.__new__(B._Job)
    job.name, job.run_id, job.alone, job.t0 = "big.py", B.run_id_of("big.py"), False, time.time() - 1
    job.record_file = tmp_path / "out" / "records" / f"{job.run_id}.json"
    job.record_file.parent.mkdir(parents=True)
    job.run_dir = tmp_path / "out" / "runs" / job.run_id
    if report is not None:
        job.run_dir.mkdir(parents=True)
        (job.run_dir / "report.json").write_text(json.dumps(report))
    return job


def test_a_problem_killed_after_its_run_ended_keeps_the_runs_answer(tmp_path):
    """The kill at the problem's limit cut only the bench's baselines after the run (its report is
    written): the record is the run's answer, correct, not a timeout; killed mid-run, or after a
    run that failed, it is a timeout as before."""
    ended = {"status": "ok", "fallback": True, "kernels": [], "timing": {"eager_ms": None},
             "candidates": [{"id": "c1", "failure": None}],
             "stages": {"algorithm": {"finish_reason": "time limit (200 s) reached: the best verified "
                                                       "candidate so far is kept"}}}
    rec = _killed_job(tmp_path / "a", ended).result("cuda", 250.0)
    assert rec["correct"] and rec["fallback"] and not rec["failure"].startswith("timeout")
    assert "time limit (200 s)" in rec["failure"] and "cut by the problem's limit (250 s)" in rec["failure"]
    rep = B.aggregate([rec])
    assert rep["timeouts"] == 0 and rep["correct"] == 1
    for report in (None, {"status": "error", "error": "boom"}):
        rec = _killed_job(tmp_path / str(report is None), report).result("cuda", 250.0)
        assert rec["failure"].startswith("timeout") and not rec["correct"]
    job = _killed_job(tmp_path / "stale", ended)  # a report left by an earlier attempt
    job.t0 = time.time() + 60
    assert job.result("cuda", 250.0)["failure"].startswith("timeout")
