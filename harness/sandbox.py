"""The operating system's wall around the candidate process (docs/verifier.md, "Threat model").

The judge (harness.worker) calls ``prepare()`` before it spawns the candidate process and
``cleanup()`` when it is done; the candidate process starts in ``candidate_process()``, which calls
``enter()`` before anything else is imported (no torch, no candidate code: the process has one
thread), reports what held to the judge, and only then loads the worker and the candidate.

``enter()`` applies, each only where it works, and reports the names of those that held:

- ``no-new-privs``: ``PR_SET_NO_NEW_PRIVS`` (no setuid binary, no file capability can raise it);
- ``rlimits``: no core dumps, a file-size cap, an open-files cap (and a process cap with a
  private uid); the judge's death kills it (``PR_SET_PDEATHSIG``);
- ``uid:N`` (root only): an unprivileged uid of its own (one per judge, so its processes can be
  found and killed by uid, and it cannot signal, trace or read the judge or another judge's
  candidate), no capabilities; ``uid:N+read`` when the Python environment is not readable by
  other users (it keeps ``CAP_DAC_READ_SEARCH`` to read it, nothing else); ``root-no-caps``: uid 0
  with every capability dropped, where another uid would break something (CUDA IPC on a GPU);
- ``landlock-fs``: Landlock: writes only under the scratch folder, the sandbox's Triton cache and
  /dev/shm (tensor sharing), reads everywhere but raw devices, and no access to other processes'
  memory, file descriptors or ``ptrace`` (Landlock's own rule); ``landlock-exec``: no program can
  be executed (CPU only: on a GPU Triton runs ptxas and a C compiler); ``landlock-net``: no TCP
  bind or connect; ``landlock-scope``: no signal and no abstract unix socket outside its domain;
- ``netns`` (root): a network namespace of its own (no interface but a loopback that is down);
  ``private-shm`` (root, CPU): a /dev/shm of its own that vanishes with it;
- ``seccomp``: a filter: sockets other than AF_UNIX, io_uring, ptrace, process_vm_*, new
  namespaces, bpf, perf events, keyrings, mounts and modules fail; signals to process groups, to
  the judge and to the judge's parent fail;
- ``env``: HOME, TMPDIR and the working directory are the scratch folder, TRITON_CACHE_DIR the
  sandbox cache, variables that look like secrets (``*KEY*``, ``*TOKEN*``, ...) are removed.

The judge's side: it is a child subreaper (``PR_SET_CHILD_SUBREAPER``), so whatever the candidate
starts and orphans (a double fork, ``setsid``, a daemon) is re-parented to the judge and killed
with it (``kill_descendants``; with a private uid also every process of that uid). The EGG process
that starts judges is a subreaper too (harness.runner), and kills the judge's whole tree when it
kills a judge.

``EGG_SANDBOX`` = ``off`` (none of it) | ``auto`` (the default: what holds, reported) | ``strict``
(a candidate is refused unless no-new-privs, rlimits, seccomp, landlock-fs and, as root, a
dropped identity all held). On a GPU, before applying it, the candidate process checks in a forked
child that CUDA and CUDA IPC from the judge still work under it, and drops the protections that
break them (the result is cached per machine: ``probe_cache_path()``).

This module imports nothing but the standard library at the top: it runs before torch.
"""
from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import secrets
import shutil
import signal
import stat
import struct
import sys
import tempfile
import time

MODES = ("off", "auto", "strict")
ENV_MODE = "EGG_SANDBOX"
#: protections to leave out, comma-separated step names (e.g. "netns,seccomp"): for a machine
#: where one of them breaks something; strict mode still requires its required ones
ENV_SKIP = "EGG_SANDBOX_SKIP"
#: environment variable carrying a judge's tag to everything it starts (harness.runner)
ENV_TAG = "EGG_JUDGE_TAG"
#: private uids for candidate processes (one per judge) come from [UID_BASE + 1, UID_BASE + UID_SPAN);
#: UID_BASE itself is their shared group (the sandbox's Triton cache is group-writable). Far above
#: any uid a distribution hands out, and inside the full 32-bit map of an ordinary container.
UID_BASE = 0x7E660000
UID_SPAN = 1 << 16
#: the candidate's limits: file size (a disk filler stops there), open files, processes+threads
#: (private uid only: RLIMIT_NPROC counts every task of the uid). Generous for honest work: the
#: largest file a candidate writes is a shared-memory tensor (outputs on the CPU).
FSIZE_BYTES = 16 << 30
NOFILE = 4096
NPROC = 4096
#: how long the GPU probe (CUDA + CUDA IPC under the sandbox, in a forked child) may take
PROBE_TIMEOUT_S = 180
#: environment variables removed from the candidate's environment (substrings, upper case)
SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH", "COOKIE")
#: device nodes a candidate may open (read, write, ioctl): the usual character devices and the
#: NVIDIA driver's; every other device (disks, /dev/kmsg, /dev/mem, ...) is out of its reach
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
DEVICE_PREFIXES = ("nvidia",)

# ----------------------------------------------------------------------------- kernel interface
PR_SET_PDEATHSIG = 1
PR_GET_DUMPABLE = 3
PR_SET_SECCOMP = 22
PR_CAPBSET_DROP = 24
PR_SET_SECUREBITS = 28
PR_SET_KEEPCAPS = 8
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECCOMP_MODE_FILTER = 2
CAP_DAC_READ_SEARCH = 2
# securebits: root gains nothing by exec, ambient capabilities cannot be raised; all locked
SECBITS = (1 << 0) | (1 << 1) | (1 << 6) | (1 << 7)
LINUX_CAPABILITY_VERSION_3 = 0x20080522
CLONE_NEWNS, CLONE_NEWNET = 0x00020000, 0x40000000
CLONE_NEW_ANY = 0x7E020000  # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 1 << 14, 1 << 18

# Landlock (include/uapi/linux/landlock.h); the syscalls are 444-446 on every architecture
LL_CREATE, LL_ADD_RULE, LL_RESTRICT = 444, 445, 446
LL_FS = {"execute": 1 << 0, "write_file": 1 << 1, "read_file": 1 << 2, "read_dir": 1 << 3,
         "remove_dir": 1 << 4, "remove_file": 1 << 5, "make_char": 1 << 6, "make_dir": 1 << 7,
         "make_reg": 1 << 8, "make_sock": 1 << 9, "make_fifo": 1 << 10, "make_block": 1 << 11,
         "make_sym": 1 << 12, "refer": 1 << 13, "truncate": 1 << 14, "ioctl_dev": 1 << 15}
LL_FS_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1,
             5: (1 << 16) - 1}
LL_FILE_RIGHTS = (LL_FS["execute"] | LL_FS["write_file"] | LL_FS["read_file"] | LL_FS["truncate"]
                  | LL_FS["ioctl_dev"])
LL_NET_TCP = 0b11  # bind, connect
LL_SCOPE_ABSTRACT_UNIX, LL_SCOPE_SIGNAL = 1, 2

# seccomp: syscall numbers per architecture (AUDIT_ARCH_*); io_uring, pidfd and clone3 share
# numbers everywhere
_IO_URING = (425, 426, 427)
SYSCALLS = {
    "x86_64": dict(arch=0xC000003E, x32=True, socket=41, socketpair=53, clone=56, clone3=435,
                   prlimit64=302,
                   deny=(101, 310, 311, 312, 303, 304, 272, 308, 321, 298, 323, 248, 249, 250,
                         165, 166, 155, 161, 175, 313, 176, 246, 320, 428, 429, 430, 431, 432,
                         433, 442) + _IO_URING,
                   # kill, tkill, tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo, pidfd_open
                   pid_guard=(62, 200, 234, 129, 297, 434)),
    "aarch64": dict(arch=0xC00000B7, x32=False, socket=198, socketpair=199, clone=220, clone3=435,
                    prlimit64=261,
                    deny=(117, 270, 271, 272, 264, 265, 97, 268, 280, 241, 282, 217, 218, 219,
                          40, 39, 41, 51, 105, 273, 106, 104, 294, 428, 429, 430, 431, 432, 433,
                          442) + _IO_URING,
                    pid_guard=(129, 130, 131, 138, 240, 434)),
}
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000

_libc = None


class SandboxError(Exception):
    """A protection that strict mode requires did not hold: the candidate does not run."""


def _c():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
        _libc.prctl.restype = ctypes.c_int
    return _libc


def _err(what: str) -> OSError:
    e = ctypes.get_errno()
    return OSError(e, f"{what}: {os.strerror(e)}")


def _prctl(*args: int) -> int:
    a = [ctypes.c_ulong(x) for x in args] + [ctypes.c_ulong(0)] * (5 - len(args))
    r = _c().prctl(ctypes.c_int(args[0]), *a[1:5])
    if r < 0:
        raise _err(f"prctl({args[0]})")
    return r


def _syscall(nr: int, *args) -> int:
    conv = [a if isinstance(a, (ctypes.Array, ctypes.c_void_p, ctypes.c_char_p)) or a is None
            else ctypes.c_long(a) for a in args]
    r = _c().syscall(ctypes.c_long(nr), *conv)
    if r < 0:
        raise _err(f"syscall {nr}")
    return r


def mode() -> str:
    """The sandbox setting (``EGG_SANDBOX``): off, auto (default) or strict."""
    m = os.environ.get(ENV_MODE, "auto").strip().lower() or "auto"
    if m not in MODES:
        raise SandboxError(f"{ENV_MODE}={m!r}: use one of {', '.join(MODES)}")
    return m


def skipped() -> list[str]:
    """The steps ``EGG_SANDBOX_SKIP`` leaves out."""
    names = [n.strip() for n in os.environ.get(ENV_SKIP, "").split(",") if n.strip()]
    bad = [n for n in names if n not in STEPS]
    if bad:
        raise SandboxError(f"{ENV_SKIP}: unknown step(s) {', '.join(bad)} (steps: {', '.join(STEPS)})")
    return names


def landlock_abi() -> int:
    """Landlock's ABI version in this kernel (0: not enabled)."""
    try:
        return _syscall(LL_CREATE, None, 0, 1)  # LANDLOCK_CREATE_RULESET_VERSION
    except OSError:
        return 0


def _status(pid: int | str = "self") -> dict[str, str]:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for ln in f:
                k, _, v = ln.partition(":")
                out[k] = v.strip()
    except OSError:
        pass
    return out


# ----------------------------------------------------------------------------- process trees
def become_subreaper() -> bool:
    """Make this process a child subreaper: orphans among its descendants become its children
    (instead of init's), so they can be found and killed. True when it is one."""
    try:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        return True
    except (OSError, AttributeError):
        return False


def harden_starter() -> bool:
    """The EGG process's side, before it starts a judge: where Landlock cannot keep candidates
    away from other processes (not enabled, or left out), make this process non-dumpable, so a
    candidate of the same uid cannot read its memory (the verdicts' nonces) or open its pipes
    through /proc. True when it did (no core dumps of it then; a debugger needs root)."""
    try:
        if mode() == "off" or (landlock_abi() > 0 and "landlock" not in skipped()):
            return False
        _prctl(4, 0)  # PR_SET_DUMPABLE
        return True
    except (OSError, SandboxError):
        return False


def _proc_table() -> dict[int, tuple[int, str, int]]:
    """pid -> (parent pid, state, uid) of every process visible in /proc."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
            uid = os.stat(f"/proc/{name}").st_uid
        except OSError:
            continue
        rest = data[data.rfind(b")") + 2:].split()
        table[int(name)] = (int(rest[1]), rest[0].decode(), uid)
    return table


def descendants(pid: int, table: dict | None = None) -> list[int]:
    """Living (not zombie) descendants of ``pid``."""
    table = _proc_table() if table is None else table
    kids: dict[int, list[int]] = {}
    for p, (pp, _, _) in table.items():
        kids.setdefault(pp, []).append(p)
    out, todo = [], [pid]
    while todo:
        for c in kids.get(todo.pop(), ()):
            todo.append(c)
            if table[c][1] not in "ZX":
                out.append(c)
    return out


def _has_tag(pid: int, tag: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"{ENV_TAG}={tag}".encode() in f.read().split(b"\0")
    except OSError:
        return False


def kill_descendants(pid: int | None = None, *, uid: int | None = None, tag: str | None = None,
                     spare: tuple = (), rounds: int = 50) -> set[int]:
    """SIGKILL the descendants of ``pid`` (default: this process) and every process of ``uid``,
    again until none is left (the orphans of a killed parent re-appear under the subreaper), and
    reap those that are this process's children. With ``tag``: only the descendants that carry
    the judge tag in their environment, with everything below them; ``spare``: pids (and what is
    below them) to leave alone. Returns the pids killed."""
    me = os.getpid()
    pid = me if pid is None else pid
    killed: set[int] = set()
    for _ in range(rounds):
        table = _proc_table()
        below = descendants(pid, table)
        for p in spare:
            if p in table:
                below = [b for b in below if b != p and b not in descendants(p, table)]
        if tag:
            victims = set()
            for p in below:
                if p not in victims and _has_tag(p, tag):
                    victims |= {p, *descendants(p, table)}
        else:
            victims = set(below)
        if uid:
            victims |= {p for p, (_, st, u) in table.items() if u == uid and st not in "ZX"}
        victims -= {me, pid}
        if not victims:
            break
        for v in victims:
            try:
                os.kill(v, signal.SIGKILL)
            except OSError:
                pass
        killed |= victims
        time.sleep(0.01)
    reap(killed)
    return killed


def reap(pids: set[int]) -> None:
    """Collect the exit status of those of ``pids`` that are (dead) children of this process."""
    deadline = time.time() + 2
    left = set(pids)
    while left and time.time() < deadline:
        for p in list(left):
            try:
                done, _ = os.waitpid(p, os.WNOHANG)
            except ChildProcessError:  # not our child (its own parent reaps it)
                left.discard(p)
                continue
            if done:
                left.discard(p)
        if left:
            time.sleep(0.01)


# ----------------------------------------------------------------------------- judge side
_KEEP: list = []  # objects the candidate process reads while it starts (the CUDA IPC probe)


def _others_can_read(path: str) -> bool:
    """Can a user other than the owner (no group) read ``path`` and traverse to it?"""
    p = os.path.abspath(path)
    try:
        st = os.stat(p)
    except OSError:
        return True  # a missing entry of sys.path: nothing to read there
    need = (stat.S_IROTH | stat.S_IXOTH) if stat.S_ISDIR(st.st_mode) else stat.S_IROTH
    if st.st_mode & need != need:
        return False
    parent = os.path.dirname(p)
    while True:
        try:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
        if parent == os.path.dirname(parent):
            return True
        parent = os.path.dirname(parent)


def _unreadable(paths: list[str]) -> list[str]:
    stdlib = os.path.dirname(os.__file__)
    todo = [os.path.realpath(sys.executable), stdlib, os.path.dirname(os.path.abspath(__file__))]
    todo += [p for p in sys.path if p and os.path.isdir(p)] + list(paths)
    return [p for p in dict.fromkeys(todo) if not _others_can_read(p)]


def _uid_mapped(uid: int) -> bool:
    try:
        with open("/proc/self/uid_map") as f:
            for ln in f:
                inside, _, count = (int(x) for x in ln.split())
                if inside <= uid and uid + 1 <= inside + count:
                    return True
    except (OSError, ValueError):
        return False
    return False


def _pick_uid() -> int | None:
    if not (_uid_mapped(UID_BASE) and _uid_mapped(UID_BASE + UID_SPAN - 1)):
        return None
    used = {u for _, (_, _, u) in _proc_table().items()}
    for _ in range(64):
        uid = UID_BASE + 1 + secrets.randbelow(UID_SPAN - 1)
        if uid not in used:
            return uid
    return None


def _own_dir(path: str, mode_bits: int, gid: int | None = None) -> str | None:
    """A directory at ``path`` that is really ours (not a link someone planted), made if missing."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        return None
    if gid is not None and st.st_gid != gid:
        os.chown(path, -1, gid)
    os.chmod(path, mode_bits)
    return path


def cache_dir(private_gid: int | None) -> str:
    """The Triton cache of sandboxed candidates: shared between them, never the trusted
    processes' cache (a candidate could plant a compiled launcher there)."""
    base = os.environ.get("EGG_SANDBOX_CACHE") or os.path.join(
        tempfile.gettempdir(), f"egg-sandbox-cache-{os.geteuid()}")
    bits = 0o2770 if private_gid is not None else 0o700
    d = _own_dir(base + ("-shared" if private_gid is not None else ""), bits, private_gid)
    d = d or tempfile.mkdtemp(prefix="egg-sandbox-cache-")
    _own_dir(os.path.join(d, "triton"), bits, private_gid)
    return d


def probe_cache_path() -> str:
    """Where the candidate process keeps the GPU probe's result (writable only by this user)."""
    d = os.path.join(tempfile.gettempdir(), f"egg-sandbox-state-{os.geteuid()}")
    return os.path.join(d, "cuda-probe.json")


def _mp_abstract_sockets() -> bool:
    """Does multiprocessing pass file descriptors through abstract unix sockets here? (Then a
    network namespace or Landlock's abstract-socket scope would cut the tensor channel.)"""
    try:
        from multiprocessing import connection

        return connection.arbitrary_address("AF_UNIX").startswith("\0")
    except Exception:  # noqa: BLE001
        return True


def _open_judge_channel() -> bool:
    """Let a candidate of another uid fetch the file descriptors this judge shares with it
    (CPU tensors go through multiprocessing's resource sharer, a unix socket in this process's
    private temp folder): the folder becomes traversable, the socket connectable; the socket
    still asks for the process's authkey, which only the spawned candidate has."""
    try:
        from multiprocessing import process, resource_sharer

        d = process.current_process()._config.get("tempdir")
        if d is None:
            d = tempfile.mkdtemp(prefix="pymp-")
            process.current_process()._config["tempdir"] = d
        os.chmod(d, 0o711)
        rs = resource_sharer._resource_sharer
        with rs._lock:
            if rs._listener is None:
                rs._start()
        os.chmod(rs._address, 0o666)
        return True
    except Exception:  # noqa: BLE001 - private API moved: no private uid then
        return False


def prepare(device: str, *, paths: tuple = (), memory_limit_bytes: int = 0,
            mode_override: str | None = None) -> dict:
    """Judge side, before spawning the candidate process: become a subreaper, make the scratch
    folder, choose the candidate's identity, prepare the GPU probe. The plan goes to the
    candidate process (``candidate_process(conn, creq)`` reads ``creq["sandbox"]``).
    ``mode_override``: off / auto / strict for this candidate instead of ``EGG_SANDBOX``."""
    m = mode()
    if mode_override:
        if mode_override not in MODES:
            raise SandboxError(f"sandbox mode {mode_override!r}: use one of {', '.join(MODES)}")
        m = mode_override
    tag = os.environ.get(ENV_TAG) or secrets.token_hex(8)
    plan = dict(mode=m, device=device, tag=tag, judge=os.getpid(), judge_parent=os.getppid(),
                subreaper=become_subreaper(), skip=skipped(), notes=[])
    scratch = tempfile.mkdtemp(prefix=f"egg-candidate-{tag}-")
    plan["scratch"] = scratch
    if m == "off":
        return plan
    root = os.geteuid() == 0
    uid = gid = None
    read_caps = False
    if root:
        uid = _pick_uid()
        if uid is None:
            plan["notes"].append("uid: no free uid in this user namespace's map")
        else:
            gid = UID_BASE
            bad = _unreadable(list(paths))
            if bad:
                read_caps = True
                plan["notes"].append("uid: keeps CAP_DAC_READ_SEARCH, these are not readable by "
                                     "other users: " + ", ".join(bad[:3]))
            if not _open_judge_channel():
                plan["notes"].append("uid: the judge's descriptor channel cannot be opened to it")
                uid = gid = None
    if uid is not None:
        os.chown(scratch, uid, gid)
    plan.update(uid=uid, gid=gid, read_caps=read_caps, root=root, cache=cache_dir(gid),
                memory_limit_bytes=int(memory_limit_bytes or 0), landlock=landlock_abi(),
                abstract=_mp_abstract_sockets(),
                netns_judge=_ns_inode("net"), judge_dumpable=_dumpable())
    if device.startswith("cuda"):
        plan.update(_cuda_probe_tensor(device))
    return plan


def _ns_inode(kind: str) -> int:
    try:
        return os.stat(f"/proc/self/ns/{kind}").st_ino
    except OSError:
        return 0


def _dumpable() -> int:
    try:
        return _prctl(PR_GET_DUMPABLE)
    except OSError:
        return -1


def _cuda_probe_tensor(device: str) -> dict:
    """A small tensor of the judge's, shared by CUDA IPC, that the GPU probe opens."""
    try:
        from multiprocessing.reduction import ForkingPickler

        import torch
        import torch.multiprocessing.reductions as reductions

        reductions.init_reductions()  # CUDA tensors pickle as IPC handles (idempotent)
        t = torch.arange(4096, dtype=torch.float32, device=device)
        torch.cuda.synchronize(t.device)
        _KEEP.append(t)
        return {"ipc_probe": bytes(ForkingPickler.dumps(t)), "ipc_expect": float(4095 * 4096 // 2)}
    except Exception as e:  # noqa: BLE001
        return {"ipc_probe": None, "ipc_error": f"{type(e).__name__}: {e}"[:200]}


def cleanup(plan: dict | None) -> int:
    """Judge side, at the end: kill whatever the candidate left (descendants of the judge, every
    process of the candidate's uid), remove the scratch folder and the candidate's leftovers in
    /dev/shm. Returns the number of processes killed."""
    if not plan:
        return len(kill_descendants(spare=_own_helpers()))
    n = len(kill_descendants(uid=plan.get("uid"), spare=_own_helpers()))
    shutil.rmtree(plan.get("scratch") or "/nonexistent", ignore_errors=True)
    uid = plan.get("uid")
    if uid:
        try:
            for name in os.listdir("/dev/shm"):
                p = os.path.join("/dev/shm", name)
                try:
                    if os.lstat(p).st_uid == uid:
                        os.unlink(p)
                except OSError:
                    pass
        except OSError:
            pass
    _KEEP.clear()
    return n


def _own_helpers() -> tuple:
    """This process's own multiprocessing resource tracker (started before any candidate)."""
    try:
        from multiprocessing import resource_tracker

        pid = resource_tracker._resource_tracker._pid
        return (pid,) if pid else ()
    except Exception:  # noqa: BLE001
        return ()


def remove_leftovers(tag: str) -> None:
    """The EGG process's side: scratch folders of a judge it had to kill (by the judge's tag)."""
    tmp = tempfile.gettempdir()
    try:
        names = os.listdir(tmp)
    except OSError:
        return
    for name in names:
        if name.startswith(f"egg-candidate-{tag}-"):
            shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)


def report(msg, result: dict, plan: dict | None = None) -> str | None:
    """Judge side: read the candidate process's first message (what held, sent before anything
    of the candidate ran) into the verdict: ``sandbox`` (names), ``sandbox_notes`` (what did not
    hold and why), a flag for each protection strict mode would require. Returns a refusal
    reason (strict mode, or a malformed report), None when the verification may go on."""
    if not (isinstance(msg, tuple) and len(msg) == 4 and msg[0] == "sandbox"
            and isinstance(msg[1], list) and isinstance(msg[2], list) and isinstance(msg[3], str)
            and all(isinstance(x, str) for x in msg[1] + msg[2])):
        return "the candidate process did not report its sandbox"
    held, missing, refused = msg[1], msg[2], msg[3]
    result["sandbox"] = list(held) + (["subreaper"] if _is_subreaper() else [])
    if _dumpable() == 0:
        result["sandbox"].append("judge-non-dumpable")
    result["sandbox_notes"] = list(missing)
    if plan and plan.get("mode") != "off":
        for m in _required_missing(plan, held):
            result.setdefault("flags", []).append(f"sandbox: the candidate process ran without {m}")
    return refused or None


def _is_subreaper() -> bool:
    v = ctypes.c_int(0)
    try:
        r = _c().prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(v), 0, 0, 0)
    except Exception:  # noqa: BLE001
        return False
    return r == 0 and v.value == 1


# ----------------------------------------------------------------------------- candidate side
STEPS = ("env", "rlimits", "no-new-privs", "netns", "private-shm", "landlock", "ro-mounts",
         "identity", "seccomp")
#: what strict mode requires: each entry is a group, one of whose names must hold
REQUIRED = (("no-new-privs",), ("rlimits",), ("seccomp",), ("landlock-fs", "ro-mounts"))


def _default_steps(plan: dict) -> list[str]:
    steps = [s for s in STEPS if s not in plan.get("skip", ())]
    if not plan.get("root"):
        steps = [s for s in steps if s not in ("netns", "private-shm", "ro-mounts", "identity")]
    if plan.get("abstract"):
        steps.remove("netns") if "netns" in steps else None
    if str(plan.get("device", "cpu")).startswith("cuda") and "private-shm" in steps:
        steps.remove("private-shm")  # CUDA IPC opens the judge's reference counters by name there
    return steps


def _step_env(plan: dict) -> str:
    scratch = plan["scratch"]
    for k in list(os.environ):
        if any(w in k.upper() for w in SECRET_WORDS):
            del os.environ[k]
    triton_cache = os.path.join(plan["cache"], "triton")
    os.environ.update(HOME=scratch, TMPDIR=scratch, TMP=scratch, TEMP=scratch,
                      TRITON_CACHE_DIR=triton_cache, XDG_CACHE_HOME=os.path.join(scratch, ".cache"),
                      TORCHINDUCTOR_CACHE_DIR=os.path.join(scratch, "inductor"),
                      PYTHONDONTWRITEBYTECODE="1")
    tempfile.tempdir = scratch
    try:  # the judge's multiprocessing temp folder came with the process object: make our own
        from multiprocessing import process, resource_tracker

        process.current_process()._config.pop("tempdir", None)
        # and the judge's resource tracker's pipe: through it a candidate could have the tracker
        # (a process of the judge) unlink shared-memory names of its choosing
        rt = resource_tracker._resource_tracker
        if rt._fd is not None:
            os.close(rt._fd)
            rt._fd = rt._pid = None
    except Exception:  # noqa: BLE001
        pass
    os.chdir(scratch)
    os.umask(0o007 if plan.get("uid") else 0o077)
    sys.dont_write_bytecode = True
    return "env"


def _step_rlimits(plan: dict) -> str:
    import resource

    def cap(which, value):
        soft, hard = resource.getrlimit(which)
        v = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (v, v))

    cap(resource.RLIMIT_CORE, 0)
    cap(resource.RLIMIT_FSIZE, max(FSIZE_BYTES, 2 * int(plan.get("memory_limit_bytes") or 0)))
    cap(resource.RLIMIT_NOFILE, NOFILE)
    if plan.get("uid"):
        cap(resource.RLIMIT_NPROC, NPROC)
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # dies with its parent (the judge)
    return "rlimits"


def _step_nnp(plan: dict) -> str:
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    return "no-new-privs"


def _step_netns(plan: dict) -> str:
    if _c().unshare(ctypes.c_int(CLONE_NEWNET)) != 0:
        raise _err("unshare(CLONE_NEWNET)")
    return "netns"


def _step_private_shm(plan: dict) -> str:
    c = _c()
    if c.unshare(ctypes.c_int(CLONE_NEWNS)) != 0:
        raise _err("unshare(CLONE_NEWNS)")
    if c.mount(None, b"/", None, ctypes.c_ulong(MS_REC | MS_PRIVATE), None) != 0:
        raise _err("mount(/, private)")
    size = max(1 << 30, 2 * int(plan.get("memory_limit_bytes") or 0))
    opts = f"size={size},mode=1777".encode()
    if c.mount(b"tmpfs", b"/dev/shm", b"tmpfs", ctypes.c_ulong(MS_NOSUID | MS_NODEV | MS_NOEXEC), opts) != 0:
        raise _err("mount(/dev/shm)")
    return "private-shm"


MOUNT_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": 1 << 10,
               "nodiratime": 1 << 11, "relatime": 1 << 21, "strictatime": 1 << 24}
MS_RDONLY, MS_REMOUNT, MS_BIND = 1, 32, 4096


def _step_ro_mounts(plan: dict) -> str:
    """Without Landlock (root only): a mount namespace of its own in which every file system is
    read-only but the scratch folder and the sandbox cache (bind-mounted writable) and the
    kernel's /proc, /sys and /dev (so a write elsewhere fails with EROFS, whatever its mode)."""
    c = _c()
    if c.unshare(ctypes.c_int(CLONE_NEWNS)) != 0:
        raise _err("unshare(CLONE_NEWNS)")
    if c.mount(None, b"/", None, ctypes.c_ulong(MS_REC | MS_PRIVATE), None) != 0:
        raise _err("mount(/, private)")
    keep = [os.path.realpath(plan["scratch"]), os.path.realpath(plan["cache"])]
    for d in keep:
        if c.mount(d.encode(), d.encode(), None, ctypes.c_ulong(MS_BIND | MS_REC), None) != 0:
            raise _err(f"bind {d}")
    with open("/proc/self/mountinfo") as f:
        mounts = [(ln.split()[4].replace("\040", " "), ln.split()[5]) for ln in f]
    for point, opts in mounts:
        if point in keep or point.startswith(("/proc", "/sys", "/dev")):
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for o in opts.split(","):
            flags |= MOUNT_FLAGS.get(o, 0)
        if c.mount(None, point.encode(), None, ctypes.c_ulong(flags), None) != 0:
            raise _err(f"remount {point} read-only")
    return "ro-mounts"


def _ll_rule(ruleset: int, path: str, access: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            access &= LL_FILE_RIGHTS
        if access:
            attr = ctypes.create_string_buffer(struct.pack("=Qi", access, fd))
            _syscall(LL_ADD_RULE, ruleset, 1, attr, 0)  # LANDLOCK_RULE_PATH_BENEATH
    finally:
        os.close(fd)


def _step_landlock(plan: dict) -> list[str]:
    abi = landlock_abi()
    if abi <= 0:
        raise OSError(errno.ENOSYS, "Landlock is not enabled in this kernel")
    fs = LL_FS_ABI[min(abi, 5)]
    gpu = str(plan.get("device", "cpu")).startswith("cuda")
    read = LL_FS["read_file"] | LL_FS["read_dir"]
    write = fs & ~(read | LL_FS["execute"])
    dev_rw = LL_FS["read_file"] | LL_FS["write_file"] | (LL_FS["truncate"] | LL_FS["ioctl_dev"]) & fs
    execute = LL_FS["execute"] if gpu else 0
    attr = [fs]
    names = ["landlock-fs"] + ([] if gpu else ["landlock-exec"])
    if abi >= 4:
        attr.append(LL_NET_TCP)
        names.append("landlock-net")
    if abi >= 6:
        attr.append(LL_SCOPE_SIGNAL | (0 if plan.get("abstract") else LL_SCOPE_ABSTRACT_UNIX))
        names.append("landlock-scope")
    buf = ctypes.create_string_buffer(struct.pack(f"={len(attr)}Q", *attr))
    rs = _syscall(LL_CREATE, buf, len(attr) * 8, 0)
    try:
        for entry in os.listdir("/"):
            if entry != "dev":
                _ll_rule(rs, "/" + entry, read | execute)
        for d in os.listdir("/dev"):
            if d in DEVICES or d.startswith(DEVICE_PREFIXES):
                _ll_rule(rs, "/dev/" + d, dev_rw | LL_FS["read_dir"])
        _ll_rule(rs, "/dev/shm", read | write)
        for d in (plan["scratch"], plan["cache"]):
            _ll_rule(rs, d, read | write)
        _syscall(LL_RESTRICT, rs, 0)
    finally:
        os.close(rs)
    return names


def _step_identity(plan: dict) -> str:
    last = 40
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
    except (OSError, ValueError):
        pass
    uid, gid = plan.get("uid"), plan.get("gid")
    keep = (1 << CAP_DAC_READ_SEARCH) if uid and plan.get("read_caps") else 0
    _prctl(PR_SET_SECUREBITS, SECBITS)
    for cap in range(last + 1):
        if not keep >> cap & 1:
            try:
                _prctl(PR_CAPBSET_DROP, cap)
            except OSError:
                pass
    try:
        _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    except OSError:
        pass
    if uid:
        if keep:
            _prctl(PR_SET_KEEPCAPS, 1)
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    hdr = struct.pack("=Ii", LINUX_CAPABILITY_VERSION_3, 0)
    data = struct.pack("=6I", keep, keep, 0, 0, 0, 0)  # effective, permitted, inheritable x2
    nr = {"x86_64": 126, "aarch64": 91}.get(platform.machine())
    if nr is None:
        raise OSError(errno.ENOSYS, "capset: unknown architecture")
    _syscall(nr, ctypes.create_string_buffer(hdr), ctypes.create_string_buffer(data))
    if uid and keep:
        _prctl(PR_SET_KEEPCAPS, 0)
    if uid:
        return f"uid:{uid}" + ("+read" if keep else "")
    return "root-no-caps"


def _bpf_filter(plan: dict, arch: dict) -> bytes:
    """A classic-BPF seccomp program (assembled here, with forward jumps to labels)."""
    prog: list = []  # (code, k, jt_label, jf_label) ; labels are str or None (next)
    labels: dict[str, int] = {}

    def op(code, k=0, jt=None, jf=None):
        prog.append((code, k, jt, jf))

    def label(name):
        labels[name] = len(prog)

    LD, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
    deny = SECCOMP_RET_ERRNO | errno.EPERM
    op(LD, 4)  # arch
    op(JEQ, arch["arch"], None, "deny")
    op(LD, 0)  # syscall number
    if arch["x32"]:
        op(JGE, 0x40000000, "deny", None)
    for nr in arch["deny"]:
        op(JEQ, nr, "deny", None)
    op(JEQ, arch["clone3"], "enosys", None)  # glibc falls back to clone, whose flags we can see
    op(JEQ, arch["socket"], "socket", None)
    op(JEQ, arch["socketpair"], "socket", None)
    op(JEQ, arch["clone"], "clone", None)
    op(JEQ, arch["prlimit64"], "prlimit", None)
    for nr in arch["pid_guard"]:
        op(JEQ, nr, "pid", None)
    op(RET, SECCOMP_RET_ALLOW)
    label("socket")
    op(LD, 16)
    op(JEQ, 1, "allow", None)  # AF_UNIX
    op(RET, SECCOMP_RET_ERRNO | errno.EACCES)
    label("clone")
    op(LD, 16)
    op(JSET, CLONE_NEW_ANY, "deny", "allow")
    label("prlimit")
    op(LD, 16)
    op(JEQ, 0, "allow", "deny")
    label("pid")
    op(LD, 16)
    op(JSET, 0x80000000, "deny", None)  # process groups and -1
    op(JEQ, 0, "deny", None)  # our process group (the judge's)
    for p in (plan.get("judge"), plan.get("judge_parent")):
        if p and p > 1:
            op(JEQ, p, "deny", None)
    label("allow")
    op(RET, SECCOMP_RET_ALLOW)
    label("deny")
    op(RET, deny)
    label("enosys")
    op(RET, SECCOMP_RET_ERRNO | errno.ENOSYS)
    out = b""
    for i, (code, k, jt, jf) in enumerate(prog):
        def off(lbl):
            if lbl is None:
                return 0
            d = labels[lbl] - i - 1
            if not 0 <= d < 256:
                raise ValueError("seccomp program: jump out of range")
            return d
        out += struct.pack("=HBBI", code, off(jt), off(jf), k & 0xFFFFFFFF)
    return out


def _step_seccomp(plan: dict) -> str:
    arch = SYSCALLS.get(platform.machine())
    if arch is None:
        raise OSError(errno.ENOSYS, f"seccomp: no syscall table for {platform.machine()}")
    code = _bpf_filter(plan, arch)
    buf = ctypes.create_string_buffer(code)

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = Prog(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p))
    r = _c().prctl(ctypes.c_int(PR_SET_SECCOMP), ctypes.c_ulong(SECCOMP_MODE_FILTER),
                   ctypes.byref(prog), ctypes.c_ulong(0), ctypes.c_ulong(0))
    if r != 0:
        raise _err("prctl(PR_SET_SECCOMP)")
    return "seccomp"


_STEP_FN = {"env": _step_env, "rlimits": _step_rlimits, "no-new-privs": _step_nnp,
            "netns": _step_netns, "private-shm": _step_private_shm, "landlock": _step_landlock,
            "ro-mounts": _step_ro_mounts, "identity": _step_identity, "seccomp": _step_seccomp}


def _apply(plan: dict, steps: list[str]) -> tuple[list[str], list[str]]:
    held, missing = [], []
    for s in STEPS:
        if s not in steps or s == "ro-mounts" and "landlock-fs" in held:  # only without Landlock
            continue
        try:
            got = _STEP_FN[s](plan)
            held += got if isinstance(got, list) else [got]
        except Exception as e:  # noqa: BLE001 - a protection that does not hold here is reported
            missing.append(f"{s}: {e}"[:200])
    return held, missing


def _verify(plan: dict, held: list[str]) -> tuple[list[str], list[str]]:
    """What really holds, observed from inside: a protection that does not show is dropped."""
    st = _status()
    landlock = "landlock-fs" in held and _write_refused(plan)
    ok, bad = [], []
    for name in held:
        why = None
        if name == "no-new-privs" and st.get("NoNewPrivs") != "1":
            why = "NoNewPrivs is not set"
        elif name == "seccomp" and not (st.get("Seccomp") == "2" and _socket_refused()):
            why = "an AF_INET socket could be opened"
        elif name.startswith("uid:") or name == "root-no-caps":
            keep = (1 << CAP_DAC_READ_SEARCH) if name.endswith("+read") else 0
            uids = st.get("Uid", "").split()
            caps = [int(st.get(k, "f"), 16) for k in ("CapEff", "CapPrm", "CapBnd")]
            if uids != [str(plan.get("uid") or 0)] * 4 or caps != [keep] * 3:
                why = f"uid {uids}, capabilities {[hex(c) for c in caps]}"
        elif name == "netns" and _ns_inode("net") == plan.get("netns_judge"):
            why = "the judge's network namespace"
        elif name.startswith("landlock-") and not landlock:
            why = "a file could be made outside the scratch folder"
        elif name == "ro-mounts" and not _write_refused(plan):
            why = "a file could be made outside the scratch folder"
        (bad if why else ok).append(f"{name}: {why}" if why else name)
    return ok, bad


def _socket_refused() -> bool:
    import socket

    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return True
    s.close()
    return False


def _write_refused(plan: dict) -> bool:
    """Landlock's own test: a file just outside the scratch folder must not be created."""
    target = os.path.join(os.path.dirname(plan["scratch"]), f".egg-sandbox-probe-{secrets.token_hex(6)}")
    try:
        fd = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except OSError:
        return True
    os.close(fd)
    os.unlink(target)
    return False


def _required_missing(plan: dict, held: list[str]) -> list[str]:
    """The required protections that did not hold (one line per group)."""
    out = [" or ".join(g) for g in REQUIRED if not any(n in held for n in g)]
    private_uid = any(h.startswith("uid:") for h in held)
    if plan.get("root") and not private_uid and "root-no-caps" not in held:
        out.append("a dropped identity (a private uid or no capabilities)")
    if "landlock-fs" not in held and not private_uid:
        out.append("landlock-fs or a private uid (other processes of its uid are within reach)")
    return out


def enter(plan: dict) -> tuple[list[str], list[str]]:
    """Candidate side, first thing in the process: apply the plan. Returns (held, missing):
    the protections that hold (verified from inside) and, for each that does not, why. Raises
    SandboxError in strict mode when a required one is missing."""
    if not plan or plan.get("mode", "off") == "off":
        return [], []
    if os.getppid() != plan.get("judge"):  # the judge is gone already
        os._exit(1)
    steps = _default_steps(plan)
    notes = list(plan.get("notes", [])) + [f"{s}: left out ({ENV_SKIP})" for s in plan.get("skip", ())]
    if str(plan.get("device", "cpu")).startswith("cuda"):
        steps, probe_notes = _gpu_steps(plan, steps)
        notes += probe_notes
    held, missing = _apply(plan, steps)
    held, bad = _verify(plan, held)
    missing = notes + missing + bad
    req = _required_missing(plan, held)
    if req and plan.get("mode") == "strict":
        raise SandboxError("EGG_SANDBOX=strict: the candidate process lacks " + ", ".join(req)
                           + (" (" + "; ".join(missing[:3]) + ")" if missing else ""))
    return held, missing


def candidate_process(conn, creq: dict) -> None:
    """The candidate process's entry (the judge's multiprocessing target): enter the sandbox,
    tell the judge what held, then load the worker and run the candidate. Nothing the candidate
    wrote has run when the report is sent."""
    refused = ""
    try:
        held, missing = enter(creq.get("sandbox") or {})
    except SandboxError as e:
        held, missing, refused = [], [], str(e)
    except Exception as e:  # noqa: BLE001 - a bug here must not pass silently
        held, missing, refused = [], [], f"the sandbox failed: {type(e).__name__}: {e}"
    conn.send(("sandbox", held, missing, refused))
    if refused:
        return
    if os.environ.get("TRITON_INTERPRET") == "1":
        from harness.interpreter import install_shims

        install_shims()
    from harness.candidate_proc import main

    main(conn, creq)


# ----------------------------------------------------------------------------- the GPU probe
def _probe_key(plan: dict, steps: list[str], as_root: bool) -> str:
    try:
        from importlib.metadata import version

        tv = version("torch")
    except Exception:  # noqa: BLE001
        tv = "?"
    drv = ""
    try:
        with open("/proc/driver/nvidia/version") as f:
            drv = f.readline().strip()
    except OSError:
        pass
    uid = "root" if as_root or not plan.get("uid") else ("uid+read" if plan.get("read_caps") else "uid")
    return json.dumps([platform.release(), drv, tv, os.geteuid(), uid, plan.get("judge_dumpable"),
                       plan.get("landlock"), sorted(steps), bool(plan.get("ipc_probe"))])


def _as_root(plan: dict) -> None:
    """Give up the private uid (the candidate stays uid 0, without capabilities)."""
    if plan.get("uid"):
        try:
            os.chown(plan["scratch"], os.geteuid(), os.getegid())
        except OSError:
            pass
    plan.update(uid=None, gid=None, read_caps=False)


def _gpu_steps(plan: dict, steps: list[str]) -> tuple[list[str], list[str]]:
    """The steps under which CUDA and CUDA IPC from the judge still work (a forked child tries
    them, most protective first; the answer is cached per machine), and notes on what was given
    up. The fallbacks drop steps cumulatively; once one works, each dropped step (and the private
    uid) is tried back alone, so only the steps CUDA cannot live with are given up. May switch the
    plan from a private uid to root-no-caps."""
    notes = []
    if not plan.get("ipc_probe"):  # still find the steps under which CUDA itself works
        notes.append(f"gpu probe: CUDA IPC not probed ({plan.get('ipc_error', 'no probe tensor')})")
        if plan.get("uid"):
            # CUDA can work under a private uid while opening the judge's tensors does not (seen on
            # the H200: the probe tensor could not be made on a full device, CUDA alone passed
            # the probe, the first trial's inputs failed to map): a private uid needs IPC proven
            _as_root(plan)
            notes.append("gpu probe: gave up a private uid: CUDA IPC under it is unproven")
    tries = [(list(steps), False)]
    if plan.get("uid"):
        tries.append((list(steps), True))
    cur = list(steps)
    for name in ("netns", "ro-mounts", "landlock", "seccomp"):
        if name in cur:
            cur = [s for s in cur if s != name]
            tries.append((list(cur), True))
    path = probe_cache_path()
    cache = {}
    try:
        with open(path) as f:
            cache = json.load(f)
    except (OSError, ValueError):
        pass

    def works(t: list[str], as_root: bool) -> tuple[bool, str]:
        key = _probe_key(plan, t, as_root)
        if key not in cache:
            cache[key] = _probe(plan, t, as_root)
            _save_cache(path, cache)
        return tuple(cache[key])

    for i, (t, as_root) in enumerate(tries):
        ok, why = works(t, as_root)
        if ok:
            if i:  # steps were dropped together: take back, one at a time, each that CUDA allows
                for s in [s for s in steps if s not in t]:
                    trial = [x for x in steps if x in t or x == s]
                    if works(trial, as_root)[0]:
                        t = trial
                if as_root and plan.get("uid") and works(t, False)[0]:
                    as_root = False
            lost = [s for s in steps if s not in t] + (["a private uid"] if as_root and plan.get("uid") else [])
            if as_root:
                _as_root(plan)
            if lost:
                notes.append(f"gpu probe: gave up {', '.join(lost)}: CUDA or CUDA IPC failed with them")
            return t, notes
        notes.append(f"gpu probe ({', '.join(t)}{', root' if as_root else ''}): {why}")
    return [], notes + ["gpu probe: CUDA does not work under any sandbox here: none applied"]


def _save_cache(path: str, cache: dict) -> None:
    d = _own_dir(os.path.dirname(path), 0o700)
    if d is None:
        return
    tmp = path + f".{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(cache, f)
        os.replace(tmp, path)
    except OSError:
        pass


def _probe(plan: dict, steps: list[str], as_root: bool) -> tuple[bool, str]:
    """Fork; the child applies the steps, then uses CUDA and opens the judge's IPC tensor."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(r)
        code = 1
        try:
            p = dict(plan)
            if as_root:
                p.update(uid=None, gid=None, read_caps=False)
            _, missing = _apply(p, steps)
            import pickle

            import torch

            x = torch.ones(256, device=plan["device"]) * 3
            assert float(x.sum()) == 768.0, "a CUDA kernel computed a wrong sum"
            if plan.get("ipc_probe"):
                t = pickle.loads(plan["ipc_probe"])
                got = float(t.sum())
                assert got == plan["ipc_expect"], f"the judge's IPC tensor reads {got}"
            msg, code = "ok", 0
        except BaseException as e:  # noqa: BLE001
            msg = f"{type(e).__name__}: {e}"[:300]
        os.write(w, msg.encode())
        os._exit(code)
    os.close(w)
    deadline = time.time() + PROBE_TIMEOUT_S
    import select

    data = b""
    while time.time() < deadline:
        rd, _, _ = select.select([r], [], [], 0.5)
        if rd:
            chunk = os.read(r, 4096)
            if not chunk:
                break
            data += chunk
    os.close(r)
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    _, status = os.waitpid(pid, 0)
    text = data.decode(errors="replace") or f"the probe died (status {status})"
    return text == "ok", text

