"""harness.gpulock: exclusive holds exclude other processes, shared holds coexist, holds nest
in one process, and the lock can be turned off."""
import os
import subprocess
import sys
import time

import pytest

from harness import gpulock

HOLDER = """
import sys, time
from harness import gpulock
mode, secs = sys.argv[1], float(sys.argv[2])
with gpulock.hold(mode):
    print("held", flush=True)
    time.sleep(secs)
"""


def _hold_in_child(mode: str, secs: float, env: dict) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLDER, mode, str(secs)], stdout=subprocess.PIPE,
                         text=True, env=env)
    assert p.stdout.readline().strip() == "held"
    return p


@pytest.fixture
def lock_env(tmp_path, monkeypatch):
    path = tmp_path / "gpu.lock"
    monkeypatch.setenv("EGG_GPU_LOCK", str(path))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    gpulock._LOCKS.clear()
    yield env
    gpulock._LOCKS.clear()


def test_exclusive_waits_for_another_process(lock_env):
    p = _hold_in_child("exclusive", 1.0, lock_env)
    t0 = time.perf_counter()
    with gpulock.hold("shared"):
        waited = time.perf_counter() - t0
    p.wait(10)
    assert waited > 0.5  # blocked until the child let go


def test_exclusive_waits_for_shared_holders(lock_env):
    p = _hold_in_child("shared", 1.0, lock_env)
    t0 = time.perf_counter()
    with gpulock.hold("exclusive"):
        waited = time.perf_counter() - t0
    p.wait(10)
    assert waited > 0.5


def test_shared_holders_coexist(lock_env):
    p = _hold_in_child("shared", 1.0, lock_env)
    t0 = time.perf_counter()
    with gpulock.hold("shared"):
        waited = time.perf_counter() - t0
    p.wait(10)
    assert waited < 0.5


def test_nested_holds_in_one_process(lock_env):
    lk_path = str(gpulock.lock_path())
    with gpulock.hold("shared"):
        lk = gpulock._LOCKS[lk_path]
        assert lk.mode == "shared"
        with gpulock.hold("exclusive"):  # upgrade
            assert lk.mode == "exclusive"
            with gpulock.hold("shared"):  # already held strongly enough
                assert lk.mode == "exclusive"
            assert lk.mode == "exclusive"
        assert lk.mode == "shared"  # back to shared
    assert lk.mode is None


def test_lock_off_and_default_path(monkeypatch, tmp_path):
    """Off (EGG_GPU_LOCK=off, or hold(enabled=False)): no wait while another process holds the
    very lock an enabled hold would take, and no lock taken. The default path is per GPU set."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tag = f"egg-test-{os.getpid()}"  # a GPU set of its own: its default lock file is this test's
    monkeypatch.delenv("EGG_GPU_LOCK", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", tag)
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the default lock file lands in the temp folder
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    default = gpulock.lock_path()
    assert default.parent == tmp_path and default.name.endswith(f"-{tag}.lock")
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    gpulock._LOCKS.clear()
    p = _hold_in_child("exclusive", 1.5, env)  # the child holds the default lock
    try:
        t0 = time.perf_counter()
        with gpulock.hold("exclusive", enabled=False):
            pass
        monkeypatch.setenv("EGG_GPU_LOCK", "off")
        assert gpulock.lock_path() is None
        with gpulock.hold("exclusive"):
            pass
        assert time.perf_counter() - t0 < 0.5 and gpulock._LOCKS == {}  # nothing waited, nothing held
        monkeypatch.delenv("EGG_GPU_LOCK")
        t0 = time.perf_counter()
        with gpulock.hold("exclusive"):  # on: waits for the child (the check above can fail)
            assert time.perf_counter() - t0 > 0.5
    finally:
        p.wait(10)
        gpulock._LOCKS.clear()
    monkeypatch.setenv("EGG_GPU_LOCK_VERIFY", "1")
    assert gpulock.verify_lock_enabled()


def test_upgrade_does_not_deadlock_with_a_waiting_writer(lock_env):
    """We hold shared; another process waits for exclusive (holding the turnstile); our upgrade
    must not wait for the turnstile while still holding shared."""
    with gpulock.hold("shared"):
        writer = subprocess.Popen([sys.executable, "-c", HOLDER, "exclusive", "0.2"],
                                  stdout=subprocess.PIPE, text=True, env=lock_env)
        time.sleep(1.0)  # the writer is now waiting at the main lock, holding the turnstile
        t0 = time.perf_counter()
        with gpulock.hold("exclusive"):
            pass
        assert time.perf_counter() - t0 < 5
    assert writer.wait(10) == 0
