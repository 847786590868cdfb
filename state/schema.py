"""The one state schema of the EGG graph.

Nodes return partial updates. Lists of records are append-only (reducer: concatenation); the
per-stage contexts, attempt counters and LLM usage merge by key. Everything else is replaced.
"""
from __future__ import annotations

import operator
from typing import Annotated, Any

from pydantic import BaseModel, Field

from state import records as r


def merge_dicts(left: dict | None, right: dict | None) -> dict:
    """Reducer: merge by key, right wins."""
    out = dict(left or {})
    out.update(right or {})
    return out


class EggInput(BaseModel):
    """What a caller gives the graph: a problem file path, or the problem's source text."""

    problem_path: str = Field("", description="path of a KernelBench-format problem file")
    problem_source: str = Field(
        "", description="the problem's source text (used when no path is given, e.g. in Studio)"
    )


class EggOutput(BaseModel):
    """What a caller reads back after a run."""

    best_id: str | None = None
    report: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None


class EggState(BaseModel):
    # -- the problem and the machine
    problem_path: str = ""
    problem_source: str = ""
    problem: r.ProblemSpec | None = None
    hardware: r.HardwareInfo | None = None
    # -- stage 0: analysis and plan
    analysis: r.Analysis | None = None
    plan: r.Plan | None = None
    # -- where the run is
    stage: str = "plan"
    stage_context: Annotated[dict[str, r.StageContext], merge_dicts] = Field(default_factory=dict)
    attempts: Annotated[dict[str, int], merge_dicts] = Field(default_factory=dict)
    caps: dict[str, int] = Field(default_factory=dict, description="attempt cap per stage")
    # -- append-only history
    candidates: Annotated[list[r.Candidate], operator.add] = Field(default_factory=list)
    verifications: Annotated[list[r.VerificationRecord], operator.add] = Field(default_factory=list)
    timings: Annotated[list[r.TimingRecord], operator.add] = Field(default_factory=list)
    # -- pointers into the history
    current_id: str | None = None
    best_id: str | None = None
    # -- budget and accounting (LLM usage per role, and for the whole run under "total")
    llm_usage: Annotated[dict[str, r.LLMUsage], merge_dicts] = Field(default_factory=dict)
    started_at: float = Field(0.0, description="when the planner started the run (Unix seconds)")
    # -- outcome
    error: str | None = None
    report: dict[str, Any] = Field(default_factory=dict)

    # ---- read-only helpers (pure functions of the state) -------------------------------
    def candidate(self, cid: str | None) -> r.Candidate | None:
        for c in self.candidates:
            if c.id == cid:
                return c
        return None

    def verification(self, cid: str | None) -> r.VerificationRecord | None:
        found = None
        for v in self.verifications:
            if v.candidate_id == cid:
                found = v
        return found

    def timing(self, cid: str | None) -> r.TimingRecord | None:
        found = None
        for t in self.timings:
            if t.candidate_id == cid:
                found = t
        return found

    def products_to_try_on_library(self) -> list[str]:
        """The Triton matrix products of the current stage-1 candidate that stage 1 tries once as
        cuBLAS calls with their epilogues fused after them (principle alg-library-tail-fusion):
        - when its timing came out within noise of the best so far: a Triton product that only
          breaks even has cost about what its fused epilogue saved;
        - when it improved, but its 16-bit products' roofline floor (the plan's ``est_ms``) is at
          least ``LIBRARY_PRODUCTS_SHARE`` of its measured time: a GEMM-bound model, where the win
          came from elsewhere (a flash kernel) and cuBLAS's products may be faster than the
          template's; then only those 16-bit products.
        Empty otherwise (regressed, later stages, no products left, an LLM's own kernels)."""
        from knowledge.heuristics import LIBRARY_PRODUCTS_SHARE

        cand = self.candidate(self.current_id)
        t = self.timing(self.current_id)
        if (cand is None or cand.stage != "algorithm" or t is None or t.interpreter
                or t.verdict not in ("noise", "improved") or self.plan is None):
            return []
        built = {k.group_id for k in cand.configs if k.template != "llm"}  # the plan's own kernels
        groups = [g for g in self.plan.groups
                  if g.kind == "matmul" and g.id in built and g.id not in cand.disabled_groups]
        if t.verdict == "improved":
            # 16-bit products only: cuBLAS runs those on tensor cores as the template does, while
            # an fp32 product's cuBLAS call keeps eager's precision class (no TF32) and cannot
            # beat the template's 3xTF32 (principle alg-matmul-epilogue)
            ops = {o.name: o for o in (self.analysis.ops if self.analysis is not None else [])}
            groups = [g for g in groups if any(
                n in ops and ops[n].kind == "matmul" and ops[n].dtype in ("bfloat16", "float16")
                for n in g.nodes)]
            floor = sum(g.est_ms or 0.0 for g in groups)
            if not groups or not t.candidate_ms or floor < LIBRARY_PRODUCTS_SHARE * t.candidate_ms:
                return []
        return [g.id for g in groups]

    def context(self, stage: str) -> r.StageContext:
        return self.stage_context.get(stage) or r.StageContext(stage=stage)

    def new_candidate_id(self) -> str:
        return f"c{len(self.candidates)}"


#: every pydantic type that can appear inside a checkpoint, for the serializer's allow-list
RECORD_TYPES: list[type] = [
    EggState, r.TensorSpec, r.ProblemSpec, r.HardwareInfo, r.OpRecord, r.Analysis,
    r.FusionGroup, r.RegionRecord, r.Plan, r.KernelConfig, r.Candidate, r.OutputError, r.TrialRecord,
    r.VerificationRecord,
    r.TimingRecord, r.Attempt, r.StageContext, r.LLMUsage,
]
