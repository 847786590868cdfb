"""Starting the harness's child processes from the EGG process (which never runs candidates).

Each child gets its own process group and a tag in its environment; this process is a child
subreaper (harness.sandbox), so what a child's descendants orphan comes back here instead of to
init. ``kill_group`` kills the child's whole process tree (not only its group: a candidate may
``setsid``), then the group, then orphans carrying the tag. Its stderr goes to a log file whose
tail explains a crash.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import secrets
import signal
import subprocess
import sys
import tempfile

from harness import gpulock, sandbox

PROJECT_ROOT = pathlib.Path(__file__).resolve().parent.parent


MEMORY_WORDS = ("out of memory", "outofmemoryerror", "can't allocate memory", "not enough memory",
                "cannot allocate memory",
                # CUDA IPC: opening the judge's tensor in the candidate process when the device is
                # full (seen on the H200 with 231 MiB of 140 GiB free, four problems at once)
                "mapping of buffer object failed")


def proc_status_kb(pid: int | str, field: str) -> int:
    """A kB field of /proc/PID/status (``VmRSS``, ``VmSize``; PID may be ``"self"``); 0 when
    unreadable."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for ln in f:
                if ln.startswith(field + ":"):
                    return int(ln.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def says_out_of_memory(text: str | None) -> bool:
    """Does this error text (an exception's, a failure reason) say memory ran out?"""
    t = (text or "").lower()
    return any(k in t for k in MEMORY_WORDS)


def child_env(device: str) -> dict:
    gpulock.background_nice()  # a bad EGG_BACKGROUND_NICE fails here, not inside a child
    env = dict(os.environ)
    paths = [str(PROJECT_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    env.setdefault("TRITON_CACHE_DIR", str(pathlib.Path(tempfile.gettempdir()) / "egg-triton-cache"))
    return env


def start_child(mode: str, req: dict, log_dir: str | None = None, stdin=None) -> tuple[subprocess.Popen, pathlib.Path]:
    log_dir = log_dir or tempfile.mkdtemp(prefix="egg-")
    log = pathlib.Path(log_dir) / f"{mode}-{os.getpid()}-{id(req)}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    errf = open(log, "w")
    env = child_env(req["device"])
    tag = secrets.token_hex(8)
    env[sandbox.ENV_TAG] = tag
    sandbox.become_subreaper()
    sandbox.harden_starter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.child", mode, json.dumps(req)],
        stdin=stdin, stdout=subprocess.PIPE, stderr=errf, env=env,
        start_new_session=True, text=True,
    )
    proc.egg_tag = tag
    errf.close()
    return proc, log


def kill_group(proc: subprocess.Popen) -> None:
    """Kill a child and everything it started: its process tree while it lives (a candidate that
    left the group with setsid is still in it), its process group, and the orphans that came
    back to this process (they carry the child's tag); remove its candidates' scratch folders."""
    tag = getattr(proc, "egg_tag", None)
    killed: set[int] = set()
    if proc.poll() is None:
        try:
            os.kill(proc.pid, signal.SIGSTOP)  # it cannot start or adopt anything while we look
        except OSError:
            pass
        killed = sandbox.kill_descendants(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass
    sandbox.reap(killed)  # the judge's children became ours when it died
    if tag:
        sandbox.kill_descendants(tag=tag, rounds=5)
        sandbox.remove_leftovers(tag)


#: the stack lines of a C++ exception's backtrace (c10::Error): a process that aborts on one
#: prints its message first and then dozens of these, which would push the message out of a tail
CPP_FRAME = re.compile(r"^\s*(frame #\d+:|Exception raised from )")


def log_tail(log: pathlib.Path, n: int = 8) -> str:
    """The last n non-empty lines of a log, a C++ backtrace's frame lines left out (the error's
    own message stays)."""
    try:
        lines = [ln for ln in log.read_text(errors="replace").splitlines()
                 if ln.strip() and not CPP_FRAME.match(ln)]
    except OSError:
        return ""
    return " | ".join(lines[-n:])


# ------------------------------------------------------------------ progress of a long step
#: environment variable naming the progress file of the current ``egg`` command; set by the CLI
#: when it shows a live status line, inherited by every child process
PROGRESS_ENV = "EGG_PROGRESS_FILE"


def report_progress(text: str, path: str | os.PathLike | None = None) -> None:
    """Say what a long step is doing now, e.g. ``"trial 3/8"``, for the CLI's status line.

    Writes ``{"text", "time", "pid"}`` as JSON to ``path`` or ``$EGG_PROGRESS_FILE`` (atomically:
    a reader never sees half a file); does nothing when neither is set, and never raises: any
    process of a step (the verifier's judge, a timing server) may call it as often as it likes.
    """
    import time

    target = path or os.environ.get(PROGRESS_ENV)
    if not target:
        return
    try:
        tmp = f"{target}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump({"text": str(text)[:200], "time": time.time(), "pid": os.getpid()}, f)
        os.replace(tmp, target)
    except OSError:
        pass


def read_progress(path: str | os.PathLike | None, since: float = 0.0) -> str | None:
    """The latest progress text written at or after ``since`` (Unix seconds), else None."""
    if not path:
        return None
    try:
        rec = json.loads(pathlib.Path(path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or float(rec.get("time", 0)) < since:
        return None
    return str(rec.get("text") or "") or None
