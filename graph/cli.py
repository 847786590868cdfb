"""The ``egg`` command line.

Exit codes (the same in every command; README "Exit codes"):

- 0: success (a run finished, its best candidate may be the reference itself; a verification passed)
- 1: ``egg verify`` rejected the candidate; ``egg profile`` could not time it
- 2: unusable input, nothing was started: a problem (including one that does not finish within
  the probe's time limit), a candidate, a run, a checkpoint, an option or setting; one line on
  stderr, never a traceback
- 3: the LLM endpoint (policy llm or hybrid) could not be reached or kept failing after the
  retries; the run folder stays intact and ``egg run --resume RUN`` continues it
- 4: policy llm or hybrid without an API key (and no ``--base-url``): nothing was started
- 130: interrupted (Ctrl-C); a run continues with ``egg run --resume RUN``
"""
from __future__ import annotations

import functools
import json
import os
import pathlib
import sys
import tempfile
import time
from typing import Any, Callable, List, Optional

import typer
from rich.markup import escape

from graph.output import Col, EggConsole, StatusLine, doing, print_table, step_summary, unique_prefixes

EXIT_OK = 0
EXIT_REJECTED = 1
EXIT_UNUSABLE = 2
EXIT_LLM = 3  # policies.llm_io.EXIT_LLM
EXIT_NO_KEY = 4
EXIT_INTERRUPTED = 130

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="EGG: turn a PyTorch program into verified, faster Triton kernels. "
                       "Exit codes: 0 ok, 1 rejected (verify/profile), 2 unusable input, "
                       "3 LLM endpoint failing, 4 no LLM API key, 130 interrupted.")
out = EggConsole(highlight=False)
err = EggConsole(stderr=True, highlight=False)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("egg-kernels")
    except PackageNotFoundError:  # pragma: no cover - running from a checkout not installed
        return "unknown (not installed)"


def _print_version(value: bool) -> None:
    if value:
        print(f"egg {_version()}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                       help="print the version and exit")) -> None:
    """EGG: turn a PyTorch program into verified, faster Triton kernels."""


def DeviceOpt():  # noqa: N802 - an option factory, named like the options it makes
    return typer.Option("auto", "--device", metavar="auto|cpu|cuda",
                        help="where candidates run: cuda when a GPU is visible under auto; cpu runs "
                             "the kernels in Triton's interpreter")


def RunsDirOpt():  # noqa: N802
    return typer.Option(None, "--runs-dir", metavar="DIR",
                        help="folder of runs (default ./runs or $EGG_RUNS_DIR); a run may also be "
                             "given by its folder's path")


def ProbeOpt():  # noqa: N802
    return typer.Option(None, "--probe-timeout", min=0, metavar="S",
                        help="seconds the problem's import and forward (on meta tensors, in a child "
                             "process) may take before it is refused (default 120 or "
                             "$EGG_PROBE_TIMEOUT_S; 0: none)")


def CheckpointOpt(required: bool):  # noqa: N802
    return typer.Option(... if required else None, "--checkpoint", metavar="STEP|ID",
                        help="a step number as egg history shows it, or a checkpoint id (a unique "
                             "prefix is enough)" + ("" if required else "; default: the latest"))


def _fail(msg: str, code: int = EXIT_UNUSABLE) -> None:
    err.print(f"[red]egg:[/red] {escape(msg)}", soft_wrap=True)
    raise typer.Exit(code)


def _interruptible(fn: Callable) -> Callable:
    """Ctrl-C anywhere in a command: one line and exit code 130 (click would say "Aborted!", 1)."""

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        try:
            return fn(*a, **kw)
        except KeyboardInterrupt:
            err.print("egg: interrupted", soft_wrap=True)
            raise typer.Exit(EXIT_INTERRUPTED) from None

    return wrapper


def _prepare_device(device: str) -> str:
    """Resolve auto; on the CPU set TRITON_INTERPRET before anything imports triton."""
    from state.settings import _cuda_visible

    if device not in ("auto", "cpu", "cuda"):
        _fail(f"--device must be auto, cpu or cuda, not {device!r}")
    dev = device if device != "auto" else ("cuda" if _cuda_visible() else "cpu")
    if dev == "cuda" and not _cuda_visible():
        _fail("--device cuda: no CUDA GPU is visible")
    if dev == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    return dev


#: run settings set by options, for messages about bad values
OPTION_OF = {"device": "--device", "policy": "--policy", "trials": "--trials", "review": "--review",
             "time_limit_s": "--time-limit", "probe_timeout_s": "--probe-timeout",
             "llm_model": "--model", "llm_base_url": "--base-url", "llm_api_key_env": "--api-key-env",
             "llm_token_budget": "--token-budget", "llm_replay_dir": "--replay-llm",
             "timing_rep_ms": "--rep-ms"}


def _settings(**kw):
    """Settings from options (None: not given, so $EGG_<FIELD> or the default); a bad value is
    one line naming the option or the environment variable it came from."""
    from pydantic import ValidationError

    from state import Settings

    given = {k: v for k, v in kw.items() if v is not None}
    try:
        return Settings(**given)
    except ValidationError as e:
        bits = []
        for er in e.errors():
            field = str(er["loc"][0]) if er.get("loc") else "?"
            src = OPTION_OF.get(field, f"--{field}") if field in given else f"EGG_{field.upper()}"
            msg = er["msg"].replace("Input should be", "should be")
            bits.append(f"{src} {er.get('input')!r}: {msg}")
        _fail("; ".join(bits))


def _check_llm_ready(settings) -> None:
    """The LLM policies need a key for a hosted API: say so before any run folder exists."""
    if settings.policy == "expert" or settings.llm_replay_dir or settings.llm_base_url:
        return
    if not os.environ.get(settings.llm_api_key_env or ""):
        _fail(f"--policy {settings.policy} needs an API key: set the environment variable "
              f"{settings.llm_api_key_env} (or name another with --api-key-env), or point --base-url "
              "at an OpenAI-compatible server (local servers need no key)", EXIT_NO_KEY)


def _llm_line(settings) -> str | None:
    if settings.policy == "expert":
        return None
    where = settings.llm_base_url or "the OpenAI API"
    if settings.llm_replay_dir:
        return f"policy {settings.policy}: replies replayed from {settings.llm_replay_dir} (model {settings.llm_model})"
    return f"policy {settings.policy}: model {settings.llm_model} at {where}"


def _loading():
    """A status line while torch, Triton and LangGraph load (seconds, before any output)."""
    st = StatusLine(out)
    st.set("starting: loading torch, Triton and LangGraph")
    return st


def _probe(problem: str, timeout_s: float | None):
    """The problem checked in a child process with a time limit (harness.problem.probe_problem)."""
    from harness.problem import ProblemError, probe_problem
    from state import Settings

    limit = Settings().probe_timeout_s if timeout_s is None else timeout_s
    with StatusLine(out) as st:
        st.set(f"checking {pathlib.Path(problem).name}: import, inputs, forward on meta tensors")
        try:
            return probe_problem(problem, limit)
        except ProblemError as e:
            msg = str(e)
    _fail(msg)


# ---------------------------------------------------------------------------- a live run
def _step_line(node: str, upd: dict, t0: float) -> str:
    if node == "__interrupt__":
        return f"[{time.time() - t0:6.1f}s] [bold]review[/bold]: paused for a person to review the plan"
    if node == "review" and not upd:
        return f"[{time.time() - t0:6.1f}s] [bold]review[/bold]: skipped (review is off)"
    return f"[{time.time() - t0:6.1f}s] [bold]{node}[/bold]: " + step_summary(node, upd)


class _Live:
    """The status line of a run's steps, and its progress file for the processes of a step.

    ``base_step``: the step of the checkpoint the work starts from, so the k-th node that
    starts writes step base_step + k (as egg history numbers them)."""

    def __init__(self, run, base_step: int | None = None):
        self.run = run
        self.progress = None
        self.step = base_step
        if out.is_terminal:
            from harness.runner import PROGRESS_ENV

            fd, self.progress = tempfile.mkstemp(prefix="egg-progress-", suffix=".json")
            os.close(fd)
            os.environ[PROGRESS_ENV] = self.progress
        self.status = StatusLine(out, self.progress)

    def on_start(self, node: str, state: Any) -> None:
        if self.step is not None:
            self.step += 1
        where = f"step {self.step} " if self.step is not None else ""
        self.status.set(f"{where}{node}: {doing(node, state)}")

    def close(self) -> None:
        if self.progress:
            from harness.runner import PROGRESS_ENV

            os.environ.pop(PROGRESS_ENV, None)
            try:
                os.unlink(self.progress)
            except OSError:
                pass


def _head_step(run) -> int:
    """The step of the run's latest checkpoint (0 before any: the planner then writes step 1)."""
    try:
        snap = run.graph().get_state(run.config)
        return int((snap.metadata or {}).get("step", 0)) if snap is not None and snap.metadata else 0
    except Exception:  # noqa: BLE001 - only the status line's numbering depends on it
        return 0


def _live(run, work: Callable[[Callable, Callable], Any], base_step: int | None = None) -> None:
    """Run ``work(on_step, on_start)`` with a printed line per step and the live status line;
    an unreachable LLM (exit 3) or Ctrl-C (exit 130) ends it with how to continue."""
    from policies.llm_io import LLMError

    t0 = time.time()
    if base_step is None and out.is_terminal:
        base_step = _head_step(run)
    live = _Live(run, base_step)
    failure = None

    def on_step(node: str, upd: dict) -> None:
        out.print(_step_line(node, upd, t0))

    try:
        with live.status:
            live.status.set("starting")
            try:
                work(on_step, live.on_start)
            except LLMError as e:
                failure = (f"{e}\nthe run folder {run.dir} is intact: continue with egg run --resume "
                           f"{run.id} (optionally with --base-url/--model)", EXIT_LLM)
            except KeyboardInterrupt:
                failure = (f"interrupted: run {run.id} keeps its checkpoints; continue with "
                           f"egg run --resume {run.id}", EXIT_INTERRUPTED)
    finally:
        live.close()
    if failure:
        _fail(*failure)


def _drive(run, inp, config=None) -> dict | None:
    """Run the graph, printing a line per step; handle a plan review; the report, or None
    while the run waits for a review."""
    from graph import runs as R

    _live(run, lambda on_step, on_start: [on_step(n, u) for n, u in R.stream(run, inp, config, on_start=on_start)])
    return _after_pause(run)


def _after_pause(run) -> dict | None:
    """A run paused for plan review: ask on the terminal, or say how to continue later."""
    from graph import runs as R

    while (req := R.pending_review(run)) is not None:
        plan_file = run.dir / "plan.json"
        plan_file.write_text(json.dumps(req["plan"], indent=2) + "\n")
        _print_plan(req)
        if not _interactive():
            out.print(f"run [bold]{run.id}[/bold] waits for a plan review. Continue with\n"
                      f"  egg resume-review {run.id} --approve\n"
                      f"  egg resume-review {run.id} --disable GROUP [--disable GROUP ...]\n"
                      f"  egg resume-review {run.id} --plan-file {plan_file}   (after editing it)\n"
                      f"  egg resume-review {run.id} --abort")
            return None
        decision = _ask(plan_file)
        _live(run, lambda on_step, on_start: [on_step(n, u) for n, u in
                                              R.stream(run, _command(decision), on_start=on_start)])
    return R.final_state(run).report


def _command(decision):
    from langgraph.types import Command

    return Command(resume=decision)


def _interactive() -> bool:
    return sys.stdin.isatty()


def _print_plan(req: dict) -> None:
    if req.get("error"):
        out.print(f"[red]the last decision was not usable:[/red] {escape(req['error'])}")
    plan = req["plan"]
    cols = [Col("group"), Col("kind"), Col("on"), Col("ops", prose=True), Col("why", prose=True, drop=1)]
    rows = [[g["id"], g["kind"], "yes" if g.get("enabled", True) else "no", " ".join(g["nodes"]),
             g.get("reason", "")] for g in plan["groups"]]
    print_table(out, f"plan for {req.get('problem')}", cols, rows)
    for st, goal in plan.get("goals", {}).items():
        out.print(f"goal of {st}: {escape(goal)}")
    for n in plan.get("notes", []):
        out.print(f"note: {escape(n)}")


def _ask(plan_file: pathlib.Path):
    """approve / edit (the plan as JSON, in $EDITOR or by hand) / abort, on the terminal."""
    while True:
        ans = typer.prompt("[a]pprove, [e]dit plan.json, a[b]ort", default="a").strip().lower()
        if ans in ("a", "approve"):
            return "approve"
        if ans in ("b", "abort"):
            return {"action": "abort", "reason": "aborted on the terminal"}
        if ans in ("e", "edit"):
            editor = os.environ.get("VISUAL") or os.environ.get("EDITOR")
            if editor:
                import shlex
                import subprocess

                subprocess.call([*shlex.split(editor), str(plan_file)])
            else:
                typer.prompt(f"edit {plan_file} (set \"enabled\": false on a group to turn it off, "
                             "change goals), then press Enter", default="", show_default=False)
            try:
                return {"action": "edit", "plan": json.loads(plan_file.read_text())}
            except json.JSONDecodeError as e:
                out.print(f"[red]{plan_file} is not JSON:[/red] {escape(str(e))}")


def _final_table(rep: dict) -> None:
    t = rep["timing"]
    fmt = lambda v, f="{:.4f}": "-" if v is None else f.format(v)  # noqa: E731
    title = f"EGG result: {rep['problem']} on {rep['hardware']}"
    if t.get("interpreter"):
        cols = [Col("reference ms (eager, CPU)", justify="right"),
                Col("best ms (Triton interpreter)", justify="right"), Col("speedup", drop=1)]
        rows = [[fmt(t.get("eager_ms")), fmt(t.get("best_ms")), "not claimed on CPU"]]
    else:
        cols = [Col("eager ms", justify="right"), Col("torch.compile ms", justify="right", drop=3),
                Col("EGG ms", justify="right"), Col("vs eager", justify="right"),
                Col("vs compile", justify="right", drop=2), Col("roofline %", justify="right", drop=1)]
        rows = [[fmt(t.get("eager_ms")), fmt(t.get("compile_ms")), fmt(t.get("best_ms")),
                 fmt(t.get("speedup_eager"), "{:.2f}x"), fmt(t.get("speedup_compile"), "{:.2f}x"),
                 fmt(t.get("roofline_pct"), "{:.1f}")]]
    print_table(out, title, cols, rows)


def _finish(run, rep: dict | None) -> None:
    """The end of run/resume/replay/fork/resume-review: the result table, or why not."""
    if rep is None:
        return
    if rep.get("status") == "error":
        from nodes.review import ABORTED

        if str(rep.get("error", "")).startswith(ABORTED):
            out.print(f"run {run.id}: {escape(rep['error'])}")
            return
        _fail(rep.get("error", "run failed"))
    if rep.get("status") != "ok":
        _fail(f"run {run.id} did not finish (egg run --resume {run.id})")
    _final_table(rep)
    if rep.get("llm"):
        tot = rep["llm"]["total"]
        per = ", ".join(f"{k} {u['prompt_tokens'] + u['completion_tokens']}"
                        for k, u in sorted(rep.get("llm_usage", {}).items()) if k != "total")
        out.print(f"LLM: {tot['calls']} call(s), {tot['prompt_tokens'] + tot['completion_tokens']} tokens "
                  f"({per}), model {rep['llm'].get('model')}"
                  + (f", ${tot['cost_usd']:.4f}" if rep["llm"].get("priced") else ""))
    out.print(f"best: {run.results_dir / 'best.py'} "
              f"({'reference, no kernel' if rep['fallback'] else ', '.join(rep['kernels'])})")
    if getattr(run, "branch", ""):
        out.print(f"branch {run.branch} of run {run.id}: its best.py and reports are in "
                  f"{run.results_dir}; the run folder's own are unchanged")


def _replay_dir(path: str, runs_dir) -> str:
    """--replay-llm: a run folder (or its llm/ folder), or a run id in the runs folder."""
    from graph import runs as R

    p = pathlib.Path(path)
    if not p.exists():
        p = (runs_dir or R.default_runs_dir()) / path
    if not (p / "llm").is_dir() and p.name != "llm":
        _fail(f"--replay-llm {path}: no recorded LLM exchanges there (expected RUN_DIR/llm/)")
    return str(p.resolve())


def _recorded_settings(replay_dir: str) -> dict:
    """Policy and model of the recorded run (a replay runs as that run did)."""
    p = pathlib.Path(replay_dir)
    for d in (p, p.parent):
        f = d / "settings.json"
        if f.is_file():
            try:
                rec = json.loads(f.read_text())
            except (OSError, json.JSONDecodeError):
                return {}
            return {"policy": rec.get("policy"), "llm_model": rec.get("llm_model")}
    return {}


def _default(field: str):
    from state import Settings

    return Settings.model_fields[field].default


# ---------------------------------------------------------------------------- commands
@app.command()
@_interruptible
def run(problem: Optional[str] = typer.Argument(None, metavar="PROBLEM", show_default=False,
                                                help="a KernelBench-format problem file (Model, get_inputs, "
                                                     "get_init_inputs); with --resume: optional, checked "
                                                     "against the run's"),
        device: str = DeviceOpt(), runs_dir: Optional[pathlib.Path] = RunsDirOpt(),
        run_id: Optional[str] = typer.Option(None, "--run-id", metavar="ID",
                                             help="name of the new run's folder in the runs folder "
                                                  "(default: PROBLEM's name and the time)"),
        policy: Optional[str] = typer.Option(None, "--policy", metavar="expert|llm|hybrid",
                                             help="who decides inside the roles: the built-in expert "
                                                  "rules and search (default, no network), an LLM, or "
                                                  "both (the LLM proposes, the expert tunes)"),
        model: Optional[str] = typer.Option(None, "--model", metavar="NAME",
                                            help=f"LLM model name (default {_default('llm_model')}, "
                                                 "or $EGG_LLM_MODEL)"),
        base_url: Optional[str] = typer.Option(None, "--base-url", metavar="URL",
                                               help="OpenAI-compatible URL, e.g. http://localhost:8000/v1 "
                                                    "(default: the OpenAI API)"),
        api_key_env: Optional[str] = typer.Option(None, "--api-key-env", metavar="NAME",
                                                  help="environment variable holding the API key "
                                                       "(default OPENAI_API_KEY)"),
        token_budget: Optional[int] = typer.Option(None, "--token-budget", metavar="N",
                                                   help="LLM tokens the run may spend (0: no limit)"),
        replay_llm: Optional[str] = typer.Option(None, "--replay-llm", metavar="RUN_DIR",
                                                 help="serve the LLM replies recorded in RUN_DIR/llm/ "
                                                      "instead of calling a model (offline)"),
        trials: Optional[int] = typer.Option(None, "--trials", metavar="N",
                                             help=f"verification trials per candidate: fresh random "
                                                  f"inputs each (default {_default('trials')})"),
        time_limit: Optional[float] = typer.Option(
            None, "--time-limit", min=0, metavar="S",
            help="wall-clock budget in seconds: once spent, no new search starts and the best "
                 "verified candidate is the answer (0: none; a resume gets it again)"),
        probe_timeout: Optional[float] = ProbeOpt(),
        review: bool = typer.Option(False, "--review", help="pause after the planner to edit the plan"),
        resume: Optional[str] = typer.Option(None, "--resume", metavar="RUN",
                                             help="continue run RUN (an id or a run folder) from its "
                                                  "last checkpoint")):
    """Optimize one problem: plan, kernels, verification, timing, tuning; writes runs/<id>/.

    The problem is first imported and its forward run on meta tensors in a child process with a
    time limit (--probe-timeout): an unusable problem gets one line and exit code 2, and no run
    folder. With --policy llm or hybrid, every exchange with the model is saved in
    runs/<id>/llm/; exit code 3 when the endpoint cannot be reached or keeps failing (then
    --resume the run), 4 when no API key is set. Ctrl-C stops with exit code 130; the run
    continues with egg run --resume RUN."""
    with _loading():
        from graph import runs as R  # noqa: F401 - the slow imports, under the status line
        import torch  # noqa: F401

    if policy is not None and policy not in ("expert", "llm", "hybrid"):
        _fail(f"--policy must be expert, llm or hybrid, not {policy!r}")
    llm = {"llm_model": model, "llm_base_url": base_url, "llm_api_key_env": api_key_env,
           "llm_token_budget": token_budget}
    if replay_llm:
        llm["llm_replay_dir"] = _replay_dir(replay_llm, runs_dir)
        rec = _recorded_settings(llm["llm_replay_dir"])
        policy = policy or rec.get("policy")
        llm["llm_model"] = model or rec.get("llm_model")
    if resume:
        _resume(resume, problem, runs_dir, {**llm, "time_limit_s": time_limit})
        return
    if not problem:
        _fail("give a problem file (or --resume RUN)")
    from graph import runs as R

    try:
        if run_id is not None:
            R.check_run_id(run_id)
    except R.RunError as e:
        _fail(str(e))
    dev = _prepare_device(device)
    settings = _settings(device=dev, policy=policy, trials=trials, review=review or None,
                         time_limit_s=time_limit, probe_timeout_s=probe_timeout, **llm)
    _check_llm_ready(settings)
    _probe(problem, settings.probe_timeout_s)  # one line and exit 2 before any run folder exists
    try:
        r = R.create_run(problem, settings, runs_dir, run_id)
    except R.RunError as e:
        _fail(str(e))
    out.print(f"run [bold]{escape(r.id)}[/bold] in {escape(str(r.dir))}")
    if (line := _llm_line(r.settings)) is not None:
        out.print(escape(line))
    rep = _drive(r, {"problem_path": str(pathlib.Path(problem).resolve())})
    _finish(r, rep)


def _resume(ref: str, problem: str | None, runs_dir, updates: dict) -> None:
    from graph import runs as R

    try:
        r = R.open_run(ref, runs_dir)
        R.check_problem(r, problem)
        status = R.run_status(r)
        if status == "finished":
            out.print(f"run [bold]{escape(r.id)}[/bold] is finished: nothing to resume "
                      f"(egg show {r.id}; egg replay or egg fork {r.id} --checkpoint STEP starts a branch)")
            _finish(r, R.final_state(r).report)
            return
        R.override_settings(r, {k: v for k, v in updates.items() if v is not None})
        _check_llm_ready(r.settings)
        _prepare_device(r.settings.device)
        where = f" (branch {r.branch}, results in {r.results_dir})" if r.branch else ""
        out.print(f"resuming run [bold]{escape(r.id)}[/bold] from its last checkpoint{escape(where)}")
        if (line := _llm_line(r.settings)) is not None:
            out.print(escape(line))
        rep = _drive(r, R.resume_input(r))
    except R.RunError as e:
        _fail(str(e))
    _finish(r, rep)


@app.command("resume-review")
@_interruptible
def resume_review(run_id: str = typer.Argument(..., metavar="RUN", help="the run (an id or a run folder)"),
                  approve: bool = typer.Option(False, "--approve", help="run the plan as it is"),
                  disable: List[str] = typer.Option([], "--disable", metavar="GROUP",
                                                    help="turn a fused group off (repeatable)"),
                  goal: List[str] = typer.Option([], "--goal", metavar="STAGE=TEXT",
                                                 help="replace a stage's goal (repeatable)"),
                  plan_file: Optional[pathlib.Path] = typer.Option(None, "--plan-file", metavar="FILE",
                                                                   help="the plan as edited JSON (runs/RUN/plan.json)"),
                  abort: bool = typer.Option(False, "--abort", help="end the run without kernels"),
                  runs_dir: Optional[pathlib.Path] = RunsDirOpt()):
    """Answer the plan review a run paused on (egg run --review), then run on.

    Without an option it asks on the terminal."""
    from graph import runs as R

    chosen = sum([approve, abort, bool(disable or goal or plan_file)])
    if chosen > 1:
        _fail("choose one of --approve, --abort, or edits (--disable/--goal/--plan-file)")
    try:
        r = R.open_run(run_id, runs_dir)
        if R.pending_review(r) is None:
            _fail(f"run {r.id} is not waiting for a plan review")
        _prepare_device(r.settings.device)
        if chosen == 0:
            rep = _after_pause(r)
            _finish(r, rep)
            return
        if approve:
            decision = "approve"
        elif abort:
            decision = {"action": "abort", "reason": "aborted with egg resume-review --abort"}
        else:
            decision = {"action": "edit", "disable": list(disable)}
            if goal:
                if any("=" not in g for g in goal):
                    _fail("--goal wants stage=text")
                decision["goals"] = dict(g.split("=", 1) for g in goal)
            if plan_file is not None:
                try:
                    decision["plan"] = json.loads(plan_file.read_text())
                except (OSError, json.JSONDecodeError) as e:
                    _fail(f"--plan-file {plan_file}: {e}")
        rep = _drive(r, _command(decision))
    except R.RunError as e:
        _fail(str(e))
    _finish(r, rep)


def history_rows(rows) -> tuple[list[Col], list[list[str]]]:
    """The columns and cells of ``egg history`` (empty columns left out)."""
    step_of = {r.checkpoint_id: r.step for r in rows}
    cells, prev = [], None
    for r in rows:
        jump = r.parent_id and r.parent_id != prev and r.parent_id in step_of
        branch = r.branch + (f" from step {step_of[r.parent_id]}" if jump else "")
        cells.append(["*" if r.on_head else "", str(r.step), r.node, r.stage, r.candidate, r.verdict,
                      "" if r.seconds is None else f"{r.seconds:.1f}", ",".join(r.next), branch.strip(),
                      r.checkpoint_id])
        prev = r.checkpoint_id
    cols = [Col(""), Col("step", justify="right"), Col("node"), Col("stage", drop=4),
            Col("candidate", drop=5), Col("verdict", drop=6), Col("s", drop=2, justify="right"),
            Col("next", drop=1), Col("branch", drop=3),
            Col("checkpoint", drop=7, short=unique_prefixes)]
    keep = [i for i, c in enumerate(cols) if c.name in ("step", "node", "checkpoint")
            or any(row[i] for row in cells)]
    return [cols[i] for i in keep], [[row[i] for i in keep] for row in cells]


@app.command()
@_interruptible
def history(run_id: str = typer.Argument(..., metavar="RUN", help="the run (an id or a run folder)"),
            runs_dir: Optional[pathlib.Path] = RunsDirOpt(),
            as_json: bool = typer.Option(False, "--json", help="one JSON object per checkpoint, per line")):
    """List a run's checkpoints, all branches, oldest first: step (what --checkpoint takes),
    the node that made each, stage, candidate, verdict, seconds; * marks the line of the latest
    checkpoint, branch names the replay/fork branch that wrote it."""
    from dataclasses import asdict

    from graph import runs as R

    try:
        r = R.open_run(run_id, runs_dir)
        rows = R.history(r)
    except R.RunError as e:
        _fail(str(e))
    if as_json:
        for row in rows:
            print(json.dumps(asdict(row)))
        return
    if not rows:
        out.print(f"run {escape(r.id)} has no checkpoint yet (egg run --resume {escape(r.id)} starts it)")
        return
    cols, cells = history_rows(rows)
    print_table(out, f"history of {r.id}", cols, cells)


def _fmt(v, f="{:.4f}") -> str:
    return "-" if v is None else f.format(v)


def print_evidence(ev: dict) -> None:
    """A verification's evidence (nodes.reporter.verification_evidence) on the console."""
    from state import trial_variant

    verdict = "passed" if ev["passed"] else f"rejected [{ev['category']}] {ev['reason']}"
    out.print(escape(f"verification of {ev['candidate_id']}: {verdict}; {ev['trials']} trial(s) on "
                     f"{ev['device']}, {ev['wall_s']:.1f} s"))
    if ev["checks"]:
        out.print(escape(f"checks: {', '.join(ev['checks'])}"))
    if ev["sandbox"]:
        out.print(escape(f"sandbox: {', '.join(ev['sandbox'])}"))
    if ev["trial_log"]:
        cols = [Col("trial", justify="right"), Col("mode"), Col("grad", drop=3), Col("inputs"),
                Col("shapes", drop=4, prose=True), Col("variant", drop=5), Col("calls", drop=2, justify="right"),
                Col("passed"), Col("max abs err", justify="right"), Col("note", drop=1, prose=True)]
        rows = [[str(t["index"]), t["mode"], "on" if t["grad"] else "off", t["inputs"],
                 " ".join("x".join(map(str, s)) for s in t["shapes"]), trial_variant(t),
                 str(t["calls"]), "yes" if t["passed"] else "no", f"{t['max_abs']:.3g}", t["note"]]
                for t in ev["trial_log"]]
        print_table(out, None, cols, rows)
    if ev["outputs"]:
        f = lambda v: "-" if v is None else f"{v:.3g}"  # noqa: E731
        cols = [Col("output", justify="right"), Col("max abs err", justify="right"),
                Col("max rel err", justify="right", drop=3), Col("eager err vs fp64", justify="right", drop=2),
                Col("candidate err vs fp64", justify="right", drop=1), Col("passed by")]
        rows = [[str(o["index"]), f(o["max_abs"]), f(o["max_rel"]), f(o["eager_err_fp64"]),
                 f(o["cand_err_fp64"]), o["passed_by"]] for o in ev["outputs"]]
        print_table(out, None, cols, rows)
    for flag in ev["flags"]:
        out.print(escape(f"flag: {flag}"))


@app.command()
@_interruptible
def show(run_id: str = typer.Argument(..., metavar="RUN", help="the run (an id or a run folder)"),
         checkpoint: Optional[str] = CheckpointOpt(False),
         runs_dir: Optional[pathlib.Path] = RunsDirOpt(),
         source: bool = typer.Option(False, "--source", help="print a candidate's source"),
         candidate: Optional[str] = typer.Option(None, "--candidate", metavar="ID",
                                                 help="the candidate --source prints and whose verification "
                                                      "is shown (default: current, else best)"),
         as_json: bool = typer.Option(False, "--json", help="the whole state at the checkpoint as JSON")):
    """The state at a checkpoint: plan, candidates with verdicts and timings, the verification
    evidence (trials, modes, per-output errors, the door passed), stages."""
    from graph import runs as R
    from nodes.reporter import verification_evidence

    try:
        r = R.open_run(run_id, runs_dir)
        row = R.row_at(r, checkpoint)
        st = R.state_at(r, row.checkpoint_id)
    except R.RunError as e:
        _fail(str(e))
    if as_json:
        print(st.model_dump_json(indent=2))
        return
    chosen = candidate or st.current_id or st.best_id
    if source:
        c = st.candidate(chosen)
        if c is None:
            _fail(f"no candidate {chosen!r} at this checkpoint")
        print(c.source)
        return
    out.print(escape(f"checkpoint {row.checkpoint_id} (step {row.step}, made by {row.node}, "
                     f"next: {', '.join(row.next) or 'nothing: finished'})"
                     + (f", branch {row.branch}" if row.branch else "")))
    line = f"stage: {st.stage}; best: {st.best_id or '-'}; current: {st.current_id or '-'}"
    out.print(escape(line + (f"; error: {st.error}" if st.error else "")))
    if r.branch and row.on_head:
        out.print(escape(f"results of this line: {r.results_dir}"))
    if st.plan is not None:
        out.print(escape("plan: " + "; ".join(f"{g.id} {g.kind}{'' if g.enabled else ' (off)'}"
                                              for g in st.plan.groups)
                         + (f" [{st.plan.reviewed}]" if st.plan.reviewed else "")))
    cols = [Col("id"), Col("parent", drop=1), Col("stage", drop=3), Col("author", drop=2),
            Col("kernels", drop=4, prose=True), Col("verified", prose=True), Col("ms", justify="right"),
            Col("eager ms", drop=5, justify="right"), Col("verdict", drop=6)]
    rows = []
    for c in st.candidates:
        v, t = st.verification(c.id), st.timing(c.id)
        rows.append([c.id, c.parent_id or "-", c.stage, c.author, ", ".join(c.kernels) or "-",
                     ("reference" if c.fallback else "-") if v is None
                     else ("yes" if v.passed else f"no [{v.category}] {v.reason[:80]}"),
                     "-" if t is None or t.candidate_ms is None else f"{t.candidate_ms:.4f}",
                     "-" if t is None or t.eager_ms is None else f"{t.eager_ms:.4f}",
                     "-" if t is None else t.verdict])
    print_table(out, None, cols, rows)
    v = st.verification(chosen) if chosen else None
    if v is not None:
        print_evidence(verification_evidence(v))
    for name in ("algorithm", "tiling", "memory"):
        ctx = st.stage_context.get(name)
        if ctx is not None and (ctx.attempts or ctx.finished):
            out.print(escape(f"{name}: {len(ctx.attempts)} attempt(s)"
                             + (f", finished: {ctx.finish_reason}" if ctx.finished else "")))


def _branch_start(run, checkpoint: str):
    """--checkpoint resolved: the full id and its history row."""
    from graph import runs as R

    full = R.find_checkpoint(run, checkpoint)
    row = next(x for x in R.history(run) if x.checkpoint_id == full)
    return full, row


@app.command()
@_interruptible
def replay(run_id: str = typer.Argument(..., metavar="RUN", help="the run (an id or a run folder)"),
           checkpoint: str = CheckpointOpt(True), runs_dir: Optional[pathlib.Path] = RunsDirOpt()):
    """Re-run a run from one of its checkpoints, on a new branch of its history; the branch's
    best.py and reports go to runs/RUN/branches/replay-N/, the run folder's stay as they are."""
    from graph import runs as R

    try:
        r = R.open_run(run_id, runs_dir)
        full, row = _branch_start(r, checkpoint)
        _prepare_device(r.settings.device)
        b = R.new_branch(r, "replay", full)
        out.print(escape(f"replaying run {r.id} from step {row.step} (checkpoint {full}, made by "
                         f"{row.node}) on branch {b.branch}: results in {b.results_dir}"))
        _live(b, lambda on_step, on_start: R.replay(r, full, on_step, branch=b, on_start=on_start),
              row.step + 1)  # LangGraph copies the checkpoint first (step + 1)
        rep = _after_pause(b)
    except R.RunError as e:
        _fail(str(e))
    _finish(b, rep)


@app.command()
@_interruptible
def fork(run_id: str = typer.Argument(..., metavar="RUN", help="the run (an id or a run folder)"),
         checkpoint: str = CheckpointOpt(True),
         set_: List[str] = typer.Option(..., "--set", metavar="FIELD=VALUE",
                                        help="a state field and its new value (JSON, else a string), "
                                             "repeatable; record lists are appended to, dicts merged by key"),
         runs_dir: Optional[pathlib.Path] = RunsDirOpt()):
    """Change the state at a checkpoint (update_state, as the node that made it) and continue
    on a new branch; its best.py and reports go to runs/RUN/branches/fork-N/."""
    from graph import runs as R

    try:
        r = R.open_run(run_id, runs_dir)
        full, row = _branch_start(r, checkpoint)
        values = dict(R.parse_assignment(a) for a in set_)  # all checked before anything is written
        if values.get("problem_path"):
            _probe(str(values["problem_path"]), None)  # a new problem is checked like any other
        R.fork_as_node(r, full)
        _prepare_device(r.settings.device)
        b = R.new_branch(r, "fork", full, set=list(set_))
        out.print(escape(f"forking run {r.id} at step {row.step} (checkpoint {full}, made by "
                         f"{row.node}) on branch {b.branch}: results in {b.results_dir}"))
        _live(b, lambda on_step, on_start: R.fork(r, full, set_, on_step, branch=b, on_start=on_start),
              row.step + 1)  # update_state writes step + 1
        rep = _after_pause(b)
    except R.RunError as e:
        _fail(str(e))
    _finish(b, rep)


@app.command("graph")
def graph_cmd(mermaid: bool = typer.Option(True, "--mermaid/--json", help="mermaid (default) or JSON"),
              write: Optional[pathlib.Path] = typer.Option(None, "--write", metavar="FILE",
                                                           help="write the graph page (docs/graph.md) there")):
    """The graph as LangGraph draws it (the same picture Studio shows)."""
    from graph.drawing import graph_markdown, mermaid as draw

    if write is not None:
        write.write_text(graph_markdown())
        out.print(f"wrote {escape(str(write))}")
        return
    if mermaid:
        print(draw())
    else:
        from graph.build import graph

        print(json.dumps(graph.get_graph().to_json(), indent=2, default=str))


@app.command()
@_interruptible
def verify(problem: str = typer.Argument(..., metavar="PROBLEM", help="the KernelBench-format problem file"),
           candidate: str = typer.Argument(..., metavar="CANDIDATE", help="a file defining ModelNew"),
           device: str = DeviceOpt(),
           trials: int = typer.Option(5, "--trials", min=1, metavar="N", help="fresh random inputs to check on"),
           as_json: bool = typer.Option(False, "--json", help="print the verdict as JSON"),
           timeout: float = typer.Option(600.0, "--timeout", metavar="S", help="seconds for the whole verification"),
           memory_limit: float = typer.Option(0.0, "--memory-limit", metavar="GIB",
                                              help="GiB for the candidate process; 0: half the RAM (and GPU)"),
           probe_timeout: Optional[float] = ProbeOpt()):
    """Verify a ModelNew file against a problem: exit 0 passed, 1 rejected, 2 unusable input."""
    with _loading():
        from harness.problem import ProblemError, check_candidate_file
        from harness.verify import UNUSABLE, verify as run_verify

        dev = _prepare_device(device)
    spec = _probe(problem, probe_timeout)
    try:
        check_candidate_file(candidate)  # parses only: nothing of the candidate runs here
    except ProblemError as e:
        _fail(str(e))
    live = _Live(None, None)
    try:
        with live.status:
            live.status.set(f"verifying {pathlib.Path(candidate).name} ({trials} trial(s))")
            res = run_verify(spec.path, str(pathlib.Path(candidate).resolve()), device=dev, trials=trials,
                             problem_source=spec.source, timeout_s=timeout, memory_limit_gb=memory_limit)
    finally:
        live.close()
    if res.get("category") in UNUSABLE:
        _fail(res.get("reason", "unusable input"))
    if as_json:
        print(json.dumps(res, indent=2))
    else:
        _print_verdict(res)
    raise typer.Exit(EXIT_OK if res["passed"] else EXIT_REJECTED)


def _print_verdict(res: dict) -> None:
    if res["passed"]:
        out.print(f"[green]PASSED[/green] {res['trials']} trial(s) on {res['device']}")
    else:
        from rich.text import Text

        out.print(Text.assemble(("REJECTED", "red"), f" [{res['category']}] {res.get('reason', '')}"))
    out.print(escape(f"checks: {', '.join(res['checks'])}; Triton launches per call: {res.get('launches', 0)}; "
                     f"{res.get('wall_s', 0):.1f} s"))
    fmt = lambda v: "-" if v is None else f"{v:.3g}"  # noqa: E731
    if res.get("outputs"):
        cols = [Col("output", justify="right"), Col("max abs err", justify="right"),
                Col("max rel err", justify="right", drop=3), Col("eager err vs fp64", justify="right", drop=2),
                Col("candidate err vs fp64", justify="right", drop=1), Col("passed by")]
        rows = [[str(o["index"]), fmt(o["max_abs"]), fmt(o["max_rel"]), fmt(o["eager_err_fp64"]),
                 fmt(o["cand_err_fp64"]), o["passed_by"]] for o in res["outputs"]]
        print_table(out, None, cols, rows)
    for f in res.get("flags", []):
        out.print(f"flag: {f}", markup=False)


@app.command()
@_interruptible
def profile(problem: str = typer.Argument(..., metavar="PROBLEM", help="the KernelBench-format problem file"),
            candidate: Optional[str] = typer.Argument(None, metavar="[CANDIDATE]", show_default=False,
                                                      help="a file defining ModelNew, timed beside the baselines"),
            device: str = DeviceOpt(),
            rep_ms: float = typer.Option(200.0, "--rep-ms", metavar="MS", help="time spent repeating each timed function"),
            as_json: bool = typer.Option(False, "--json", help="print the numbers as JSON"),
            probe_timeout: Optional[float] = ProbeOpt()):
    """Time eager, torch.compile (and a candidate) in one process; speedups, roofline and bound.

    On the CPU the timings are the Triton interpreter's and eager's CPU times: labelled, no
    speedup claimed, torch.compile not timed."""
    with _loading():
        from harness import profile as P
        from harness import roofline
        from harness.hardware import detect
        from harness.problem import ProblemError, check_candidate_file, load_problem

        dev = _prepare_device(device)
    spec = _probe(problem, probe_timeout)
    try:
        prob = load_problem(spec.path)  # its forward is known to finish (the probe ran it)
        if candidate:
            check_candidate_file(candidate)
    except ProblemError as e:
        _fail(str(e))
    live = _Live(None, None)
    try:
        with live.status:
            live.status.set("timing eager and torch.compile" + (f", then {pathlib.Path(candidate).name}" if candidate else ""))
            s = P.ProfileSession(spec.path, dev, rep_ms)
            try:
                base = s.baselines()
                cand = s.time_candidate(str(pathlib.Path(candidate).resolve())) if candidate else None
            finally:
                s.close()
    except P.ProfileError as e:
        _fail(str(e), EXIT_REJECTED)
    finally:
        live.close()
    hw = detect(dev)  # after the session: its process measured and cached this GPU's peaks
    cnt = roofline.count(prob)
    fl = roofline.floor(cnt, hw.peak_tflops, hw.mem_bandwidth_gbs)
    interp = hw.interpreter
    eager = base["eager"]["median_ms"]
    comp = base.get("compile") or {}
    rows = [("eager", base["eager"])]
    if "median_ms" in comp:
        rows.append(("torch.compile", comp))
    if cand:
        rows.append(("candidate", cand))
    result = {"problem": spec.name, "device": dev, "hardware": hw.name, "interpreter": interp,
              "peaks_source": hw.peaks_source, "flops": cnt.flops, "flops_counted": cnt.counted_flops,
              "flops_estimated": cnt.estimated_flops, "flops_by_peak": cnt.flops_by_peak,
              "bytes": cnt.nbytes, "floor_ms": fl.ms, "compute_ms": fl.compute_ms,
              "memory_ms": fl.memory_ms, "bound": fl.bound, "compile_s": comp.get("compile_s"),
              "compile_error": comp.get("error"), "timings": {}}
    for name, r in rows:
        entry = {k: r.get(k) for k in ("median_ms", "p20_ms", "p80_ms", "n", "wall_ms", "lock_wait_s", "flags")}
        if not interp:
            entry["speedup_eager"] = eager / r["median_ms"]
            entry["speedup_compile"] = comp["median_ms"] / r["median_ms"] if "median_ms" in comp else None
            entry["roofline_pct"] = roofline.percent(fl.ms, r["median_ms"])
        result["timings"][name.replace("torch.compile", "compile")] = entry
    if as_json:
        print(json.dumps(result, indent=2))
        return
    title = f"{spec.name} on {hw.name}"
    if interp:
        title += " - CPU: interpreter/CPU timings, not GPU timings; no speedup claimed"
    cols = [Col("what", prose=True), Col("median ms", justify="right"), Col("p20 ms", justify="right", drop=3),
            Col("p80 ms", justify="right", drop=4), Col("reps", justify="right", drop=1),
            Col("vs eager", justify="right", drop=6), Col("vs compile", justify="right", drop=5),
            Col("roofline %", justify="right", drop=2)]
    cells = []
    for name, r in rows:
        e = result["timings"][name.replace("torch.compile", "compile")]
        label = name + (f" (compile {comp.get('compile_s')} s, not timed)" if name == "torch.compile" else "")
        cells.append([label, _fmt(r["median_ms"]), _fmt(r.get("p20_ms")), _fmt(r.get("p80_ms")),
                      str(r.get("n", "-")), _fmt(e.get("speedup_eager"), "{:.2f}x"),
                      _fmt(e.get("speedup_compile"), "{:.2f}x"), _fmt(e.get("roofline_pct"), "{:.1f}")])
    print_table(out, title, cols, cells)
    if comp.get("error"):
        out.print(escape(f"torch.compile: {comp['error']}"))
    elif interp:
        out.print("torch.compile: not timed on the CPU")
    for name, r in rows:
        for f in r.get("flags") or []:
            out.print(escape(f"flag ({name}): {f}"))
    out.print(f"FLOPs {cnt.flops:.3g} ({cnt.counted_flops:.3g} counted by flop_counter, "
              f"{cnt.estimated_flops:.3g} estimated), compulsory bytes {cnt.nbytes:.3g}")
    out.print(escape(f"roofline floor {_fmt(fl.ms)} ms = max(compute {_fmt(fl.compute_ms)} ms, memory "
                     f"{_fmt(fl.memory_ms)} ms): {fl.bound}-bound; peaks: {hw.peaks_source}"))


@app.command()
@_interruptible
def bench(folder: pathlib.Path = typer.Argument(..., metavar="DIR", help="a folder of problem files (searched recursively)"),
          out_dir: pathlib.Path = typer.Option(pathlib.Path("bench-out"), "--out", metavar="OUT",
                                               help="where results.jsonl, the reports, the plot and the runs go"),
          device: str = DeviceOpt(),
          filter_: Optional[str] = typer.Option(None, "--filter", metavar="GLOB", help="glob on relative paths"),
          list_file: Optional[pathlib.Path] = typer.Option(None, "--list", metavar="FILE", help="file of relative paths"),
          resume: bool = typer.Option(False, "--resume", help="skip problems already in results.jsonl"),
          jobs: int = typer.Option(1, "--jobs", "-j", min=1, metavar="N",
                                   help="problems at once (subprocesses; with --scheduler: per GPU "
                                        "worker); timings never overlap"),
          problem_timeout: float = typer.Option(900.0, "--problem-timeout", metavar="S",
                                                help="wall-clock limit of one problem, seconds"),
          verify_lock: Optional[bool] = typer.Option(None, "--verify-lock/--no-verify-lock",
                                                     help="verification holds the GPU lock shared "
                                                          "(default: on when --jobs > 1; docs/bench.md)"),
          scheduler: Optional[str] = typer.Option(None, "--scheduler", metavar="ADDRESS",
                                                  help="run the problems as tasks on a Dask cluster: "
                                                       "tcp://HOST:PORT, or local[:N] (docs/cluster.md)"),
          shared_dir: Optional[pathlib.Path] = typer.Option(
              None, "--shared-dir", metavar="DIR",
              help="with --scheduler: a folder every worker sees at this path; run folders and logs go "
                   "there instead of back to OUT"),
          retries: int = typer.Option(1, "--retries", min=0, metavar="N",
                                      help="with --scheduler: runs again of a problem whose worker died"),
          policy: Optional[str] = typer.Option(None, "--policy", metavar="expert|llm|hybrid",
                                               help="who decides inside the roles (default expert)"),
          model: Optional[str] = typer.Option(None, "--model", metavar="NAME",
                                              help=f"LLM model name (default {_default('llm_model')})"),
          base_url: Optional[str] = typer.Option(None, "--base-url", metavar="URL", help="OpenAI-compatible URL"),
          trials: Optional[int] = typer.Option(None, "--trials", metavar="N",
                                               help="verification trials per candidate (default 5)"),
          rep_ms: Optional[float] = typer.Option(None, "--rep-ms", metavar="MS",
                                                 help="time spent repeating each timed function")):
    """Run every problem under DIR through the graph; results.jsonl, report.json/.md, plot.
    Exit 1 when no problem of the suite has a correct answer."""
    from graph import bench as B
    from policies.llm_io import LLMError

    dev = device if scheduler else _prepare_device(device)  # a cluster's workers decide (graph.cluster)
    try:
        problems = B.select(folder, filter_, list_file)
    except B.BenchError as e:
        _fail(str(e))
    settings = _settings(device=dev, policy=policy, trials=trials, llm_model=model, llm_base_url=base_url,
                         timing_rep_ms=rep_ms)
    try:
        if scheduler:
            from graph import cluster as C

            rep = C.run_cluster_bench(problems, folder, out_dir, settings, resume, scheduler, console=out,
                                      jobs=jobs, problem_timeout_s=problem_timeout, verify_lock=verify_lock,
                                      shared_dir=shared_dir, retries=retries)
        else:
            rep = B.run_bench(problems, folder, out_dir, settings, resume, console=out, jobs=jobs,
                              problem_timeout_s=problem_timeout,
                              verify_lock=(jobs > 1) if verify_lock is None else verify_lock)
    except B.BenchError as e:
        _fail(str(e))
    except LLMError as e:
        _fail(f"{e}\nbench stopped; the problems done so far are in {out_dir / 'results.jsonl'}: "
              "continue with egg bench ... --resume", EXIT_LLM)
    except KeyboardInterrupt:
        _fail(f"interrupted; the problems done so far are in {out_dir / 'results.jsonl'}: "
              "continue with egg bench ... --resume", 130)
    out.print(B.summary_table(rep))
    out.print(B.written_files(rep, out_dir), highlight=False)
    if rep["problems"] and not rep["correct"]:
        _fail(f"no problem of the suite has a correct answer ({rep['failed']} failed, "
              f"{rep.get('reference_nondeterministic', 0)} with a non-deterministic reference)",
              B.EXIT_NO_CORRECT)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        err.print("egg: interrupted")
        sys.exit(EXIT_INTERRUPTED)


if __name__ == "__main__":
    main()
