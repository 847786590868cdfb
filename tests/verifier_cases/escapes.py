"""Hostile candidates against the OS sandbox (harness.sandbox), as data, and the arena that watches
for their side effects: a folder outside every scratch folder, a token in the environment of
everything a judge starts, a TCP and UDP listener on 127.0.0.1, the environment's site-packages.

Used by tests/test_sandbox.py on the CPU and by scripts/gpu_sandbox_check.py on a GPU. Each
escape runs with the static check off (it would stop most of them first): what is tested is that
its side effect did not happen, and that its own report (the error it raises) shows each attempt
refused. Routes (``ROUTES``) are the static check's: each is rejected with a phrase of its reason.
"""
from __future__ import annotations

import os
import pathlib
import secrets
import socket
import tempfile
import threading
from dataclasses import dataclass, field

from tests.verifier_cases.cases import CANDIDATES, PROBLEMS


#: how a refused write shows (Landlock: EACCES; read-only mounts: EROFS)
REFUSED = "PermissionError|Read-only file system"


@dataclass
class Escape:
    candidate: str
    expect: str  # verdict category ("passed" or a failure category; "a|b": either)
    files: tuple = ()  # names in the arena's folder that must not exist afterwards
    must: tuple = ()  # phrases its reason must contain ("a|b": either)
    must_not: tuple = ()  # phrases its reason must not contain
    no_exec: dict = field(default_factory=dict)  # extra "must"/"must_not" where no program may run
    # (landlock-exec held: the CPU with Landlock)
    problem: str = "rowsum"
    note: str = ""

    @property
    def id(self) -> str:
        return self.candidate


ESCAPES = [
    Escape("escape_write_outside", "runtime", ("escape_write_outside.txt",), ("escape:", REFUSED),
           ("wrote",), note="a file outside the scratch folder"),
    Escape("escape_pth", "runtime", (), ("escape:", REFUSED), ("wrote",),
           note="a .pth file in the environment's site-packages"),
    Escape("escape_shell", "runtime", ("escape_shell.txt", "escape_shell2.txt"), ("escape:",), ("system=0",),
           no_exec={"must": ("subprocess PermissionError",), "must_not": ("subprocess=7",)},
           note="shell commands"),
    Escape("escape_daemon", "passed", note="a double-forked, setsid daemon that would outlive the judge"),
    Escape("escape_proc_judge", "runtime", (), ("escape:", "judge-mem=", "egg-fds="), ("=ok",),
           note="the judge's and EGG's memory, environment, fds, ptrace, signals"),
    Escape("escape_socket", "runtime", (), ("escape:", "tcp="), ("=sent",), note="network sockets"),
    Escape("escape_exit_hook", "passed", ("escape_exit_hook.txt",), note="exit hooks writing a file"),
    # the static check's routes with the check off: the OS sandbox keeps their side effects away
    Escape("route_builtins_payload", "compile", ("route_payload.txt",), (REFUSED,),
           note="a base64+zlib payload run by builtins.exec (its write raises at import)"),
]
#: the static check's routes with the check off (the GPU script runs them too; the CPU tests run
#: ``route_builtins_payload`` from ESCAPES: the others' mechanisms are the escapes' above)
ROUTES_OFF = [
    Escape("route_torch_os", "passed|compile", ("route_torch_os.txt", "route_torch_os_popen.txt"),
           no_exec={"must": ("PermissionError",)},
           note="torch.os.system / popen (where no program may run, popen raises at import)"),
    Escape("route_atexit", "passed", ("route_atexit.txt",), note="atexit reached through torch"),
]


@dataclass
class Route:
    candidate: str
    reason: str  # a phrase of the static check's reason


ROUTES = [
    Route("route_torch_os", "reaches module os through an attribute"),
    Route("route_sys_modules", "reaches module sys through an attribute"),
    Route("route_triton_subprocess", "reaches module subprocess through an attribute"),
    Route("route_builtins_payload", "reaches module builtins through an attribute"),
    Route("route_patch_timer", "replaces perf_counter"),
    Route("route_reference_forward", "reaches the reference Model"),
    Route("route_atexit", "reaches module atexit through an attribute"),
    Route("escape_exit_hook", "imports atexit"),
    Route("escape_shell", "imports subprocess"),
    Route("escape_socket", "imports socket"),
]


def candidate_path(name: str) -> pathlib.Path:
    return CANDIDATES / f"{name}.py"


def problem_path(name: str) -> pathlib.Path:
    return PROBLEMS / f"{name}.py"


def site_packages() -> pathlib.Path:
    import torch

    return pathlib.Path(torch.__file__).resolve().parent.parent


class Arena:
    """Sets EGG_ESCAPE_DIR / _TOKEN / _PORT in this process's environment (judges inherit it) and
    watches: files in the folder and next to scratch folders, the .pth file, the listener, and
    any process that still carries the token."""

    def __init__(self, folder: pathlib.Path):
        self.dir = pathlib.Path(folder)
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o777)  # a candidate of another uid could write here, were it allowed
        self.token = secrets.token_hex(8)
        self.received: list[bytes] = []
        self._tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._tcp.bind(("127.0.0.1", 0))
        self._tcp.listen(8)
        self._tcp.settimeout(0.2)
        self.port = self._tcp.getsockname()[1]
        self._udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._udp.bind(("127.0.0.1", self.port))
        self._udp.settimeout(0.2)
        self._stop = False
        self._thread = threading.Thread(target=self._listen, daemon=True)
        self._old = {}

    def _listen(self) -> None:
        while not self._stop:
            for s in (self._tcp, self._udp):
                try:
                    if s is self._tcp:
                        c, _ = s.accept()
                        c.settimeout(1)
                        self.received.append(c.recv(100) or b"<connected>")
                        c.close()
                    else:
                        self.received.append(s.recv(100))
                except OSError:
                    pass

    def __enter__(self) -> "Arena":
        for e in ESCAPES + ROUTES_OFF:  # what an earlier run without the sandbox left next to scratch folders
            for f in e.files:
                p = pathlib.Path(tempfile.gettempdir()) / f
                if p.is_file() and not p.is_symlink():
                    p.unlink()
        env = {"EGG_ESCAPE_DIR": str(self.dir), "EGG_ESCAPE_TOKEN": self.token,
               "EGG_ESCAPE_PORT": str(self.port)}
        for k, v in env.items():
            self._old[k] = os.environ.get(k)
            os.environ[k] = v
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop = True
        self._thread.join(2)
        self._tcp.close()
        self._udp.close()
        for k, v in self._old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self.remove_pth()

    def pth(self) -> pathlib.Path:
        return site_packages() / f"egg_escape_{self.token}.pth"

    def remove_pth(self) -> None:
        try:
            self.pth().unlink()
        except OSError:
            pass

    def token_processes(self) -> list[int]:
        """Processes that still carry the token (anything a judge started and left behind)."""
        out = []
        mark = f"EGG_ESCAPE_TOKEN={self.token}".encode()
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == os.getpid():
                continue
            try:
                with open(f"/proc/{name}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] in "ZX":
                        continue
                with open(f"/proc/{name}/environ", "rb") as f:
                    if mark in f.read().split(b"\0"):
                        out.append(int(name))
            except (OSError, IndexError):
                pass
        return out

    def problems(self, esc: Escape, res: dict) -> list[str]:
        """What went wrong for this escape (empty: the sandbox held)."""
        out = []
        got = "passed" if res.get("passed") else res.get("category", "")
        if got not in esc.expect.split("|"):
            out.append(f"verdict {got!r} ({res.get('reason', '')[:300]}), expected {esc.expect}")
        reason = res.get("reason", "")
        no_exec = "landlock-exec" in res.get("sandbox", [])
        must = list(esc.must) + (list(esc.no_exec.get("must", ())) if no_exec else [])
        must_not = list(esc.must_not) + (list(esc.no_exec.get("must_not", ())) if no_exec else [])
        out += [f"reason lacks {m!r}: {reason[:300]}" for m in must
                if not any(alt in reason for alt in m.split("|"))]
        out += [f"reason has {m!r}: {reason[:300]}" for m in must_not if m in reason]
        for f in esc.files:
            if (self.dir / f).exists():
                out.append(f"{f} was written")
            nxt = pathlib.Path(tempfile.gettempdir()) / f
            if nxt.exists():
                out.append(f"{nxt} was written")
        if self.pth().exists():
            out.append(f"{self.pth()} was written")
        if self.received:
            out.append(f"the listener received {self.received[:3]}")
        return out
