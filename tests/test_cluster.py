"""egg bench on Dask distributed (graph.cluster), on the CPU: a scheduler and workers on
127.0.0.1, a worker killed mid-suite (its problem re-run on the other, its processes gone), the
client interrupted and resumed; the pure parts (scheduler strings, GPU assignment, capacity,
the retry cap, the tuning cache merge, run folders coming back) without a cluster."""
import io
import json
import os
import pathlib
import signal
import subprocess
import sys
import tarfile
import threading
import time

import pytest

pytest.importorskip("distributed")

from graph import bench as B  # noqa: E402
from graph import cluster as C  # noqa: E402
from state import Settings  # noqa: E402
from tests.test_bench import ADD_RELU, HEADER, _folder  # noqa: E402 - the same test problems

ROOT = pathlib.Path(__file__).resolve().parent.parent


def lib_only(n: int) -> str:
    """A problem with nothing to fuse (the reference is the answer): the quickest correct record."""
    return HEADER + f"""class Model(nn.Module):
    def forward(self, a, b):
        return torch.mv(a, b)


def get_inputs():
    return [torch.randn({n}, 24), torch.randn(24)]


def get_init_inputs():
    return []
"""


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def _running(pid: int) -> bool:
    """The process exists and is not a zombie: an orphan adopted by this test process (a child
    subreaper once any verification ran in it: harness.runner.start_child) stays a zombie, its
    /proc entry present, until this process waits for it."""
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _bench_children(root: pathlib.Path) -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, problem name) of the `graph.bench one` processes whose output folder
    (OUT, or a worker's scratch folder) is under ``root``."""
    found = {}
    for d in pathlib.Path("/proc").glob("[0-9]*"):
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
            if b"graph.bench" not in argv or b"one" not in argv:
                continue
            spec = json.loads(argv[argv.index(b"one") + 1])
            if not spec["out"].startswith(str(root)):
                continue
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            found[int(d.name)] = (ppid, spec["name"])
        except (OSError, ValueError, IndexError, json.JSONDecodeError, KeyError):
            continue
    return found


class DaskCluster:
    """`dask scheduler` and `dask worker` processes on 127.0.0.1, as a user starts them."""

    def __init__(self, tmp_path: pathlib.Path, n_workers: int):
        self.dir = tmp_path / "dask"
        self.dir.mkdir()
        sf = self.dir / "scheduler.json"
        env = _env()
        self.procs = []
        self.sched = self._start([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                  "--port", "0", "--no-dashboard", "--scheduler-file", str(sf)], "scheduler", env)
        deadline = time.time() + 60
        while time.time() < deadline and not (sf.exists() and sf.read_text().strip()):
            time.sleep(0.2)
        self.address = json.loads(sf.read_text())["address"]
        self.workers = {f"w{i}": self._start(
            [sys.executable, "-m", "distributed.cli.dask_worker", self.address, "--nthreads", "1",
             "--no-nanny", "--no-dashboard", "--name", f"w{i}", "--local-directory", str(self.dir / f"w{i}")],
            f"w{i}", env) for i in range(n_workers)}

    def _start(self, argv, name, env):
        log = open(self.dir / f"{name}.log", "w")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                             start_new_session=True)
        self.procs.append(p)
        return p

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)


@pytest.fixture
def dask_cluster(tmp_path):
    made = []

    def start(n_workers):
        made.append(DaskCluster(tmp_path, n_workers))
        return made[-1]

    yield start
    for c in made:
        c.close()


def _records(out):
    return [json.loads(ln) for ln in (out / "results.jsonl").read_text().splitlines() if ln.strip()]


def test_worker_killed_mid_suite_reruns_its_problem_elsewhere(tmp_path, dask_cluster):
    folder = _folder(tmp_path, {"a_add_relu.py": ADD_RELU, "b_mv.py": lib_only(16), "c_mv.py": lib_only(17),
                                "d_mv.py": lib_only(18)})
    out = tmp_path / "out"
    cl = dask_cluster(2)
    killed = {}

    def kill_first_busy_worker():  # the first worker seen running a problem's process
        pids = {p.pid: name for name, p in cl.workers.items()}
        deadline = time.time() + 240
        while time.time() < deadline and not killed:
            for child, (ppid, problem) in _bench_children(tmp_path).items():
                if ppid in pids:
                    os.kill(ppid, signal.SIGKILL)
                    killed.update(worker=pids[ppid], problem=problem, child=child)
                    return
            time.sleep(0.05)

    t = threading.Thread(target=kill_first_busy_worker, daemon=True)
    t.start()
    from harness.tuning_cache import TuningCache

    # entries that travel with every task (a worker's death must not take them, and the tasks
    # needing them, along: Dask cancels every task whose input data lived only on a dead worker)
    TuningCache(tmp_path / "tuning.json").put("k", {"BLOCK": 64}, ms=1.0)
    settings = Settings(device="cpu", trials=1, tuning_cache=str(tmp_path / "tuning.json"))
    rep = C.run_cluster_bench(B.select(folder, None, None), folder, out, settings, resume=False,
                              scheduler=cl.address, problem_timeout_s=240)
    t.join(5)
    assert killed, "no worker was seen running a problem"
    recs = {r["name"]: r for r in _records(out)}
    assert sorted(recs) == ["a_add_relu.py", "b_mv.py", "c_mv.py", "d_mv.py"]  # each once
    assert all(r["correct"] for r in recs.values()), {n: r["failure"] for n, r in recs.items()}
    assert recs["a_add_relu.py"]["verified"] and recs["a_add_relu.py"]["kernels"]
    again = recs[killed["problem"]]
    # run again, on the worker that is left, as its second attempt; the others ran once
    assert again["attempt"] == 2 and again["worker"] != killed["worker"]
    assert all(r["attempt"] == 1 for n, r in recs.items() if n != killed["problem"])
    assert {r["worker"] for r in recs.values()} <= {"w0", "w1"}
    # the dead worker's problem process did not outlive it (it would time on the same GPU)
    deadline = time.time() + 60  # its parent watch polls every 0.5 s; a loaded CI machine is slow
    while time.time() < deadline and _running(killed["child"]):
        time.sleep(0.2)
    assert not _running(killed["child"])
    assert not _bench_children(tmp_path)
    # the run folders and logs came back from the workers' scratch folders
    for n in recs:
        rid = B.run_id_of(n)
        assert (out / "runs" / rid / "report.json").exists() and (out / "logs" / f"{rid}.log").exists()
    assert rep["problems"] == 4 and rep["correct"] == 4 and rep["scheduler"] == cl.address
    assert TuningCache(tmp_path / "tuning.json").get("k")["config"] == {"BLOCK": 64}


SLOW = "import pathlib, time\n" + HEADER + """class Model(nn.Module):
    def forward(self, x):
        return x * 2


def get_inputs():
    if pathlib.Path(__file__).with_suffix(".slow").exists():  # the first time: still running at Ctrl-C
        time.sleep(90)
    return [torch.randn(4)]


def get_init_inputs():
    return []
"""


def test_interrupted_client_leaves_whole_records_and_resumes(tmp_path, dask_cluster):
    folder = _folder(tmp_path, {"a_slow.py": SLOW, "b_mv.py": lib_only(17), "c_mv.py": lib_only(18)})
    (folder / "a_slow.slow").write_text("")
    out = tmp_path / "out"
    cl = dask_cluster(2)
    argv = [sys.executable, "-m", "graph.cli", "bench", str(folder), "--out", str(out), "--device", "cpu",
            "--trials", "1", "--scheduler", cl.address, "--problem-timeout", "240"]
    env = {**_env(), "EGG_TUNING_CACHE": str(tmp_path / "tuning.json"), "COLUMNS": "200"}
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(ROOT))
    deadline = time.time() + 240
    while time.time() < deadline and not (out / "results.jsonl").exists():
        time.sleep(0.1)
    assert (out / "results.jsonl").exists(), p.communicate()
    p.send_signal(signal.SIGINT)
    so, se = p.communicate(timeout=120)
    assert p.returncode == 130, (so, se)
    assert "--resume" in se
    before = (out / "results.jsonl").read_text()
    recs = [json.loads(ln) for ln in before.splitlines()]  # every line whole
    assert 1 <= len(recs) < 3 and all(r["correct"] for r in recs)
    assert "a_slow.py" not in {r["name"] for r in recs}
    # the cancelled tasks' problems were killed on their workers (a_slow would sleep 90 s)
    deadline = time.time() + 10
    while time.time() < deadline and _bench_children(tmp_path):
        time.sleep(0.2)
    assert not _bench_children(tmp_path)
    (folder / "a_slow.slow").unlink()

    # resumed with the run folders written straight into OUT (as on storage every worker sees)
    r = subprocess.run(argv + ["--resume", "--shared-dir", str(out)], capture_output=True, text=True, env=env,
                       cwd=str(ROOT), timeout=400)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert f"resume: {len(recs)} of 3 problem(s) already in" in r.stdout
    assert f"{3 - len(recs)} left to run" in r.stdout
    after = (out / "results.jsonl").read_text()
    assert after.startswith(before)  # nothing finished was lost or re-run
    names = [x["name"] for x in _records(out)]
    assert sorted(names) == ["a_slow.py", "b_mv.py", "c_mv.py"]
    assert json.loads((out / "report.json").read_text())["correct"] == 3
    for n in names:  # sent back (before the interrupt) or written there (after)
        assert (out / "runs" / B.run_id_of(n) / "report.json").exists()
    assert list(cl.dir.rglob("egg-bench")) and not list(cl.dir.rglob("egg-bench/*"))  # scratch: cleaned up


# ----------------------------------------------------------------------------- without a cluster
def test_scheduler_strings_and_devices():
    assert C.parse_scheduler("local") == ("local", None)
    assert C.parse_scheduler("local:3") == ("local", 3)
    assert C.parse_scheduler("tcp://10.0.0.1:8786") == ("tcp://10.0.0.1:8786", None)
    for bad in ("local:0", "local:x", ""):
        with pytest.raises(C.ClusterError):
            C.parse_scheduler(bad)
    gpu = {"a": {"resources": {"GPU": 1}, "nthreads": 4}, "b": {"resources": {"GPU": 1}, "nthreads": 4}}
    cpu = {"c": {"resources": {}, "nthreads": 3}}
    assert C.resolve_device("auto", gpu) == "cuda" and C.resolve_device("auto", cpu) == "cpu"
    assert C.resolve_device("cpu", gpu) == "cpu"
    with pytest.raises(C.ClusterError, match="GPU"):
        C.resolve_device("cuda", cpu)
    # one problem per GPU at a time; --jobs N shares a GPU N ways; CPU workers by their threads
    assert C.capacity(gpu, "cuda", 1) == 2 and C.capacity(gpu, "cuda", 3) == 6
    assert C.capacity({**gpu, **cpu}, "cuda", 1) == 2 and C.capacity(cpu, "cpu", 1) == 3
    assert C.task_resources("cuda", 1, False) == {"GPU": 1.0}
    assert C.task_resources("cuda", 4, False) == {"GPU": 0.25}
    assert C.task_resources("cuda", 4, True) == {"GPU": 1.0}  # run alone: the whole GPU
    assert C.task_resources("cpu", 4, False) is None


def test_local_cluster_pins_one_gpu_per_worker():
    specs = C.local_worker_specs(3, "cuda", ["0", "2", "5"], jobs=2)
    opts = [s["options"] for s in specs.values()]
    assert [o["env"]["CUDA_VISIBLE_DEVICES"] for o in opts] == ["0", "2", "5"]
    assert all(o["resources"] == {"GPU": 1} and o["nthreads"] == 2 and o["memory_limit"] == 0 for o in opts)
    assert all(o["preload"] == ["graph.cluster"] for o in opts) and callable(C.dask_setup)
    with pytest.raises(C.ClusterError, match="one worker per GPU"):
        C.local_worker_specs(4, "cuda", ["0", "1"], jobs=1)
    cpu = [s["options"] for s in C.local_worker_specs(2, "cpu", [], jobs=1).values()]
    assert len(cpu) == 2 and all("resources" not in o and "env" not in o for o in cpu)


def test_retry_cap_records_a_lost_problem():
    spec = {"name": "p.py", "device": "cpu", "retries": 1}
    assert C.lost_after(spec, deaths=0, worker="w1") is None
    assert C.lost_after(spec, deaths=1, worker="w1") is None  # died once: run it again
    rec = C.lost_after(spec, deaths=2, worker="w1")  # died twice: failed, with the reason
    assert not rec["correct"] and rec["failure"].startswith("lost: 2 worker(s) died")
    assert rec["attempt"] == 2 and rec["worker"] == "w1"  # started twice, both lost
    assert C.lost_after({**spec, "retries": 0}, deaths=1, worker="w1")["failure"].startswith("lost")


def test_tuning_cache_travels_to_workers_and_back(tmp_path):
    from harness.tuning_cache import TuningCache

    client = tmp_path / "client.json"
    worker = tmp_path / "worker.json"
    TuningCache(client).put_many({"k1": {"config": {"BLOCK": 128}, "ms": 1.0},
                                  "k2": {"config": {"BLOCK": 64}, "ms": 2.0}})
    TuningCache(worker).put_many({"k0": {"config": {"BLOCK": 32}, "ms": 0.5}})
    shipped = TuningCache(client).entries()
    before = C.tuning_seed(worker, shipped)  # a worker gets every entry the client has
    assert set(before) == {"k0", "k1", "k2"} and before["k1"]["config"] == {"BLOCK": 128}
    assert C.tuning_seed(worker, shipped) == before  # seeding again changes nothing
    # the run tunes a new kernel, re-tunes k2 and drops k1 (its config failed verification)
    TuningCache(worker).put_many({"k3": {"config": {"BLOCK": 256}, "ms": 0.7},
                                  "k2": {"config": {"BLOCK": 512}, "ms": 1.5}})
    TuningCache(worker).drop(["k1"])
    delta = C.tuning_delta(before, TuningCache(worker).entries())
    assert sorted(delta["put"]) == ["k2", "k3"] and delta["drop"] == ["k1"]
    assert C.tuning_merge(client, delta) == 3
    got = TuningCache(client).entries()
    assert set(got) == {"k2", "k3"} and got["k2"]["config"] == {"BLOCK": 512}
    assert C.tuning_merge(None, delta) == 0  # cache off


def test_run_folders_come_back_and_nothing_else(tmp_path):
    src = tmp_path / "worker"
    (src / "runs" / "p" / "candidates").mkdir(parents=True)
    (src / "runs" / "p" / "best.py").write_text("best")
    (src / "runs" / "p" / "candidates" / "c1.py").write_text("c1")
    (src / "logs").mkdir()
    (src / "logs" / "p.log").write_text("log")
    out = tmp_path / "out"
    (out / "runs" / "p").mkdir(parents=True)
    (out / "runs" / "p" / "stale.txt").write_text("an earlier attempt")
    C.unpack(C._pack(src, "p"), out, "p")
    assert (out / "runs" / "p" / "best.py").read_text() == "best"
    assert (out / "runs" / "p" / "candidates" / "c1.py").read_text() == "c1"
    assert (out / "logs" / "p.log").read_text() == "log" and not (out / "runs" / "p" / "stale.txt").exists()
    # a result naming another run or a path outside OUT writes nothing there
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in ("runs/other/x.txt", "../escape.txt", "runs/p/../../escape2.txt"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    C.unpack(buf.getvalue(), out, "p")
    assert not (out / "runs" / "other").exists() and not (tmp_path / "escape.txt").exists()
    assert not (tmp_path / "escape2.txt").exists()


def test_problem_file_on_a_worker(tmp_path):
    import hashlib

    p = tmp_path / "sub" / "prob.py"
    p.parent.mkdir()
    p.write_text(ADD_RELU)
    spec = {"path": str(p), "name": "sub/prob.py", "source": ADD_RELU,
            "sha256": hashlib.sha256(ADD_RELU.encode()).hexdigest()}
    assert C._problem_file(spec, tmp_path / "scratch") == p  # same file here: used as it is
    spec["path"] = str(tmp_path / "elsewhere.py")  # another host: the source the client sent
    got = C._problem_file(spec, tmp_path / "scratch")
    assert got == tmp_path / "scratch" / "problems" / "sub" / "prob.py" and got.read_text() == ADD_RELU
    p.write_text(ADD_RELU + "\n# changed\n")  # same path, other source: the client's source wins
    spec["path"] = str(p)
    assert C._problem_file(spec, tmp_path / "scratch2").read_text() == ADD_RELU


def test_an_unreachable_cluster_leaves_the_old_records(tmp_path, monkeypatch):
    folder = _folder(tmp_path, {"a.py": lib_only(16)})
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.jsonl").write_text(json.dumps(B.empty_record("a.py", "cpu")) + "\n")

    def unreachable(*a, **k):
        raise C.ClusterError("--scheduler tcp://127.0.0.1:9: cannot reach the scheduler")

    monkeypatch.setattr(C, "connect", unreachable)
    with pytest.raises(C.ClusterError):
        C.run_cluster_bench(B.select(folder, None, None), folder, out, Settings(device="cpu"), resume=False,
                            scheduler="tcp://127.0.0.1:9")
    assert len(_records(out)) == 1  # a new suite replaces them only once the cluster is there
    # --resume with nothing left: reports from the records, no cluster reached at all
    rep = C.run_cluster_bench(B.select(folder, None, None), folder, out, Settings(device="cpu"), resume=True,
                              scheduler="tcp://127.0.0.1:9")
    assert rep["problems"] == 1 and rep["workers"] is None and (out / "report.md").exists()
