"""Verification, the EGG process's side: static check, then a judge child process.

``verify(problem, candidate, ...)`` returns a ``VerificationRecord``-shaped dict: passed,
reason, category, trials, checks, per-output errors, flags, wall time.
"""
from __future__ import annotations

import json
import pathlib
import subprocess
import time

from harness.compare import Tolerance
from harness.runner import kill_group, log_tail, start_child
from harness.static_check import check_source


def static_findings(candidate_path: str, problem_source: str | None) -> list[str]:
    src = pathlib.Path(candidate_path).read_text()
    skip = 0
    if problem_source and src.startswith(problem_source.rstrip()):
        skip = problem_source.rstrip().count("\n") + 1  # the problem's own code is trusted
    return [str(f) for f in check_source(src, skip_lines=skip)]


def verify(problem_path: str, candidate_path: str, *, device: str = "cpu", trials: int = 5,
           tol: Tolerance | None = None, timeout_s: float = 600.0, memory_limit_gb: float = 0.0,
           problem_source: str | None = None, log_dir: str | None = None) -> dict:
    t0 = time.time()
    base = {"passed": False, "trials": 0, "checks": [], "outputs": [], "flags": [],
            "device": device, "launches": 0}
    if not pathlib.Path(candidate_path).is_file():
        return {**base, "category": "problem", "reason": f"candidate {candidate_path}: no such file"}
    findings = static_findings(candidate_path, problem_source)
    if findings:
        return {**base, "category": "cheat", "checks": ["static"],
                "reason": "static check: " + "; ".join(findings[:5]), "wall_s": time.time() - t0}
    tol = tol or Tolerance()
    req = {"problem": str(problem_path), "candidate": str(candidate_path), "device": device,
           "trials": trials, "tolerance": tol.__dict__, "memory_limit_gb": memory_limit_gb,
           "call_timeout_s": timeout_s}
    proc, log = start_child("verify", req, log_dir)
    try:
        out, _ = proc.communicate(timeout=timeout_s + 60)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        return {**base, "category": "timeout", "checks": ["static"],
                "reason": f"verification did not finish within {timeout_s:g} s",
                "wall_s": time.time() - t0}
    finally:
        kill_group(proc)  # anything the judge left behind
    lines = [ln for ln in (out or "").splitlines() if ln.strip()]
    if not lines:
        return {**base, "category": "crash", "checks": ["static"],
                "reason": f"verifier process exited with code {proc.returncode}: {log_tail(log)}",
                "wall_s": time.time() - t0}
    res = json.loads(lines[-1])
    res["checks"] = ["static"] + res.get("checks", [])
    return {**base, **res}
