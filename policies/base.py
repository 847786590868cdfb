"""The policy interface: every role node asks its policy and turns the answer into records."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from state import Analysis, EggState, KernelConfig, Plan, Settings

#: principle id of a candidate whose kernel path replays from a CUDA graph (codegen.emit graph=,
#: policies.expert.graph_choice); the tiler's variants of such a candidate are graphed too
GRAPH_PRINCIPLE = "alg-cuda-graph"


@dataclass
class Draft:
    """A candidate a policy proposes (the node assigns its id and files it)."""

    source: str
    configs: list[KernelConfig] = field(default_factory=list)
    disabled_groups: list[str] = field(default_factory=list)
    kernels: list[str] = field(default_factory=list)
    fallback: bool = False
    rationale: str = ""
    principle_ids: list[str] = field(default_factory=list)
    decisions: list[str] = field(default_factory=list)
    #: counts the stage context accumulates (e.g. the tiler's cache_hits, searched, timed)
    stats: dict[str, float] = field(default_factory=dict)


@dataclass
class Decline:
    """A policy's answer that it has nothing (more) to try in this stage, and why."""

    reason: str
    decisions: list[str] = field(default_factory=list)
    stats: dict[str, float] = field(default_factory=dict)


class Policy(Protocol):
    name: str

    def plan(self, state: EggState, settings: Settings) -> tuple[Analysis, Plan]: ...

    def design(self, state: EggState, settings: Settings) -> Draft | Decline: ...

    def tile(self, state: EggState, settings: Settings) -> Draft | Decline: ...

    def optimize_memory(self, state: EggState, settings: Settings) -> Draft | Decline: ...
