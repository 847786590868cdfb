"""``egg bench``: every problem of a folder through the graph, one record per problem.

Each problem runs in its own process (``python -m graph.bench one SPEC``) with a wall-clock
limit, so a problem that hangs or crashes (a signal in the interpreter, an out-of-memory kill)
becomes a failure record and never stops the suite. ``--jobs N`` runs N problems at once; their
timing sections never overlap (harness.gpulock, docs/bench.md).

results.jsonl is appended after each problem (so ``--resume`` continues a suite across short GPU
sessions); report.json / report.md / bench.png aggregate it. Record fields: name, device,
interpreter, verified (a verified Triton candidate is the answer), correct (the answer passed
verification, or is the reference itself), fallback, kernels, eager_ms, compile_ms, compile_s,
egg_ms, speedup_eager, speedup_compile, roofline_pct, floor_ms, bound, stage1_ms, wall_s,
failure (why the problem failed, or why no kernel was kept), run_id, memory_failures (candidates
that ran out of memory, verified or timed), ran_alone (true when the problem was run again by itself: see below),
reference_nondeterministic (the reference gave two different outputs on the same inputs, so
nothing could be verified: the answer is the reference, counted apart from "correct"),
eager_p20_ms / eager_p80_ms / egg_p20_ms / egg_p80_ms (the spread of the answer's timings),
compile_contract (torch.compile's own output under the precision contract: "passes", or why not).
With ``--scheduler`` (graph.cluster) the same records come from Dask workers, plus worker and
attempt.

With ``--jobs`` > 1 the problems share the GPU's memory: a problem that runs out of memory (its
failure, or any candidate's) next to others (KernelBench level-1 inputs reach several GiB, and
verification holds fp32 and fp64 copies) is not recorded then; it is queued again at the end and
run alone, with nothing else started until it finishes, and that record is kept whatever it says.
Its name goes to run_alone.txt, so that ``--resume`` of an interrupted suite starts it alone.
Before that, on a GPU, problems are admitted by an estimate of their device memory
(``footprint_bytes``, ``next_startable``): docs/bench.md.

Exit status of ``egg bench`` (graph.cli): EXIT_NO_CORRECT when no problem of the suite has a
correct answer.
"""
from __future__ import annotations

import collections
import fnmatch
import json
import math
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from harness.runner import child_env, log_tail, says_out_of_memory
from state import Settings

FAST_P = (0.0, 1.0, 1.5, 2.0)
#: default wall-clock limit of one problem (graph run, verification, tuning, timing), seconds
PROBLEM_TIMEOUT_S = 900.0
#: share of the problem's limit given to its run as time_limit_s (unless set): past it the run
#: starts no new search and reports its best verified candidate, the rest is for that last
#: verification and timing
RUN_TIME_SHARE = 0.8
#: the baselines of a run that timed nothing end this long before the problem's limit, and are
#: not started with less than MIN_BASELINE_S left
BASELINE_MARGIN_S = 10.0
MIN_BASELINE_S = 20.0
#: names of the problems queued to run alone (kept so that a resumed suite starts them alone)
ALONE_FILE = "run_alone.txt"
#: exit status of ``egg bench`` when no problem of the suite has a correct answer
EXIT_NO_CORRECT = 1
#: the verification category of a reference that differs from itself on the same inputs
NONDETERMINISTIC = "[reference]"


class BenchError(Exception):
    pass


def select(folder: pathlib.Path, pattern: str | None, list_file: pathlib.Path | None) -> list[pathlib.Path]:
    if not folder.is_dir():
        raise BenchError(f"{folder}: not a folder")
    probs = sorted(p for p in folder.rglob("*.py") if not p.name.startswith("_"))
    if list_file is not None:
        if not list_file.is_file():
            raise BenchError(f"--list {list_file}: no such file")
        wanted = [ln.strip() for ln in list_file.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
        by_rel = {str(p.relative_to(folder)): p for p in probs}
        missing = [w for w in wanted if w not in by_rel]
        if missing:
            raise BenchError(f"--list names problems not under {folder}: {', '.join(missing[:3])}")
        probs = [by_rel[w] for w in wanted]
    if pattern:
        probs = [p for p in probs if fnmatch.fnmatch(str(p.relative_to(folder)), pattern)]
    if not probs:
        raise BenchError(f"no problem files selected under {folder}")
    return probs


def read_results(results: pathlib.Path) -> list[dict]:
    """The records of a results.jsonl (unreadable lines skipped, e.g. one cut by a kill)."""
    if not results.exists():
        return []
    recs = []
    for ln in results.read_text().splitlines():
        try:
            r = json.loads(ln)
        except json.JSONDecodeError:
            continue
        if isinstance(r, dict) and "name" in r:
            recs.append(r)
    return recs


def ran_out_of_memory(rec: dict) -> bool:
    """The run ran out of (GPU or host) memory somewhere: its failure says so, or a candidate's
    verification or timing did (a verified answer may then lack the groups backed out after it)."""
    return says_out_of_memory(rec.get("failure")) or bool(rec.get("memory_failures"))


def run_id_of(name: str) -> str:
    return name.replace("/", "__").removesuffix(".py")


def empty_record(name: str, device: str) -> dict:
    return {"name": name, "run_id": run_id_of(name), "device": device, "interpreter": device == "cpu",
            "verified": False, "correct": False, "fallback": True, "kernels": [],
            "eager_ms": None, "compile_ms": None, "compile_s": None, "egg_ms": None,
            "speedup_eager": None, "speedup_compile": None, "roofline_pct": None,
            "floor_ms": None, "bound": None, "stage1_ms": None, "failure": None, "wall_s": None,
            "tuning": None, "reference_nondeterministic": False}


# ----------------------------------------------------------------------------- one problem
def run_one(path: pathlib.Path, name: str, out_dir: pathlib.Path, settings: Settings) -> dict:
    """One problem through the graph, in this process; never raises."""
    from graph import runs as R
    from harness.problem import ProblemError, describe_problem
    from policies.llm_io import LLMError

    t0 = time.time()
    device = settings.resolved_device()
    rec = empty_record(name, device)
    try:
        describe_problem(path)
        run_id = rec["run_id"]
        runs_dir = out_dir / "runs"
        if (runs_dir / run_id).exists():
            import shutil

            shutil.rmtree(runs_dir / run_id)
        # a suite runs unattended: no pause for plan review (even with EGG_REVIEW set)
        run = R.create_run(str(path), settings.model_copy(update={"device": device, "review": False}),
                           runs_dir, run_id)
        # the problem's log says when each role starts and ends (a problem killed at its timeout
        # leaves no report: this is where its time went)
        for node, _upd in R.stream(run, {"problem_path": str(path.resolve())},
                                   on_start=lambda n, _s: _log_step(t0, n, "start")):
            _log_step(t0, node, _plain_summary(node, _upd))
        st = R.final_state(run)
        rep = st.report
        if rep.get("status") != "ok":
            rec["failure"] = rep.get("error", "run failed")
        else:
            _fill(rec, rep)
            _spreads(rec, st)
            if not rec["interpreter"] and rec["eager_ms"] is None:
                # the problem's limit is the run's budget / RUN_TIME_SHARE (start_suite): the
                # baselines after a run that timed nothing end before it, so the record (the
                # reference is the answer: correct) is written, not lost to the kill
                end = t0 + settings.time_limit_s / RUN_TIME_SHARE - BASELINE_MARGIN_S \
                    if settings.time_limit_s else None
                _baselines_only(rec, run.dir, settings, end)
    except ProblemError as e:
        rec["failure"] = str(e)
    except LLMError:
        raise  # the endpoint is down for every problem: the suite stops (bench --resume goes on)
    except Exception as e:  # noqa: BLE001 - one bad problem never stops the suite
        tb = " | ".join(traceback.format_exc().strip().splitlines()[-3:])
        rec["failure"] = f"{type(e).__name__}: {e} | {tb}"[:600]
    rec["wall_s"] = round(time.time() - t0, 1)
    return rec


def _log_step(t0: float, node: str, what: str) -> None:
    print(f"[{time.time() - t0:7.1f} s] {node}: {what}", flush=True)


def _plain_summary(node: str, upd) -> str:
    """The step's summary as egg run prints it, without markup: a problem cut off by its
    timeout (or a slice's end) still says which candidates failed, why, and what was timed."""
    from rich.text import Text

    from graph.output import step_summary

    try:
        return Text.from_markup(step_summary(node, upd if isinstance(upd, dict) else {})).plain
    except Exception:  # noqa: BLE001 - a log line never stops a run
        return "done"


def memory_failed(rep: dict) -> set[str]:
    """Ids of the run's candidates that ran out of memory: in verification (the candidate's
    failure) or when timed (a stage's attempt: the timing judge's rejection)."""
    ids = {c["id"] for c in rep.get("candidates", []) if says_out_of_memory(c.get("failure"))}
    for st in (rep.get("stages") or {}).values():
        ids |= {a.get("candidate_id") for a in st.get("attempts", [])
                if a.get("outcome") == "failed" and says_out_of_memory(a.get("summary"))}
    return ids


def _fill(rec: dict, rep: dict) -> None:
    t = rep["timing"]
    a = rep.get("analysis") or {}
    rec.update(
        fallback=rep["fallback"], kernels=rep["kernels"], correct=True, verified=not rep["fallback"],
        eager_ms=t.get("eager_ms"), compile_ms=t.get("compile_ms"), compile_s=t.get("compile_s"),
        egg_ms=t.get("best_ms"), speedup_eager=t.get("speedup_eager"),
        speedup_compile=t.get("speedup_compile"), roofline_pct=t.get("roofline_pct"),
        stage1_ms=rep.get("stage1_best_ms"), interpreter=bool(t.get("interpreter")),
        bound=a.get("bound"), floor_ms=a.get("floor_ms"), hardware=rep.get("hardware"),
        compile_error=t.get("compile_error"), compile_contract=t.get("compile_contract"),
        templates=sorted({g["template"] for g in (rep.get("plan") or {}).get("groups", [])
                          if g.get("template")}),
        rewrites=(rep.get("plan") or {}).get("rewrites", []), tuning=rep.get("tuning"),
        memory_failures=len(memory_failed(rep)))
    if rep["fallback"]:
        fails = [c["failure"] for c in rep["candidates"] if c.get("failure")]
        reasons = [s.get("finish_reason") for s in rep["stages"].values() if s.get("finish_reason")]
        rec["failure"] = (fails[0] if fails else (reasons[0] if reasons else "no kernel"))[:400]
        if not rec["interpreter"]:
            rec["speedup_eager"] = 1.0  # the answer is the reference itself
            if rec["eager_ms"] and rec["compile_ms"]:
                rec["speedup_compile"] = rec["compile_ms"] / rec["eager_ms"]
        if any((c.get("failure") or "").startswith(NONDETERMINISTIC) for c in rep["candidates"]):
            # the reference differs from itself: no candidate could be judged, and the
            # reference's answer is not "correct" in the sense of a verified one either
            rec["correct"] = False
            rec["reference_nondeterministic"] = True


def _spreads(rec: dict, st) -> None:
    """p20 / p80 of the answer's and eager's timings (the noise model's spread), from the run's
    timing records: the answer's own, or the reference's (c0) for a fallback."""
    t = st.timing(st.best_id) or st.timing("c0")
    if t is None or t.interpreter:
        return
    rec.update(eager_p20_ms=t.eager_p20_ms, eager_p80_ms=t.eager_p80_ms)
    if rec["fallback"]:
        rec.update(egg_p20_ms=t.eager_p20_ms, egg_p80_ms=t.eager_p80_ms)
    else:
        rec.update(egg_p20_ms=t.p20_ms, egg_p80_ms=t.p80_ms)


def _baselines_only(rec: dict, run_dir: pathlib.Path, settings: Settings,
                    end: float | None = None) -> None:
    """A GPU run that timed nothing (no candidate verified, e.g. nothing to fuse): time eager and
    torch.compile anyway, so every problem of the suite has both baselines; by ``end`` (a
    time.time()), else the record says they were cut (ResNet-101 on the H200: its run used its
    288 s, torch.compile's first call took the problem past its 360 s limit: no record at all)."""
    from harness import profile as P
    from harness import roofline

    def left() -> float:
        return float("inf") if end is None else end - time.time()

    if left() < MIN_BASELINE_S:
        rec["failure"] = ((rec["failure"] or "") + f"; baselines: not timed, {max(0, left()):.0f} s "
                          "left before the problem's time limit")[:600]
        return
    try:
        problem = (run_dir / "problem.txt").read_text().strip()
        s = P.ProfileSession(problem, "cuda", settings.timing_rep_ms,
                             min(settings.profile_timeout_s, left()), str(run_dir / "logs"))
        try:
            s.timeout_s = max(1.0, min(s.timeout_s, left()))
            base = s.baselines()
        finally:
            s.close()
    except P.ProfileError as e:
        rec["failure"] = (rec["failure"] or "") + f"; baselines: {e}"[:300]
        return
    e_ms = base["eager"]["median_ms"]
    c = base.get("compile") or {}
    rec.update(eager_ms=e_ms, egg_ms=e_ms, compile_ms=c.get("median_ms"), compile_s=c.get("compile_s"),
               eager_p20_ms=base["eager"].get("p20_ms"), eager_p80_ms=base["eager"].get("p80_ms"),
               egg_p20_ms=base["eager"].get("p20_ms"), egg_p80_ms=base["eager"].get("p80_ms"),
               compile_error=c.get("error"), compile_contract=c.get("contract"), speedup_eager=1.0,
               speedup_compile=(c["median_ms"] / e_ms) if c.get("median_ms") else None,
               roofline_pct=roofline.percent(rec.get("floor_ms"), e_ms))


# ----------------------------------------------------------------------------- the suite
JOB_ENV = "EGG_BENCH_JOB"


def _job_pids(token: str) -> list[int]:
    """Processes whose environment carries this job's marker (Linux /proc): the problem's
    process and everything it started, orphans and new sessions included."""
    marker = f"{JOB_ENV}={token}".encode() + b"\0"
    me = os.getpid()
    out = []
    for d in pathlib.Path("/proc").glob("[0-9]*"):
        try:
            pid = int(d.name)
            if pid != me and marker in (d / "environ").read_bytes():
                out.append(pid)
        except (OSError, ValueError):
            continue
    return out


def kill_job(proc: subprocess.Popen, token: str) -> None:
    """Kill a problem's process and everything it started. The judge and profiling processes
    start their own sessions, so the process group alone would miss them; they are found by the
    marker in their environment."""
    for _ in range(3):
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        pids = _job_pids(token) if pathlib.Path("/proc").is_dir() else []
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            continue
        if not pids:
            break
        time.sleep(0.1)


class _Job:
    def __init__(self, path: pathlib.Path, name: str, out_dir: pathlib.Path, settings: Settings,
                 env: dict, alone: bool = False):
        self.path, self.name, self.alone = path, name, alone
        self.shared = False  # another problem ran at some point while this one did
        self.run_id = run_id_of(name)
        self.run_dir = out_dir / "runs" / self.run_id  # where the problem's run writes report.json
        self.record_file = out_dir / "records" / f"{self.run_id}.json"
        self.record_file.parent.mkdir(parents=True, exist_ok=True)
        self.record_file.unlink(missing_ok=True)
        self.log = out_dir / "logs" / f"{self.run_id}.log"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        spec = {"path": str(path.resolve()), "name": name, "out": str(out_dir.resolve()),
                "record": str(self.record_file.resolve()), "settings": settings.model_dump(),
                "parent": os.getpid()}
        self.token = f"{self.run_id}-{os.getpid()}-{time.time_ns()}"
        env = {**env, JOB_ENV: self.token}
        with open(self.log, "w") as logf:
            self.proc = subprocess.Popen([sys.executable, "-m", "graph.bench", "one", json.dumps(spec)],
                                         stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, start_new_session=True)
        self.t0 = time.time()

    def result(self, device: str, timed_out_after: float | None) -> dict:
        rec = None
        if timed_out_after is None and self.record_file.exists():
            try:
                rec = json.loads(self.record_file.read_text())
            except json.JSONDecodeError:
                rec = None
        if rec is None and timed_out_after is not None:
            rec = self._finished_run(device, timed_out_after)
        if rec is None:
            rec = empty_record(self.name, device)
            if timed_out_after is not None:
                rec["failure"] = f"timeout: the problem did not finish within {timed_out_after:g} s"
            else:
                code = self.proc.returncode
                how = (f"killed by signal {signal.Signals(-code).name}" if code is not None and code < 0
                       else f"exited with code {code}")
                rec["failure"] = f"crash: the problem's process {how}: {log_tail(self.log, 4)}"[:600]
        rec["wall_s"] = round(time.time() - self.t0, 1)
        if self.alone:
            rec["ran_alone"] = True
        return rec

    def _finished_run(self, device: str, limit: float) -> dict | None:
        """The record of a problem killed at its limit after its run had ended (the report is
        written): the run's answer, the best verified candidate or the reference, stands; what the
        kill cut was the bench's own baselines after it (DenseNet-201 on the H200: the run's
        profiler timed out compiling torch.compile's baseline, the bench's second try was killed
        at 250 s). None when the run itself did not end."""
        report = self.run_dir / "report.json"
        try:
            if report.stat().st_mtime < self.t0:  # an earlier attempt's (a resumed suite)
                return None
            rep = json.loads(report.read_text())
        except (OSError, json.JSONDecodeError):
            return None
        if rep.get("status") != "ok" or "timing" not in rep:
            return None
        rec = empty_record(self.name, device)
        _fill(rec, rep)
        note = (f"the run ended with its answer; the baselines after it were cut by the problem's "
                f"limit ({limit:g} s)")
        rec["failure"] = f"{rec['failure']}; {note}" if rec.get("failure") else note
        return rec


#: a problem's device memory while it runs, estimated from its inputs, outputs and parameters.
#: The judge holds the inputs, the candidate's copy and the float64 reference's (two bytes per
#: byte), eager's, the candidate's and the float64 outputs; the candidate process its own outputs
#: and temporaries; the timing session (alive while later candidates are verified) its inputs,
#: fresh round buffers and the outputs of eager, torch.compile and the candidate. Measured on the
#: H200: a 6 GiB-input problem's judge held 55 GiB at its first trial; with its timing session,
#: one elementwise problem (6 GiB in, 6 GiB out) held 67 + 29 GiB in two processes, where the
#: former estimate (12x inputs, no outputs) said 72 GiB and let it start next to others. 10x and
#: 8x say 108 GiB for it (of the 112 GiB budget: next to small problems only); estimating more
#: would run every large problem alone, and one that still runs out of memory next to others is
#: run again alone.
FOOTPRINT_PER_INPUT_BYTE = 10
FOOTPRINT_PER_OUTPUT_BYTE = 8
FOOTPRINT_PER_PARAM_BYTE = 4
#: the share of the device's memory the running problems' estimates may add up to
FOOTPRINT_SHARE = 0.8


def next_startable(pending: collections.deque, running: list, jobs: int, budget: int = 0,
                   foot: dict | None = None):
    """The next (path, alone) to start now, or None: at most ``jobs`` at once; a problem queued to
    run alone starts only when nothing runs, and nothing starts while it runs. With a memory
    ``budget`` (bytes) and per-path estimates ``foot``: the first pending problem whose estimate
    fits next to the running ones' (a problem larger than the budget starts when nothing runs;
    problems of unknown size count as 0)."""
    if not pending or len(running) >= jobs or any(j.alone for j in running):
        return None
    if not budget or not foot:
        if pending[0][1] and running:
            return None
        return pending.popleft()
    used = sum(foot.get(j.path, 0) for j in running)
    for i, (path, alone) in enumerate(pending):
        if alone:
            if running:
                break  # an alone problem keeps its place: nothing passes it
            del pending[i]
            return path, alone
        if not running or used + foot.get(path, 0) <= budget:
            del pending[i]
            return path, alone
    return None


def footprint_bytes(path) -> int:
    """Estimated device memory of one problem while it runs (FOOTPRINT_* above), from its
    inputs and parameters on meta tensors (nothing allocated); 0 when unknown."""
    import torch

    from harness.problem import build_model, load_problem

    try:
        prob = load_problem(path)
        with torch.device("meta"):
            xs = prob.inputs()
        if not all(x.is_meta for x in xs if isinstance(x, torch.Tensor)):
            return 0  # get_inputs made real tensors: its own device choice, not ours to guess
        inputs = sum(x.nelement() * x.element_size() for x in xs if isinstance(x, torch.Tensor))
        params = outputs = 0
        try:
            model = build_model(prob, prob.init_inputs(), "meta")  # never built for real here
            params = sum(t.nelement() * t.element_size()
                         for t in list(model.parameters()) + list(model.buffers()))
            with torch.no_grad():
                outputs = sum(t.nelement() * t.element_size()
                              for t in torch.utils._pytree.tree_leaves(model(*xs)) if isinstance(t, torch.Tensor))
        except Exception:  # noqa: BLE001 - a model that does not build or run on meta: what is known
            pass
        return (FOOTPRINT_PER_INPUT_BYTE * inputs + FOOTPRINT_PER_OUTPUT_BYTE * outputs
                + FOOTPRINT_PER_PARAM_BYTE * params)
    except Exception:  # noqa: BLE001 - the problem's own run reports what is wrong with it
        return 0


def estimate_footprints(paths: list, env: dict, timeout_s: float = 300) -> tuple[dict, int]:
    """In one child process (CUDA is not initialized in the bench): each problem's estimate and
    the device's memory in bytes. ({}, 0) when the child fails: every problem then counts as 0."""
    try:
        r = subprocess.run([sys.executable, "-m", "graph.bench", "footprints", *map(str, paths)],
                           capture_output=True, text=True, env=env, timeout=timeout_s)
        got = json.loads(r.stdout.strip().splitlines()[-1])
        return {pathlib.Path(k): int(v) for k, v in got["problems"].items()}, int(got["device_bytes"])
    except Exception:  # noqa: BLE001
        return {}, 0


def _footprints_main(paths: list[str]) -> int:
    import torch

    dev = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else 0
    print(json.dumps({"device_bytes": dev, "problems": {p: footprint_bytes(p) for p in paths}}))
    return 0


def run_job(path: pathlib.Path, name: str, out_dir: pathlib.Path, settings: Settings, env: dict,
            device: str, problem_timeout_s: float, alone: bool = False, stop=None,
            watch=None, poll_s: float = 0.2) -> dict | None:
    """One problem in its own process, exactly as the suite runs each (same child, same limit,
    same record), waited for here: the body of a Dask task (graph.cluster). ``stop()`` is asked
    at every poll: when true the problem is killed and None returned (no record); ``watch()``
    is called at every poll (e.g. to note that another task ran beside this one). Raises
    LLMError when the problem's process said the LLM endpoint failed."""
    from policies.llm_io import EXIT_LLM, LLMError

    job = _Job(path, name, out_dir, settings, env, alone)
    timed_out = None
    try:
        while job.proc.poll() is None:
            if time.time() - job.t0 > problem_timeout_s:
                timed_out = problem_timeout_s
                break
            if stop is not None and stop():
                return None
            if watch is not None:
                watch()
            time.sleep(poll_s)
    finally:
        kill_job(job.proc, job.token)  # a timeout, a stop, or anything the problem left behind
    if timed_out is None and job.proc.returncode == EXIT_LLM:
        raise LLMError(log_tail(job.log, 2))
    return job.result(device, timed_out)


def _child_env(device: str, verify_lock: bool) -> dict:
    env = child_env(device)
    env["PYTHONUNBUFFERED"] = "1"
    if verify_lock:
        env["EGG_GPU_LOCK_VERIFY"] = "1"
    return env


def ensure_peaks(env: dict, log: pathlib.Path) -> str:
    """Measure (or read) this GPU's peaks once, before any problem, in a separate process: every
    problem's roofline then uses the same measured numbers."""
    try:
        with open(log, "w") as f:
            r = subprocess.run([sys.executable, "-m", "harness.peaks"], stdout=f, stderr=subprocess.STDOUT,
                               env=env, timeout=600)
        return "measured peaks ready" if r.returncode == 0 else f"peaks not measured (exit {r.returncode}, see {log})"
    except subprocess.TimeoutExpired:
        return f"peaks not measured (timed out, see {log})"


def start_suite(problems: list[pathlib.Path], folder: pathlib.Path, out_dir: pathlib.Path,
                settings: Settings, resume: bool, problem_timeout_s: float, console=None):
    """What the local pool and the cluster share before the first problem: the run's time limit,
    results.jsonl kept (``resume``) or started anew, the problems left to run and those to start
    alone. Says what ``--resume`` found. Returns (settings, todo, done names, alone names)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if not settings.time_limit_s:  # a slow run reports what it has before it would be killed
        settings = settings.model_copy(update={"time_limit_s": round(RUN_TIME_SHARE * problem_timeout_s, 1)})
    results = out_dir / "results.jsonl"
    alone_file = out_dir / ALONE_FILE
    if not resume:
        results.unlink(missing_ok=True)
        alone_file.unlink(missing_ok=True)
    done = {r["name"] for r in read_results(results)}
    names = [str(p.relative_to(folder)) for p in problems]
    todo = [p for p, n in zip(problems, names) if n not in done]
    if resume and console is not None:
        had = len(problems) - len(todo)
        if not todo:
            console.print(f"resume: all {len(problems)} problem(s) are already in {results}; nothing "
                          "left to run (reports written again from it)", highlight=False)
        else:
            console.print(f"resume: {had} of {len(problems)} problem(s) already in {results}, "
                          f"{len(todo)} left to run", highlight=False)
    alone = set(alone_file.read_text().split()) if alone_file.exists() else set()
    return settings, todo, done, alone


def append_record(out_dir: pathlib.Path, rec: dict) -> None:
    """One record appended to results.jsonl, in one write (an interrupt leaves whole lines)."""
    line = (json.dumps(rec) + "\n").encode()
    fd = os.open(str(out_dir / "results.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def record_line(rec: dict) -> str:
    """The console line of one finished problem."""
    if rec["correct"]:
        state = "ok" if rec["verified"] else "fallback"
    elif rec.get("reference_nondeterministic"):
        state = "unverified (the reference is not deterministic; the answer is the reference)"
    else:
        state = "FAILED"
    return f"{rec['name']}: {state}" + _short(rec)


def progress(console):
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=console, transient=False)


def finish_suite(problems: list[pathlib.Path], folder: pathlib.Path, out_dir: pathlib.Path,
                 info: dict) -> dict:
    """report.json, report.md and the plot from results.jsonl (the selected problems, in their
    order); ``info`` (device, jobs, elapsed_s, ...) goes into report.json."""
    recs = read_results(out_dir / "results.jsonl")
    order = {str(p.relative_to(folder)): i for i, p in enumerate(problems)}
    recs = sorted((r for r in recs if r["name"] in order), key=lambda r: order[r["name"]])
    rep = aggregate(recs)
    rep.update(info)
    return write_reports(out_dir, rep, recs)


def write_reports(out_dir: pathlib.Path, rep: dict, recs: list[dict]) -> dict:
    """The plot (or why there is none: rep's plot / plot_note), report.json, report.md."""
    png = out_dir / "bench.png"
    why = plot_skip_reason(recs)
    if why is None:
        try:
            plot(recs, png)
        except Exception as e:  # noqa: BLE001 - the plot is a convenience; the tables are the record
            why = f"plotting failed: {type(e).__name__}: {e}"[:200]
    if why is not None:
        png.unlink(missing_ok=True)  # a plot of another run of this folder would not match
    rep.update(plot=None if why else png.name, plot_note=why)
    (out_dir / "report.json").write_text(json.dumps(rep, indent=2))
    (out_dir / "report.md").write_text(report_markdown(rep, recs))
    return rep


def written_files(rep: dict, out_dir: pathlib.Path) -> str:
    """The line that says what the suite wrote (and why there is no plot)."""
    files = [out_dir / "results.jsonl", out_dir / "report.json", out_dir / "report.md"]
    if rep.get("plot"):
        files.append(out_dir / rep["plot"])
    line = "wrote " + ", ".join(str(f) for f in files)
    return line + (f"; no plot: {rep['plot_note']}" if rep.get("plot_note") else "")


def run_bench(problems: list[pathlib.Path], folder: pathlib.Path, out_dir: pathlib.Path,
              settings: Settings, resume: bool, console=None, jobs: int = 1,
              problem_timeout_s: float = PROBLEM_TIMEOUT_S, verify_lock: bool = False) -> dict:
    from policies.llm_io import EXIT_LLM, LLMError

    settings, todo, done, alone = start_suite(problems, folder, out_dir, settings, resume,
                                              problem_timeout_s, console)
    alone_file = out_dir / ALONE_FILE
    device = settings.resolved_device()
    env = _child_env(device, verify_lock)
    t_start = time.time()
    if device == "cuda" and todo:
        (out_dir / "logs").mkdir(parents=True, exist_ok=True)
        msg = ensure_peaks(env, out_dir / "logs" / "peaks.log")
        if console is not None:
            console.print(msg, highlight=False)
    # problems that ran out of memory next to others in an earlier slice start alone, last
    pending = collections.deque(sorted(((p, str(p.relative_to(folder)) in alone) for p in todo),
                                       key=lambda t: t[1]))
    running: list[_Job] = []
    jobs = max(1, int(jobs))
    foot, budget = {}, 0
    if device == "cuda" and jobs > 1 and todo:  # large problems are not started next to others
        foot, dev_bytes = estimate_footprints(todo, env)
        budget = int(FOOTPRINT_SHARE * dev_bytes)
        if console is not None and budget:
            big = sum(1 for v in foot.values() if v > budget / jobs)
            console.print(f"memory: {dev_bytes / 2**30:.0f} GiB device, {big} problem(s) estimated above "
                          f"1/{jobs} of {FOOTPRINT_SHARE:.0%} of it", highlight=False)
    if todo:
        with progress(console) as prog:
            task = prog.add_task("bench", total=len(todo))
            try:
                while pending or running:
                    while (nxt := next_startable(pending, running, jobs, budget, foot)) is not None:
                        p, alone = nxt
                        running.append(_Job(p, str(p.relative_to(folder)), out_dir, settings, env, alone))
                    if len(running) > 1:
                        for job in running:
                            job.shared = True
                    for job in list(running):
                        timed_out = None
                        if job.proc.poll() is None:
                            if time.time() - job.t0 <= problem_timeout_s:
                                continue
                            kill_job(job.proc, job.token)
                            timed_out = problem_timeout_s
                        else:
                            kill_job(job.proc, job.token)  # anything it left behind
                        if timed_out is None and job.proc.returncode == EXIT_LLM:
                            raise LLMError(log_tail(job.log, 2))
                        rec = job.result(device, timed_out)
                        running.remove(job)
                        if job.shared and ran_out_of_memory(rec):
                            pending.append((job.path, True))
                            with alone_file.open("a") as f:
                                f.write(job.name + "\n")
                            prog.console.print(f"{rec['name']}: ran out of memory next to other problems; "
                                               "queued to run again alone", highlight=False)
                            continue
                        append_record(out_dir, rec)
                        prog.advance(task)
                        prog.console.print(record_line(rec), highlight=False, markup=False)
                    prog.update(task, description=f"bench ({len(running)} running)")
                    if running:
                        time.sleep(0.2)
            except BaseException:
                for job in running:
                    kill_job(job.proc, job.token)
                raise
    return finish_suite(problems, folder, out_dir,
                        {"device": device, "jobs": jobs, "elapsed_s": round(time.time() - t_start, 1),
                         "problem_timeout_s": problem_timeout_s, "resumed": bool(done)})


def _short(rec: dict) -> str:
    if rec.get("failure") and not rec["correct"]:
        return f" ({rec['failure'][:120]})"
    if rec.get("interpreter"):
        return " (CPU interpreter: not timed for speed)"
    if rec.get("speedup_eager"):
        return (f" ({rec['speedup_eager']:.2f}x eager"
                + (f", {rec['speedup_compile']:.2f}x compile" if rec.get("speedup_compile") else "") + ")")
    return ""


# ----------------------------------------------------------------------------- aggregation
def _geo(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def _fast(recs: list[dict], key: str, p: float, n: int) -> float | None:
    return sum(1 for r in recs if r["correct"] and (r.get(key) or 0) > p) / n if n else None


def aggregate(recs: list[dict]) -> dict:
    """fast_p: the fraction of all problems whose answer is correct and more than p times faster
    than eager (fast_0: the fraction correct). Means are over the correct problems' speedups.
    A problem whose reference is not deterministic is neither correct nor failed: its answer is
    the reference, unverified (reference_nondeterministic counts them)."""
    n = len(recs)
    interp = bool(recs) and all(r.get("interpreter") for r in recs)
    gpu = [r for r in recs if not r.get("interpreter")]
    ok = [r for r in gpu if r["correct"]]
    sp = [r["speedup_eager"] for r in ok if r.get("speedup_eager")]
    spc = [r["speedup_compile"] for r in ok if r.get("speedup_compile")]
    comp_vs_eager = [r["eager_ms"] / r["compile_ms"] for r in gpu if r.get("compile_ms") and r.get("eager_ms")]
    roof = [r["roofline_pct"] for r in ok if r.get("roofline_pct") is not None]
    walls = [r["wall_s"] for r in recs if r.get("wall_s") is not None]
    correct = sum(bool(r["correct"]) for r in recs)
    nondet = sum(1 for r in recs if not r["correct"] and r.get("reference_nondeterministic"))
    rep = {
        "problems": n,
        "correct": correct,
        "verified_kernels": sum(bool(r["verified"]) for r in recs),
        "fallbacks": sum(bool(r["correct"] and r["fallback"]) for r in recs),
        "reference_nondeterministic": nondet,
        "failed": n - correct - nondet,
        "timeouts": sum(1 for r in recs if (r.get("failure") or "").startswith("timeout")),
        "interpreter": interp,
        "fast_p": {str(p): (correct / n if n else None) if p == 0 else
                   (None if interp else _fast(gpu, "speedup_eager", p, n)) for p in FAST_P},
        "fast_p_compile": {str(p): (correct / n if n else None) if p == 0 else
                           (None if interp else _fast(gpu, "speedup_compile", p, n)) for p in FAST_P},
        "geomean_speedup_eager": _geo(sp),
        "mean_speedup_eager": statistics.mean(sp) if sp else None,
        "geomean_speedup_compile": _geo(spc),
        "mean_speedup_compile": statistics.mean(spc) if spc else None,
        "geomean_compile_vs_eager": _geo(comp_vs_eager),
        # torch.compile's own output judged by the precision contract (docs/verifier.md)
        "compile_contract_checked": sum(1 for r in gpu if r.get("compile_contract")),
        "compile_contract_failed": sorted(r["name"] for r in gpu if r.get("compile_contract")
                                          not in (None, "passes")),
        "median_roofline_pct": statistics.median(roof) if roof else None,
        "median_wall_s": statistics.median(walls) if walls else None,
        "sum_wall_s": round(sum(walls), 1) if walls else None,
        "tuning_cache_hits": sum((r.get("tuning") or {}).get("cache_hits", 0) for r in recs),
        "tuning_searched": sum((r.get("tuning") or {}).get("searched", 0) for r in recs),
    }
    if interp:
        rep["note"] = ("CPU interpreter run: correctness only; timings are not GPU timings, "
                       "no speedup is claimed (fast_p for p > 0 is not defined)")
    return rep


def _f(v, fmt="{:.3f}") -> str:
    return "-" if v is None else fmt.format(v)


def report_markdown(rep: dict, recs: list[dict]) -> str:
    lines = ["# EGG bench report", "",
             f"- device: {rep.get('device', '-')}, jobs: {rep.get('jobs', 1)}, "
             f"elapsed: {_f(rep.get('elapsed_s'), '{:.0f} s')}"
             + (" (resumed: this invocation only)" if rep.get("resumed") else ""),
             f"- problems: {rep['problems']}, correct: {rep['correct']} "
             f"(verified kernels {rep['verified_kernels']}, reference fallbacks {rep['fallbacks']}), "
             f"reference not deterministic (answer = the reference, unverified): "
             f"{rep.get('reference_nondeterministic', 0)}, "
             f"failed: {rep['failed']} (timeouts {rep.get('timeouts', 0)})"]
    if rep.get("note"):
        lines.append(f"- {rep['note']}")
    else:
        fp = ", ".join(f"fast_{p}={_f(v, '{:.2f}')}" for p, v in rep["fast_p"].items())
        fpc = ", ".join(f"fast_{p}={_f(v, '{:.2f}')}" for p, v in rep["fast_p_compile"].items())
        lines += [f"- vs eager: {fp}",
                  f"- vs torch.compile: {fpc}",
                  f"- speedup vs eager: geomean {_f(rep['geomean_speedup_eager'], '{:.2f}x')}, "
                  f"mean {_f(rep['mean_speedup_eager'], '{:.2f}x')}",
                  f"- speedup vs torch.compile: geomean {_f(rep['geomean_speedup_compile'], '{:.2f}x')}, "
                  f"mean {_f(rep['mean_speedup_compile'], '{:.2f}x')}",
                  f"- torch.compile vs eager (same runs): geomean {_f(rep['geomean_compile_vs_eager'], '{:.2f}x')}",
                  f"- torch.compile's output under the precision contract: "
                  f"{rep.get('compile_contract_checked', 0) - len(rep.get('compile_contract_failed', []))} of "
                  f"{rep.get('compile_contract_checked', 0)} checked pass"
                  + (f"; fails: {', '.join(rep['compile_contract_failed'])}" if rep.get("compile_contract_failed") else ""),
                  f"- median percent of roofline: {_f(rep['median_roofline_pct'], '{:.1f}%')}"]
    lines += [f"- median wall time per problem: {_f(rep['median_wall_s'], '{:.1f} s')}",
              f"- tiler: {rep.get('tuning_cache_hits', 0)} kernel(s) from the tuning cache, "
              f"{rep.get('tuning_searched', 0)} searched",
              f"- plot: {rep['plot']}" if rep.get("plot") else f"- no plot: {rep.get('plot_note') or '-'}",
              ""]
    if rep.get("scheduler"):
        lines.insert(3, f"- Dask scheduler: {rep['scheduler']}, workers: {rep.get('workers', '-')}")
    lines += ["| problem | eager ms | compile ms | EGG ms | vs eager | vs compile | stage-1 ms | roofline % | bound | kernels | tuning | wall s | note |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in recs:
        note = "" if r["verified"] else (r.get("failure") or "")
        if r.get("compile_contract") not in (None, "passes"):
            note = f"torch.compile fails the contract: {r['compile_contract']}" + (f"; {note}" if note else "")
        if r.get("reference_nondeterministic") and not r["correct"]:
            note = "reference not deterministic: the answer is the reference, unverified"
        lines.append(
            f"| {r['name']} | {_f(r['eager_ms'])} | {_f(r['compile_ms'])} | {_f(r['egg_ms'])} "
            f"| {_f(r['speedup_eager'], '{:.2f}x')} | {_f(r['speedup_compile'], '{:.2f}x')} "
            f"| {_f(r.get('stage1_ms'))} | {_f(r['roofline_pct'], '{:.1f}')} | {r.get('bound') or '-'} "
            f"| {len(r['kernels'])} | {_tuning_cell(r.get('tuning'))} | {_f(r.get('wall_s'), '{:.0f}')} "
            f"| {note.replace('|', '/').replace(chr(10), ' ')[:140]} |")
    return "\n".join(lines) + "\n"


def _tuning_cell(t: dict | None) -> str:
    """Cache hits and searched kernels of one problem's tiler, e.g. '2 hit / 1 searched'."""
    if not t:
        return "-"
    return f"{t.get('cache_hits', 0)} hit / {t.get('searched', 0)} searched"


def plot_skip_reason(recs: list[dict]) -> str | None:
    """Why the suite has no plot (None: there is something to plot). The plot shows GPU speedups
    and times against the roofline: a CPU interpreter suite, or one where no problem has a GPU
    speedup, would draw empty axes."""
    if not recs:
        return "no records"
    if all(r.get("interpreter") for r in recs):
        return "CPU interpreter run: there are no GPU timings to plot"
    if not any(r.get("speedup_eager") and not r.get("interpreter") for r in recs):
        return "no problem has a GPU speedup to plot"
    return None


def plot(recs: list[dict], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rs = [r for r in recs if r.get("speedup_eager") and not r.get("interpreter")]
    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    names = [r["name"].split("/")[-1][:28] for r in rs]
    x = range(len(rs))
    axes[0].bar(x, [r["speedup_eager"] for r in rs], label="EGG vs eager")
    axes[0].plot(x, [r["eager_ms"] / r["compile_ms"] if r.get("compile_ms") and r.get("eager_ms")
                     else float("nan") for r in rs], "r.", label="torch.compile vs eager")
    axes[0].axhline(1.0, color="k", lw=0.5)
    axes[0].set_yscale("log")
    axes[0].set_xticks(list(x))
    axes[0].set_xticklabels(names, rotation=90, fontsize=6)
    axes[0].set_title("speedup per problem")
    axes[0].legend()
    rr = [r for r in rs if r.get("floor_ms") and r.get("egg_ms")]
    axes[1].scatter([r["floor_ms"] for r in rr], [r["egg_ms"] for r in rr], s=12, label="EGG")
    axes[1].scatter([r["floor_ms"] for r in rr if r.get("eager_ms")],
                    [r["eager_ms"] for r in rr if r.get("eager_ms")], s=8, marker="x", label="eager")
    lo = min([r["floor_ms"] for r in rr] + [1e-3])
    hi = max([r["egg_ms"] for r in rr] + [r.get("eager_ms") or 0 for r in rr] + [1.0])
    axes[1].plot([lo, hi], [lo, hi], "k--", lw=0.5, label="roofline floor (100%)")
    axes[1].set_xscale("log")
    axes[1].set_yscale("log")
    axes[1].set_xlabel("roofline floor ms")
    axes[1].set_ylabel("measured ms")
    axes[1].set_title("achieved vs roofline")
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary_table(rep: dict) -> Table:
    t = Table(title="EGG bench")
    t.add_column("metric")
    t.add_column("value")
    for k in ("problems", "correct", "verified_kernels", "fallbacks", "reference_nondeterministic",
              "failed", "timeouts"):
        t.add_row(k, str(rep.get(k, 0)))
    if rep.get("note"):
        t.add_row("fast_0 (correct)", _f(rep["fast_p"]["0.0"], "{:.2f}"))
        t.add_row("note", rep["note"])
    else:
        for p, v in rep["fast_p"].items():
            t.add_row(f"fast_{p}", _f(v, "{:.2f}"))
        t.add_row("geomean vs eager", _f(rep["geomean_speedup_eager"], "{:.2f}x"))
        t.add_row("geomean vs torch.compile", _f(rep["geomean_speedup_compile"], "{:.2f}x"))
        t.add_row("median roofline %", _f(rep["median_roofline_pct"], "{:.1f}"))
    t.add_row("median wall s", _f(rep["median_wall_s"], "{:.1f}"))
    t.add_row("elapsed s", _f(rep.get("elapsed_s"), "{:.0f}"))
    return t


# ----------------------------------------------------------------------------- child entry
def _child(spec: dict) -> int:
    """``python -m graph.bench one SPEC``: run one problem, write its record file."""
    def _term(signum, frame):  # a kill from the suite: close profiling sessions on the way out
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _term)
    if spec.get("parent"):
        _watch_parent(int(spec["parent"]))
    from policies.llm_io import EXIT_LLM, LLMError

    settings = Settings(**spec["settings"])
    try:
        rec = run_one(pathlib.Path(spec["path"]), spec["name"], pathlib.Path(spec["out"]), settings)
    except LLMError as e:
        print(f"LLM endpoint error: {e}", file=sys.stderr)
        return EXIT_LLM
    out = pathlib.Path(spec["record"])
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec))
    tmp.replace(out)
    return 0


def _watch_parent(parent: int, poll_s: float = 0.5) -> None:
    """When the process that started this problem dies (the suite killed, a Dask worker lost),
    kill the problem's processes and exit: left running, they would go on using (and timing on)
    a GPU that the problem's next attempt or another problem gets. They carry this job's marker
    in their environment (``EGG_BENCH_JOB``), as for kill_job."""
    def loop():
        while os.getppid() == parent:
            time.sleep(poll_s)
        token = os.environ.get(JOB_ENV)
        for pid in (_job_pids(token) if token and pathlib.Path("/proc").is_dir() else []):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        os._exit(137)

    threading.Thread(target=loop, name="egg-watch-parent", daemon=True).start()


def rewrite_reports(folder: pathlib.Path) -> dict:
    """report.json, report.md and bench.png of a folder, again from its results.jsonl (after
    merging or copying records between bench slices)."""
    recs = read_results(folder / "results.jsonl")
    return write_reports(folder, aggregate(recs), recs)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "one":
        return _child(json.loads(argv[1]))
    if argv and argv[0] == "footprints":
        return _footprints_main(argv[1:])
    if len(argv) == 2 and argv[0] == "report":
        rewrite_reports(pathlib.Path(argv[1]))
        return 0
    print("usage: python -m graph.bench one SPEC_JSON (internal; use `egg bench`)\n"
          "       python -m graph.bench report FOLDER  (reports again from FOLDER/results.jsonl)",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
