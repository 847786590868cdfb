"""The LLM policy: every role's decision made by a chat model through langchain-openai.

Same nodes, same records, same verifier and profiler as the expert policy; only the decision
maker differs. Any OpenAI-compatible endpoint works (``settings.llm_model``,
``llm_base_url``, key from the variable named by ``llm_api_key_env``).

- planner: the facts (fx capture, FLOPs, bytes, roofline floor) come from the harness as for the
  expert; the model decides fusion groups, rewrites and stage goals (structured ``PlanProposal``).
- algorithm_designer: the model writes a complete KernelBench-format ModelNew file (code reply).
- tiler: the model proposes per-kernel launch parameters (structured ``TilingProposal``), which
  EGG applies to the best candidate (its ``EGG_CONFIGS`` dict, or by re-emitting an expert-built
  candidate with the new configurations).
- memory_optimizer: the model revises the best candidate's code for memory traffic.

A reply that does not parse (bad JSON, wrong fields, no ``class ModelNew``) is sent back with
the error, up to ``llm_retries`` times; then the role declines with the reason. Repairs need no
special path: the routers send a failed or slower candidate back to its role, and the prompt
carries the verifier's message or the timing (policies.prompts).

``hybrid``: the model proposes the plan and the stage-1 code; the expert policy tunes candidates
it can regenerate (expert-built ones) and fills in whatever the model fails to deliver: an
unusable plan or reply, a declined design, and the last stage-1 attempt when no model-written
candidate of the stage has won.

On the CPU interpreter the tiler and memory optimizer decline, as the expert's do: without GPU
timing a launch configuration cannot be judged.
"""
from __future__ import annotations

import ast
import json
import re
from typing import Callable, Literal

from langchain_core.messages import AIMessage
from pydantic import BaseModel, Field

import knowledge
from policies import prompts as PR
from policies.base import GRAPH_PRINCIPLE, Decline, Draft
from policies.llm_io import BudgetExhausted, LLMClient
from state import (Analysis, EggState, FusionGroup, KernelConfig, LLMUsage, Plan, Settings,
                   STAGE_NODE)


# --------------------------------------------------------------------------- structured outputs
class GroupProposal(BaseModel):
    """One fusion group: op-graph nodes computed together (one kernel), or a library call."""

    id: str = Field(description="short id, e.g. g0")
    kind: Literal["pointwise", "reduction", "softmax", "norm", "matmul", "conv", "library", "other"]
    nodes: list[str] = Field(description="names of op-graph nodes computed together")
    reason: str = Field(description="why these ops belong together (or stay in a library)")
    principle_ids: list[str] = Field(default_factory=list, description="ids of principles applied")


class StageGoals(BaseModel):
    algorithm: str = Field(description="goal of stage 1 (algorithmic structure)")
    tiling: str = Field(description="goal of stage 2's tiling")
    memory: str = Field(description="goal of stage 2's memory optimization")


class PlanProposal(BaseModel):
    """The planner's decision."""

    groups: list[GroupProposal] = Field(description="fusion groups and library calls")
    rewrites: list[str] = Field(default_factory=list, description="algebraic rewrites for stage 1")
    goals: StageGoals
    notes: list[str] = Field(default_factory=list, description="anything the next roles should know")


class ParamValue(BaseModel):
    name: str = Field(description="a parameter of the kernel's current configuration")
    value: int


class KernelTiling(BaseModel):
    kernel: str = Field(description="kernel name as in the current configurations")
    params: list[ParamValue] = Field(description="new values; parameters not listed keep theirs")
    reason: str = ""


class TilingProposal(BaseModel):
    """The tiler's decision."""

    change: bool = Field(description="false to keep the current configurations")
    kernels: list[KernelTiling] = Field(default_factory=list)
    rationale: str = Field("", description="why, citing principle ids")


class Unusable(Exception):
    """The model's replies could not be used within the retries."""


# --------------------------------------------------------------------------- code replies
class CodeError(ValueError):
    pass


NO_CHANGE = re.compile(r"^\s*(?:\*\*)?NO_CHANGE(?:\*\*)?\s*:?\s*(.*)", re.S)


def extract_code(reply: str) -> str:
    """The code of a reply: the last ```python block defining ModelNew (or the last block, or
    the whole reply); raises CodeError when it does not parse or defines no ModelNew."""
    blocks = re.findall(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", reply, re.S)
    if not blocks:
        m = re.search(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*)$", reply, re.S)  # unclosed fence
        blocks = [m.group(1)] if m else []
    with_model = [b for b in blocks if re.search(r"^class\s+ModelNew\b", b, re.M)]
    code = (with_model or blocks or [reply])[-1].strip("\n")
    try:
        tree = ast.parse(code)
    except SyntaxError as e:
        line = (e.text or "").strip()
        raise CodeError(f"the code does not parse: line {e.lineno}: {e.msg}"
                        + (f" ({line[:120]})" if line else "")) from None
    if not any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body):
        raise CodeError("the code defines no top-level `class ModelNew`")
    return code + "\n"


def complete_file(code: str, problem_source: str, model: str) -> str:
    """A KernelBench-format file: the problem's source, then the code (unless the code is already
    a complete file defining Model and get_inputs)."""
    tree = ast.parse(code)
    names = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    mark = f"# EGG: {PR.LLM_MARK} ({model})"
    if {"Model", "get_inputs", "get_init_inputs"} <= names:
        return mark + "\n" + code
    body = code
    if body.lstrip().startswith(PR.GENERATED_LINE):
        body = body.lstrip()[len(PR.GENERATED_LINE):].lstrip("\n")
    return f"{problem_source.rstrip()}\n\n\n{PR.GENERATED_LINE}\n{mark}\n{body}"


def jit_kernels(source: str) -> list[str]:
    """Names of the module's @triton.jit / @jit functions."""
    out = []
    for n in ast.parse(source).body:
        if isinstance(n, ast.FunctionDef):
            for d in n.decorator_list:
                d = d.func if isinstance(d, ast.Call) else d
                name = d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", "")
                if name in ("jit", "autotune", "heuristics"):
                    out.append(n.name)
                    break
    return out


def _configs_node(tree: ast.Module) -> ast.Assign | None:
    for n in tree.body:
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EGG_CONFIGS"
                                             for t in n.targets):
            return n
    return None


def egg_configs(source: str) -> dict[str, dict]:
    """The module-level EGG_CONFIGS literal of a source ({} when absent or not a literal)."""
    try:
        node = _configs_node(ast.parse(source))
        val = ast.literal_eval(node.value) if node is not None else {}
    except (SyntaxError, ValueError):
        return {}
    if not isinstance(val, dict):
        return {}
    return {str(k): dict(v) for k, v in val.items() if isinstance(v, dict)}


def replace_configs(source: str, configs: dict[str, dict]) -> str:
    tree = ast.parse(source)
    node = _configs_node(tree)
    if node is None:
        raise CodeError("no EGG_CONFIGS dict to update")
    lines = source.splitlines(keepends=True)
    body = ",\n".join(f"    {json.dumps(k)}: {json.dumps(v)}" for k, v in configs.items())
    new = f"EGG_CONFIGS = {{\n{body},\n}}\n"
    return "".join(lines[: node.lineno - 1]) + new + "".join(lines[node.end_lineno:])


def is_llm_built(c) -> bool:
    return PR.LLM_MARK in c.source


def is_expert_built(c) -> bool:
    from knowledge.templates import all_templates

    names = set(all_templates())
    return (not c.fallback and not is_llm_built(c) and bool(c.configs)
            and all(k.template in names for k in c.configs))


def cited_principles(text: str) -> list[str]:
    return sorted(pid for pid in knowledge.principles() if pid in text)


def _summary(reply: str) -> str:
    """The prose around a code reply, in one line."""
    prose = re.sub(r"```.*?(```|$)", " ", reply, flags=re.S)
    return " ".join(prose.split())[:400]


# --------------------------------------------------------------------------- the policy
class LLMPolicy:
    """The ``llm`` policy (``hybrid=True``: the ``hybrid`` policy)."""

    def __init__(self, hybrid: bool = False):
        self.hybrid = hybrid
        self.name = "hybrid" if hybrid else "llm"
        self._usage: dict[str, LLMUsage] = {}
        self._expert = None

    # -- accounting ------------------------------------------------------------
    def take_usage(self) -> dict[str, LLMUsage]:
        """Usage per role (run totals for the roles used since the last call)."""
        out, self._usage = self._usage, {}
        return out

    def _client(self, state: EggState, settings: Settings) -> LLMClient:
        return LLMClient(settings, state)

    def _done(self, client: LLMClient) -> None:
        self._usage.update(client.usage())

    @property
    def expert(self):
        if self._expert is None:
            from policies.expert import ExpertPolicy

            self._expert = ExpertPolicy()
        return self._expert

    # -- asking ------------------------------------------------------------------
    def _structured(self, client: LLMClient, role: str, messages: list, schema: type[BaseModel],
                    check: Callable[[BaseModel], list[str]]) -> BaseModel:
        msgs, last = list(messages), ""
        for _ in range(client.settings.llm_retries + 1):
            r = client.ask(role, msgs, schema)
            err = r.error
            if err is None:
                problems = check(r.parsed)
                if not problems:
                    return r.parsed
                err = "; ".join(problems)
            last = err
            msgs = list(messages) + [AIMessage(r.text[:6000] or "(empty reply)"),
                                     PR.retry_message(r.text, err, structured=True)]
        raise Unusable(f"no usable {schema.__name__} after {client.settings.llm_retries + 1} "
                       f"replies: {last[:300]}")

    def _code(self, client: LLMClient, role: str, messages: list) -> tuple[str | None, str]:
        """(code, reply text); code None when the model answers NO_CHANGE (text: its reason)."""
        msgs, last = list(messages), ""
        for _ in range(client.settings.llm_retries + 1):
            r = client.ask(role, msgs)
            m = NO_CHANGE.match(r.text)
            if m and "class ModelNew" not in r.text:
                return None, " ".join(m.group(1).split())[:400] or "no reason given"
            try:
                return extract_code(r.text), r.text
            except CodeError as e:
                last = str(e)
            msgs = list(messages) + [AIMessage(r.text[:6000] or "(empty reply)"),
                                     PR.retry_message(r.text, last, structured=False)]
        raise Unusable(f"no usable code after {client.settings.llm_retries + 1} replies: {last[:300]}")

    # -- planner -----------------------------------------------------------------
    def plan(self, state: EggState, settings: Settings) -> tuple[Analysis, Plan]:
        analysis, expert_plan = self.expert.plan(state, settings)  # the measured facts
        ready = state.model_copy(update={"analysis": analysis, "plan": None})
        known = {o.name for o in analysis.ops if o.kind != "io"}
        ref = None
        if self.hybrid:
            ref = [f"- {g.id} ({g.kind}): {', '.join(g.nodes)}; {g.reason}" for g in expert_plan.groups]
        client = self._client(state, settings)

        def check(p: PlanProposal) -> list[str]:
            out, seen = [], set()
            ids = [g.id for g in p.groups]
            if len(ids) != len(set(ids)):
                out.append("group ids must be unique")
            for g in p.groups:
                for n in g.nodes:
                    if known and n not in known:
                        out.append(f"group {g.id}: node {n!r} is not in the op graph")
                    if n in seen:
                        out.append(f"node {n!r} is in two groups")
                    seen.add(n)
            if known and len(out) > 0:
                out.append("op-graph node names: " + ", ".join(sorted(known))[:800])
            return out

        try:
            msgs = PR.plan_messages(ready, settings, PlanProposal, ref)
            prop = self._structured(client, "planner", msgs, PlanProposal, check)
        except (Unusable, BudgetExhausted) as e:
            self._done(client)
            if self.hybrid:
                expert_plan.notes.insert(0, f"the LLM's plan was unusable ({e}): the expert's plan is used")
                return analysis, expert_plan
            return analysis, Plan(
                goals={"algorithm": "kernels written from the op graph", "tiling": "launch parameters",
                       "memory": "memory traffic"},
                notes=[f"the LLM's plan was unusable ({e}): the designer works from the op graph"])
        self._done(client)
        valid = set(knowledge.principles())
        templates = {"pointwise": "pointwise", "reduction": "reduction", "softmax": "softmax"}
        plan = Plan(
            groups=[FusionGroup(id=g.id, kind="library" if g.kind in ("matmul", "conv") else g.kind,
                                template=templates.get(g.kind), nodes=g.nodes, reason=g.reason,
                                principle_ids=[p for p in g.principle_ids if p in valid])
                    for g in prop.groups],
            rewrites=prop.rewrites, goals=prop.goals.model_dump(),
            notes=[f"plan by the {self.name} policy ({settings.llm_model})"] + prop.notes)
        return analysis, plan

    # -- stage 1 -----------------------------------------------------------------
    def design(self, state: EggState, settings: Settings) -> Draft | Decline:
        if self.hybrid and self._expert_turn(state, "algorithm", settings):
            return self._expert_design(state, settings, "last attempt of the stage and no LLM "
                                                        "candidate has won it")
        client = self._client(state, settings)
        try:
            code, text = self._code(client, "algorithm_designer", PR.design_messages(state, settings))
        except (Unusable, BudgetExhausted) as e:
            self._done(client)
            return self._expert_design(state, settings, str(e)) if self.hybrid else Decline(str(e))
        self._done(client)
        if code is None:
            why = f"the LLM declined: {text}"
            return self._expert_design(state, settings, why) if self.hybrid else Decline(why)
        return self._draft(state, settings, code, text, "algorithm")

    def _draft(self, state: EggState, settings: Settings, code: str, text: str, stage: str) -> Draft:
        source = complete_file(code, state.problem.source, settings.llm_model)
        summary = _summary(text)
        cfgs = egg_configs(source)
        return Draft(
            source=source,
            configs=[KernelConfig(group_id=k, template="llm", params=v) for k, v in cfgs.items()],
            kernels=jit_kernels(source), rationale=f"{self.name}: {summary}" if summary else self.name,
            principle_ids=cited_principles(text),
            decisions=[f"{STAGE_NODE[stage]} ({self.name}): {summary[:200] or 'code written'}"])

    def _expert_turn(self, state: EggState, stage: str, settings: Settings) -> bool:
        """hybrid: the stage's last attempt goes to the expert when no LLM candidate won it."""
        n, cap = state.attempts.get(stage, 0), settings.max_attempts(stage)
        mine = [c for c in state.candidates if c.stage == stage]
        won = any(c.id == state.best_id for c in mine)
        expert_tried = any(not is_llm_built(c) for c in mine)
        return cap > 1 and n == cap - 1 and bool(mine) and not won and not expert_tried

    def _expert_design(self, state: EggState, settings: Settings, why: str) -> Draft | Decline:
        """The expert's stage-1 draft, built from its own plan and its own earlier attempts."""
        _, eplan = self.expert.plan(state, settings)
        own = [c for c in state.candidates if not is_llm_built(c)]
        clean = state.model_copy(update={"plan": eplan, "candidates": own})
        res = self.expert.design(clean, settings)
        note = f"expert fills in ({why[:200]})"
        if isinstance(res, Decline):
            return Decline(f"{note}; the expert declines too: {res.reason}", res.decisions)
        wrong, right = clean.new_candidate_id(), state.new_candidate_id()
        res.source = res.source.replace(f"# candidate {wrong} ", f"# candidate {right} ", 1)
        res.rationale = f"{note}; {res.rationale}"
        res.decisions = [note] + res.decisions
        return res

    # -- stage 2 -----------------------------------------------------------------
    def _stage2_base(self, state: EggState, what: str):
        base = state.candidate(state.best_id)
        if base is None or base.fallback or not base.kernels:
            return None, Decline(f"no Triton kernel: no {what} to choose")
        if state.hardware.interpreter:
            return None, Decline(f"CPU interpreter: no GPU timing to judge {what} by; "
                                 "the stage-1 kernels are kept")
        return base, None

    def tile(self, state: EggState, settings: Settings) -> Draft | Decline:
        base, no = self._stage2_base(state, "launch configurations")
        if no:
            return no
        if self.hybrid and is_expert_built(base):
            return self.expert.tile(state, settings)
        current = self._current_configs(base)
        if not current:
            return Decline(f"{base.id} declares no launch configurations (EGG_CONFIGS) to tune")
        client = self._client(state, settings)

        def check(p: TilingProposal) -> list[str]:
            out = []
            for k in p.kernels:
                if k.kernel not in current:
                    out.append(f"unknown kernel {k.kernel!r} (kernels: {', '.join(current)})")
                    continue
                for pv in k.params:
                    if pv.name not in current[k.kernel]:
                        out.append(f"{k.kernel}: unknown parameter {pv.name!r} "
                                   f"(parameters: {', '.join(current[k.kernel])})")
                    elif pv.value < 1:
                        out.append(f"{k.kernel}.{pv.name} must be positive")
                    elif (pv.name.upper().startswith("BLOCK") or pv.name == "num_warps") and pv.value & (pv.value - 1):
                        out.append(f"{k.kernel}.{pv.name}={pv.value} is not a power of two")
            return out

        try:
            msgs = PR.tile_messages(state, settings, TilingProposal, current)
            prop = self._structured(client, "tiler", msgs, TilingProposal, check)
        except (Unusable, BudgetExhausted) as e:
            self._done(client)
            return Decline(str(e))
        self._done(client)
        new = {k: dict(v) for k, v in current.items()}
        for k in prop.kernels:
            for pv in k.params:
                new[k.kernel][pv.name] = pv.value
        if not prop.change or new == current:
            return Decline(f"the LLM keeps the current launch configurations: {prop.rationale[:200]}")
        tried = [self._current_configs(c) for c in state.candidates if c.stage == "tiling"]
        if new in tried:
            return Decline("the LLM proposed a configuration already tried")
        changes = "; ".join(f"{k}: {current[k]} -> {new[k]}" for k in new if new[k] != current[k])
        try:
            draft = self._apply_configs(state, settings, base, new)
        except CodeError as e:
            return Decline(f"the proposal cannot be applied: {e}")
        draft.rationale = f"{self.name} tiling: {changes}. {prop.rationale}"[:600]
        draft.principle_ids = cited_principles(prop.rationale + json.dumps(prop.model_dump()))
        if GRAPH_PRINCIPLE in (base.principle_ids or []) and is_expert_built(base):
            draft.principle_ids = sorted(set(draft.principle_ids) | {GRAPH_PRINCIPLE})
        draft.decisions = [f"tiler ({self.name}): {changes}"[:300]]
        return draft

    @staticmethod
    def _current_configs(c) -> dict[str, dict]:
        if is_expert_built(c):
            return {k.group_id: dict(k.params) for k in c.configs}
        return egg_configs(c.source)

    def _apply_configs(self, state: EggState, settings: Settings, base, new: dict[str, dict]) -> Draft:
        if is_expert_built(base):  # re-emit EGG's own kernels with the new configurations
            from codegen import pipeline
            from codegen.emit import emit_model
            from harness.problem import load_problem

            prob = load_problem(state.problem.path)
            fplan, _rw, err = pipeline.analyze(prob, set(base.disabled_groups))
            if fplan is None:
                raise CodeError(f"capture failed: {err}")
            header = f"# candidate {state.new_candidate_id()} (stage tiling, launch configs by the {self.name} policy)"
            em = emit_model(prob.source, fplan, new, header,
                            graph=GRAPH_PRINCIPLE in (base.principle_ids or []))
            return Draft(source=em.source, disabled_groups=list(base.disabled_groups), kernels=em.kernels,
                         configs=[KernelConfig(group_id=i["id"], template=i["template"], params=i["config"])
                                  for i in em.groups])
        source = replace_configs(base.source, new)
        return Draft(source=source, kernels=list(base.kernels), disabled_groups=list(base.disabled_groups),
                     configs=[KernelConfig(group_id=k, template="llm", params=v) for k, v in new.items()])

    def optimize_memory(self, state: EggState, settings: Settings) -> Draft | Decline:
        best = state.candidate(state.best_id)
        if self.hybrid and (best is None or best.fallback or not best.kernels):
            # no kernel to revise: the expert's layout variant (channels-last convolutions of the
            # reference) may still apply
            return self.expert.optimize_memory(state, settings)
        base, no = self._stage2_base(state, "memory optimizations")
        if no:
            return no
        if self.hybrid and is_expert_built(base):
            return self.expert.optimize_memory(state, settings)
        client = self._client(state, settings)
        try:
            code, text = self._code(client, "memory_optimizer", PR.memory_messages(state, settings))
        except (Unusable, BudgetExhausted) as e:
            self._done(client)
            return Decline(str(e))
        self._done(client)
        if code is None:
            return Decline(f"the LLM keeps the memory behaviour: {text}")
        return self._draft(state, settings, code, text, "memory")
