"""Schemas that every knowledge file is validated against when it is loaded."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


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


class ConfigSpace(BaseModel):
    """Candidate launch parameters for one template on one architecture."""

    template: str
    arch: str
    params: dict[str, list[int]]
    default: dict[str, int]
    source: str = Field(description="where these ranges came from")


class TemplateInfo(BaseModel):
    name: str
    kind: str
    tunables: dict[str, list[int]]
    defaults: dict[str, int]
    principle_ids: list[str]
    description: str
