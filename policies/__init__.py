"""Who decides inside the role nodes. ``expert`` (default): knowledge base, rules and measured
search. ``llm``: a chat model through langchain-openai. ``hybrid``: the LLM proposes, the expert
tunes and fills in."""
from __future__ import annotations

from policies.base import Draft, Policy  # noqa: F401


def get_policy(name: str) -> "Policy":
    if name == "expert":
        from policies.expert import ExpertPolicy

        return ExpertPolicy()
    if name in ("llm", "hybrid"):
        from policies.llm import LLMPolicy

        return LLMPolicy(hybrid=(name == "hybrid"))
    raise ValueError(f"unknown policy {name!r} (expert, llm or hybrid)")
