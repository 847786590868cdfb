"""Run folders and LangGraph time travel: start, resume, history, show, replay, fork.

A run is one LangGraph thread (thread id = run id) checkpointed in
``runs/<run-id>/checkpoints.sqlite``; ``settings.json`` keeps the settings so resume, replay and
fork run with the same context. Used by the CLI and from Python.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import pathlib
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from graph.build import build_graph
from graph.checkpoints import sqlite_saver
from state import EggState, Settings


class RunError(Exception):
    """A run folder or checkpoint that cannot be used (one line, CLI exit code 2)."""


def default_runs_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("EGG_RUNS_DIR", "runs"))


def new_run_id(problem_path: str) -> str:
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", pathlib.Path(problem_path).stem)[:60]
    return f"{stem}-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S-%f')[:-3]}"


@dataclass
class Run:
    id: str
    dir: pathlib.Path
    settings: Settings

    @property
    def config(self) -> dict:
        return {"configurable": {"thread_id": self.id}}

    def graph(self, **kw):
        return build_graph(checkpointer=sqlite_saver(self.dir / "checkpoints.sqlite"), **kw)


def create_run(problem_path: str, settings: Settings, runs_dir: pathlib.Path | None = None,
               run_id: str | None = None) -> Run:
    runs_dir = runs_dir or default_runs_dir()
    run_id = run_id or new_run_id(problem_path)
    d = runs_dir / run_id
    if (d / "checkpoints.sqlite").exists():
        raise RunError(f"run {run_id} already exists in {runs_dir} (use --resume {run_id})")
    d.mkdir(parents=True, exist_ok=True)
    settings = settings.model_copy(update={"run_dir": str(d.resolve())})
    (d / "settings.json").write_text(settings.model_dump_json(indent=2))
    (d / "problem.txt").write_text(str(pathlib.Path(problem_path).resolve()) + "\n")
    return Run(run_id, d, settings)


def open_run(run_id: str, runs_dir: pathlib.Path | None = None) -> Run:
    runs_dir = runs_dir or default_runs_dir()
    d = runs_dir / run_id
    if not (d / "settings.json").exists() or not (d / "checkpoints.sqlite").exists():
        raise RunError(f"no run {run_id!r} in {runs_dir}")
    try:
        settings = Settings(**json.loads((d / "settings.json").read_text()))
    except Exception as e:  # noqa: BLE001
        raise RunError(f"run {run_id}: settings.json is unreadable ({e})") from None
    settings = settings.model_copy(update={"run_dir": str(d.resolve())})
    return Run(run_id, d, settings)


def override_settings(run: Run, updates: dict) -> Run:
    """Change some settings of an existing run (e.g. a new --base-url on resume) and save them."""
    if not updates:
        return run
    try:
        run.settings = Settings(**{**run.settings.model_dump(), **updates})
    except Exception as e:  # noqa: BLE001 - pydantic's message, one line
        raise RunError(f"bad settings: {str(e).splitlines()[0]}") from None
    (run.dir / "settings.json").write_text(run.settings.model_dump_json(indent=2))
    return run


def stream(run: Run, inp: Any, config: dict | None = None, graph=None) -> Iterator[tuple[str, dict]]:
    """(node, update) pairs as the graph runs; ``inp`` None continues from the checkpoint."""
    g = graph or run.graph()
    for ev in g.stream(inp, config or run.config, context=run.settings, stream_mode="updates"):
        for node, update in ev.items():
            yield node, (update or {})


def final_state(run: Run) -> EggState:
    snap = run.graph().get_state(run.config)
    return EggState.model_validate(snap.values)


@dataclass
class HistoryRow:
    step: int
    node: str
    stage: str
    candidate: str
    verdict: str
    checkpoint_id: str
    next: tuple


def history(run: Run) -> list[HistoryRow]:
    """Checkpoints oldest first; ``node`` is the node whose step produced the checkpoint."""
    snaps = list(run.graph().get_state_history(run.config))
    snaps.reverse()
    rows, prev_next = [], ("input",)
    for s in snaps:
        v = s.values or {}
        cid = v.get("current_id") or ""
        verdict = ""
        if cid:
            st = EggState.model_validate(v)
            t, ver = st.timing(cid), st.verification(cid)
            verdict = t.verdict if t else (("passed" if ver.passed else f"failed: {ver.category}")
                                           if ver else "pending")
        rows.append(HistoryRow(step=s.metadata.get("step", -1), node=",".join(prev_next) or "-",
                               stage=v.get("stage", ""), candidate=cid, verdict=verdict,
                               checkpoint_id=s.config["configurable"]["checkpoint_id"],
                               next=tuple(s.next)))
        prev_next = tuple(s.next) or ("-",)
    return rows


def checkpoint_config(run: Run, checkpoint_id: str) -> dict:
    for s in run.graph().get_state_history(run.config):
        if s.config["configurable"]["checkpoint_id"] == checkpoint_id:
            return s.config
    raise RunError(f"run {run.id} has no checkpoint {checkpoint_id!r} (see egg history {run.id})")


def state_at(run: Run, checkpoint_id: str | None = None) -> EggState:
    g = run.graph()
    cfg = checkpoint_config(run, checkpoint_id) if checkpoint_id else run.config
    return EggState.model_validate(g.get_state(cfg).values)


def replay(run: Run, checkpoint_id: str, on_step: Callable[[str, dict], None] | None = None) -> EggState:
    """Re-run the graph from a checkpoint (LangGraph time travel; a new branch of the thread)."""
    cfg = checkpoint_config(run, checkpoint_id)
    for node, upd in stream(run, None, cfg):
        if on_step:
            on_step(node, upd)
    return final_state(run)


def parse_assignment(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise RunError(f"--set wants field=value, got {text!r}")
    key, raw = text.split("=", 1)
    key = key.strip()
    if key not in EggState.model_fields:
        raise RunError(f"--set: the state has no field {key!r}")
    try:
        val = json.loads(raw)
    except json.JSONDecodeError:
        val = raw
    return key, val


def fork(run: Run, checkpoint_id: str, assignments: list[str],
         on_step: Callable[[str, dict], None] | None = None) -> EggState:
    """update_state at a checkpoint (a new branch), then continue from there."""
    cfg = checkpoint_config(run, checkpoint_id)
    values = dict(parse_assignment(a) for a in assignments)
    g = run.graph()
    snap = g.get_state(cfg)
    as_node = None  # the update is applied as if the node that made the checkpoint wrote it
    for row in history(run):
        if row.checkpoint_id == checkpoint_id and row.node not in ("input", "-", "__start__"):
            as_node = row.node.split(",")[0]
    new_cfg = g.update_state(snap.config, values, as_node=as_node)
    for node, upd in stream(run, None, new_cfg, graph=g):
        if on_step:
            on_step(node, upd)
    return final_state(run)
