"""Verification, the EGG process's side: static check, then a judge child process.

``verify(problem, candidate, ...)`` returns a ``VerificationRecord``-shaped dict: passed,
reason, category, trials, checks, per-output errors, flags, wall time (docs/verifier.md).
Nothing of the candidate runs in this process.
"""
from __future__ import annotations

import json
import pathlib
import secrets
import subprocess
import time

from harness.compare import Tolerance
from harness.problem import ProblemError, check_candidate_file
from harness.runner import kill_group, log_tail, start_child
from harness.static_check import check_source

#: failure categories, in the order a verification can reach them (docs/verifier.md)
CATEGORIES = ("problem", "candidate", "cheat", "compile", "params", "timeout", "memory", "crash",
              "runtime", "mismatch", "precision", "reference", "harness")
#: categories that mean "this input cannot be used" rather than "this candidate is wrong"
UNUSABLE = ("problem", "candidate")
#: seconds past ``timeout_s`` before the judge's process is killed from outside: the judge keeps
#: the same wall-clock deadline (``deadline_at``, counted from here, its start-up included) and
#: reports a timeout itself; this is only for a judge stuck in a step it cannot interrupt
KILL_GRACE_S = 30.0


def static_findings(candidate_path: str, problem_source: str | None) -> list[str]:
    src = pathlib.Path(candidate_path).read_text()
    return static_findings_src(src, problem_source)


def static_findings_src(src: str, problem_source: str | None) -> list[str]:
    skip = 0
    if problem_source and src.startswith(problem_source.rstrip()):
        skip = problem_source.rstrip().count("\n") + 1  # the problem's own code is trusted
    return [str(f) for f in check_source(src, skip_lines=skip)]


def verify(problem_path: str, candidate_path: str, *, device: str = "cpu", trials: int = 5,
           tol: Tolerance | None = None, timeout_s: float = 600.0, memory_limit_gb: float = 0.0,
           problem_source: str | None = None, log_dir: str | None = None,
           static: bool = True, sandbox_mode: str | None = None) -> dict:
    """Verify a candidate file against a problem file.

    ``timeout_s`` bounds the whole verification (loading, every trial); ``memory_limit_gb`` caps
    the candidate process (0: half the machine's RAM, and half the GPU's memory; < 0: no cap).
    ``static=False`` skips the static check (to show what the dynamic checks catch alone);
    ``sandbox_mode`` (off / auto / strict) overrides ``EGG_SANDBOX`` for this verification.
    """
    t0 = time.time()
    base = {"passed": False, "reason": "", "category": "", "trials": 0, "checks": [], "outputs": [],
            "flags": [], "device": device, "launches": 0}
    try:
        src = check_candidate_file(candidate_path)
    except ProblemError as e:
        return {**base, "category": "candidate", "reason": str(e), "wall_s": time.time() - t0}
    if static:
        findings = static_findings_src(src, problem_source)
        if findings:
            return {**base, "category": "cheat", "checks": ["static"],
                    "reason": "static check: " + "; ".join(findings[:5]), "wall_s": time.time() - t0}
    tol = tol or Tolerance()
    req = {"problem": str(problem_path), "candidate": str(candidate_path), "device": device,
           "trials": trials, "tolerance": tol.__dict__, "memory_limit_gb": memory_limit_gb,
           "timeout_s": timeout_s, "deadline_at": time.time() + timeout_s, "sandbox_mode": sandbox_mode}
    nonce = secrets.token_hex(16)
    proc, log = start_child("verify", req, log_dir, stdin=subprocess.PIPE)
    checks = ["static"] if static else []
    try:
        out, _ = proc.communicate(nonce + "\n" + json.dumps(src) + "\n", timeout=timeout_s + KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        return {**base, "category": "timeout", "checks": checks,
                "reason": f"verification did not finish within {timeout_s:g} s (the judge was stopped)",
                "wall_s": time.time() - t0}
    finally:
        kill_group(proc)  # anything the judge left behind
    res = None
    for ln in (out or "").splitlines():
        try:
            obj = json.loads(ln)
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("nonce") == nonce:
            res = obj
    if res is None:
        return {**base, "category": "crash", "checks": checks,
                "reason": f"verifier process exited with code {proc.returncode} without a verdict: "
                          f"{log_tail(log)}",
                "wall_s": time.time() - t0}
    res.pop("nonce", None)
    res["checks"] = checks + res.get("checks", [])
    # where the seconds went: the judge's process start, then its own steps (worker.judge)
    start = res.pop("started_at", None)
    lag = round(start - t0, 3) if isinstance(start, (int, float)) else 0.0
    res["phases"] = {"judge_started": lag, **{k: round(v + lag, 3) for k, v in res.get("phases", {}).items()},
                     "done": round(time.time() - t0, 3)}
    return {**base, **res}
