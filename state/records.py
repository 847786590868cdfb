"""Records held in the shared state.

Append-only records (candidates, verifications, timings) carry the id of the candidate they
describe, so a run's story can be replayed from them. Every field is plain data that survives a
SQLite checkpoint round trip.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

Stage = Literal["plan", "algorithm", "tiling", "memory", "done"]
#: the optimization stages in order, each owned by one role node
STAGES: tuple[str, ...] = ("algorithm", "tiling", "memory")
STAGE_NODE: dict[str, str] = {
    "algorithm": "algorithm_designer",
    "tiling": "tiler",
    "memory": "memory_optimizer",
}
NEXT_STAGE: dict[str, str] = {"algorithm": "tiling", "tiling": "memory", "memory": "done"}

Verdict = Literal["baseline", "improved", "regressed", "noise", "unmeasured", "failed"]


class TensorSpec(BaseModel):
    shape: list[int]
    dtype: str  # torch dtype name without the "torch." prefix, e.g. "float32"

    @property
    def nbytes(self) -> int:
        """Bytes of a dense tensor of this shape and dtype (a dtype of unknown size: 4)."""
        n = 1
        for d in self.shape:
            n *= int(d)
        bits = "".join(c for c in self.dtype if c.isdigit())
        size = {"bool": 1, "uint8": 1, "int8": 1}.get(self.dtype, int(bits) // 8 if bits else 4)
        return n * max(1, size)


class ProblemSpec(BaseModel):
    """A KernelBench-format problem file, as loaded."""

    path: str
    name: str
    source: str
    sha256: str
    inputs: list[TensorSpec | str] = Field(
        default_factory=list, description="tensor specs; non-tensor inputs as their repr"
    )
    init_args: list[str] = Field(default_factory=list, description="repr of get_init_inputs()")
    outputs: list[TensorSpec] = Field(default_factory=list)
    n_params: int = 0


class HardwareInfo(BaseModel):
    """The machine a run targets, matched to a profile of knowledge/hardware."""

    device: Literal["cpu", "cuda"]
    name: str
    profile_id: str
    interpreter: bool = Field(description="True when kernels run in Triton's CPU interpreter")
    sm_count: int = 0
    mem_bandwidth_gbs: float = 0.0
    peak_tflops: dict[str, float] = Field(default_factory=dict)
    smem_per_block: int = 0
    l2_bytes: int = 0
    arch: str = ""
    peaks_source: str = Field("", description="where peak_tflops/mem_bandwidth_gbs come from")


class OpRecord(BaseModel):
    """One node of the captured op graph."""

    name: str
    op: str  # fx opcode
    target: str  # canonical op name, e.g. "relu", "sum", "library:Conv2d"
    kind: str  # pointwise | reduction | softmax | matmul | conv | norm | view | library | io
    shape: list[int] = Field(default_factory=list)
    dtype: str = ""
    args: list[str] = Field(default_factory=list)
    flops: float = 0.0
    bytes: float = 0.0


class RegionRecord(BaseModel):
    """One region of the captured graph: the ops between two graph breaks (docs/capture.md),
    with the planner's estimate of where eager's time goes."""

    index: int
    nodes: int = 0
    groups: list[str] = Field(default_factory=list, description="fused groups inside it")
    flops: float = 0.0
    bytes: float = 0.0
    est_ms: float | None = Field(None, description="each op at max(FLOPs/peak, bytes/bandwidth), summed")
    measured_ms: float | None = Field(
        None, description="eager's time on it, measured node by node on the device (harness.regionprof)")
    share: float | None = Field(None, description="of the whole forward's time: measured, else estimated")
    ends_with: str = Field("", description="the graph break after it (empty for the last)")


class Analysis(BaseModel):
    capture: Literal["fx", "fx-breaks", "none"] = "none"
    capture_error: str | None = None
    capture_s: float = Field(0.0, description="seconds the capture took")
    breaks: list[str] = Field(default_factory=list, description="graph breaks: where and why")
    attr_buffers: list[str] = Field(
        default_factory=list, description="plain tensor attributes registered as buffers")
    folds: list[str] = Field(default_factory=list, description="tables computed once at init")
    regions: list[RegionRecord] = Field(default_factory=list)
    ops: list[OpRecord] = Field(default_factory=list)
    flops: float = 0.0
    bytes: float = 0.0
    floor_ms: float | None = None
    bound: Literal["memory", "compute", "unknown"] = "unknown"
    compute_ms: float | None = Field(None, description="FLOPs at their peak rates (harness.roofline)")
    memory_ms: float | None = Field(None, description="compulsory bytes at the bandwidth")
    flops_by_peak: dict[str, float] = Field(
        default_factory=dict, description="FLOPs per peak-rate key (fp32, tf32, bf16, ...)")
    flops_estimated: float = Field(0.0, description="part of flops estimated, not counted")


class FusionGroup(BaseModel):
    """A set of op-graph nodes computed together: one Triton kernel or one library call."""

    id: str
    kind: str  # pointwise | reduction | softmax | library | view
    template: str | None = None  # knowledge template name when kind is a Triton kernel
    nodes: list[str] = Field(default_factory=list)
    reason: str = ""
    principle_ids: list[str] = Field(default_factory=list)
    est_bytes_saved: float = 0.0
    est_us_saved: float | None = Field(
        None, description="expected time saved (bytes at the bandwidth, plus product FLOPs moved "
                          "from the CUDA cores to 3xTF32); None without a hardware profile")
    est_ms: float | None = Field(
        None, description="eager's time on the group's ops (each at its own roofline)")
    region: int = Field(0, description="the graph region it is in")
    kernel_key: str = Field("", description="hash of its kernel text but for names (codegen.emit."
                                            "kernel_key): groups with one key share their kernels")
    enabled: bool = Field(
        True, description="False: turned off at plan review; its ops stay in PyTorch")


class Plan(BaseModel):
    groups: list[FusionGroup] = Field(default_factory=list)
    rewrites: list[str] = Field(default_factory=list, description="rewrite rule ids applied")
    goals: dict[str, str] = Field(default_factory=dict, description="goal per stage")
    notes: list[str] = Field(default_factory=list)
    reviewed: str = Field("", description="outcome of the optional plan review: approved, edited")


class KernelConfig(BaseModel):
    """Launch configuration of one kernel of a candidate (stage 2 tunes these)."""

    group_id: str
    template: str
    params: dict[str, Any] = Field(default_factory=dict)


class Candidate(BaseModel):
    id: str
    parent_id: str | None = None
    stage: str
    author: str
    source: str
    path: str | None = None
    configs: list[KernelConfig] = Field(default_factory=list)
    disabled_groups: list[str] = Field(default_factory=list)
    kernels: list[str] = Field(default_factory=list, description="Triton kernels it launches")
    fallback: bool = Field(False, description="True when the candidate is the reference wrapped")
    rationale: str = ""
    principle_ids: list[str] = Field(default_factory=list)


class OutputError(BaseModel):
    index: int
    max_abs: float = 0.0
    max_rel: float = 0.0
    eager_err_fp64: float | None = None
    cand_err_fp64: float | None = None
    passed_by: Literal["tolerance", "fp64", "none"] = "none"


class TrialRecord(BaseModel):
    """One verification trial: how the models were called and what came out (the evidence of
    what "verified" covers, docs/verifier.md)."""

    index: int
    mode: Literal["train", "eval"] = "train"
    grad: bool = Field(False, description="called with grad mode on (outputs compared detached)")
    inputs: str = Field("own", description="how the inputs were drawn: own (get_inputs()), x3, "
                        "x0.01, negated, large, partial (a few elements changed in the same buffers), "
                        "recall (new values in the same buffers)")
    shapes: list[list[int]] = Field(default_factory=list, description="tensor input shapes")
    shape_variant: str = Field("", description="empty: the problem's own shapes; else e.g. 'batch 7'")
    layout: str = Field("", description="empty: contiguous inputs; else the candidate's inputs held "
                        "the same values in another memory layout: padded (rows at an offset, as "
                        "split or a slice give) or transposed (the last two dims swapped in memory)")
    calls: int = 1
    passed: bool = True
    max_abs: float = 0.0
    note: str = ""
    s: float = Field(0.0, description="seconds the trial took in the judge (the reference's call, "
                     "the candidate's, the checks)")


def trial_variant(t: dict) -> str:
    """A trial's shapes and layout in words, for tables: 'own', 'batch 7', 'padded layout'."""
    bits = [b for b in (t.get("shape_variant"), f"{t['layout']} layout" if t.get("layout") else "") if b]
    return ", ".join(bits) or "own"


class VerificationRecord(BaseModel):
    candidate_id: str
    passed: bool
    reason: str = ""
    category: str = Field("", description="failure class: compile, runtime, mismatch, cheat, ...")
    trials: int = 0
    device: str = "cpu"
    checks: list[str] = Field(default_factory=list)
    outputs: list[OutputError] = Field(default_factory=list)
    wall_s: float = 0.0
    flags: list[str] = Field(default_factory=list)
    trial_log: list[TrialRecord] = Field(default_factory=list, description="one entry per trial")
    phases: dict[str, float] = Field(default_factory=dict, description="seconds after the verification "
                                     "started at which each step ended: judge_started (its process "
                                     "up), model (Model built), candidate_ready (the candidate's "
                                     "process started and ModelNew built), state_loaded, trials, done")
    candidate_sha256: str = Field("", description="hash of the candidate text that was verified "
                                  "(the timing judge refuses another)")
    sandbox: list[str] = Field(default_factory=list,
                               description="OS protections that held for the candidate process")


class TimingRecord(BaseModel):
    candidate_id: str
    device: str
    interpreter: bool
    candidate_ms: float | None = None
    p20_ms: float | None = None
    p80_ms: float | None = None
    eager_ms: float | None = None
    eager_p20_ms: float | None = None
    eager_p80_ms: float | None = None
    compile_ms: float | None = None
    compile_s: float | None = None
    compile_error: str | None = None
    #: does torch.compile's own output pass the precision contract against eager ("passes", or
    #: why not): the baseline we compare against, judged like a candidate (once per session)
    compile_contract: str | None = None
    speedup_eager: float | None = None
    speedup_compile: float | None = None
    roofline_pct: float | None = None
    verdict: Verdict = "unmeasured"
    compared_to: str | None = None
    note: str = ""
    flags: list[str] = Field(default_factory=list)


class Attempt(BaseModel):
    candidate_id: str
    outcome: Literal["pending", "failed", "improved", "regressed", "noise", "unmeasured"]
    summary: str = ""


class StageContext(BaseModel):
    """What the next node (or LLM) reads about a stage instead of the whole history."""

    stage: str
    goal: str = ""
    attempts: list[Attempt] = Field(default_factory=list)
    failures: list[str] = Field(default_factory=list)
    decisions: list[str] = Field(default_factory=list)
    best_id: str | None = None
    finished: bool = False
    finish_reason: str = ""
    stats: dict[str, float] = Field(
        default_factory=dict, description="counts summed over the stage's steps, e.g. the "
        "tiler's cache_hits / searched / pruned / compiled / timed")


class LLMUsage(BaseModel):
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
