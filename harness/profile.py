"""Profiling, the EGG process's side: one long-lived timing judge per (run, problem, device).

The timing judge (harness.worker.profile_server) times eager and torch.compile itself (compile
time reported apart from run time), and every candidate it is asked about in a candidate process
of its own, in timed rounds interleaved with eager's on the same fresh values, bounded by the
judge's wall clock and with the outputs of timed calls checked (docs/verifier.md, "Timing"); a
candidate whose timed calls are wrong is rejected (``ProfileRejected``), not timed. The file
that is timed is the one that was verified: its text is checked statically here, read once by
the judge and compared with the hash the verifier recorded. On a GPU the judge measures the
machine's peaks at start-up when none are cached (harness.peaks), and every timing section holds
the machine-wide GPU lock (harness.gpulock).
"""
from __future__ import annotations

import atexit
import json
import pathlib
import selectors
import subprocess
import time

from harness.runner import kill_group, log_tail, start_child


class ProfileError(RuntimeError):
    pass


class ProfileRejected(ProfileError):
    """The timing judge rejected the candidate: the static check, wrong outputs of timed calls,
    times that do not add up, a file that changed since it was verified."""

    def __init__(self, category: str, reason: str):
        super().__init__(reason)
        self.category = category


class ProfileSession:
    def __init__(self, problem_path: str, device: str, rep_ms: float = 200.0,
                 timeout_s: float = 900.0, log_dir: str | None = None, tolerance: dict | None = None,
                 memory_limit_gb: float = 0.0, spare: bool | None = None):
        """``spare``: keep a candidate process started for the next candidate (default: on a
        GPU; harness.worker._Spares)."""
        self.device, self.timeout_s = device, timeout_s
        try:
            self.problem_source = pathlib.Path(problem_path).read_text()
        except OSError:
            self.problem_source = None
        req = {"problem": str(problem_path), "device": device, "rep_ms": rep_ms,
               "timeout_s": timeout_s, "memory_limit_gb": memory_limit_gb}
        if tolerance:
            req["tolerance"] = tolerance
        if spare is not None:
            req["spare"] = bool(spare)
        self.proc, self.log = start_child("profile", req, log_dir, stdin=subprocess.PIPE)
        self.baseline: dict | None = None
        self.last_eager: dict | None = None
        #: {"ready": true, "gpu": name, "peaks": measured peaks (harness.peaks) on a GPU}
        self.ready = self._read(timeout_s)

    @property
    def peaks(self) -> dict | None:
        """This machine's measured peaks (cached per GPU model), None on the CPU or on failure."""
        return self.ready.get("peaks")

    def _read(self, timeout: float) -> dict:
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if sel.select(timeout=0.5):
                line = self.proc.stdout.readline()
                if not line:
                    break
                if line.strip():
                    return json.loads(line)
            if self.proc.poll() is not None:
                break
        alive = self.proc.poll() is None
        self.close()
        why = "timed out" if alive else f"exited with code {self.proc.returncode}"
        raise ProfileError(f"profiling process {why}: {log_tail(self.log)}")

    def _ask(self, req: dict) -> dict:
        if self.proc.poll() is not None:
            raise ProfileError(f"profiling process is gone: {log_tail(self.log)}")
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        res = self._read(self.timeout_s)
        if res.get("rejected"):
            raise ProfileRejected(res.get("category") or "cheat", res.get("error", "rejected"))
        if not res.get("ok"):
            raise ProfileError(res.get("error", "profiling failed"))
        return res

    def baselines(self) -> dict:
        if self.baseline is None:
            self.baseline = self._ask({"op": "baseline"})
        return self.baseline

    def time_candidate(self, path: str, sha256: str | None = None, static: bool = True) -> dict:
        """The candidate's timing; eager's, measured interleaved with it, is ``last_eager``.
        ``sha256``: the hash of the text that was verified (a changed file is rejected).
        ``static=False`` skips the static check (to show what the timing judge catches alone)."""
        from harness.verify import static_findings

        findings = static_findings(str(path), self.problem_source) if static else []
        if findings:
            raise ProfileRejected("cheat", "static check: " + "; ".join(findings[:5]))
        res = self._ask({"op": "time", "path": str(path), "sha256": sha256})
        self.last_eager = res.get("eager")
        return res["candidate"]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(5)
            except Exception:  # noqa: BLE001
                pass
        kill_group(self.proc)


_SESSIONS: dict[tuple, ProfileSession] = {}


def session_key(run_dir: str, problem_sha: str, device: str) -> tuple:
    """One profiling process per run, problem and device."""
    return (run_dir or "", problem_sha, device)


def session(key: tuple, problem_path: str, device: str, rep_ms: float, timeout_s: float,
            log_dir: str | None = None, tolerance: dict | None = None,
            memory_limit_gb: float = 0.0) -> ProfileSession:
    """The run's profiling session, started on first use and restarted if it died."""
    s = _SESSIONS.get(key)
    if s is None or not s.alive():
        s = ProfileSession(problem_path, device, rep_ms, timeout_s, log_dir, tolerance, memory_limit_gb)
        _SESSIONS[key] = s
    return s


def close_session(key: tuple) -> None:
    s = _SESSIONS.pop(key, None)
    if s is not None:
        s.close()


@atexit.register
def _close_all() -> None:
    for k in list(_SESSIONS):
        close_session(k)
