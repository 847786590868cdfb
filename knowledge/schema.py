"""Schemas that every knowledge file is validated against when it is loaded."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator


class Principle(BaseModel):
    """An expert optimization principle: why, when, expected impact, risks."""

    id: str
    stage: Literal["plan", "algorithm", "tiling", "memory", "verify", "profile"]
    title: str
    applies_to: list[str] = Field(default_factory=list, description="op kinds or template names")
    why: str
    when: str
    impact: str
    risks: str

    def brief(self) -> str:
        return f"[{self.id}] {self.title}: {self.when.strip()} Impact: {self.impact.strip()}"


class HardwareProfile(BaseModel):
    id: str
    name: str
    match: list[str] = Field(description="substrings of the device name that select this profile")
    arch: str
    sm_count: int
    mem_bandwidth_gbs: float
    memory_gb: float
    l2_bytes: int
    smem_per_block: int = Field(description="max shared memory one block may use, bytes")
    regs_per_sm: int = 65536
    max_warps_per_sm: int = 64
    peak_tflops: dict[str, float]
    measured: dict[str, float] = Field(default_factory=dict, description="numbers measured here")
    sources: list[str]
    interpreter: bool = False


#: dtype keys of tuning tables: element types by their short names, or "any"
DTYPE_KEYS = {"fp32": "fp32", "float32": "fp32", "bf16": "bf16", "bfloat16": "bf16",
              "fp16": "fp16", "float16": "fp16", "fp64": "fp64", "float64": "fp64",
              "fp8": "fp8", "any": "any"}


def dtype_key(dtype: str | None) -> str:
    """The tuning-table key of a dtype name ('bfloat16', 'torch.bfloat16', 'bf16' -> 'bf16')."""
    if not dtype:
        return "any"
    d = str(dtype).replace("torch.", "").lower()
    return DTYPE_KEYS.get(d, d)


class ConfigSpace(BaseModel):
    """Candidate launch parameters for one template on one architecture and element type.

    ``params`` lists the values the tiler may try per parameter; ``default`` must be a point of
    the space. Parameters a kernel has that the space does not name keep the heuristic's value.
    """

    template: str
    arch: str = Field(description="sm_90, sm_80, sm_89, ... or 'any'")
    dtype: str = Field("any", description="element type of the streamed input: fp32, bf16, fp16 or any")
    params: dict[str, list[int]]
    default: dict[str, int]
    source: str = Field(description="where these ranges came from")

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, v: str) -> str:
        k = dtype_key(v)
        if k not in set(DTYPE_KEYS.values()):
            raise ValueError(f"unknown dtype {v!r} (fp32, bf16, fp16, fp64, fp8 or any)")
        return k

    @model_validator(mode="after")
    def _default_in_space(self) -> "ConfigSpace":
        for name, vals in self.params.items():
            if not vals:
                raise ValueError(f"{self.template}/{self.arch}/{self.dtype}: {name} has no values")
            if sorted(set(vals)) != list(vals):
                raise ValueError(f"{self.template}/{self.arch}/{self.dtype}: {name} values must "
                                 "be increasing and distinct")
        for name, v in self.default.items():
            if name in self.params and v not in self.params[name]:
                raise ValueError(f"{self.template}/{self.arch}/{self.dtype}: default {name}={v} "
                                 f"is not in {self.params[name]}")
        return self

    def size(self) -> int:
        n = 1
        for vals in self.params.values():
            n *= len(vals)
        return n


class TemplateInfo(BaseModel):
    name: str
    kind: str
    tunables: dict[str, list[int]]
    defaults: dict[str, int]
    principle_ids: list[str]
    description: str
