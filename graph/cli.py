"""The ``egg`` command line.

Exit codes: 0 success; 1 a verification rejected the candidate (egg verify); 2 a problem,
candidate, run or checkpoint that cannot be used (one line on stderr, never a traceback).
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
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="EGG: turn a PyTorch program into verified, faster Triton kernels.")
out = Console()
err = Console(stderr=True)

DeviceOpt = typer.Option("auto", "--device", help="auto | cpu | cuda")
RunsDirOpt = typer.Option(None, "--runs-dir", help="folder of runs (default ./runs or $EGG_RUNS_DIR)")


def _fail(msg: str, code: int = 2) -> None:
    err.print(f"[red]egg:[/red] {msg}", highlight=False, soft_wrap=True)
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
    bits = []
    if upd.get("error"):
        bits.append(f"[red]{upd['error']}[/red]")
    for c in upd.get("candidates", []) or []:
        bits.append(f"candidate {c.id} ({len(c.kernels)} kernel(s))")
    for v in upd.get("verifications", []) or []:
        bits.append(f"{v.candidate_id} [green]verified[/green] ({v.trials} trials)" if v.passed
                    else f"{v.candidate_id} [red]rejected[/red] [{v.category}] {v.reason[:140]}")
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
            bits.append(f"{stage} stage done: {ctx.finish_reason}")
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


def _drive(run, inp, config=None) -> dict:
    from graph import runs as R

    t0 = time.time()
    for node, upd in R.stream(run, inp, config):
        out.print(_step_line(node, upd, t0), highlight=False)
    st = R.final_state(run)
    return st.report


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
        base_url: Optional[str] = typer.Option(None, "--base-url", help="OpenAI-compatible URL"),
        trials: Optional[int] = typer.Option(None, "--trials"),
        review: bool = typer.Option(False, "--review", help="pause after the planner to edit the plan"),
        resume: Optional[str] = typer.Option(None, "--resume", help="continue run RUN from its last checkpoint")):
    """Optimize one problem: plan, kernels, verification, timing, tuning; writes runs/<id>/."""
    from graph import runs as R
    from harness.problem import ProblemError, describe_problem

    try:
        if resume:
            r = R.open_run(resume, runs_dir)
            _prepare_device(r.settings.device)
            out.print(f"resuming run [bold]{r.id}[/bold] from its last checkpoint")
            rep = _drive(r, None)
        else:
            if not problem:
                _fail("give a problem file (or --resume RUN)")
            dev = _prepare_device(device)
            describe_problem(problem)  # one-line error and exit 2 before any run folder exists
            settings = _settings(device=dev, policy=policy, llm_model=model, llm_base_url=base_url,
                                 trials=trials, review=review or None)
            r = R.create_run(problem, settings, runs_dir, run_id)
            out.print(f"run [bold]{r.id}[/bold] in {r.dir}")
            rep = _drive(r, {"problem_path": str(pathlib.Path(problem).resolve())})
    except (ProblemError, R.RunError) as e:
        _fail(str(e))
    if rep.get("status") == "error":
        _fail(rep.get("error", "run failed"))
    out.print(_final_table(rep))
    out.print(f"best: {r.dir / 'best.py'} ({'reference, no kernel' if rep['fallback'] else ', '.join(rep['kernels'])})")


@app.command()
def history(run_id: str = typer.Argument(..., metavar="RUN"), runs_dir: Optional[pathlib.Path] = RunsDirOpt):
    """List a run's checkpoints: step, node, stage, candidate, verdict."""
    from graph import runs as R

    try:
        rows = R.history(R.open_run(run_id, runs_dir))
    except R.RunError as e:
        _fail(str(e))
    tab = Table(title=f"history of {run_id}")
    for c in ("step", "node", "stage", "candidate", "verdict", "checkpoint"):
        tab.add_column(c)
    for r in rows:
        tab.add_row(str(r.step), r.node, r.stage, r.candidate, r.verdict, r.checkpoint_id)
    out.print(tab)


@app.command()
def show(run_id: str = typer.Argument(..., metavar="RUN"), checkpoint: Optional[str] = typer.Option(None, "--checkpoint"),
         runs_dir: Optional[pathlib.Path] = RunsDirOpt, source: bool = typer.Option(False, "--source", help="print the candidate's source")):
    """The state at a checkpoint: stage, candidates, verdicts, timings."""
    from graph import runs as R

    try:
        st = R.state_at(R.open_run(run_id, runs_dir), checkpoint)
    except R.RunError as e:
        _fail(str(e))
    out.print(f"stage: {st.stage}; best: {st.best_id}; current: {st.current_id}; error: {st.error}")
    tab = Table()
    for c in ("id", "stage", "author", "kernels", "verified", "ms", "verdict"):
        tab.add_column(c)
    for c in st.candidates:
        v, t = st.verification(c.id), st.timing(c.id)
        tab.add_row(c.id, c.stage, c.author, str(len(c.kernels)),
                    "-" if v is None else ("yes" if v.passed else f"no: {v.reason[:60]}"),
                    "-" if t is None or t.candidate_ms is None else f"{t.candidate_ms:.4f}",
                    "-" if t is None else t.verdict)
    out.print(tab)
    if source:
        c = st.candidate(st.current_id or st.best_id)
        if c is not None:
            out.print(c.source, highlight=False, markup=False)


@app.command()
def replay(run_id: str = typer.Argument(..., metavar="RUN"), checkpoint: str = typer.Option(..., "--checkpoint"),
           runs_dir: Optional[pathlib.Path] = RunsDirOpt):
    """Re-run a run from one of its checkpoints (a new branch of its history)."""
    from graph import runs as R

    try:
        r = R.open_run(run_id, runs_dir)
        _prepare_device(r.settings.device)
        t0 = time.time()
        st = R.replay(r, checkpoint, lambda n, u: out.print(_step_line(n, u, t0), highlight=False))
    except R.RunError as e:
        _fail(str(e))
    if st.report.get("status") == "ok":
        out.print(_final_table(st.report))


@app.command()
def fork(run_id: str = typer.Argument(..., metavar="RUN"), checkpoint: str = typer.Option(..., "--checkpoint"),
         set_: List[str] = typer.Option(..., "--set", help="field=value (JSON value), repeatable"),
         runs_dir: Optional[pathlib.Path] = RunsDirOpt):
    """Change the state at a checkpoint (update_state) and continue on a new branch."""
    from graph import runs as R

    try:
        r = R.open_run(run_id, runs_dir)
        _prepare_device(r.settings.device)
        t0 = time.time()
        st = R.fork(r, checkpoint, set_, lambda n, u: out.print(_step_line(n, u, t0), highlight=False))
    except R.RunError as e:
        _fail(str(e))
    except Exception as e:  # noqa: BLE001 - invalid values for the state schema
        _fail(f"fork failed: {type(e).__name__}: {str(e).splitlines()[0]}")
    if st.report.get("status") == "ok":
        out.print(_final_table(st.report))


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
            rep_ms: float = typer.Option(200.0, "--rep-ms")):
    """Time eager, torch.compile (and a candidate) in one process; roofline and bound."""
    from harness import profile as P
    from harness.hardware import detect
    from harness import roofline
    from harness.problem import ProblemError, check_candidate_file, describe_problem

    dev = _prepare_device(device)
    try:
        prob, spec = describe_problem(problem)
        if candidate:
            check_candidate_file(candidate)
    except ProblemError as e:
        _fail(str(e))
    hw = detect(dev)
    flops, nbytes, dt = roofline.count(prob)
    floor, bound = roofline.floor_ms(flops, nbytes, dt, hw.peak_tflops, hw.mem_bandwidth_gbs)
    try:
        s = P.ProfileSession(spec.path, dev, rep_ms)
        base = s.baselines()
        cand = s.time_candidate(str(pathlib.Path(candidate).resolve())) if candidate else None
        s.close()
    except P.ProfileError as e:
        _fail(str(e), 1)
    tab = Table(title=f"{spec.name} on {hw.name}" + (" (interpreter timings)" if hw.interpreter else ""))
    for c in ("what", "median ms", "p20 ms", "p80 ms", "vs eager", "roofline %"):
        tab.add_column(c)
    eager = base["eager"]["median_ms"]
    rows = [("eager", base["eager"])]
    if "compile" in base and "median_ms" in base["compile"]:
        rows.append((f"torch.compile (compile {base['compile'].get('compile_s')} s)", base["compile"]))
    elif "compile" in base:
        out.print(base["compile"].get("error", ""))
    if cand:
        rows.append(("candidate", cand))
    for name, r in rows:
        sp = "-" if hw.interpreter else f"{eager / r['median_ms']:.2f}x"
        rf = "-" if floor is None or hw.interpreter else f"{100 * floor / r['median_ms']:.1f}"
        tab.add_row(name, f"{r['median_ms']:.4f}", f"{r['p20_ms']:.4f}", f"{r['p80_ms']:.4f}", sp, rf)
    out.print(tab)
    out.print(f"FLOPs {flops:.3g}, compulsory bytes {nbytes:.3g}, floor "
              f"{'-' if floor is None else f'{floor:.4f} ms'} ({bound}-bound)")


@app.command()
def bench(folder: pathlib.Path, out_dir: pathlib.Path = typer.Option(pathlib.Path("bench-out"), "--out"),
          device: str = DeviceOpt, filter_: Optional[str] = typer.Option(None, "--filter", help="glob on relative paths"),
          list_file: Optional[pathlib.Path] = typer.Option(None, "--list", help="file of relative paths"),
          resume: bool = typer.Option(False, "--resume", help="skip problems already in results.jsonl"),
          policy: Optional[str] = typer.Option(None, "--policy"),
          trials: Optional[int] = typer.Option(None, "--trials")):
    """Run every problem under FOLDER through the graph; results.jsonl, report.json/.md, plot."""
    from graph import bench as B

    dev = _prepare_device(device)
    try:
        problems = B.select(folder, filter_, list_file)
    except B.BenchError as e:
        _fail(str(e))
    settings = _settings(device=dev, policy=policy, trials=trials)
    rep = B.run_bench(problems, folder, out_dir, settings, resume, console=out)
    out.print(B.summary_table(rep))
    out.print(f"wrote {out_dir / 'results.jsonl'}, {out_dir / 'report.json'}, {out_dir / 'report.md'}")


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
