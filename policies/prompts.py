"""Prompts of the LLM policy, one builder per role.

A prompt is assembled from parts: the role's contract (system message), the problem, the
hardware profile, the plan, the knowledge principles relevant to the stage and the op kinds at
hand (``knowledge.principles_for``: selected, not all), the condensed stage context of this and
earlier stages (what was tried, what failed with the verifier's or compiler's own message, what
won), the last failure of this stage with its code, and the current best candidate's source.

Everything stays within ``settings.llm_context_tokens`` (tokens estimated as characters / 4):
parts carry a rank, and the lowest-ranked droppable items go first, oldest first - earlier
stages' history, then this stage's older attempts, then the least relevant principles, then the
style example; long sources are cut in the middle last. The contract, the problem and the last
failure's message are never dropped.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage
from pydantic import BaseModel

import knowledge
from state import Candidate, EggState, Settings, STAGES

#: the separator EGG's generated files put between the problem and the generated code
GENERATED_LINE = "# ======== EGG generated below this line ========"
#: a comment the LLM policy writes into every file it authors (how hybrid tells authors apart)
LLM_MARK = "code written by the LLM policy"

# --------------------------------------------------------------------------- style example
#: a small problem and a ModelNew for it in EGG's own style (tests/test_llm_policy.py verifies
#: that this example passes the verifier, so the model is shown working code)
STYLE_PROBLEM = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, alpha: float):
        super().__init__()
        self.alpha = alpha

    def forward(self, x, y):
        return torch.relu(x * self.alpha + y).sum(dim=-1)


def get_inputs():
    return [torch.randn(16, 1000), torch.randn(16, 1000)]


def get_init_inputs():
    return [0.5]
'''

STYLE_EXAMPLE = '''# ======== EGG generated below this line ========
import torch
import triton
import triton.language as tl

# launch parameters of every kernel, read by the wrappers: the tiler tunes these numbers
EGG_CONFIGS = {
    "_egg_k_g0": {"BLOCK_R": 1024, "num_warps": 4},
}


@triton.jit
def _egg_k_g0(X, Y, OUT, R, SX, SY, ALPHA, BLOCK_R: tl.constexpr):
    # one program per row: the elementwise prologue relu(x * alpha + y) fused into the row sum,
    # accumulated in fp32 (alg-reduction-prologue, alg-fp32-accumulate)
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK_R], dtype=tl.float32)
    for start in range(0, R, BLOCK_R):
        cols = start + tl.arange(0, BLOCK_R)
        mask = cols < R
        x = tl.load(X + row * SX + cols, mask=mask, other=0).to(tl.float32)
        y = tl.load(Y + row * SY + cols, mask=mask, other=0).to(tl.float32)
        acc += tl.where(mask, tl.maximum(x * ALPHA + y, 0.0), 0.0)
    tl.store(OUT + row, tl.sum(acc, axis=0).to(OUT.dtype.element_ty))


def _egg_g0(x, y, alpha):
    assert x.shape == y.shape, "EGG: x and y must have the same shape"
    r = x.shape[-1]
    x2 = x.contiguous().view(-1, r)
    y2 = y.contiguous().view(-1, r)
    out = torch.empty(x2.shape[0], device=x.device, dtype=x.dtype)
    cfg = EGG_CONFIGS["_egg_k_g0"]
    grid = (x2.shape[0],)
    _egg_k_g0[grid](x2, y2, out, r, x2.stride(0), y2.stride(0), alpha,
                    BLOCK_R=cfg["BLOCK_R"], num_warps=cfg["num_warps"])
    return out.view(x.shape[:-1])


class ModelNew(Model):
    # same constructor and parameters as Model (inherited); forward runs the Triton kernel
    def forward(self, x, y):
        return _egg_g0(x, y, self.alpha)
'''

# --------------------------------------------------------------------------- contracts
RULES = """Rules the verifier enforces (a candidate that breaks one is rejected):
- outputs match PyTorch eager on fresh random inputs of the problem's shapes (fp32: atol = rtol
  = 1e-4; fp16/bf16: 1e-2) or are at least as close to a float64 reference as eager is;
- compute at the reference's precision: accumulate in fp32, no TF32 or fp16 where it is fp32;
- the heavy work runs in your kernels: never call Model.forward / super().forward or the
  reference's torch ops for it (vendor-library ops the plan leaves to a library may stay);
- no caching of results across calls, no modifying inputs, no other CUDA streams, threads or
  processes, no `global` statements, no exec/eval/open, no imports of os, sys, time, inspect,
  subprocess, threading, importlib, pathlib or the EGG harness, no patching of torch or triton."""

CODE_FORMAT = """Reply format: one or two sentences on what you do and why (cite principle ids), then ONE
```python block with the code that goes BELOW the problem's source. EGG prepends the problem
file, so `Model`, `get_inputs` and `get_init_inputs` already exist: do not repeat them. Import
what you use (torch, triton, triton.language as tl). Define `class ModelNew(Model)` with the
same constructor arguments and parameters (subclass Model and keep its __init__) and a forward
with the same inputs and outputs. Put every launch parameter in a module-level dict
`EGG_CONFIGS = {"<kernel name>": {"BLOCK": 1024, "num_warps": 4, ...}}` that the wrappers read.
Kernel anatomy: pointers, then sizes, then strides, then `tl.constexpr` tunables; a host wrapper
checks shapes, allocates outputs and launches with a grid. If nothing can beat the reference,
reply `NO_CHANGE: <reason>` instead of code."""

SYSTEM = {
    "planner": """You are the planner of EGG, an expert-guided agent that turns PyTorch programs into
faster Triton kernels in two stages: (1) algorithmic structure (rewrites, fusion, one Triton
kernel per fused group) and (2) hardware-specific tuning (tiling, memory traffic). From the
problem, its captured op graph and the roofline numbers, decide: the fusion groups (each becomes
one Triton kernel; matmuls and convolutions usually stay in a vendor library as kind "library"),
the algebraic rewrites worth applying in stage 1, and one measurable goal per stage. Use only
node names of the op graph; every computing node should belong to exactly one group. Cite the
principles you follow by id.""",
    "algorithm_designer": """You are the algorithm designer of EGG (stage 1: algorithmic
structure). Following the plan and the principles, write the Triton kernels that compute the
problem's forward pass with fewer bytes moved and fewer launches than PyTorch eager, and a
KernelBench-format `ModelNew` that uses them. When a previous attempt failed, read the
verifier's or compiler's message and fix the cause.""",
    "tiler": """You are the tiler of EGG (stage 2: parallel mapping and tensor tiling). The kernels of
the best candidate are fixed; you choose their launch parameters (block sizes, num_warps,
num_stages, ...) for the target GPU. Only parameters already present in a kernel's configuration
can change; block sizes (tl.arange extents) must be powers of two. Change what the principles
and the measurements justify; set change to false to keep the current configurations. When a
previous proposal failed verification or ran slower, do not propose it again.""",
    "memory_optimizer": """You are the memory optimizer of EGG (stage 2: memory traffic). Revise the
best candidate so it moves fewer bytes or hides memory latency better on the target GPU: cache
and eviction hints on loads (eviction_policy="evict_first"/"evict_last"), contiguous vectorizable
access, software pipelining depth (num_stages in EGG_CONFIGS), fewer passes over the data, no
extra copies in the wrappers. Keep the algorithm and the results identical. When a previous
revision failed or ran slower, fix or drop that change.""",
}

INTERPRETER_NOTE = """This machine runs kernels in Triton's CPU interpreter (TRITON_INTERPRET=1): use
tl.math functions or plain formulas (libdevice functions fail), upcast bf16 to fp32 before
arithmetic, and prefer large blocks with small grids (programs run one after another)."""


# --------------------------------------------------------------------------- budgeted parts
def estimate_tokens(text: str) -> int:
    return (len(text) + 3) // 4


@dataclass
class Part:
    """A titled section. ``items`` are dropped one by one from the front (oldest first) when the
    prompt is over budget, lowest ``rank`` first; rank None: never dropped. ``cut``: the text may
    be shortened in the middle as a last resort."""

    title: str
    items: list[str] = field(default_factory=list)
    rank: int | None = None
    cut: bool = False
    keep: int = 0  # items never dropped (the newest ones)

    def render(self) -> str:
        if not self.items:
            return ""
        return f"## {self.title}\n" + "\n".join(self.items)


def render(parts: list[Part]) -> str:
    return "\n\n".join(r for p in parts if (r := p.render()))


def fit(parts: list[Part], budget_tokens: int, fixed_chars: int = 0) -> tuple[str, list[str]]:
    """Render the parts within the budget; returns the text and what was trimmed."""
    trimmed: list[str] = []
    limit = max(1, budget_tokens * 4 - fixed_chars)
    text = render(parts)
    while len(text) > limit:
        droppable = [p for p in parts if p.rank is not None and len(p.items) > p.keep]
        if not droppable:
            break
        p = min(droppable, key=lambda q: q.rank)
        p.items.pop(0)
        trimmed.append(p.title)
        text = render(parts)
    while len(text) > limit:  # last resort: cut the longest cuttable text in the middle
        cuttable = [(len(it), p, i) for p in parts if p.cut for i, it in enumerate(p.items) if len(it) > 400]
        if not cuttable:
            break
        n, p, i = max(cuttable, key=lambda t: t[0])
        excess = len(text) - limit
        keep = max(200, n - excess - 80)
        head, tail = p.items[i][: keep // 2], p.items[i][n - keep // 2:]
        p.items[i] = f"{head}\n# ... [{n - keep} characters cut to fit the context budget] ...\n{tail}"
        trimmed.append(f"{p.title} (cut)")
        text = render(parts)
    return text, trimmed


# --------------------------------------------------------------------------- content
def hardware_text(state: EggState) -> str:
    hw = state.hardware
    if hw is None:
        return "unknown"
    bits = [f"{hw.name} ({hw.device}, profile {hw.profile_id}, arch {hw.arch or '-'})"]
    if hw.sm_count:
        bits.append(f"{hw.sm_count} SMs")
    if hw.mem_bandwidth_gbs:
        bits.append(f"memory bandwidth {hw.mem_bandwidth_gbs:g} GB/s")
    if hw.peak_tflops:
        bits.append("peak TFLOP/s " + ", ".join(f"{k} {v:g}" for k, v in hw.peak_tflops.items()))
    if hw.smem_per_block:
        bits.append(f"shared memory per block {hw.smem_per_block} B")
    if hw.l2_bytes:
        bits.append(f"L2 {hw.l2_bytes / 2**20:.0f} MiB")
    text = "; ".join(bits)
    return text + ("\n" + INTERPRETER_NOTE if hw.interpreter else "")


def op_kinds(state: EggState) -> list[str]:
    kinds: set[str] = set()
    if state.plan:
        kinds |= {g.kind for g in state.plan.groups}
    if state.analysis:
        kinds |= {o.kind for o in state.analysis.ops if o.kind not in ("io", "view")}
    return sorted(kinds)


def principle_items(stage: str, kinds: list[str], prefer: list[str] | None = None) -> list[str]:
    """The principles of a stage for these op kinds, least relevant first (dropped first):
    general ones, then those matching fewer kinds, then those the plan cites."""
    prefer = set(prefer or [])
    ps = knowledge.principles_for(stage, kinds)

    def relevance(p) -> tuple:
        return (p.id in prefer, len(set(p.applies_to) & set(kinds)), p.id)

    out = []
    for p in sorted(ps, key=relevance):
        out.append(f"- [{p.id}] {p.title}. When: {_one_line(p.when)} Impact: {_one_line(p.impact)} "
                   f"Risks: {_one_line(p.risks)}")
    return out


def _one_line(s: str) -> str:
    return " ".join(s.split())


def analysis_items(state: EggState) -> list[str]:
    a = state.analysis
    if a is None:
        return []
    floor = f"{a.floor_ms:.4g} ms" if a.floor_ms is not None else "unknown"
    out = [f"capture: {a.capture}" + (f" ({a.capture_error})" if a.capture_error else ""),
           f"FLOPs {a.flops:.3g}, compulsory bytes {a.bytes:.3g}, roofline floor {floor} ({a.bound}-bound)"]
    return out


def op_items(state: EggState) -> list[str]:
    a = state.analysis
    if a is None or not a.ops:
        return []
    rows = ["name | op | kind | shape | dtype | inputs"]
    for o in a.ops:
        rows.append(f"{o.name} | {o.target} | {o.kind} | {o.shape} | {o.dtype} | {', '.join(o.args)}")
    return rows


def plan_items(state: EggState) -> list[str]:
    p = state.plan
    if p is None:
        return ["(no plan)"]
    out = []
    for g in p.groups:
        off = ("; TURNED OFF by the plan review: keep these ops as PyTorch code"
               if g.kind != "library" and not g.enabled else "")
        out.append(f"- group {g.id} ({g.kind}{', template ' + g.template if g.template else ''}): "
                   f"nodes {', '.join(g.nodes)}; {g.reason}{off}"
                   + (f" [{', '.join(g.principle_ids)}]" if g.principle_ids else ""))
    if p.rewrites:
        out.append(f"- rewrites: {', '.join(p.rewrites)}")
    for st in STAGES:
        if p.goals.get(st):
            out.append(f"- goal of stage {st}: {p.goals[st]}")
    for n in p.notes:
        out.append(f"- note: {n}")
    return out or ["(empty plan)"]


def context_items(state: EggState, stage: str) -> list[str]:
    """Condensed history of one stage, oldest first."""
    ctx = state.stage_context.get(stage)
    if ctx is None:
        return []
    out = []
    if ctx.goal:
        out.append(f"[{stage}] goal: {ctx.goal}")
    for d in ctx.decisions:
        out.append(f"[{stage}] decision: {d}")
    for a in ctx.attempts:
        line = f"[{stage}] tried {a.candidate_id}: {a.outcome}"
        t = state.timing(a.candidate_id)
        if t is not None and t.candidate_ms is not None and not t.interpreter:
            line += f" ({t.candidate_ms:.4f} ms"
            line += f", {t.speedup_eager:.2f}x eager)" if t.speedup_eager else ")"
        if a.summary:
            line += f" - {a.summary}"
        out.append(line)
    listed = {a.candidate_id for a in ctx.attempts if a.outcome == "failed"}
    for f in ctx.failures:  # failures of attempts listed above are already there
        if f.split(":", 1)[0] not in listed:
            out.append(f"[{stage}] failure {f}")
    if ctx.finished:
        out.append(f"[{stage}] finished: {ctx.finish_reason or 'done'}; best {ctx.best_id or state.best_id}")
    elif ctx.best_id:
        out.append(f"[{stage}] best so far: {ctx.best_id}")
    return out


def generated_part(source: str, problem_source: str) -> str:
    """A candidate's code without the problem's source it starts with."""
    ps = (problem_source or "").rstrip()
    if ps and source.startswith(ps):
        return "# (the problem's source, as above)\n" + source[len(ps):].lstrip("\n")
    return source


def last_attempt(state: EggState, stage: str) -> tuple[Candidate | None, str]:
    """The stage's newest candidate and, when it failed or ran slower, the evidence."""
    mine = [c for c in state.candidates if c.stage == stage]
    if not mine:
        return None, ""
    c = mine[-1]
    v, t = state.verification(c.id), state.timing(c.id)
    if v is not None and not v.passed:
        return c, f"Candidate {c.id} FAILED verification [{v.category}]:\n{v.reason[:3000]}"
    if t is not None and t.verdict in ("regressed", "failed"):
        best = state.timing(t.compared_to) if t.compared_to else None
        ms = f"{t.candidate_ms:.4f} ms" if t.candidate_ms is not None else "-"
        vs = f" vs {best.candidate_ms:.4f} ms for {t.compared_to}" if best and best.candidate_ms else ""
        return c, f"Candidate {c.id} verified but {t.verdict}: {ms}{vs}. {t.note}".strip()
    return c, ""


def best_items(state: EggState, header: str = "") -> list[str]:
    best = state.candidate(state.best_id)
    if best is None:
        return []
    t = state.timing(best.id)
    about = f"{best.id} (stage {best.stage})"
    if best.fallback:
        about += ": the reference itself wrapped as ModelNew (no kernel yet)"
    if t is not None and t.candidate_ms is not None and not t.interpreter:
        about += f"; {t.candidate_ms:.4f} ms, eager {t.eager_ms or 0:.4f} ms"
        if t.roofline_pct:
            about += f", {t.roofline_pct:.0f}% of the roofline floor"
    items = [header + about] if header else [about]
    if not best.fallback:
        items.append("```python\n" + generated_part(best.source, state.problem.source) + "\n```")
    return items


def _messages(system: str, parts: list[Part], settings: Settings) -> tuple[list[BaseMessage], list[str]]:
    text, trimmed = fit(parts, settings.llm_context_tokens, fixed_chars=len(system))
    if trimmed:
        text += f"\n\n(Context trimmed to fit the prompt budget: {', '.join(sorted(set(trimmed)))}.)"
    return [SystemMessage(system), HumanMessage(text)], trimmed


def structured_suffix(schema: type[BaseModel], settings: Settings) -> str:
    if settings.llm_structured_method == "function_calling":
        return f"\n\nAnswer by calling the {schema.__name__} tool."
    if settings.llm_structured_method == "json_schema":
        return f"\n\nAnswer with a JSON object of the {schema.__name__} schema."
    return (f"\n\nAnswer with one JSON object (no prose) that follows this JSON schema:\n"
            + json.dumps(schema.model_json_schema()))


def _problem_part(state: EggState) -> Part:
    return Part("Problem (KernelBench format)", ["```python\n" + state.problem.source.rstrip() + "\n```"],
                rank=None, cut=True)


def _history_parts(state: EggState, stage: str) -> list[Part]:
    """Earlier stages (dropped first), then this stage's history (older items dropped next)."""
    order = ["plan", *STAGES]
    earlier = [s for s in order[: order.index(stage)]] if stage in order else []
    parts = []
    items = [it for s in earlier for it in context_items(state, s)]
    if items:
        parts.append(Part("What earlier stages did", items, rank=0))
    mine = context_items(state, stage)
    if mine:
        parts.append(Part(f"This stage ({stage}) so far", mine, rank=1, keep=2))
    return parts


# --------------------------------------------------------------------------- role prompts
def plan_messages(state: EggState, settings: Settings, schema: type[BaseModel],
                  reference_plan: list[str] | None = None) -> list[BaseMessage]:
    kinds = op_kinds(state)
    parts = [
        _problem_part(state),
        Part("Target hardware", [hardware_text(state)]),
        Part("Analysis", analysis_items(state)),
        Part("Op graph (fx capture)", op_items(state) or ["(no op graph: capture failed)"], rank=4, keep=40),
        Part("Principles (planning and stage 1)",
             principle_items("plan", kinds) + principle_items("algorithm", kinds), rank=2, keep=3),
    ]
    if reference_plan:
        parts.append(Part("EGG's rule-based grouping (a reference; improve on it)", reference_plan, rank=3))
    parts.append(Part("Task", ["Propose the plan." + structured_suffix(schema, settings)]))
    return _messages(SYSTEM["planner"], parts, settings)[0]


def design_messages(state: EggState, settings: Settings) -> list[BaseMessage]:
    kinds = op_kinds(state)
    cited = [p for g in (state.plan.groups if state.plan else []) for p in g.principle_ids]
    last, evidence = last_attempt(state, "algorithm")
    parts = [
        _problem_part(state),
        Part("Target hardware", [hardware_text(state)]),
        Part("Plan", analysis_items(state) + plan_items(state), rank=5, keep=2),
        Part("Principles (stage 1)", principle_items("algorithm", kinds, cited), rank=2, keep=2),
        *_history_parts(state, "algorithm"),
    ]
    if evidence:
        parts.append(Part("Last attempt: fix this", [evidence], rank=None, cut=True))
        parts.append(Part(f"Code of {last.id} (the failed attempt)",
                          ["```python\n" + generated_part(last.source, state.problem.source) + "\n```"],
                          rank=None, cut=True))
    parts.append(Part("Current best candidate", best_items(state), rank=6, cut=True, keep=1))
    parts.append(Part("Example of EGG's style (a different problem, shown with its Model)",
                      ["```python\n" + STYLE_PROBLEM + "\n\n" + STYLE_EXAMPLE + "```"], rank=3))
    parts.append(Part("Rules", [RULES]))
    task = ("Write the stage-1 kernels and ModelNew." if not evidence else
            f"Write a corrected version: fix what made {last.id} fail, keep what was right.")
    parts.append(Part("Task", [task + "\n" + CODE_FORMAT]))
    return _messages(SYSTEM["algorithm_designer"], parts, settings)[0]


def tile_messages(state: EggState, settings: Settings, schema: type[BaseModel],
                  configs: dict[str, dict]) -> list[BaseMessage]:
    kinds = op_kinds(state)
    _last, evidence = last_attempt(state, "tiling")
    parts = [
        _problem_part(state),  # the shapes the kernels run on
        Part("Target hardware", [hardware_text(state)]),
        Part("Plan", analysis_items(state) + plan_items(state), rank=5, keep=2),
        Part("Principles (stage 2, tiling)", principle_items("tiling", kinds), rank=2, keep=2),
        *_history_parts(state, "tiling"),
    ]
    if evidence:
        parts.append(Part("Last proposal: do not repeat it", [evidence], cut=True))
    parts.append(Part("Best candidate (its kernels are fixed)", best_items(state), rank=6, cut=True, keep=2))
    parts.append(Part("Current launch configurations (kernel: parameters)",
                      [json.dumps(configs, indent=1, sort_keys=True)]))
    parts.append(Part("Task", ["Propose launch parameters per kernel." + structured_suffix(schema, settings)]))
    return _messages(SYSTEM["tiler"], parts, settings)[0]


def memory_messages(state: EggState, settings: Settings) -> list[BaseMessage]:
    kinds = op_kinds(state)
    last, evidence = last_attempt(state, "memory")
    parts = [
        _problem_part(state),
        Part("Target hardware", [hardware_text(state)]),
        Part("Plan", analysis_items(state) + plan_items(state), rank=5, keep=2),
        Part("Principles (stage 2, memory)", principle_items("memory", kinds), rank=2, keep=2),
        *_history_parts(state, "memory"),
    ]
    if evidence:
        parts.append(Part("Last revision: fix or drop it", [evidence], cut=True))
        parts.append(Part(f"Code of {last.id} (the failed revision)",
                          ["```python\n" + generated_part(last.source, state.problem.source) + "\n```"],
                          rank=4, cut=True))
    parts.append(Part("Best candidate (revise this one)", best_items(state), cut=True))
    parts.append(Part("Rules", [RULES]))
    parts.append(Part("Task", ["Revise the best candidate's memory behaviour.\n" + CODE_FORMAT]))
    return _messages(SYSTEM["memory_optimizer"], parts, settings)[0]


def retry_message(reply_text: str, error: str, structured: bool) -> HumanMessage:
    """The feedback after an unusable reply: what was wrong, and the reply itself (shortened)."""
    shown = reply_text if len(reply_text) <= 3000 else reply_text[:1500] + "\n...\n" + reply_text[-1500:]
    how = ("Answer again with the structure asked for." if structured else
           "Answer again: one ```python block defining class ModelNew (or NO_CHANGE: <reason>).")
    return HumanMessage(f"Your previous reply could not be used: {error}\n\nYour reply was:\n{shown}\n\n{how}")
