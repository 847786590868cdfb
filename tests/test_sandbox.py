"""The OS sandbox around the candidate process (harness.sandbox) and the static check's routes.

Every escape of tests/verifier_cases/escapes.py runs through ``verify()`` with the static check
off: its side effect must not have happened (no file, no .pth, no connection, no process left)
and its own report must show each attempt refused. Every route runs with the static check on and
is rejected. Two honest candidates that the old check rejected (a computed getattr on torch, a
standard ``@triton.autotune`` kernel) pass. The verifications run two at a time in a module-wide
pool while the tests wait on their own results.
"""
from __future__ import annotations

import concurrent.futures as cf
import os

import pytest

from harness import sandbox
from harness.verify import verify
from tests.verifier_cases import escapes as E

LANDLOCK = sandbox.landlock_abi() > 0
HONEST = [("honest_autotune", "rowsum"), ("honest_computed_getattr", "pointwise")]


def _verify(cand: str, problem: str = "rowsum", *, static: bool = False, trials: int = 1) -> dict:
    prob = E.problem_path(problem)
    return verify(str(prob), str(E.candidate_path(cand)), device="cpu", trials=trials,
                  problem_source=prob.read_text(), static=static, timeout_s=180)


@pytest.fixture(scope="module")
def arena(tmp_path_factory):
    with E.Arena(tmp_path_factory.mktemp("arena")) as a:
        yield a


@pytest.fixture(scope="module")
def verdicts(arena):
    pool = cf.ThreadPoolExecutor(max_workers=2)
    futs = {e.id: pool.submit(_verify, e.candidate, e.problem, trials=1)
            for e in E.ESCAPES}
    futs.update({c: pool.submit(_verify, c, p, static=True, trials=2) for c, p in HONEST})
    yield futs
    pool.shutdown(wait=True, cancel_futures=True)


def _all_done(verdicts) -> None:
    for f in verdicts.values():
        f.result(timeout=600)


@pytest.mark.skipif(not LANDLOCK, reason="Landlock is not enabled in this kernel")
@pytest.mark.parametrize("esc", E.ESCAPES, ids=lambda e: e.id)
def test_escape_is_contained(esc, verdicts, arena):
    res = verdicts[esc.id].result(timeout=600)
    assert arena.problems(esc, res) == [], res
    assert "no-new-privs" in res["sandbox"] and "seccomp" in res["sandbox"], res["sandbox"]


@pytest.mark.skipif(not LANDLOCK, reason="Landlock is not enabled in this kernel")
def test_nothing_outlives_the_judges(verdicts, arena):
    """The daemon (double fork + setsid) and everything else a candidate started is gone when
    ``verify()`` returns: no process carries the arena's token."""
    _all_done(verdicts)
    assert arena.token_processes() == []
    assert "subreaper" in verdicts["escape_daemon"].result()["sandbox"]


@pytest.mark.parametrize("cand,problem", HONEST)
def test_honest_candidate_passes(cand, problem, verdicts):
    res = verdicts[cand].result(timeout=600)
    assert res["passed"], res["reason"]
    assert res["trials"] == len(res["trial_log"]) >= 12 and res["checks"][0] == "static"
    if LANDLOCK:
        held = set(res["sandbox"])
        assert {"no-new-privs", "rlimits", "seccomp", "landlock-fs", "landlock-exec", "subreaper"} <= held
        if os.geteuid() == 0:
            assert any(h.startswith("uid:") or h == "root-no-caps" for h in held), held
            assert "netns" in held


@pytest.mark.parametrize("route", E.ROUTES, ids=lambda r: r.candidate)
def test_route_rejected_statically(route):
    from harness.verify import static_findings

    res = _verify(route.candidate, static=True)
    assert res["category"] == "cheat" and res["checks"] == ["static"], res
    found = static_findings(str(E.candidate_path(route.candidate)), None)
    assert any(route.reason in f for f in found), found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def test_kill_group_kills_a_hung_judges_whole_tree():
    """The EGG process's side: a judge that must be killed (it hangs) has a daemon below it that
    left its process group (setsid); killing the group alone would leave the daemon."""
    import subprocess
    import sys

    from harness import runner

    code = ("import os, sys, time\n"
            f"sys.path.insert(0, {str(E.CANDIDATES.parent.parent.parent)!r})\n"
            "from harness import sandbox\n"
            "sandbox.become_subreaper()\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    if os.fork() == 0:\n"
            "        time.sleep(120)\n"
            "    os._exit(0)\n"
            "os.wait()\n"
            "print('ready', flush=True)\n"
            "time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout.readline().strip() == "ready"
    (daemon,) = sandbox.descendants(proc.pid)  # re-parented to the "judge", in a session of its own
    assert os.getsid(daemon) != os.getsid(proc.pid)
    runner.kill_group(proc)
    assert proc.returncode is not None and not _alive(daemon)


def test_gpu_probe_falls_back_and_caches(tmp_path, monkeypatch):
    """The GPU path's choice (CUDA IPC cannot be tried here): a fake probe for which a private
    uid and the network namespace break CUDA IPC; the first working set of steps is chosen, the
    plan drops its uid, and the answer is cached (no probe the second time)."""
    calls = []

    def fake_probe(plan, steps, as_root):
        calls.append((tuple(steps), as_root))
        if not as_root:
            return False, "the judge's IPC tensor reads 0.0"
        return ("netns" not in steps), "CUDA error: invalid device context"

    monkeypatch.setattr(sandbox, "_probe", fake_probe)
    monkeypatch.setattr(sandbox, "probe_cache_path", lambda: str(tmp_path / "state" / "cuda-probe.json"))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    base = dict(device="cuda", root=True, uid=sandbox.UID_BASE + 7, gid=sandbox.UID_BASE,
                read_caps=False, scratch=str(scratch), ipc_probe=b"x", ipc_expect=1.0,
                judge_dumpable=1, landlock=7)
    steps = sandbox._default_steps(dict(base))
    plan = dict(base)
    got, notes = sandbox._gpu_steps(plan, steps)
    assert "netns" not in got and "landlock" in got and "seccomp" in got
    assert plan["uid"] is None and plan["gid"] is None
    # three fallbacks, then the private uid tried back with the working steps (it fails again)
    assert len(calls) == 4 and calls[-1][1] is False
    assert any("gave up netns, a private uid" in n for n in notes), notes
    plan2 = dict(base)
    assert sandbox._gpu_steps(plan2, steps)[0] == got and len(calls) == 4  # from the cache
    assert plan2["uid"] is None


def test_gpu_probe_runs_without_an_ipc_tensor(tmp_path, monkeypatch):
    """The judge could not make its IPC probe tensor (on the H200, torch 2.11 moved
    ForkingPickler): the probe still tries CUDA under each set of steps instead of applying every
    step untried (which left CUDA broken in every candidate process), and says IPC went unprobed."""
    calls = []

    def fake_probe(plan, steps, as_root):
        calls.append((tuple(steps), as_root))
        return ("seccomp" not in steps), "RuntimeError: Unexpected error from cudaGetDeviceCount()"

    monkeypatch.setattr(sandbox, "_probe", fake_probe)
    monkeypatch.setattr(sandbox, "probe_cache_path", lambda: str(tmp_path / "cuda-probe.json"))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    plan = dict(device="cuda", root=True, uid=None, gid=None, read_caps=False, scratch=str(scratch),
                ipc_probe=None, ipc_error="ImportError: cannot import name 'ForkingPickler'",
                judge_dumpable=1, landlock=7)
    steps = sandbox._default_steps(dict(plan))
    got, notes = sandbox._gpu_steps(plan, steps)
    assert calls and "seccomp" not in got and "rlimits" in got
    # the fallbacks dropped netns, ro-mounts and landlock on the way to seccomp: each taken back
    assert {"netns", "ro-mounts", "landlock"} <= set(got), got
    assert got == [s for s in steps if s != "seccomp"]
    assert any("CUDA IPC not probed" in n and "ForkingPickler" in n for n in notes), notes
    assert any(n.endswith("gave up seccomp: CUDA or CUDA IPC failed with them") for n in notes), notes


def test_no_private_uid_without_the_ipc_probe(tmp_path, monkeypatch):
    """On a full device the judge's probe tensor could not be made; CUDA alone works under the
    private uid, but opening the judge's tensors did not (the H200, run F): without the IPC probe
    the candidate runs without the private uid; with it (and IPC working) the uid is kept."""
    calls = []

    def fake_probe(plan, steps, as_root):
        calls.append((tuple(steps), as_root))
        return True, ""

    monkeypatch.setattr(sandbox, "_probe", fake_probe)
    monkeypatch.setattr(sandbox, "probe_cache_path", lambda: str(tmp_path / "cuda-probe.json"))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    base = dict(device="cuda", root=True, uid=sandbox.UID_BASE + 7, gid=sandbox.UID_BASE,
                read_caps=False, scratch=str(scratch), judge_dumpable=1, landlock=7)
    steps = sandbox._default_steps(dict(base))
    plan = dict(base, ipc_probe=None, ipc_error="OutOfMemoryError: CUDA out of memory")
    got, notes = sandbox._gpu_steps(plan, steps)
    assert plan["uid"] is None and got == steps
    assert all(as_root or not plan["uid"] for _, as_root in calls)
    assert any("gave up a private uid" in n for n in notes), notes
    kept = dict(base, ipc_probe=b"x", ipc_expect=1.0)
    assert sandbox._gpu_steps(kept, steps)[0] == steps and kept["uid"] == sandbox.UID_BASE + 7


def test_the_ipc_probe_tensor_is_made(monkeypatch):
    """The judge's side of the probe pickles a tensor as CUDA IPC does (here on the CPU: the
    import path is what broke on the GPU image)."""
    import torch

    monkeypatch.setattr(torch, "arange", lambda *a, **k: torch.zeros(4096))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    got = sandbox._cuda_probe_tensor("cpu")
    assert got.get("ipc_probe"), got


def test_settings_are_checked(monkeypatch):
    monkeypatch.setenv(sandbox.ENV_MODE, "paranoid")
    with pytest.raises(sandbox.SandboxError, match="off, auto, strict"):
        sandbox.mode()
    monkeypatch.setenv(sandbox.ENV_MODE, "strict")
    assert sandbox.mode() == "strict"
    monkeypatch.setenv(sandbox.ENV_SKIP, "seccomp, landlok")
    with pytest.raises(sandbox.SandboxError, match="landlok"):
        sandbox.skipped()


def test_seccomp_program_assembles_for_each_architecture():
    plan = {"judge": 4242, "judge_parent": 4241}
    for name, arch in sandbox.SYSCALLS.items():
        code = sandbox._bpf_filter(plan, arch)
        assert len(code) % 8 == 0 and 40 < len(code) // 8 < 200, name
        assert arch["arch"].to_bytes(4, "little") in code and (4242).to_bytes(4, "little") in code


# these change the environment of this process: they run after every pooled verification is done
def test_off_mode_lets_the_escape_through(verdicts, arena, monkeypatch):
    """The control: without the sandbox the same candidate writes its file (so the escape tests
    above can fail)."""
    _all_done(verdicts)
    monkeypatch.setenv(sandbox.ENV_MODE, "off")
    res = _verify("escape_write_outside")
    target = arena.dir / "escape_write_outside.txt"
    try:
        assert res["category"] == "runtime" and "wrote" in res["reason"], res["reason"]
        assert target.exists()
        assert "seccomp" not in res["sandbox"] and "landlock-fs" not in res["sandbox"]
    finally:
        target.unlink(missing_ok=True)


@pytest.mark.skipif(not LANDLOCK, reason="Landlock is not enabled in this kernel")
def test_strict_mode_refuses_a_candidate_without_a_required_protection(verdicts, monkeypatch):
    _all_done(verdicts)
    monkeypatch.setenv(sandbox.ENV_MODE, "strict")
    monkeypatch.setenv(sandbox.ENV_SKIP, "landlock,ro-mounts")
    res = _verify("honest_autotune")
    assert not res["passed"] and res["category"] == "harness", res
    assert "EGG_SANDBOX=strict" in res["reason"] and "landlock-fs or ro-mounts" in res["reason"]
    assert "parameters" not in res["checks"]  # refused before the candidate was imported


class _FailsToLoad:
    """Pickles fine in the judge; loading it raises (as a CUDA tensor whose IPC mapping fails
    does in the candidate process on a full device)."""

    def __reduce__(self):
        import operator

        return operator.truediv, (1, 0)


def test_a_message_the_candidate_process_cannot_open_is_its_reported_failure():
    """The candidate process reports a judge's message it cannot load (the H200, run F: "CUDA
    error: mapping of buffer object failed" while receiving the first trial's inputs) as a failure
    with its cause, not a bare exit code 1: a memory-like cause then sends the problem to run alone."""
    import time

    import torch

    from harness import worker as W

    src = "import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x\n"
    cand = W.CandidateProcess(src, "echo", torch.device("cpu"), [], 0, 0, 0, time.time() + 120)
    try:
        cand.enter({})
        cand.expect("ready", "loading the candidate")
        cand.send(("inputs", [_FailsToLoad()]))
        with pytest.raises(W._Verdict) as e:
            cand.expect("ok", "receiving inputs")
        assert e.value.category == "runtime", e.value
        assert "receiving the judge's tensors raised ZeroDivisionError" in str(e.value), e.value
    finally:
        cand.close()


def test_a_spare_candidate_process_takes_one_candidate_after_its_sandbox_report():
    """A spare is started without a candidate; the candidate goes to it after the sandbox report
    (``enter``), once: a second ``give`` and an ``enter`` before ``give`` are errors."""
    import time

    import torch

    from harness import worker as W

    src = "import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x\n"
    cand = W.CandidateProcess.spare(torch.device("cpu"), 0, 0)
    try:
        with pytest.raises(RuntimeError, match="before give"):
            cand.enter({})
        cand.give(src, "echo", [], 0, time.time() + 120)
        with pytest.raises(RuntimeError, match="one candidate only"):
            cand.give(src, "echo", [], 0, time.time() + 120)
        result = {}
        cand.enter(result)
        assert "sandbox" in result
        assert cand.expect("ready", "loading the candidate")[1] == {}
    finally:
        cand.close()
