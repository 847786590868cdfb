"""Run folders and LangGraph time travel: start, resume, history, show, replay, fork.

A run is one LangGraph thread (thread id = run id) checkpointed in
``runs/<run-id>/checkpoints.sqlite``; ``settings.json`` keeps the settings so resume, replay and
fork run with the same context. Used by the CLI and from Python.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import pathlib
import re
import sqlite3
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator

from graph.build import build_graph
from graph.checkpoints import sqlite_saver
from state import EggState, Settings


class RunError(Exception):
    """A run folder or checkpoint that cannot be used (one line, CLI exit code 2)."""


def default_runs_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("EGG_RUNS_DIR", "runs"))


def new_run_id(problem_path: str) -> str:
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", pathlib.Path(problem_path).stem)[:60].lstrip(".") or "run"
    return f"{stem}-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S-%f')[:-3]}"


def check_run_id(run_id: str) -> str:
    """A run id names one folder inside the runs folder: no path separator, no '..', not hidden,
    no control characters (``--run-id ../escape`` would write outside the runs folder)."""
    seps = {"/", "\\", os.sep} | ({os.altsep} if os.altsep else set())
    if (not run_id or len(run_id) > 200 or any(c in run_id for c in seps) or ".." in run_id
            or run_id.startswith((".", "-")) or any(ord(c) < 32 for c in run_id)):
        raise RunError(f"run id {run_id!r} cannot be used: a run id is one folder name inside the "
                       "runs folder (no path separator, no '..', not starting with '.' or '-')")
    return run_id


#: checkpoint metadata key naming the branch folder (runs/ID/branches/NAME) a replay or fork
#: writes its results to; absent on the run's own line
BRANCH_KEY = "egg_branch"


@dataclass
class Run:
    id: str
    dir: pathlib.Path
    settings: Settings
    thread_id: str = ""  # the LangGraph thread: the run id, unless the folder was renamed
    branch: str = ""  # "": the run's own line; else the replay/fork branch its results go to

    @property
    def config(self) -> dict:
        return self.with_branch({"configurable": {"thread_id": self.thread_id or self.id}})

    def with_branch(self, config: dict) -> dict:
        """A LangGraph config whose checkpoints are marked as this branch's (metadata)."""
        if not self.branch:
            return config
        return {**config, "metadata": {**config.get("metadata", {}), BRANCH_KEY: self.branch}}

    @property
    def results_dir(self) -> pathlib.Path:
        """Where best.py, report.json and report.md of this line go: the run folder, or its
        branch folder (runs/ID/branches/NAME) for a replay or fork."""
        return self.dir / "branches" / self.branch if self.branch else self.dir

    def graph(self, **kw):
        return build_graph(checkpointer=sqlite_saver(self.dir / "checkpoints.sqlite"), **kw)


def is_run_dir(d: pathlib.Path) -> bool:
    return (d / "settings.json").is_file() and (d / "checkpoints.sqlite").is_file()


def _looks_like_path(ref: str) -> bool:
    seps = ("/", "\\", os.sep) + ((os.altsep,) if os.altsep else ())
    return any(c in ref for c in seps) or ref in (".", "..") or ref.startswith("~")


def resolve_run(ref: str, runs_dir: pathlib.Path | None = None) -> pathlib.Path:
    """The folder of a run named by its id (in ``runs_dir``) or by its folder's path (absolute
    or relative, e.g. the ``runs/ID`` that egg run prints), interchangeably."""
    runs_dir = pathlib.Path(runs_dir or default_runs_dir())
    tries = [] if _looks_like_path(ref) else [runs_dir / ref]
    tries.append(pathlib.Path(ref).expanduser())
    for d in tries:
        if is_run_dir(d):
            return d
    for d in tries:
        if d.is_dir():
            inside = sorted(p.name for p in d.iterdir() if is_run_dir(p))[-3:] if d.is_dir() else []
            hint = f"; it holds runs ({', '.join(inside)}): name one of them" if inside else ""
            raise RunError(f"{d} is not a run folder (no settings.json and checkpoints.sqlite){hint}")
    known = sorted((p for p in runs_dir.iterdir() if is_run_dir(p)), key=lambda p: p.stat().st_mtime)[-3:] \
        if runs_dir.is_dir() else []
    hint = f" (latest there: {', '.join(p.name for p in reversed(known))})" if known else ""
    raise RunError(f"no run {ref!r}: not a run id in {runs_dir}{hint} nor a run folder")


def _thread_id(d: pathlib.Path) -> str:
    """The run's LangGraph thread: its folder name, or the one thread of a renamed folder."""
    try:
        con = sqlite3.connect(str(d / "checkpoints.sqlite"))
        try:
            ids = [r[0] for r in con.execute("SELECT DISTINCT thread_id FROM checkpoints")]
        finally:
            con.close()
    except sqlite3.Error:
        ids = []
    return ids[0] if len(ids) == 1 and d.name not in ids else d.name


def create_run(problem_path: str, settings: Settings, runs_dir: pathlib.Path | None = None,
               run_id: str | None = None) -> Run:
    runs_dir = runs_dir or default_runs_dir()
    run_id = check_run_id(run_id) if run_id is not None else new_run_id(problem_path)
    d = runs_dir / run_id
    if (d / "checkpoints.sqlite").exists():
        raise RunError(f"run {run_id} already exists in {runs_dir} (use --resume {run_id})")
    d.mkdir(parents=True, exist_ok=True)
    settings = settings.model_copy(update={"run_dir": str(d.resolve())})
    (d / "settings.json").write_text(settings.model_dump_json(indent=2))
    (d / "problem.txt").write_text(str(pathlib.Path(problem_path).resolve()) + "\n")
    return Run(run_id, d, settings, run_id)


def open_run(ref: str, runs_dir: pathlib.Path | None = None) -> Run:
    """A run by id or by folder path, on the line of its latest checkpoint: a run whose latest
    checkpoint belongs to a replay or fork branch writes its results to that branch's folder."""
    d = resolve_run(ref, runs_dir)
    run_id = d.name
    try:
        settings = Settings(**json.loads((d / "settings.json").read_text()))
    except Exception as e:  # noqa: BLE001
        raise RunError(f"run {run_id}: settings.json is unreadable ({str(e).splitlines()[0]})") from None
    settings = settings.model_copy(update={"run_dir": str(d.resolve())})
    run = Run(run_id, d, settings, _thread_id(d))
    head = run.graph().get_state(run.config)
    branch = (head.metadata or {}).get(BRANCH_KEY) if head is not None else None
    if branch and (d / "branches" / branch).is_dir():
        run = on_branch(run, branch)
    return run


def on_branch(run: Run, branch: str) -> Run:
    """The same run, writing its results to ``runs/ID/branches/BRANCH`` ("" : the run folder)."""
    main = replace(run, branch="")
    folder = (main.dir / "branches" / branch) if branch else main.dir
    return replace(run, branch=branch, settings=run.settings.model_copy(update={"run_dir": str(folder.resolve())}))


def new_branch(run: Run, kind: str, checkpoint_id: str, **info: Any) -> Run:
    """A branch folder ``runs/ID/branches/KIND-N`` for a replay or fork from a checkpoint, with
    branch.json saying where it starts; the run folder's own best.py and reports stay as they are."""
    root = run.dir / "branches"
    root.mkdir(parents=True, exist_ok=True)
    taken = [int(m.group(1)) for p in root.iterdir() if (m := re.fullmatch(rf"{kind}-(\d+)", p.name))]
    name = f"{kind}-{max(taken, default=0) + 1}"
    (root / name).mkdir()
    row = next((r for r in history(run) if r.checkpoint_id == checkpoint_id), None)
    (root / name / "branch.json").write_text(json.dumps({
        "branch": name, "kind": kind, "run": run.id, "from_checkpoint": checkpoint_id,
        "from_step": row.step if row else None, "from_node": row.node if row else None,
        "created_at": _dt.datetime.now().isoformat(timespec="seconds"), **info}, indent=2) + "\n")
    return on_branch(run, name)


def _field(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def _head_problem(run: Run) -> Any:
    snap = run.graph().get_state(run.config)
    return (snap.values or {}).get("problem") if snap is not None else None


def problem_file(run: Run) -> str:
    """The problem file the run's line works on: the state's (a fork may change it), else
    problem.txt."""
    path = _field(_head_problem(run), "path")
    if path:
        return str(path)
    f = run.dir / "problem.txt"
    return f.read_text().strip() if f.is_file() else ""


def check_problem(run: Run, problem: str | None = None) -> None:
    """Refuse to resume a run with another problem than its own, or after its file changed."""
    own = problem_file(run)
    if problem is not None and own and pathlib.Path(problem).resolve() != pathlib.Path(own).resolve():
        raise RunError(f"run {run.id} optimizes {own}, not {problem}: leave the problem out to "
                       f"resume it (egg run --resume {run.id}), or start a new run without --resume")
    sha = _field(_head_problem(run), "sha256")
    if sha and own:
        p = pathlib.Path(own)
        if not p.is_file():
            raise RunError(f"run {run.id}: its problem file {own} no longer exists")
        if hashlib.sha256(p.read_text().encode()).hexdigest() != sha:
            raise RunError(f"run {run.id}: its problem file {own} has changed since the run started; "
                           "resuming would mix two problems: start a new run")


def run_status(run: Run) -> str:
    """``new`` (no checkpoint), ``review`` (paused for a plan review), ``finished`` (nothing is
    scheduled: the reporter has run or the run ended with an error) or ``stopped`` (resumable)."""
    snap = run.graph().get_state(run.config)
    if snap is None or (not snap.values and not snap.next):
        return "new"
    if any(isinstance(i.value, dict) and i.value.get("kind") == "plan_review" for i in snap.interrupts):
        return "review"
    return "stopped" if snap.next else "finished"


def override_settings(run: Run, updates: dict) -> Run:
    """Change some settings of an existing run (e.g. a new --base-url on resume) and save them."""
    if not updates:
        return run
    try:
        run.settings = Settings(**{**run.settings.model_dump(), **updates})
    except Exception as e:  # noqa: BLE001 - pydantic's message, one line
        raise RunError(f"bad settings: {str(e).splitlines()[0]}") from None
    own = run.settings.model_copy(update={"run_dir": str(run.dir.resolve())})  # not a branch's
    (run.dir / "settings.json").write_text(own.model_dump_json(indent=2))
    return run


def stream(run: Run, inp: Any, config: dict | None = None, graph=None,
           on_start: Callable[[str, Any], None] | None = None) -> Iterator[tuple[str, dict]]:
    """(node, update) pairs as the graph runs; ``inp`` None continues from the checkpoint, a
    ``Command(resume=...)`` answers a pending review. A pause yields ("__interrupt__",
    {"interrupts": [payload, ...]}). ``on_start(node, state)`` is called as each node starts
    (LangGraph's "tasks" stream), with the state it reads."""
    import time

    g = graph or run.graph()
    ctx = run.settings.model_copy(update={"run_started_at": time.time()})  # time_limit_s from now
    cfg = run.with_branch(config or run.config)
    for mode, ev in g.stream(inp, cfg, context=ctx, stream_mode=["updates", "tasks"]):
        if mode == "tasks":
            if on_start is not None and "input" in ev and "result" not in ev:
                on_start(ev.get("name", ""), ev.get("input"))
            continue
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
    branch: str = ""  # the replay/fork branch (runs/ID/branches/NAME) that wrote it; "": the run's own


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
            created_at=s.created_at or "", seconds=secs, on_head=ck in head,
            branch=str((s.metadata or {}).get(BRANCH_KEY) or "")))
    return rows


_STEP = re.compile(r"-1|0|[1-9][0-9]*")


def _listing(rows: list[HistoryRow], limit: int = 12) -> str:
    lines = [f"  step {r.step:>3}  {r.node:<18} {r.checkpoint_id}"
             + (f"  (branch {r.branch})" if r.branch else "") + ("" if r.on_head else "  (not on the latest line)")
             for r in rows[:limit]]
    if len(rows) > limit:
        lines.append(f"  ... and {len(rows) - limit} more")
    return "\n".join(lines)


def find_checkpoint(run: Run, ref: str) -> str:
    """A full checkpoint id from a step number (as ``egg history`` shows it: the latest line's
    checkpoint of that step, else the only one of any branch), a full id or a unique id prefix.
    An unknown or ambiguous reference is a RunError that lists the candidates."""
    ref = (ref or "").strip()
    rows = history(run)
    if not rows:
        raise RunError(f"run {run.id} has no checkpoint yet")
    if _STEP.fullmatch(ref):
        step = int(ref)
        hits = [r for r in rows if r.step == step]
        head = [r for r in hits if r.on_head]
        if len(head) == 1:
            return head[0].checkpoint_id
        if len(hits) == 1:
            return hits[0].checkpoint_id
        if hits:
            raise RunError(f"step {step} of run {run.id} is ambiguous; give a checkpoint id "
                           f"(a unique prefix is enough):\n{_listing(hits)}")
        line = [r for r in rows if r.on_head]
        raise RunError(f"run {run.id} has no step {step}; the steps of its latest line "
                       f"(egg history {run.id}):\n{_listing(line, 40)}")
    exact = [r for r in rows if r.checkpoint_id == ref]
    if exact:
        return exact[0].checkpoint_id
    hits = [r for r in rows if ref and r.checkpoint_id.startswith(ref)]
    if len(hits) == 1:
        return hits[0].checkpoint_id
    if hits:
        raise RunError(f"checkpoint {ref!r} is ambiguous in run {run.id} ({len(hits)} ids start with it); "
                       f"give more of the id, or a step number:\n{_listing(hits)}")
    line = [r for r in rows if r.on_head]
    raise RunError(f"run {run.id} has no checkpoint {ref!r} (a step number or the start of an id); "
                   f"the steps of its latest line (egg history {run.id}):\n{_listing(line, 40)}")


def checkpoint_config(run: Run, checkpoint_id: str) -> dict:
    full = find_checkpoint(run, checkpoint_id)
    for s in run.graph().get_state_history(run.config):
        if s.config["configurable"]["checkpoint_id"] == full:
            return {"configurable": dict(s.config["configurable"])}
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


def replay(run: Run, checkpoint_id: str, on_step: Callable[[str, dict], None] | None = None,
           branch: Run | None = None, on_start: Callable[[str, Any], None] | None = None) -> EggState:
    """Re-run the graph from a checkpoint: the nodes it had scheduled run again, on a new branch
    of the thread (LangGraph time travel); the old branch stays in the history. The branch's
    best.py and reports go to its branch folder (``branch``, else a new ``replay-N``), never
    over the run folder's."""
    cfg = checkpoint_config(run, checkpoint_id)
    b = branch or new_branch(run, "replay", cfg["configurable"]["checkpoint_id"])
    for node, upd in stream(b, None, cfg, on_start=on_start):
        if on_step:
            on_step(node, upd)
    return final_state(b)


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
         on_step: Callable[[str, dict], None] | None = None, branch: Run | None = None,
         on_start: Callable[[str, Any], None] | None = None) -> EggState:
    """update_state at a checkpoint (a new branch: the original stays in the history), as the
    node that made the checkpoint, then continue from there. Reducer fields merge as nodes'
    updates do: lists of records are appended to, dicts merged by key. The branch's best.py
    and reports go to its branch folder (``branch``, else a new ``fork-N``)."""
    if not assignments:
        raise RunError("fork needs at least one --set field=value")
    values = dict(parse_assignment(a) for a in assignments)
    cfg = checkpoint_config(run, checkpoint_id)
    full = cfg["configurable"]["checkpoint_id"]
    as_node = fork_as_node(run, full)
    from langgraph.errors import InvalidUpdateError

    b = branch or new_branch(run, "fork", full, set=list(assignments))
    g = b.graph()
    try:
        new_cfg = g.update_state(b.with_branch(cfg), values, as_node=as_node)
    except InvalidUpdateError as e:
        import shutil

        if branch is None:
            shutil.rmtree(b.results_dir, ignore_errors=True)
        raise RunError(f"fork at {checkpoint_id}: {e}") from None
    for node, upd in stream(b, None, new_cfg, graph=g, on_start=on_start):
        if on_step:
            on_step(node, upd)
    return final_state(b)
