"""Profiling, the EGG process's side: one long-lived timing process per (run, problem, device).

The process times eager and torch.compile once (compile time reported apart from run time) and
then every candidate it is asked about, all on the same inputs in that one process, so every
timing record's speedups compare numbers measured side by side. On a GPU it measures the
machine's peaks at start-up when none are cached (harness.peaks), and every timing section holds
the machine-wide GPU lock (harness.gpulock).
"""
from __future__ import annotations

import atexit
import json
import selectors
import subprocess
import time

from harness.runner import kill_group, log_tail, start_child


class ProfileError(RuntimeError):
    pass


class ProfileSession:
    def __init__(self, problem_path: str, device: str, rep_ms: float = 200.0,
                 timeout_s: float = 900.0, log_dir: str | None = None):
        self.device, self.timeout_s = device, timeout_s
        req = {"problem": str(problem_path), "device": device, "rep_ms": rep_ms}
        self.proc, self.log = start_child("profile", req, log_dir, stdin=subprocess.PIPE)
        self.baseline: dict | None = None
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
        if not res.get("ok"):
            raise ProfileError(res.get("error", "profiling failed"))
        return res

    def baselines(self) -> dict:
        if self.baseline is None:
            self.baseline = self._ask({"op": "baseline"})
        return self.baseline

    def time_candidate(self, path: str) -> dict:
        return self._ask({"op": "time", "path": str(path)})["candidate"]

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
            log_dir: str | None = None) -> ProfileSession:
    """The run's profiling session, started on first use and restarted if it died."""
    s = _SESSIONS.get(key)
    if s is None or not s.alive():
        s = ProfileSession(problem_path, device, rep_ms, timeout_s, log_dir)
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
