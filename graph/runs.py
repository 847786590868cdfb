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
    """(node, update) pairs as the graph runs; ``inp`` None continues from the checkpoint, a
    ``Command(resume=...)`` answers a pending review. A pause yields ("__interrupt__",
    {"interrupts": [payload, ...]})."""
    import time

    g = graph or run.graph()
    ctx = run.settings.model_copy(update={"run_started_at": time.time()})  # time_limit_s from now
    for ev in g.stream(inp, config or run.config, context=ctx, stream_mode="updates"):
        for node, update in ev.items():
            if node == "__interrupt__":
                yield node, {"interrupts": [i.value for i in update]}
            else:
                yield node, (update or {})


def final_state(run: Run) -> EggState:
    snap = run.graph().get_state(run.config)
    return EggState.model_validate(snap.values)


def resume_input(run: Run) -> Any:
    """What continues a run from its last checkpoint: None, or the problem again when the run
    was killed before its first checkpoint."""
    snap = run.graph().get_state(run.config)
    if snap.values or snap.next:
        return None
    problem = (run.dir / "problem.txt")
    if not problem.exists():
        raise RunError(f"run {run.id} has no checkpoint and no problem.txt to start from")
    return {"problem_path": problem.read_text().strip()}


def pending_review(run: Run) -> dict | None:
    """The plan-review request a paused run waits on, or None."""
    snap = run.graph().get_state(run.config)
    for it in snap.interrupts:
        if isinstance(it.value, dict) and it.value.get("kind") == "plan_review":
            return it.value
    return None


def resume_review(run: Run, decision: Any,
                  on_step: Callable[[str, dict], None] | None = None) -> EggState:
    """Answer a pending plan review (see nodes.review for the decisions) and run on."""
    from langgraph.types import Command

    if pending_review(run) is None:
        raise RunError(f"run {run.id} is not waiting for a plan review")
    for node, upd in stream(run, Command(resume=decision)):
        if on_step:
            on_step(node, upd)
    return final_state(run)


# ---------------------------------------------------------------- time travel
@dataclass
class HistoryRow:
    step: int
    node: str  # what produced the checkpoint: a node, "input", "update_state" (fork), "replay"
    source: str  # LangGraph's checkpoint source: input, loop, update, fork
    stage: str
    candidate: str
    verdict: str
    checkpoint_id: str
    parent_id: str | None
    next: tuple
    created_at: str
    seconds: float | None  # time since the parent checkpoint: the producing step's duration
    on_head: bool  # on the branch that leads to the run's latest checkpoint


def _verdict(v: dict) -> tuple[str, str]:
    cid = v.get("current_id") or ""
    if not cid:
        return "", ""
    st = EggState.model_validate(v)
    t, ver = st.timing(cid), st.verification(cid)
    if t is not None:
        return cid, t.verdict
    if ver is not None:
        return cid, "passed" if ver.passed else f"failed: {ver.category}"
    return cid, "pending"


def _producer(snap, by_id: dict) -> str:
    """The node whose step wrote the checkpoint: the tasks its parent checkpoint scheduled."""
    src = snap.metadata.get("source", "")
    if src == "input":
        return "input"
    if src == "update":
        return "update_state"
    if src == "fork":
        return "replay"
    parent = by_id.get((snap.parent_config or {}).get("configurable", {}).get("checkpoint_id"))
    if parent is None:
        return "?"
    return ",".join(parent.next) or "?"


def history(run: Run) -> list[HistoryRow]:
    """Every checkpoint of the run, all branches, oldest first."""
    snaps = list(run.graph().get_state_history(run.config))  # newest first
    by_id = {s.config["configurable"]["checkpoint_id"]: s for s in snaps}
    head = set()
    cur = snaps[0] if snaps else None
    while cur is not None:
        cid = cur.config["configurable"]["checkpoint_id"]
        head.add(cid)
        cur = by_id.get((cur.parent_config or {}).get("configurable", {}).get("checkpoint_id"))
    rows = []
    for s in reversed(snaps):
        v = s.values or {}
        cid, verdict = _verdict(v)
        pid = (s.parent_config or {}).get("configurable", {}).get("checkpoint_id")
        secs = None
        if s.metadata.get("source") == "loop" and pid in by_id and s.created_at and by_id[pid].created_at:
            secs = (_dt.datetime.fromisoformat(s.created_at)
                    - _dt.datetime.fromisoformat(by_id[pid].created_at)).total_seconds()
        ck = s.config["configurable"]["checkpoint_id"]
        rows.append(HistoryRow(
            step=s.metadata.get("step", -1), node=_producer(s, by_id),
            source=s.metadata.get("source", ""), stage=v.get("stage", ""), candidate=cid,
            verdict=verdict, checkpoint_id=ck, parent_id=pid, next=tuple(s.next),
            created_at=s.created_at or "", seconds=secs, on_head=ck in head))
    return rows


def find_checkpoint(run: Run, checkpoint_id: str) -> str:
    """A full checkpoint id from a full id or a unique prefix/suffix (as history prints them)."""
    ids = [s.config["configurable"]["checkpoint_id"]
           for s in run.graph().get_state_history(run.config)]
    if checkpoint_id in ids:
        return checkpoint_id
    hits = [i for i in ids if checkpoint_id and (i.startswith(checkpoint_id) or i.endswith(checkpoint_id))]
    if len(hits) == 1:
        return hits[0]
    if hits:
        raise RunError(f"checkpoint {checkpoint_id!r} is ambiguous in run {run.id} ({len(hits)} match)")
    raise RunError(f"run {run.id} has no checkpoint {checkpoint_id!r} (see egg history {run.id})")


def checkpoint_config(run: Run, checkpoint_id: str) -> dict:
    full = find_checkpoint(run, checkpoint_id)
    for s in run.graph().get_state_history(run.config):
        if s.config["configurable"]["checkpoint_id"] == full:
            return s.config
    raise RunError(f"run {run.id} has no checkpoint {checkpoint_id!r}")  # pragma: no cover


def state_at(run: Run, checkpoint_id: str | None = None) -> EggState:
    g = run.graph()
    cfg = checkpoint_config(run, checkpoint_id) if checkpoint_id else run.config
    return EggState.model_validate(g.get_state(cfg).values)


def row_at(run: Run, checkpoint_id: str | None = None) -> HistoryRow:
    """The history row of a checkpoint (the latest one when None)."""
    rows = history(run)
    if not rows:
        raise RunError(f"run {run.id} has no checkpoint yet")
    if checkpoint_id is None:
        return max((r for r in rows if r.on_head), key=lambda r: r.checkpoint_id)
    full = find_checkpoint(run, checkpoint_id)
    return next(r for r in rows if r.checkpoint_id == full)


def replay(run: Run, checkpoint_id: str, on_step: Callable[[str, dict], None] | None = None) -> EggState:
    """Re-run the graph from a checkpoint: the nodes it had scheduled run again, on a new branch
    of the thread (LangGraph time travel); the old branch stays in the history."""
    cfg = checkpoint_config(run, checkpoint_id)
    for node, upd in stream(run, None, cfg):
        if on_step:
            on_step(node, upd)
    return final_state(run)


def parse_assignment(text: str) -> tuple[str, Any]:
    """``field=value`` (value as JSON, else a string), validated against the state's schema."""
    from pydantic import TypeAdapter, ValidationError

    if "=" not in text:
        raise RunError(f"--set wants field=value, got {text!r}")
    key, raw = text.split("=", 1)
    key = key.strip()
    field = EggState.model_fields.get(key)
    if field is None:
        raise RunError(f"--set: the state has no field {key!r} (fields: {', '.join(EggState.model_fields)})")
    try:
        val = json.loads(raw)
    except json.JSONDecodeError:
        val = raw
    try:
        val = TypeAdapter(field.annotation).validate_python(val)
    except ValidationError as e:
        msg = e.errors()[0]
        raise RunError(f"--set {key}: {msg['msg']} at {'.'.join(map(str, msg['loc'])) or key}"
                       f" (got {raw[:80]!r})") from None
    return key, val


def fork_as_node(run: Run, checkpoint_id: str) -> str | None:
    """The node an update at this checkpoint is written as: the node that produced it, so its
    router runs again on the edited state and picks what comes next."""
    rows = {r.checkpoint_id: r for r in history(run)}
    row = rows[find_checkpoint(run, checkpoint_id)]
    while row.node == "replay" and row.parent_id in rows:  # a replay's copy: as its original
        row = rows[row.parent_id]
    if row.node == "input":
        raise RunError("nothing has run at the input checkpoint: fork from step 0 or later")
    if row.node == "update_state":
        return None  # LangGraph infers it from the channel versions the nodes have seen
    if "," in row.node or row.node == "?":
        raise RunError(f"cannot tell which node made checkpoint {checkpoint_id}")
    return row.node


def fork(run: Run, checkpoint_id: str, assignments: list[str],
         on_step: Callable[[str, dict], None] | None = None) -> EggState:
    """update_state at a checkpoint (a new branch: the original stays in the history), as the
    node that made the checkpoint, then continue from there. Reducer fields merge as nodes'
    updates do: lists of records are appended to, dicts merged by key."""
    if not assignments:
        raise RunError("fork needs at least one --set field=value")
    values = dict(parse_assignment(a) for a in assignments)
    cfg = checkpoint_config(run, checkpoint_id)
    as_node = fork_as_node(run, checkpoint_id)
    from langgraph.errors import InvalidUpdateError

    g = run.graph()
    try:
        new_cfg = g.update_state(cfg, values, as_node=as_node)
    except InvalidUpdateError as e:
        raise RunError(f"fork at {checkpoint_id}: {e}") from None
    for node, upd in stream(run, None, new_cfg, graph=g):
        if on_step:
            on_step(node, upd)
    return final_state(run)
