"""``egg bench --scheduler``: a suite's problems as tasks on a Dask distributed cluster.

The engine is Dask distributed's (docs/cluster.md): a scheduler (``dask scheduler``, or a local
cluster this module starts for ``--scheduler local[:N]``) and workers (``dask worker ADDRESS``).
Each problem becomes one task, ``bench_task``, that runs it exactly as the local bench does:
graph.bench.run_job starts the same child process (``python -m graph.bench one``, the same
isolation and process-tree kill), under the same time limit, and returns the same record. The
client writes each record into OUT/results.jsonl as its task finishes, so ``--resume`` works as
it does locally.

- GPUs: one per worker, as the Dask resource ``GPU`` (``dask worker ... --resources GPU=1``,
  ``CUDA_VISIBLE_DEVICES`` pinning the worker to its GPU). A GPU task asks for ``GPU=1/jobs``: with
  ``--jobs 1`` (the default) two problems never run on one GPU at once; with ``--jobs N`` up to
  N share a GPU, their timings kept apart by the machine's GPU lock (harness.gpulock), as with
  the local ``--jobs``. CPU suites (the interpreter) ask for no resource: a worker runs as many
  at once as its threads (``--nthreads``).
- Load: the client keeps no more tasks in flight than the workers can run at once, so every
  task waits at the scheduler, not behind another on a worker: a free worker takes the next
  problem, and a dying worker takes only the problems it was running with it.
- Faults: a worker that dies mid-problem has the problem re-run on another worker (Dask
  reschedules the task); the task counts the workers that died running it (the scheduler's
  ``suspicious`` count) and past ``retries`` (default 1: a problem is tried at most twice)
  records the problem as failed, ``lost: ...``, instead of running it again. A worker that dies
  takes its problem's processes with it (graph.bench._watch_parent).
- Ctrl-C: the client writes the records of tasks that already finished, cancels the rest (their
  workers kill the problems' processes), and leaves results.jsonl whole; ``--resume`` continues.
- Run folders: a task runs in a scratch folder of its worker and sends the run folder and log
  back (a tar.gz in its result) to OUT/runs/<run id> and OUT/logs; with ``--shared-dir DIR`` (a
  folder every worker sees at the same path) tasks write them under DIR instead.
- Tuning cache: the client sends its cache's entries with every task; each task merges them
  into its worker's cache file before the problem runs and returns what the run added or dropped,
  which the client merges into its own cache. A second run of the suite finds every kernel's
  configuration, whichever worker tuned it.
"""
from __future__ import annotations

import collections
import contextlib
import hashlib
import io
import logging
import math
import os
import pathlib
import shutil
import sys
import tarfile
import threading
import time
import uuid

from graph import bench as B
from state import Settings

#: times a problem is run again after the worker running it died (so at most RETRIES + 1 tries)
RETRIES = 1
#: seconds the client waits for a first worker at a scheduler address
WORKER_WAIT_S = 60.0
#: the Dask resource that a GPU worker offers (``dask worker --resources GPU=1``)
GPU = "GPU"
#: seconds the client waits, after Ctrl-C, for the results of tasks that had already finished
HARVEST_S = 10.0


class ClusterError(B.BenchError):
    pass


# ----------------------------------------------------------------------------- the cluster
def parse_scheduler(text: str) -> tuple[str, int | None]:
    """``local`` -> ("local", None), ``local:N`` -> ("local", N), else (address, None)."""
    t = (text or "").strip()
    if t == "local" or t.startswith("local:"):
        n = t.partition(":")[2]
        if not n:
            return "local", None
        if not n.isdigit() or int(n) < 1:
            raise ClusterError(f"--scheduler {t}: local:N needs a worker count N >= 1")
        return "local", int(n)
    if not t:
        raise ClusterError("--scheduler: give tcp://HOST:PORT or local[:N]")
    return t, None


def visible_gpus() -> list[str]:
    """The GPUs this machine lets EGG use, as CUDA_VISIBLE_DEVICES entries."""
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        return [d.strip() for d in cvd.split(",") if d.strip() and d.strip() != "-1"]
    if os.environ.get("TRITON_INTERPRET") == "1":
        return []
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001 - no usable torch CUDA: no GPU
        return []


def local_worker_specs(n: int, device: str, gpus: list[str], jobs: int) -> dict:
    """The workers of ``--scheduler local:N`` (distributed.SpecCluster specs): on a GPU machine
    worker i sees only GPU i (CUDA_VISIBLE_DEVICES) and offers it as the resource GPU=1, with
    ``jobs`` threads (``--jobs`` problems at once on its GPU); on the CPU, ``jobs`` threads each.
    No memory limit: the problems' own processes, not the worker, hold the memory."""
    from distributed import Nanny

    if device == "cuda" and n > len(gpus):
        raise ClusterError(f"--scheduler local:{n}: {len(gpus)} GPU(s) visible; one worker per GPU "
                           "(--jobs N runs N problems at once on each)")
    specs = {}
    for i in range(n):
        opts = {"nthreads": max(1, int(jobs)), "memory_limit": 0, "silence_logs": logging.ERROR,
                "preload": ["graph.cluster"]}  # dask_setup below
        if device == "cuda":
            opts.update(env={"CUDA_VISIBLE_DEVICES": gpus[i]}, resources={GPU: 1})
        specs[f"egg-{device}-{gpus[i] if device == 'cuda' else i}"] = {"cls": Nanny, "options": opts}
    return specs


def dask_setup(worker) -> None:
    """Preload of the ``local[:N]`` workers: they ignore SIGINT. Ctrl-C in a terminal (or
    ``timeout -s INT``) reaches the whole process group; the client then cancels the tasks and
    stops its workers itself, where a worker killed by the signal would only print a traceback."""
    if threading.current_thread() is threading.main_thread():
        import signal

        signal.signal(signal.SIGINT, signal.SIG_IGN)


def resolve_device(device: str, workers: dict) -> str:
    """The suite's device on a cluster: ``auto`` is cuda when a worker offers a GPU."""
    has_gpu = any(float((w.get("resources") or {}).get(GPU, 0)) > 0 for w in workers.values())
    if device not in ("auto", "cpu", "cuda"):
        raise ClusterError(f"--device must be auto, cpu or cuda, not {device!r}")
    if device == "cuda" and not has_gpu:
        raise ClusterError(f"--device cuda: no worker offers the {GPU} resource (start GPU workers "
                           f"with `dask worker ADDRESS --resources {GPU}=1`, one per GPU)")
    if device == "auto":
        return "cuda" if has_gpu else "cpu"
    return device


def capacity(workers: dict, device: str, jobs: int) -> int:
    """Problems the workers can run at once: GPU units x jobs on GPU workers, threads on CPU."""
    if device == "cuda":
        return sum(int(math.floor(float((w.get("resources") or {}).get(GPU, 0)) * jobs + 1e-9))
                   for w in workers.values())
    return sum(int(w.get("nthreads") or 1) for w in workers.values())


def task_resources(device: str, jobs: int, alone: bool) -> dict | None:
    if device != "cuda":
        return None
    return {GPU: 1.0 if alone else 1.0 / max(1, int(jobs))}


_SOURCE_HASH: str | None = None


def source_hash() -> str:
    """A short hash of this EGG installation's code and knowledge (the client's and each worker's
    are compared: a worker running other code would give other results)."""
    global _SOURCE_HASH
    if _SOURCE_HASH is None:
        from harness.runner import PROJECT_ROOT

        h = hashlib.sha256()
        for pkg in ("state", "knowledge", "harness", "codegen", "policies", "nodes", "graph"):
            for f in sorted((PROJECT_ROOT / pkg).rglob("*")):
                if f.is_file() and f.suffix in (".py", ".yaml", ".md"):
                    h.update(str(f.relative_to(PROJECT_ROOT)).encode())
                    h.update(f.read_bytes())
        _SOURCE_HASH = h.hexdigest()[:12]
    return _SOURCE_HASH


def _probe() -> dict:
    """Run on every worker at connection: it can import EGG, and which code it runs."""
    return {"source": source_hash(), "python": sys.version.split()[0],
            "gpus": os.environ.get("CUDA_VISIBLE_DEVICES")}


class Connection:
    """A client on a scheduler (and the local cluster, for local[:N])."""

    def __init__(self, client, local, label: str, device: str):
        self.client, self.local, self.label, self.device = client, local, label, device

    def workers(self) -> dict:
        try:
            return self.client.scheduler_info()["workers"]
        except Exception:  # noqa: BLE001 - the scheduler is unreachable for a moment
            return {}

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close(timeout=10)
        if self.local is not None:
            with contextlib.suppress(Exception):
                self.local.close(timeout=20)


def connect(scheduler: str, device: str, jobs: int = 1, retries: int = RETRIES, console=None) -> Connection:
    try:
        import distributed
    except ImportError as e:
        raise ClusterError("--scheduler needs Dask distributed: pip install -e '.[cluster]' "
                           f"(the dev extra has it too) ({e})") from None
    where, n = parse_scheduler(scheduler)
    local = None
    if where == "local":
        from state.settings import _cuda_visible

        if device not in ("auto", "cpu", "cuda"):
            raise ClusterError(f"--device must be auto, cpu or cuda, not {device!r}")
        gpus = visible_gpus() if device != "cpu" and _cuda_visible() else []
        dev = device if device != "auto" else ("cuda" if gpus else "cpu")
        if dev == "cuda" and not gpus:
            raise ClusterError("--device cuda --scheduler local: no CUDA GPU is visible")
        n = n or (len(gpus) if dev == "cuda" else 1)
        specs = local_worker_specs(n, dev, gpus, jobs)
        from distributed import Scheduler, SpecCluster

        # the scheduler's own cap on reruns after worker deaths: the same as the tasks' (bench_task)
        local = SpecCluster(scheduler={"cls": Scheduler, "options": {
            "host": "127.0.0.1", "dashboard_address": None, "allowed_failures": retries}},
            workers=specs, silence_logs=logging.ERROR)
        client = distributed.Client(local)
        label = f"local:{n} ({local.scheduler_address})"
    else:
        try:
            client = distributed.Client(where, timeout=30)
        except (OSError, TimeoutError, ValueError) as e:
            raise ClusterError(f"--scheduler {where}: cannot reach the scheduler ({e})") from None
        try:
            client.wait_for_workers(1, timeout=WORKER_WAIT_S)
        except (TimeoutError, distributed.TimeoutError):
            client.close()
            raise ClusterError(f"--scheduler {where}: no worker joined within {WORKER_WAIT_S:g} s "
                               "(start them with `dask worker ADDRESS`, docs/cluster.md)") from None
        label = where
        try:
            dev = resolve_device(device, client.scheduler_info()["workers"])
        except ClusterError:
            client.close()
            raise
    conn = Connection(client, local, label, dev)
    try:
        probes = client.run(_probe)
    except Exception as e:  # noqa: BLE001 - a worker that cannot import EGG
        conn.close()
        raise ClusterError(f"a Dask worker cannot run EGG's code ({type(e).__name__}: {e}); start "
                           "workers where the project is installed (pip install -e .) or from its "
                           "root folder") from None
    mine = source_hash()
    other = sorted(a for a, p in probes.items() if p.get("source") != mine)
    if other and console is not None:
        console.print(f"warning: {len(other)} worker(s) run EGG code that differs from this client's "
                      f"(source {mine}): {', '.join(other[:3])}", highlight=False)
    return conn


# ----------------------------------------------------------------------------- the tuning cache
def _same_entry(a: dict, b: dict) -> bool:
    return {k: v for k, v in a.items() if k != "when"} == {k: v for k, v in b.items() if k != "when"}


def tuning_seed(path: pathlib.Path | None, entries: dict) -> dict:
    """Merge the client's entries into a worker's cache file (those it lacks or holds otherwise);
    returns the file's entries after that: the snapshot tuning_delta compares against."""
    from harness.tuning_cache import TuningCache

    if path is None:
        return {}
    cache = TuningCache(path)
    have = cache.entries()
    new = {k: {kk: vv for kk, vv in v.items() if kk != "when"} for k, v in (entries or {}).items()
           if k not in have or not _same_entry(have[k], v)}
    if new:
        cache.put_many(new)
    return cache.entries()


def tuning_delta(before: dict, after: dict) -> dict:
    """What a run changed in a cache: entries added or changed ("put"), keys dropped ("drop")."""
    put = {k: v for k, v in after.items() if k not in before or not _same_entry(before[k], v)}
    return {"put": put, "drop": sorted(k for k in before if k not in after)}


def tuning_merge(path: pathlib.Path | None, delta: dict | None) -> int:
    """Merge a task's tuning_delta into the client's cache file; returns the entries changed."""
    from harness.tuning_cache import TuningCache

    if path is None or not delta:
        return 0
    cache = TuningCache(path)
    put = {k: {kk: vv for kk, vv in v.items() if kk != "when"} for k, v in delta.get("put", {}).items()}
    cache.put_many(put)
    cache.drop(delta.get("drop", []))
    return len(put) + len(delta.get("drop", []))


# ----------------------------------------------------------------------------- on a worker
_PEAKS: dict[str, str] = {}
_PEAKS_LOCK = threading.Lock()


def _worker_peaks(env: dict, log: pathlib.Path) -> str | None:
    """Measure (or read) this worker's GPU peaks once per worker process, before its first
    problem, as the local bench does once per suite. Returns the message the first time."""
    key = env.get("CUDA_VISIBLE_DEVICES", "all")
    with _PEAKS_LOCK:
        if key in _PEAKS:
            return None
        log.parent.mkdir(parents=True, exist_ok=True)
        _PEAKS[key] = B.ensure_peaks(env, log)
        return _PEAKS[key]


def _pack(out: pathlib.Path, run_id: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        run = out / "runs" / run_id
        if run.exists():
            tar.add(str(run), arcname=f"runs/{run_id}")
        log = out / "logs" / f"{run_id}.log"
        if log.exists():
            tar.add(str(log), arcname=f"logs/{run_id}.log")
    return buf.getvalue()


def unpack(data: bytes, out_dir: pathlib.Path, run_id: str) -> None:
    """A task's run folder and log into OUT (a previous attempt's folder replaced)."""
    run = out_dir / "runs" / run_id
    if run.exists():
        shutil.rmtree(run)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        allowed = (f"runs/{run_id}", f"logs/{run_id}.log")
        members = [m for m in tar.getmembers()
                   if (m.name == allowed[0] or m.name.startswith(allowed[0] + "/") or m.name == allowed[1])
                   and ".." not in pathlib.PurePosixPath(m.name).parts and (m.isfile() or m.isdir())]
        kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(str(out_dir), members=members, **kw)


def _problem_file(spec: dict, scratch: pathlib.Path) -> pathlib.Path:
    """The problem's file on this worker: the client's path where it holds the same source (one
    host, shared storage), else the source the client sent, written into the scratch folder."""
    p = pathlib.Path(spec["path"])
    try:
        if p.is_file() and hashlib.sha256(p.read_bytes()).hexdigest() == spec["sha256"]:
            return p
    except OSError:
        pass
    local = scratch / "problems" / spec["name"]
    local.parent.mkdir(parents=True, exist_ok=True)
    local.write_text(spec["source"])
    return local


def lost_after(spec: dict, deaths: int, worker: str) -> dict | None:
    """The failure record of a problem whose workers died more often than ``--retries`` allows
    (``deaths``: the workers that died while running its task), or None: run it."""
    if deaths <= spec["retries"]:
        return None
    rec = B.empty_record(spec["name"], spec["device"])
    rec["failure"] = (f"lost: {deaths} worker(s) died while running it; not run again "
                      f"(--retries {spec['retries']})")
    rec.update(worker=worker, attempt=deaths)  # the runs it had, every one lost with its worker
    return rec


def bench_task(spec: dict, tuning: dict | None = None) -> dict:
    """One problem on a Dask worker (never raises for the problem's sake): the record, and what
    travels back with it (run folder, tuning cache changes, the worker's name)."""
    from distributed import get_client, get_worker
    from harness.tuning_cache import resolve_path
    from policies.llm_io import LLMError

    w = get_worker()
    key = w.get_current_task()

    def _suspicious(dask_scheduler, key=key):  # runs on the scheduler (pickled by value)
        ts = dask_scheduler.tasks.get(key)
        return 0 if ts is None else int(ts.suspicious)

    try:
        deaths = int(get_client().run_on_scheduler(_suspicious))
    except Exception:  # noqa: BLE001 - a scheduler that runs no functions: Dask's own cap only
        deaths = 0
    name, device = spec["name"], spec["device"]
    res = {"name": name, "worker": str(w.name or w.address), "address": w.address,
           "attempt": deaths + 1, "record": None, "files": None, "tuning": None,
           "llm_error": None, "stopped": False, "shared": False, "note": None}
    lost = lost_after(spec, deaths, res["worker"])
    if lost is not None:
        res["record"] = lost
        return res
    run_id = B.run_id_of(name)
    scratch = pathlib.Path(w.local_directory) / "egg-bench" / f"{run_id}-{uuid.uuid4().hex[:8]}"
    scratch.mkdir(parents=True, exist_ok=True)
    out = pathlib.Path(spec["shared_dir"]) if spec.get("shared_dir") else scratch / "out"
    try:
        path = _problem_file(spec, scratch)
        settings = Settings(**spec["settings"])
        env = B._child_env(device, spec["verify_lock"])
        if device == "cuda":
            res["note"] = _worker_peaks(env, pathlib.Path(w.local_directory) / "egg-peaks.log")
        cache_path = resolve_path(settings.tuning_cache)
        before = tuning_seed(cache_path, tuning or {}) if cache_path is not None else {}

        def stop() -> bool:  # the client cancelled the task (Ctrl-C) or went away
            ts = w.state.tasks.get(key)
            return ts is None or ts.state == "cancelled"

        def watch() -> None:  # another problem ran beside this one on this worker
            if len(w.state.executing) > 1:
                res["shared"] = True

        try:
            rec = B.run_job(path, name, out, settings, env, device, spec["problem_timeout_s"],
                            alone=spec["alone"], stop=stop, watch=watch)
        except LLMError as e:
            res["llm_error"] = str(e)
            return res
        if rec is None:
            res["stopped"] = True
            return res
        if cache_path is not None:
            res["tuning"] = tuning_delta(before, tuning_seed(cache_path, {}))
        rec.update(worker=res["worker"], attempt=res["attempt"])
        res["record"] = rec
        if not spec.get("shared_dir"):
            res["files"] = _pack(out, run_id)
        return res
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# ----------------------------------------------------------------------------- the client
class _Item:
    def __init__(self, path: pathlib.Path, name: str, alone: bool):
        self.path, self.name, self.alone = path, name, alone
        self.cancels = 0  # times its task was cancelled by someone else (submitted again)


def _lost_record(name: str, device: str, err: BaseException) -> dict:
    rec = B.empty_record(name, device)
    rec["failure"] = (f"lost: the workers running it died ({type(err).__name__}: {err})"
                      if type(err).__name__ == "KilledWorker"
                      else f"task error: {type(err).__name__}: {err}")[:600]
    return rec


def run_cluster_bench(problems: list[pathlib.Path], folder: pathlib.Path, out_dir: pathlib.Path,
                      settings: Settings, resume: bool, scheduler: str, console=None, jobs: int = 1,
                      problem_timeout_s: float = B.PROBLEM_TIMEOUT_S, verify_lock: bool | None = None,
                      shared_dir: pathlib.Path | None = None, retries: int = RETRIES) -> dict:
    """``egg bench --scheduler``: the suite on a Dask cluster; returns report.json's dict."""
    from concurrent.futures import CancelledError

    from distributed import TimeoutError as DaskTimeout
    from distributed import wait
    from harness.tuning_cache import TuningCache, resolve_path
    from policies.llm_io import LLMError

    t_start = time.time()
    jobs = max(1, int(jobs))
    parse_scheduler(scheduler)
    if resume:  # what is left first: with nothing left, no cluster to start or reach
        settings, todo, done, alone_names = B.start_suite(problems, folder, out_dir, settings, resume,
                                                          problem_timeout_s, console)
        if not todo:
            devs = {r.get("device") for r in B.read_results(out_dir / "results.jsonl")}
            return B.finish_suite(problems, folder, out_dir,
                                  {"device": devs.pop() if len(devs) == 1 else settings.device, "jobs": jobs,
                                   "elapsed_s": 0.0, "problem_timeout_s": problem_timeout_s,
                                   "resumed": bool(done), "scheduler": scheduler, "workers": None})
    conn = connect(scheduler, settings.device, jobs, retries, console)
    client, device = conn.client, conn.device
    try:
        if not resume:  # a new suite replaces the old records only once the cluster is there
            settings, todo, done, alone_names = B.start_suite(problems, folder, out_dir, settings, resume,
                                                              problem_timeout_s, console)
        settings = settings.model_copy(update={"device": device})
        verify_lock = (jobs > 1) if verify_lock is None else verify_lock
        shared = str(shared_dir.resolve()) if shared_dir is not None else None
        cache_path = resolve_path(settings.tuning_cache)
        entries = TuningCache(cache_path).entries() if cache_path is not None else {}
        if console is not None:
            console.print(f"Dask scheduler {conn.label}: {len(conn.workers())} worker(s), device {device}"
                          + (f", {len(entries)} tuning cache entries sent" if entries else ""),
                          highlight=False)
        # the entries travel inside each task, not scattered: data scattered to a worker that dies
        # is lost, and with it every task that depends on it (Dask cancels them, "forgotten")
        tuning = entries
        pending = collections.deque(sorted((_Item(p, str(p.relative_to(folder)), str(p.relative_to(folder))
                                                  in alone_names) for p in todo), key=lambda i: i.alone))
        inflight: dict = {}

        def submit(item: _Item):
            src = item.path.read_text()
            spec = {"path": str(item.path.resolve()), "name": item.name, "source": src,
                    "sha256": hashlib.sha256(src.encode()).hexdigest(), "device": device,
                    "settings": settings.model_dump(), "verify_lock": verify_lock,
                    "problem_timeout_s": problem_timeout_s, "alone": item.alone, "retries": retries,
                    "shared_dir": shared}
            fut = client.submit(bench_task, spec, tuning, key=f"egg-bench-{B.run_id_of(item.name)}-"
                                f"{uuid.uuid4().hex[:8]}", pure=False,
                                resources=task_resources(device, jobs, item.alone),
                                priority=1 if item.alone else 0)
            inflight[fut] = item

        def slots(item: _Item) -> int:
            return jobs if (item.alone and device == "cuda") else 1

        def collect(fut, prog, task) -> None:
            item = inflight.pop(fut)
            try:
                res = fut.result()
            except CancelledError as e:  # not by us (a scheduler restart): submit it again
                fut.release()
                item.cancels += 1
                if item.cancels <= retries + 1:
                    pending.appendleft(item)
                    return
                res = {"record": _lost_record(item.name, device, e), "note": None}
            except Exception as e:  # noqa: BLE001 - KilledWorker past the cap, or the task broke
                res = {"record": _lost_record(item.name, device, e), "note": None}
            fut.release()
            if res.get("llm_error"):
                raise LLMError(res["llm_error"])
            if res.get("note") and console is not None:
                prog.console.print(f"{res['worker']}: {res['note']}", highlight=False, markup=False)
            if res.get("stopped"):  # its worker was told to stop it without our asking: again
                item.cancels += 1
                if item.cancels <= retries + 1:
                    pending.appendleft(item)
                    return
                res["record"] = B.empty_record(item.name, device)
                res["record"]["failure"] = "task error: its worker stopped it again and again"
            rec = res["record"]
            if res.get("files"):
                unpack(res["files"], out_dir, B.run_id_of(item.name))
            tuning_merge(cache_path, res.get("tuning"))
            if (device == "cuda" and not item.alone and res.get("shared")
                    and B.ran_out_of_memory(rec)):
                pending.append(_Item(item.path, item.name, True))
                with (out_dir / B.ALONE_FILE).open("a") as f:
                    f.write(item.name + "\n")
                prog.console.print(f"{item.name}: ran out of memory next to other problems; queued "
                                   "to run again alone", highlight=False)
                return
            B.append_record(out_dir, rec)
            prog.advance(task)
            where = f" [{rec.get('worker', '?')}" + (f", attempt {rec['attempt']}" if rec.get("attempt", 1) > 1
                                                      else "") + "]"
            prog.console.print(B.record_line(rec) + where, highlight=False, markup=False)

        with B.progress(console) as prog:
            task = prog.add_task("bench", total=len(todo))
            waiting_said = False
            try:
                while pending or inflight:
                    cap = capacity(conn.workers(), device, jobs)
                    used = sum(slots(i) for i in inflight.values())
                    while pending and (used + slots(pending[0]) <= cap or (not inflight and cap > 0)):
                        used += slots(pending[0])
                        submit(pending.popleft())
                    if cap == 0 and not inflight and not waiting_said:
                        prog.console.print("no worker can take a problem now; waiting for one "
                                           "(Ctrl-C stops, --resume continues)", highlight=False)
                        waiting_said = True
                    prog.update(task, description=f"bench ({len(inflight)} running)")
                    if not inflight:
                        time.sleep(1.0)
                        continue
                    try:
                        finished = wait(list(inflight), timeout=1.0, return_when="FIRST_COMPLETED").done
                    except (TimeoutError, DaskTimeout):
                        finished = ()
                    except CancelledError:  # cancelled by someone else: collect() submits them again
                        finished = [f for f in inflight if f.status != "pending"]
                    for fut in finished:
                        if fut in inflight:
                            collect(fut, prog, task)
            except BaseException:
                _stop(client, inflight, lambda f: collect(f, prog, task))
                raise
        return B.finish_suite(problems, folder, out_dir,
                              {"device": device, "jobs": jobs, "elapsed_s": round(time.time() - t_start, 1),
                               "problem_timeout_s": problem_timeout_s, "resumed": bool(done),
                               "scheduler": conn.label, "workers": len(conn.workers())})
    finally:
        conn.close()


def _stop(client, inflight: dict, collect) -> None:
    """Ctrl-C (or an error): keep the records of the tasks that already finished, cancel the rest
    (their workers kill the problems' processes, bench_task's stop)."""
    deadline = time.time() + HARVEST_S
    for fut in [f for f in inflight if f.status == "finished"]:
        if time.time() > deadline:
            break
        with contextlib.suppress(Exception):
            collect(fut)
    with contextlib.suppress(Exception):
        client.cancel(list(inflight), force=True)
