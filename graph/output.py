"""What the CLI prints: consoles that fit the terminal and stay plain when piped, tables that
drop or shorten columns instead of splitting words, and the live status line.

On a terminal, tables are fitted to its width: columns with a shorter form (checkpoint ids as
their shortest unique prefix) are shortened first, then the least useful columns are dropped,
in the order each table declares; cells are never folded inside a word. When stdout is not a
terminal (a pipe, a file, a test) nothing is wrapped or cut: a table is plain text, one line per
row, columns separated by two spaces and empty cells written "-", so ``egg history RUN | grep
planner`` finds every line; no status line is drawn.
"""
from __future__ import annotations

import pathlib
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text


class EggConsole(Console):
    """A rich Console that never wraps or crops what it prints when it is not a terminal."""

    def print(self, *objects: Any, **kw: Any) -> None:  # noqa: A003 - rich's name
        if not self.is_terminal:
            kw.setdefault("soft_wrap", True)
            kw.setdefault("crop", False)
        super().print(*objects, **kw)


@dataclass
class Col:
    """One column of a fitted table.

    ``drop``: the order in which columns go when the terminal is too narrow (1 first; None:
    never); ``short``: a shorter form of the column's cells, tried before any column is dropped;
    ``prose``: free text that may wrap between words (never inside one); ``justify``: rich's."""

    name: str
    drop: int | None = None
    short: Callable[[list[str]], list[str]] | None = None
    prose: bool = False
    justify: str = "left"


#: the narrowest a prose column is squeezed to before columns are dropped for it
PROSE_MIN = 24


def _need(cols: Sequence[Col], cells: list[list[str]]) -> int:
    """Width of a table drawn with a box: each column's widest cell + 2 padding + 1 rule."""
    total = 1
    for i, c in enumerate(cols):
        w = max([cell_len(c.name)] + [cell_len(r[i]) for r in cells])
        if c.prose:
            longest_word = max([cell_len(w_) for r in cells for w_ in r[i].split()] + [cell_len(c.name)])
            w = min(w, max(PROSE_MIN, longest_word))
        total += w + 3
    return total


def fit_columns(cols: Sequence[Col], rows: Sequence[Sequence[str]], width: int) -> tuple[list[Col], list[list[str]]]:
    """The columns (and their cells) that fit ``width``: shortened forms first, then columns
    dropped in their ``drop`` order, until the table fits or only undroppable columns remain."""
    cols = list(cols)
    cells = [list(map(str, r)) for r in rows]
    for i, c in enumerate(cols):
        if _need(cols, cells) <= width:
            break
        if c.short is not None:
            short = c.short([r[i] for r in cells])
            for r, v in zip(cells, short):
                r[i] = v
    order = sorted((c.drop, i) for i, c in enumerate(cols) if c.drop is not None)
    gone: set[int] = set()
    for _, i in order:
        keep = [j for j in range(len(cols)) if j not in gone]
        if _need([cols[j] for j in keep], [[r[j] for j in keep] for r in cells]) <= width:
            break
        gone.add(i)
    keep = [j for j in range(len(cols)) if j not in gone]
    return [cols[j] for j in keep], [[r[j] for j in keep] for r in cells]


def plain_table(title: str | None, cols: Sequence[Col], rows: Sequence[Sequence[str]]) -> str:
    """A table as plain text: every column, nothing cut, nothing wrapped."""
    cells = [[(str(v) if str(v) != "" else "-").replace("\n", " ") for v in r] for r in rows]
    heads = [c.name or "-" for c in cols]
    widths = [max([cell_len(h)] + [cell_len(r[i]) for r in cells]) for i, h in enumerate(heads)]

    def line(vals: list[str]) -> str:
        out = []
        for i, v in enumerate(vals):
            last = i == len(vals) - 1
            pad = "" if last else " " * (widths[i] - cell_len(v))
            out.append(pad + v if cols[i].justify == "right" and not last else v + pad)
        return "  ".join(out).rstrip()

    lines = [title] if title else []
    lines.append(line(heads))
    lines += [line(r) for r in cells]
    return "\n".join(lines)


def rich_table(title: str | None, cols: Sequence[Col], rows: Sequence[Sequence[str]], width: int) -> Table:
    """A table fitted to ``width`` (see ``fit_columns``), cells as text (no markup)."""
    cols, cells = fit_columns(cols, rows, width)
    tab = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=True, show_edge=True)
    for c in cols:
        if c.prose:
            tab.add_column(c.name, overflow="ellipsis", no_wrap=False, justify=c.justify,
                           min_width=min(PROSE_MIN, max(cell_len(c.name), 1)))
        else:
            tab.add_column(c.name, no_wrap=True, overflow="ellipsis", justify=c.justify)
    for r in cells:
        tab.add_row(*[Text(v) for v in r])
    return tab


def print_table(console: Console, title: str | None, cols: Sequence[Col], rows: Sequence[Sequence[str]]) -> None:
    """Fitted to the terminal, or plain text when the console is not one."""
    if console.is_terminal:
        console.print(rich_table(title, cols, rows, console.width))
    else:
        console.print(Text(plain_table(title, cols, rows)), soft_wrap=True, crop=False)


def unique_prefixes(ids: list[str], least: int = 8) -> list[str]:
    """Each id cut to the shortest prefix (at least ``least`` characters) that no other id shares."""
    uniq = sorted(set(ids))
    n = least
    while n < max((len(i) for i in uniq), default=0) and len({i[:n] for i in uniq}) < len(uniq):
        n += 1
    return [i[:n] for i in ids]


# ------------------------------------------------------------------------- the status line
#: what each node is doing, for the status line (the state it reads fills in the candidate)
DOING = {
    "planner": "reading the problem: op graph, FLOPs and bytes, fusion plan",
    "review": "plan review",
    "algorithm_designer": "building a stage-1 candidate (fusion, kernels)",
    "verifier": "verifying {cand}",
    "profiler": "timing {cand}",
    "tiler": "tuning tiles (stage 2)",
    "memory_optimizer": "memory variants (stage 2)",
    "reporter": "writing best.py and the reports",
}


def step_summary(node: str, upd: dict) -> str:
    """What a finished step did, in rich markup (values escaped): candidates written, verdicts
    with their reasons, timings, a stage's end, the plan; "done" when nothing of that. The live
    run's line (egg run) and the bench's per-problem log (plain) both print it."""
    from rich.markup import escape

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
            bits.append(f"{t.candidate_id}: {escape(t.note)}")
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
    return "; ".join(bits) or "done"


def doing(node: str, state: Any) -> str:
    cand = None
    if isinstance(state, dict):
        cand = state.get("current_id")
    elif state is not None:
        cand = getattr(state, "current_id", None)
    text = DOING.get(node, node)
    return text.format(cand=cand or "the candidate")


class StatusLine:
    """A spinner with the elapsed time and what is running ("step 4 verifier: verifying c2"),
    redrawn in place below the printed lines, only on a terminal. A progress file (see
    harness.runner.report_progress) written since the current step began adds its text
    ("trial 3/8"). Use as a context manager; ``set`` changes what it says."""

    def __init__(self, console: Console, progress_file: str | pathlib.Path | None = None):
        self.console = console
        self.progress_file = str(progress_file) if progress_file else None
        self.active = console.is_terminal
        self.text = ""
        self.t0 = time.time()
        self.step_t0 = self.t0
        self._live = None
        self._spinner = Spinner("dots", text="")
        self._lock = threading.Lock()

    def set(self, text: str) -> None:
        with self._lock:
            self.text = text
            self.step_t0 = time.time()

    def render_text(self) -> str:
        from harness.runner import read_progress

        with self._lock:
            text, since = self.text, self.step_t0
        extra = read_progress(self.progress_file, since) if self.progress_file else None
        now = time.time()
        return (f"{now - self.t0:6.1f}s  {text}" + (f", {extra}" if extra else "")
                + f"  ({now - since:.0f} s)")

    def __rich__(self):
        # one line, never wrapped: a wrapped status line leaves copies of itself on the screen
        frame = self._spinner.render(time.time())
        line = Text.assemble(frame, " ", self.render_text(), no_wrap=True, overflow="ellipsis")
        line.truncate(max(self.console.width - 1, 10), overflow="ellipsis")
        return line

    def __enter__(self) -> "StatusLine":
        if self.active:
            from rich.live import Live

            self._live = Live(self, console=self.console, refresh_per_second=8, transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None
