"""A machine-wide GPU lock: timings never overlap other GPU work of EGG processes.

Several EGG processes may share one GPU (``egg bench --jobs N``, or two ``egg run`` at once).
Their compilation, verification and process start-up may overlap freely, but a timing section
must have the GPU to itself: CUDA events measure elapsed GPU time, and kernels of another
process time-sliced in between would be counted as the timed function's.

So a timing section holds the lock *exclusively*, and untimed GPU work that EGG schedules in
the profiling process (the first call of a candidate that JIT-compiles its kernels, the
torch.compile warm-up with Inductor's autotuning) holds it *shared*. Verification may also hold
it shared (``EGG_GPU_LOCK_VERIFY=1``, ``egg bench --verify-lock``); see docs/bench.md for the
trade-off.

The GPU lock alone does not make a timing's host side undisturbed: the timing judge bounds each
timing by its own wall clock (docs/verifier.md, "Timing"), and a process that waits for a CPU
core while its neighbours compile kernels on every core makes that bound, and so the timing,
too slow (on the H200's 16 cores, 32 busy processes made a 2.69 ms matmul time 3.06 ms through
the bound; at nice 10 they made it 2.71 ms: docs/results/interference_h200.md). So the processes
doing untimed CPU work, the verification judge (and the candidate processes it starts) and the
compile-check workers, lower their own CPU priority (``yield_cpu``, nice ``EGG_BACKGROUND_NICE``,
10 by default, 0 keeps it); the EGG process and its timing server keep theirs.

The lock is ``fcntl.flock`` on a file in the system temp folder, one per user and visible GPU
set (``CUDA_VISIBLE_DEVICES``), so it spans every EGG process of the machine and is released by
the kernel when a process dies.
``EGG_GPU_LOCK`` names another file, or ``off`` disables the lock. Writers go first: a waiting
timing section stops new shared holders (a turnstile lock), so a stream of verifications cannot
starve it.
"""
from __future__ import annotations

import contextlib
import os
import pathlib
import re
import tempfile
import threading
import time

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock (single-job use only)
    fcntl = None

ENV_PATH = "EGG_GPU_LOCK"
ENV_VERIFY = "EGG_GPU_LOCK_VERIFY"
ENV_NICE = "EGG_BACKGROUND_NICE"
#: the niceness of processes doing untimed CPU work (verification, compile checks)
BACKGROUND_NICE = 10


def lock_path() -> pathlib.Path | None:
    """The lock file of the GPUs this process sees, or None when the lock is off."""
    val = os.environ.get(ENV_PATH, "").strip()
    if val.lower() in ("off", "0", "none") or fcntl is None:
        return None
    if val:
        return pathlib.Path(val)
    vis = os.environ.get("CUDA_VISIBLE_DEVICES", "all") or "all"
    tag = re.sub(r"[^A-Za-z0-9_.-]+", "_", vis)[:80]
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return pathlib.Path(tempfile.gettempdir()) / f"egg-gpu-{uid}-{tag}.lock"


def verify_lock_enabled() -> bool:
    return os.environ.get(ENV_VERIFY, "").strip().lower() in ("1", "true", "yes", "on")


class _Lock:
    """Per process: one open file per lock path and a stack of holds (re-entrant)."""

    def __init__(self, path: pathlib.Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.main = os.open(str(path), os.O_RDWR | os.O_CREAT, 0o666)
        self.turn = os.open(str(path) + ".turn", os.O_RDWR | os.O_CREAT, 0o666)
        self.mode: str | None = None  # None | "shared" | "exclusive"
        self.frames: list[tuple[bool, str | None]] = []  # (took the lock, mode before)
        self.mutex = threading.RLock()
        self.waited_s = 0.0  # total time spent waiting, for diagnostics

    def acquire(self, mode: str) -> None:
        self.mutex.acquire()
        if self.mode == "exclusive" or (self.mode == "shared" and mode == "shared"):
            self.frames.append((False, self.mode))  # already held strongly enough
            return
        prev = self.mode
        try:
            if prev == "shared":  # upgrade: let go first, or a writer waiting at the turnstile
                fcntl.flock(self.main, fcntl.LOCK_UN)  # for our shared hold deadlocks with us
                self.mode = None
            t0 = time.perf_counter()
            fcntl.flock(self.turn, fcntl.LOCK_EX)  # writers first: a waiting writer holds this
            try:
                fcntl.flock(self.main, fcntl.LOCK_EX if mode == "exclusive" else fcntl.LOCK_SH)
            finally:
                fcntl.flock(self.turn, fcntl.LOCK_UN)
        except BaseException:
            if prev == "shared" and self.mode is None:  # an interrupted upgrade: hold shared again
                fcntl.flock(self.main, fcntl.LOCK_SH)
                self.mode = prev
            self.mutex.release()
            raise
        self.waited_s += time.perf_counter() - t0
        self.frames.append((True, prev))
        self.mode = mode

    def release(self) -> None:
        try:
            took, prev = self.frames.pop()
            if took:  # exclusive -> shared (after an upgrade) is a downgrade: it never waits
                fcntl.flock(self.main, fcntl.LOCK_UN if prev is None else fcntl.LOCK_SH)
                self.mode = prev
        finally:
            self.mutex.release()


_LOCKS: dict[str, _Lock] = {}


@contextlib.contextmanager
def hold(mode: str, enabled: bool = True):
    """Hold the GPU lock (``"exclusive"`` or ``"shared"``) for the duration of the block."""
    path = lock_path() if enabled else None
    if path is None:
        yield
        return
    lk = _LOCKS.get(str(path))
    if lk is None:
        lk = _LOCKS[str(path)] = _Lock(path)
    lk.acquire(mode)
    try:
        yield
    finally:
        lk.release()


def waited_s() -> float:
    """Seconds this process has spent waiting for the GPU lock so far."""
    path = lock_path()
    lk = _LOCKS.get(str(path)) if path is not None else None
    return lk.waited_s if lk is not None else 0.0


def background_nice() -> int:
    """The niceness untimed work runs at (``EGG_BACKGROUND_NICE``, default 10; 0: unchanged)."""
    val = os.environ.get(ENV_NICE, "").strip()
    if not val:
        return BACKGROUND_NICE
    try:
        n = int(val)
    except ValueError:
        raise ValueError(f"{ENV_NICE}={val!r}: expected an integer niceness (0 to 19)") from None
    if not 0 <= n <= 19:
        raise ValueError(f"{ENV_NICE}={val!r}: expected an integer niceness (0 to 19)")
    return n


def yield_cpu() -> int:
    """Lower this process's CPU priority to ``background_nice()`` (never raise it), so that a
    timing of another process running beside it gets the CPU first. Returns the niceness now."""
    if not hasattr(os, "nice"):  # pragma: no cover - not POSIX
        return 0
    cur = os.nice(0)
    target = background_nice()
    if target > cur:
        try:
            cur = os.nice(target - cur)
        except OSError:  # pragma: no cover - a sandbox that forbids it: keep the priority
            pass
    return cur
