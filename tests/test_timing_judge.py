"""The timing judge (harness.worker.profile_server through harness.profile.ProfileSession): the
candidate runs in a process of its own, every timed round's outputs are checked on the CPU, the
file timed is the file verified, and the wall-clock bound of harness.timing.summarize_rounds."""
import pathlib

import pytest

from harness import profile as P
from harness.timing import HOST_COVER_MS, WALL_ALLOWANCE_MS, summarize_rounds
from tests.verifier_cases import cases as C

ROWSUM = C.PROBLEMS / "rowsum.py"

LATE_WRONG = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Right for its first 20 calls (more than a verification makes), wrong after."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        out = (x * x).sum(dim=-1, keepdim=True)
        return out if self.calls <= 20 else out * 1.5
'''

MUTATES_LATE = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Right, but after 20 calls it also scales its input in place."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        out = (x * x).sum(dim=-1, keepdim=True)
        if self.calls > 20:
            x.mul_(2.0)
        return out
'''


@pytest.fixture(scope="module")
def session():
    s = P.ProfileSession(str(ROWSUM), "cpu", 20.0)
    yield s
    s.close()


def test_honest_candidate_is_timed_with_eager_interleaved(session):
    base = session.baselines()
    assert base["eager"]["interpreter"] and base["eager"]["n"] >= 3
    t = session.time_candidate(str(C.CANDIDATES / "honest_triton_reduction.py"))
    assert t["interpreter"] and t["n"] == 3 and t["median_ms"] > 0
    assert session.last_eager and session.last_eager["n"] == 3


def test_wrong_only_in_timed_calls_is_rejected_not_timed(session, tmp_path):
    path = tmp_path / "late_wrong.py"
    path.write_text(LATE_WRONG)
    with pytest.raises(P.ProfileRejected) as e:
        for _ in range(8):  # each timing makes ~5 calls: the 21st call is inside a timing
            session.time_candidate(str(path))
    assert e.value.category == "mismatch" and "timed calls are wrong" in str(e.value)


def test_wrong_in_a_timed_round_is_rejected(session, tmp_path):
    """Right on the first timed call (the warm-up), wrong from the third: a round's check."""
    path = tmp_path / "round_wrong.py"
    path.write_text(LATE_WRONG.replace("self.calls <= 20", "self.calls <= 2"))
    with pytest.raises(P.ProfileRejected) as e:
        session.time_candidate(str(path))
    assert e.value.category == "mismatch" and "timed round" in str(e.value)


def test_input_changed_during_timing_is_rejected(session, tmp_path):
    path = tmp_path / "mutates_late.py"
    path.write_text(MUTATES_LATE)
    with pytest.raises(P.ProfileRejected) as e:
        for _ in range(8):
            session.time_candidate(str(path))
    assert e.value.category == "cheat" and "was modified" in str(e.value)


def test_the_file_timed_is_the_file_verified(session, tmp_path):
    import hashlib

    path = tmp_path / "cand.py"
    src = (C.CANDIDATES / "honest_triton_reduction.py").read_text()
    path.write_text(src)
    verified = hashlib.sha256(src.encode()).hexdigest()
    assert session.time_candidate(str(path), verified)["n"] == 3
    path.write_text(src + "\n# changed after verification\n")
    with pytest.raises(P.ProfileRejected, match="changed since it was verified"):
        session.time_candidate(str(path), verified)


def test_the_static_check_runs_before_timing(session):
    with pytest.raises(P.ProfileRejected) as e:
        session.time_candidate(str(C.CANDIDATES / "cheat_patch_timer.py"))
    assert e.value.category == "cheat" and str(e.value).startswith("static check: line ")


# ----------------------------------------------------------------------------- the wall-clock bound
def _rounds(times_per_round, wall_per_call, calls=10, singles=()):
    rs = [{"times": [t] * calls, "wall_ms": wall_per_call * calls} for t in times_per_round]
    rs += [{"times": [t], "wall_ms": HOST_COVER_MS + t + 0.05} for t in singles]  # run_round's cover
    return rs


def test_honest_gpu_bound_times_are_the_event_times():
    """Events 1 ms, the judge's wall clock 1 ms + the flush per call: the events count."""
    s = summarize_rounds(_rounds([1.0] * 6, 1.0 + 0.06), flush_ms=0.06, ipc_ms=0.0)
    assert s["median_ms"] == pytest.approx(1.0) and not s["flags"]


def test_times_reported_below_the_wall_clock_count_for_nothing():
    """A candidate that reports 0.1 ms per call where the judge's clock saw 1 ms of work per call
    is timed at the wall clock's bound, flagged."""
    s = summarize_rounds(_rounds([0.1] * 6, 1.0 + 0.06), flush_ms=0.06, ipc_ms=0.0)
    assert s["median_ms"] == pytest.approx(1.0 - WALL_ALLOWANCE_MS, rel=1e-6)
    assert s["p20_ms"] <= s["median_ms"] <= s["p80_ms"]
    assert any("wall clock" in f for f in s["flags"])


def test_channel_overhead_is_not_charged_to_the_candidate():
    calls, ipc = 10, 0.5
    rs = [{"times": [1.0] * calls, "wall_ms": 1.06 * calls + ipc} for _ in range(6)]
    s = summarize_rounds(rs, flush_ms=0.06, ipc_ms=ipc)
    assert s["median_ms"] == pytest.approx(1.0) and not s["flags"]


def test_a_rounds_fixed_cost_is_not_charged_per_call():
    """Each round costs 1.3 ms beyond its calls (the channel, opening the outputs' IPC handles):
    an honest 2.7 ms kernel in rounds of 7 stays 2.7 ms (charged per call it read 2.86 ms on the
    H200); a kernel whose events report 1 ms of 2.7 ms of marginal wall time is still raised."""
    fixed, k, flush = 1.3, 7, 0.06

    def rounds(event_ms, work_ms):
        rs = [{"times": [event_ms] * k, "wall_ms": fixed + k * (work_ms + flush)} for _ in range(8)]
        return rs + [{"times": [event_ms], "wall_ms": fixed + HOST_COVER_MS + work_ms + flush}
                     for _ in range(2)]

    honest = summarize_rounds(rounds(2.7, 2.7), flush_ms=flush, ipc_ms=0.2)
    assert honest["median_ms"] == pytest.approx(2.7) and not honest["flags"]
    hidden = summarize_rounds(rounds(1.0, 2.7), flush_ms=flush, ipc_ms=0.2)
    assert hidden["median_ms"] == pytest.approx(2.7 - WALL_ALLOWANCE_MS, rel=1e-6)
    assert any("wall clock" in f for f in hidden["flags"])


def test_long_rounds_far_faster_than_checked_single_calls_are_inconsistent():
    """A memo within a round: calls after the first cost nothing; the single-call rounds (every
    output checked) show the real cost."""
    rs = _rounds([0.01] * 6, 0.08, singles=(1.0, 1.0))
    assert "inconsistent" in summarize_rounds(rs, flush_ms=0.06, ipc_ms=0.0)
    honest = _rounds([1.0] * 6, 1.06, singles=(1.05, 1.02))
    assert "inconsistent" not in summarize_rounds(honest, flush_ms=0.06, ipc_ms=0.0)


BATCHED_PAIRS = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Batches calls two at a time: an odd call keeps its input and returns an unfilled buffer,
    the next call computes both (a timer checking a round's last output sees all values right)."""

    def __init__(self):
        super().__init__()
        self.pending = None

    def forward(self, x):
        out = torch.empty(x.shape[0], 1, dtype=x.dtype, device=x.device)
        if self.pending is None:
            self.pending = (x, out)
            return out
        px, pout = self.pending
        self.pending = None
        both = (torch.stack([px, x]) ** 2).sum(dim=-1, keepdim=True)
        pout.copy_(both[0])
        out.copy_(both[1])
        return out
'''


def test_calls_batched_two_at_a_time_are_rejected(session, tmp_path):
    """Every round's last output is right after the round (even-length rounds); the single-call
    rounds, whose one output is checked, return an unfilled buffer: rejected, never timed."""
    path = tmp_path / "batched_pairs.py"
    path.write_text(BATCHED_PAIRS)
    with pytest.raises(P.ProfileRejected) as e:
        for _ in range(4):
            session.time_candidate(str(path))
    assert e.value.category in ("mismatch", "cheat"), e.value


# ----------------------------------------------------------------------------- the spare process
KILLS_SIBLINGS = '''import os
import signal

import torch.nn as nn


def _siblings():
    me, parent = os.getpid(), os.getppid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent and b"multiprocessing" in cmd:
            yield int(name)


class ModelNew(nn.Module):
    """Right, and it kills the other candidate processes of its judge (the spare among them)."""

    def forward(self, x):
        for pid in _siblings():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        return (x * x).sum(dim=-1, keepdim=True)
'''


@pytest.fixture()
def spare_session():
    s = P.ProfileSession(str(ROWSUM), "cpu", 20.0, spare=True)
    yield s
    s.close()


def test_the_next_candidate_runs_in_a_process_started_before_it(spare_session, tmp_path):
    """With a spare (the default on a GPU), the second candidate's process was started while the
    first was timed; both are timed as usual."""
    src = (C.CANDIDATES / "honest_triton_reduction.py").read_text()
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text(src)
    b.write_text(src + "\n# another variant\n")
    ta = spare_session.time_candidate(str(a))
    tb = spare_session.time_candidate(str(b))
    assert ta["n"] == tb["n"] == 3
    assert ta["prestarted"] is False and tb["prestarted"] is True


@pytest.mark.parametrize("sandbox", ["auto", "off"])
def test_a_candidate_that_kills_the_spare_does_not_fail_the_next(sandbox, tmp_path, monkeypatch):
    """A candidate (past the static check) kills its judge's other candidate processes, the spare
    among them, while it is timed: the next honest candidate is still timed. Without the sandbox
    the kill gets through and the next candidate gets a fresh process."""
    monkeypatch.setenv("EGG_SANDBOX", sandbox)
    bad, good = tmp_path / "kills.py", tmp_path / "honest.py"
    bad.write_text(KILLS_SIBLINGS)
    good.write_text((C.CANDIDATES / "honest_triton_reduction.py").read_text())
    s = P.ProfileSession(str(ROWSUM), "cpu", 20.0, spare=True)
    try:
        s.time_candidate(str(bad), static=False)
        t = s.time_candidate(str(good))
    finally:
        s.close()
    assert t["n"] == 3 and t["median_ms"] > 0
    if sandbox == "off":
        assert t["prestarted"] is False
