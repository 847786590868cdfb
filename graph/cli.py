"""The ``egg`` command line.

Exit codes: 0 success; 1 a verification rejected the candidate (egg verify); 2 a problem,
candidate, run or checkpoint that cannot be used (one line on stderr, never a traceback);
3 the LLM endpoint (policy llm or hybrid) could not be reached or kept failing after the retries
(unreachable, HTTP errors, timeouts, rate limits, a missing API key, a replay that ran out): one
line on stderr; the run folder stays intact and ``egg run --resume RUN`` continues it.
"""
from __future__ import annotations

import json
import os
import pathlib
import sys
import time
from typing import List, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="EGG: turn a PyTorch program into verified, faster Triton kernels.")
out = Console()
err = Console(stderr=True)

DeviceOpt = typer.Option("auto", "--device", help="auto | cpu | cuda")
RunsDirOpt = typer.Option(None, "--runs-dir", help="folder of runs (default ./runs or $EGG_RUNS_DIR)")


def _fail(msg: str, code: int = 2) -> None:
    err.print(f"[red]egg:[/red] {escape(msg)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


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


def _step_line(node: str, upd: dict, t0: float) -> str:
    if node == "__interrupt__":
        return f"[{time.time() - t0:6.1f}s] [bold]review[/bold]: paused for a person to review the plan"
    if node == "review" and not upd:
        return f"[{time.time() - t0:6.1f}s] [bold]review[/bold]: skipped (review is off)"
    bits = []
    if upd.get("error"):
        bits.append(f"[red]{escape(upd['error'])}[/red]")
    for c in upd.get("candidates", []) or []:
        bits.append(f"candidate {c.id} ({len(c.kernels)} kernel(s))")
    for v in upd.get("verifications", []) or []:
        bits.append(f"{v.candidate_id} [green]verified[/green] ({v.trials} trials)" if v.passed
                    else f"{v.candidate_id} [red]rejected[/red] {escape(f'[{v.category}] {v.reason[:140]}')}")
    for t in upd.get("timings", []) or []:
        if t.candidate_id == "c0":
            continue
        if t.interpreter:
            bits.append(f"{t.candidate_id}: {t.candidate_ms:.2f} ms in the interpreter (not a GPU timing)")
        elif t.candidate_ms is not None:
            bits.append(f"{t.candidate_id}: {t.candidate_ms:.4f} ms, {t.verdict}"
                        + (f", {t.speedup_eager:.2f}x eager" if t.speedup_eager else ""))
        else:
            bits.append(f"{t.candidate_id}: {t.note}")
    for stage, ctx in (upd.get("stage_context") or {}).items():
        if node in ("tiler", "memory_optimizer", "algorithm_designer") and ctx.finished and not upd.get("candidates"):
            bits.append(f"{stage} stage done: {escape(ctx.finish_reason)}")
    if node == "review" and upd.get("plan") is not None:
        p = upd["plan"]
        off = [g.id for g in p.groups if not g.enabled]
        bits.append(f"plan {p.reviewed}" + (f" (off: {', '.join(off)})" if off else ""))
    if node == "planner" and upd.get("plan") is not None:
        p = upd["plan"]
        bits.append(f"{sum(g.kind != 'library' for g in p.groups)} fused group(s), "
                    f"{sum(g.kind == 'library' for g in p.groups)} library op(s)")
    return f"[{time.time() - t0:6.1f}s] [bold]{node}[/bold]: " + ("; ".join(bits) or "done")


def _final_table(rep: dict) -> Table:
    t = rep["timing"]
    tab = Table(title=f"EGG result: {rep['problem']} on {rep['hardware']}")
    fmt = lambda v, f="{:.4f}": "-" if v is None else f.format(v)  # noqa: E731
    if t.get("interpreter"):
        tab.add_column("reference ms (eager, CPU)")
        tab.add_column("best ms (Triton interpreter)")
        tab.add_column("speedup")
        tab.add_row(fmt(t.get("eager_ms")), fmt(t.get("best_ms")), "not claimed on CPU")
    else:
        for c in ("eager ms", "torch.compile ms", "EGG ms", "vs eager", "vs compile", "roofline %"):
            tab.add_column(c)
        tab.add_row(fmt(t.get("eager_ms")), fmt(t.get("compile_ms")), fmt(t.get("best_ms")),
                    fmt(t.get("speedup_eager"), "{:.2f}x"), fmt(t.get("speedup_compile"), "{:.2f}x"),
                    fmt(t.get("roofline_pct"), "{:.1f}"))
    return tab


def _drive(run, inp, config=None) -> dict | None:
    """Run the graph, printing a line per step; handle a plan review; the report, or None
    while the run waits for a review."""
    from graph import runs as R
    from policies.llm_io import EXIT_LLM, LLMError

    t0 = time.time()
    try:
        for node, upd in R.stream(run, inp, config):
            out.print(_step_line(node, upd, t0), highlight=False)
    except LLMError as e:
        _fail(f"{e}\nthe run folder {run.dir} is intact: continue with "
              f"egg run --resume {run.id} (optionally with --base-url/--model)", EXIT_LLM)
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
                      f"  egg resume-review {run.id} --abort", highlight=False)
            return None
        decision = _ask(plan_file)
        t0 = time.time()
        for node, upd in R.stream(run, _command(decision)):
            out.print(_step_line(node, upd, t0), highlight=False)
    return R.final_state(run).report


def _command(decision):
    from langgraph.types import Command

    return Command(resume=decision)


def _interactive() -> bool:
    return sys.stdin.isatty()


def _print_plan(req: dict) -> None:
    if req.get("error"):
        out.print(f"[red]the last decision was not usable:[/red] {req['error']}", highlight=False)
    plan = req["plan"]
    tab = Table(title=f"plan for {req.get('problem')}")
    for c in ("group", "kind", "on", "ops", "why"):
        tab.add_column(c)
    for g in plan["groups"]:
        tab.add_row(g["id"], g["kind"], "yes" if g.get("enabled", True) else "no",
                    " ".join(g["nodes"]), g.get("reason", ""))
    out.print(tab)
    for st, goal in plan.get("goals", {}).items():
        out.print(f"goal of {st}: {goal}", highlight=False)
    for n in plan.get("notes", []):
        out.print(f"note: {n}", highlight=False)


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
                out.print(f"[red]{plan_file} is not JSON:[/red] {e}", highlight=False)


def _finish(run, rep: dict | None) -> None:
    """The end of run/resume/replay/fork/resume-review: the result table, or why not."""
    if rep is None:
        return
    if rep.get("status") == "error":
        from nodes.review import ABORTED

        if str(rep.get("error", "")).startswith(ABORTED):
            out.print(f"run {run.id}: {rep['error']}", highlight=False)
            return
        _fail(rep.get("error", "run failed"))
    if rep.get("status") != "ok":
        _fail(f"run {run.id} did not finish (egg run --resume {run.id})")
    out.print(_final_table(rep))
    if rep.get("llm"):
        tot = rep["llm"]["total"]
        per = ", ".join(f"{k} {u['prompt_tokens'] + u['completion_tokens']}"
                        for k, u in sorted(rep.get("llm_usage", {}).items()) if k != "total")
        out.print(f"LLM: {tot['calls']} call(s), {tot['prompt_tokens'] + tot['completion_tokens']} tokens "
                  f"({per})" + (f", ${tot['cost_usd']:.4f}" if rep["llm"].get("priced") else ""),
                  highlight=False)
    out.print(f"best: {run.dir / 'best.py'} "
              f"({'reference, no kernel' if rep['fallback'] else ', '.join(rep['kernels'])})",
              highlight=False)


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


def _settings(**kw):
    from state import Settings

    try:
        return Settings(**{k: v for k, v in kw.items() if v is not None})
    except Exception as e:  # noqa: BLE001
        _fail(f"bad settings: {e}")


@app.command()
def run(problem: str = typer.Argument(None, help="a KernelBench-format problem file"),
        device: str = DeviceOpt, runs_dir: Optional[pathlib.Path] = RunsDirOpt,
        run_id: Optional[str] = typer.Option(None, "--run-id"),
        policy: Optional[str] = typer.Option(None, "--policy", help="expert | llm | hybrid"),
        model: Optional[str] = typer.Option(None, "--model", help="LLM model name"),
        base_url: Optional[str] = typer.Option(None, "--base-url", help="OpenAI-compatible URL, e.g. http://localhost:8000/v1"),
        api_key_env: Optional[str] = typer.Option(None, "--api-key-env", help="environment variable holding the API key (default OPENAI_API_KEY)"),
        token_budget: Optional[int] = typer.Option(None, "--token-budget", help="LLM tokens the run may spend (0: no limit)"),
        replay_llm: Optional[str] = typer.Option(None, "--replay-llm", metavar="RUN_DIR",
                                                 help="serve the LLM replies recorded in RUN_DIR/llm/ instead of calling a model (offline)"),
        trials: Optional[int] = typer.Option(None, "--trials"),
        time_limit: Optional[float] = typer.Option(
            None, "--time-limit", min=0, metavar="S",
            help="wall-clock budget in seconds: once spent, no new search starts and the best "
                 "verified candidate is the answer (0: none; a resume gets it again)"),
        review: bool = typer.Option(False, "--review", help="pause after the planner to edit the plan"),
        resume: Optional[str] = typer.Option(None, "--resume", help="continue run RUN from its last checkpoint")):
    """Optimize one problem: plan, kernels, verification, timing, tuning; writes runs/<id>/.

    With --policy llm or hybrid, every exchange with the model is saved in runs/<id>/llm/; exit
    code 3 when the endpoint cannot be reached or keeps failing (then --resume the run)."""
    from graph import runs as R
    from harness.problem import ProblemError, describe_problem

    llm = {"llm_model": model, "llm_base_url": base_url, "llm_api_key_env": api_key_env,
           "llm_token_budget": token_budget}
    if replay_llm:
        llm["llm_replay_dir"] = _replay_dir(replay_llm, runs_dir)
        rec = _recorded_settings(llm["llm_replay_dir"])
        policy = policy or rec.get("policy")
        llm["llm_model"] = model or rec.get("llm_model")
    try:
        if resume:
            r = R.open_run(resume, runs_dir)
            R.override_settings(r, {k: v for k, v in {**llm, "time_limit_s": time_limit}.items()
                                    if v is not None})
            _prepare_device(r.settings.device)
            out.print(f"resuming run [bold]{r.id}[/bold] from its last checkpoint")
            rep = _drive(r, R.resume_input(r))
        else:
            if not problem:
                _fail("give a problem file (or --resume RUN)")
            dev = _prepare_device(device)
            describe_problem(problem)  # one-line error and exit 2 before any run folder exists
            settings = _settings(device=dev, policy=policy, trials=trials, review=review or None,
                                 time_limit_s=time_limit, **llm)
            r = R.create_run(problem, settings, runs_dir, run_id)
            out.print(f"run [bold]{r.id}[/bold] in {r.dir}")
            rep = _drive(r, {"problem_path": str(pathlib.Path(problem).resolve())})
    except (ProblemError, R.RunError) as e:
        _fail(str(e))
    _finish(r, rep)


@app.command("resume-review")
def resume_review(run_id: str = typer.Argument(..., metavar="RUN"),
                  approve: bool = typer.Option(False, "--approve", help="run the plan as it is"),
                  disable: List[str] = typer.Option([], "--disable", help="turn a fused group off (repeatable)"),
                  goal: List[str] = typer.Option([], "--goal", help="stage=text: replace a stage's goal (repeatable)"),
                  plan_file: Optional[pathlib.Path] = typer.Option(None, "--plan-file", help="the plan as edited JSON (runs/RUN/plan.json)"),
                  abort: bool = typer.Option(False, "--abort", help="end the run without kernels"),
                  runs_dir: Optional[pathlib.Path] = RunsDirOpt):
    """Answer the plan review a run paused on (egg run --review), then run on.

    Without an option it asks on the terminal."""
    from graph import runs as R

    chosen = sum([approve, abort, bool(disable or goal or plan_file)])
    if chosen > 1:
        _fail("choose one of --approve, --abort, or edits (--disable/--goal/--plan-file)")
    try:
        r = R.open_run(run_id, runs_dir)
        if R.pending_review(r) is None:
            _fail(f"run {run_id} is not waiting for a plan review")
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


@app.command()
def history(run_id: str = typer.Argument(..., metavar="RUN"), runs_dir: Optional[pathlib.Path] = RunsDirOpt,
            as_json: bool = typer.Option(False, "--json", help="one JSON object per checkpoint")):
    """List a run's checkpoints, all branches, oldest first: step, the node that made each,
    stage, candidate, verdict, seconds; * marks the branch of the latest checkpoint."""
    from dataclasses import asdict

    from graph import runs as R

    try:
        rows = R.history(R.open_run(run_id, runs_dir))
    except R.RunError as e:
        _fail(str(e))
    if as_json:
        for r in rows:
            print(json.dumps(asdict(r)))
        return
    tab = Table(title=f"history of {run_id}")
    for c in ("", "step", "node", "stage", "candidate", "verdict", "s", "next", "branch from"):
        tab.add_column(c, overflow="fold")
    tab.add_column("checkpoint", no_wrap=True, min_width=36)  # whole ids, to copy
    step_of = {r.checkpoint_id: r.step for r in rows}
    prev = None
    for r in rows:
        branch = f"step {step_of[r.parent_id]}" if r.parent_id and r.parent_id != prev else ""
        tab.add_row("*" if r.on_head else "", str(r.step), r.node, r.stage, r.candidate, r.verdict,
                    "" if r.seconds is None else f"{r.seconds:.1f}", ",".join(r.next), branch,
                    r.checkpoint_id)
        prev = r.checkpoint_id
    out.print(tab)


@app.command()
def show(run_id: str = typer.Argument(..., metavar="RUN"),
         checkpoint: Optional[str] = typer.Option(None, "--checkpoint", help="a checkpoint id (default: the latest)"),
         runs_dir: Optional[pathlib.Path] = RunsDirOpt,
         source: bool = typer.Option(False, "--source", help="print a candidate's source"),
         candidate: Optional[str] = typer.Option(None, "--candidate", help="which candidate --source prints (default: current, else best)"),
         as_json: bool = typer.Option(False, "--json", help="the whole state as JSON")):
    """The state at a checkpoint: plan, candidates with verdicts and timings, stages."""
    from graph import runs as R

    try:
        r = R.open_run(run_id, runs_dir)
        row = R.row_at(r, checkpoint)
        st = R.state_at(r, row.checkpoint_id)
    except R.RunError as e:
        _fail(str(e))
    if as_json:
        print(st.model_dump_json(indent=2))
        return
    if source:
        c = st.candidate(candidate or st.current_id or st.best_id)
        if c is None:
            _fail(f"no candidate {candidate or st.current_id or st.best_id!r} at this checkpoint")
        print(c.source)
        return
    out.print(f"checkpoint {row.checkpoint_id} (step {row.step}, made by {row.node}, "
              f"next: {', '.join(row.next) or 'nothing: finished'})", highlight=False)
    out.print(f"stage: {st.stage}; best: {st.best_id}; current: {st.current_id}; error: {st.error}",
              highlight=False)
    if st.plan is not None:
        out.print("plan: " + "; ".join(f"{g.id} {g.kind}{'' if g.enabled else ' (off)'}"
                                       for g in st.plan.groups)
                  + (f" [{st.plan.reviewed}]" if st.plan.reviewed else ""), highlight=False)
    tab = Table()
    for c in ("id", "parent", "stage", "author", "kernels", "verified", "ms", "eager ms", "verdict"):
        tab.add_column(c, overflow="fold")
    for c in st.candidates:
        v, t = st.verification(c.id), st.timing(c.id)
        tab.add_row(c.id, c.parent_id or "-", c.stage, c.author, ", ".join(c.kernels) or "-",
                    "-" if v is None else ("yes" if v.passed else f"no [{v.category}] {v.reason[:80]}"),
                    "-" if t is None or t.candidate_ms is None else f"{t.candidate_ms:.4f}",
                    "-" if t is None or t.eager_ms is None else f"{t.eager_ms:.4f}",
                    "-" if t is None else t.verdict)
    out.print(tab)
    for name in ("algorithm", "tiling", "memory"):
        ctx = st.stage_context.get(name)
        if ctx is not None and (ctx.attempts or ctx.finished):
            out.print(f"{name}: {len(ctx.attempts)} attempt(s)"
                      + (f", finished: {ctx.finish_reason}" if ctx.finished else ""), highlight=False)


@app.command()
def replay(run_id: str = typer.Argument(..., metavar="RUN"), checkpoint: str = typer.Option(..., "--checkpoint"),
           runs_dir: Optional[pathlib.Path] = RunsDirOpt):
    """Re-run a run from one of its checkpoints (a new branch of its history)."""
    from graph import runs as R

    try:
        r = R.open_run(run_id, runs_dir)
        _prepare_device(r.settings.device)
        t0 = time.time()
        R.replay(r, checkpoint, lambda n, u: out.print(_step_line(n, u, t0), highlight=False))
        rep = _after_pause(r)
    except R.RunError as e:
        _fail(str(e))
    _finish(r, rep)


@app.command()
def fork(run_id: str = typer.Argument(..., metavar="RUN"), checkpoint: str = typer.Option(..., "--checkpoint"),
         set_: List[str] = typer.Option(..., "--set", help="field=value (JSON value), repeatable; "
                                        "record lists are appended to, dicts merged by key"),
         runs_dir: Optional[pathlib.Path] = RunsDirOpt):
    """Change the state at a checkpoint (update_state, as the node that made it) and continue
    on a new branch."""
    from graph import runs as R

    try:
        r = R.open_run(run_id, runs_dir)
        _prepare_device(r.settings.device)
        t0 = time.time()
        R.fork(r, checkpoint, set_, lambda n, u: out.print(_step_line(n, u, t0), highlight=False))
        rep = _after_pause(r)
    except R.RunError as e:
        _fail(str(e))
    _finish(r, rep)


@app.command("graph")
def graph_cmd(mermaid: bool = typer.Option(True, "--mermaid/--json", help="mermaid (default) or JSON"),
              write: Optional[pathlib.Path] = typer.Option(None, "--write", help="write docs/graph.md there")):
    """The graph as LangGraph draws it (the same picture Studio shows)."""
    from graph.drawing import graph_markdown, mermaid as draw

    if write is not None:
        write.write_text(graph_markdown())
        out.print(f"wrote {write}")
        return
    if mermaid:
        print(draw())
    else:
        from graph.build import graph

        print(json.dumps(graph.get_graph().to_json(), indent=2, default=str))


@app.command()
def verify(problem: str, candidate: str, device: str = DeviceOpt,
           trials: int = typer.Option(5, "--trials", min=1, help="fresh random inputs to check on"),
           as_json: bool = typer.Option(False, "--json", help="print the verdict as JSON"),
           timeout: float = typer.Option(600.0, "--timeout", help="seconds for the whole verification"),
           memory_limit: float = typer.Option(0.0, "--memory-limit",
                                              help="GiB for the candidate process; 0: half the RAM (and GPU)")):
    """Verify a ModelNew file against a problem: exit 0 passed, 1 rejected, 2 unusable input."""
    from harness.problem import ProblemError, check_candidate_file, describe_problem
    from harness.verify import UNUSABLE, verify as run_verify

    dev = _prepare_device(device)
    try:
        _prob, spec = describe_problem(problem)
        check_candidate_file(candidate)  # parses only: nothing of the candidate runs here
    except ProblemError as e:
        _fail(str(e))
    res = run_verify(spec.path, str(pathlib.Path(candidate).resolve()), device=dev, trials=trials,
                     problem_source=spec.source, timeout_s=timeout, memory_limit_gb=memory_limit)
    if res.get("category") in UNUSABLE:
        _fail(res.get("reason", "unusable input"))
    if as_json:
        print(json.dumps(res, indent=2))
    else:
        _print_verdict(res)
    raise typer.Exit(0 if res["passed"] else 1)


def _print_verdict(res: dict) -> None:
    if res["passed"]:
        out.print(f"[green]PASSED[/green] {res['trials']} trial(s) on {res['device']}", highlight=False)
    else:
        from rich.text import Text

        out.print(Text.assemble(("REJECTED", "red"), f" [{res['category']}] {res.get('reason', '')}"),
                  highlight=False)
    out.print(f"checks: {', '.join(res['checks'])}; Triton launches per call: {res.get('launches', 0)}; "
              f"{res.get('wall_s', 0):.1f} s", highlight=False)
    fmt = lambda v: "-" if v is None else f"{v:.3g}"  # noqa: E731
    if res.get("outputs"):
        tab = Table()
        for c in ("output", "max abs err", "max rel err", "eager err vs fp64", "candidate err vs fp64", "passed by"):
            tab.add_column(c)
        for o in res["outputs"]:
            tab.add_row(str(o["index"]), fmt(o["max_abs"]), fmt(o["max_rel"]), fmt(o["eager_err_fp64"]),
                        fmt(o["cand_err_fp64"]), o["passed_by"])
        out.print(tab)
    for f in res.get("flags", []):
        out.print(f"flag: {f}", highlight=False, markup=False)


@app.command()
def profile(problem: str, candidate: Optional[str] = typer.Argument(None), device: str = DeviceOpt,
            rep_ms: float = typer.Option(200.0, "--rep-ms", help="time spent repeating each timed function"),
            as_json: bool = typer.Option(False, "--json", help="print the numbers as JSON")):
    """Time eager, torch.compile (and a candidate) in one process; speedups, roofline and bound.

    On the CPU the timings are the Triton interpreter's and eager's CPU times: labelled, no
    speedup claimed, torch.compile not timed."""
    from harness import profile as P
    from harness import roofline
    from harness.hardware import detect
    from harness.problem import ProblemError, check_candidate_file, describe_problem

    dev = _prepare_device(device)
    try:
        prob, spec = describe_problem(problem)
        if candidate:
            check_candidate_file(candidate)
    except ProblemError as e:
        _fail(str(e))
    try:
        s = P.ProfileSession(spec.path, dev, rep_ms)
        try:
            base = s.baselines()
            cand = s.time_candidate(str(pathlib.Path(candidate).resolve())) if candidate else None
        finally:
            s.close()
    except P.ProfileError as e:
        _fail(str(e), 1)
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
    tab = Table(title=title)
    for c in ("what", "median ms", "p20 ms", "p80 ms", "reps", "vs eager", "vs compile", "roofline %"):
        tab.add_column(c)
    fmt = lambda v, f="{:.4f}": "-" if v is None else f.format(v)  # noqa: E731
    for name, r in rows:
        e = result["timings"][name.replace("torch.compile", "compile")]
        label = name + (f" (compile {comp.get('compile_s')} s, not timed)" if name == "torch.compile" else "")
        tab.add_row(label, fmt(r["median_ms"]), fmt(r.get("p20_ms")), fmt(r.get("p80_ms")),
                    str(r.get("n", "-")), fmt(e.get("speedup_eager"), "{:.2f}x"),
                    fmt(e.get("speedup_compile"), "{:.2f}x"), fmt(e.get("roofline_pct"), "{:.1f}"))
    out.print(tab)
    if comp.get("error"):
        out.print(f"torch.compile: {comp['error']}", highlight=False)
    elif interp:
        out.print("torch.compile: not timed on the CPU", highlight=False)
    for name, r in rows:
        for f in r.get("flags") or []:
            out.print(f"flag ({name}): {f}", highlight=False)
    out.print(f"FLOPs {cnt.flops:.3g} ({cnt.counted_flops:.3g} counted by flop_counter, "
              f"{cnt.estimated_flops:.3g} estimated), compulsory bytes {cnt.nbytes:.3g}", highlight=False)
    out.print(f"roofline floor {fmt(fl.ms)} ms = max(compute {fmt(fl.compute_ms)} ms, memory "
              f"{fmt(fl.memory_ms)} ms): {fl.bound}-bound; peaks: {hw.peaks_source}", highlight=False)


@app.command()
def bench(folder: pathlib.Path, out_dir: pathlib.Path = typer.Option(pathlib.Path("bench-out"), "--out"),
          device: str = DeviceOpt, filter_: Optional[str] = typer.Option(None, "--filter", help="glob on relative paths"),
          list_file: Optional[pathlib.Path] = typer.Option(None, "--list", help="file of relative paths"),
          resume: bool = typer.Option(False, "--resume", help="skip problems already in results.jsonl"),
          jobs: int = typer.Option(1, "--jobs", "-j", min=1,
                                   help="problems at once (subprocesses; with --scheduler: per GPU "
                                        "worker); timings never overlap"),
          problem_timeout: float = typer.Option(900.0, "--problem-timeout",
                                                help="wall-clock limit of one problem, seconds"),
          verify_lock: Optional[bool] = typer.Option(None, "--verify-lock/--no-verify-lock",
                                                     help="verification holds the GPU lock shared "
                                                          "(default: on when --jobs > 1; docs/bench.md)"),
          scheduler: Optional[str] = typer.Option(None, "--scheduler",
                                                  help="run the problems as tasks on a Dask cluster: "
                                                       "tcp://HOST:PORT, or local[:N] (docs/cluster.md)"),
          shared_dir: Optional[pathlib.Path] = typer.Option(
              None, "--shared-dir", help="with --scheduler: a folder every worker sees at this path; "
                                         "run folders and logs go there instead of back to OUT"),
          retries: int = typer.Option(1, "--retries", min=0,
                                      help="with --scheduler: runs again of a problem whose worker died"),
          policy: Optional[str] = typer.Option(None, "--policy"),
          model: Optional[str] = typer.Option(None, "--model", help="LLM model name"),
          base_url: Optional[str] = typer.Option(None, "--base-url", help="OpenAI-compatible URL"),
          trials: Optional[int] = typer.Option(None, "--trials"),
          rep_ms: Optional[float] = typer.Option(None, "--rep-ms", help="time spent repeating each timed function")):
    """Run every problem under FOLDER through the graph; results.jsonl, report.json/.md, plot.
    Exit 1 when no problem of the suite has a correct answer."""
    from graph import bench as B
    from policies.llm_io import EXIT_LLM, LLMError

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
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
