"""Run settings: the graph's context schema (``Runtime[Settings]``).

Every field has a description; a field that is not given reads the environment variable
``EGG_<FIELD NAME IN UPPER CASE>`` (for example ``EGG_POLICY=llm``), then its default.
"""
from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator


#: a verification or timing (the profiler's, the tiling search's) does not start with less than
#: this many seconds of the run's budget left (it would end past the budget); a started one is
#: cut at the budget's end
MIN_CALL_S = 10.0


class Settings(BaseModel):
    policy: Literal["expert", "llm", "hybrid"] = Field(
        "expert", description="who decides inside the role nodes: rules+search, an LLM, or both"
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="where candidates run: cuda when a GPU is present under auto"
    )
    run_dir: str = Field("", description="folder of this run (candidates/ goes there); temp if empty")
    # -- loop caps
    max_attempts_algorithm: int = Field(4, description="candidates stage 1 may make", ge=1)
    max_attempts_tiling: int = Field(3, description="candidates the tiler may make", ge=1)
    max_attempts_memory: int = Field(3, description="candidates the memory optimizer may make", ge=1)
    time_limit_s: float = Field(
        0.0, description="wall-clock budget of a run from its start, seconds: once spent, the "
        "authoring roles start nothing new (the tiler stops between kernels) and the run reports "
        "its best verified candidate; 0: no limit", ge=0)
    run_started_at: float = Field(
        0.0, description="when this invocation of the graph started (Unix seconds), set by "
        "graph.runs.stream: time_limit_s counts from it, so a resume or a replay gets the whole "
        "budget again; 0: from the planner's start (state.started_at)")
    probe_timeout_s: float = Field(
        120.0, description="wall-clock limit of the problem probe, seconds: the CLI first imports "
        "the problem and runs its forward (on meta tensors) in a child process; a problem that "
        "does not finish in time is unusable (exit code 2, no run folder); 0: no limit", ge=0)
    # -- verification
    trials: int = Field(5, description="draws of the problem's own inputs per verification; the "
                        "drop-in battery (modes, distributions, shapes) runs besides them", ge=1)
    atol_fp32: float = Field(1e-4, description="absolute tolerance for fp32 outputs")
    rtol_fp32: float = Field(1e-4, description="relative tolerance for fp32 outputs")
    atol_lowp: float = Field(1e-2, description="absolute tolerance for fp16/bf16 outputs")
    rtol_lowp: float = Field(1e-2, description="relative tolerance for fp16/bf16 outputs")
    verify_timeout_s: float = Field(
        600.0, description="wall-clock limit of one verification (loading the candidate and every trial)"
    )
    memory_limit_gb: float = Field(
        0.0, description="memory cap of the candidate process in GiB (host memory, and device memory on "
        "a GPU); 0: half the machine's RAM and half the GPU's memory; negative: no cap"
    )
    # -- timing
    timing_rep_ms: float = Field(200.0, description="time spent repeating each timed function")
    profile_timeout_s: float = Field(900.0, description="wall-clock limit of one profiling call")
    # -- stage 2 search
    search_width: int = Field(6, description="tile configs measured per kernel by the tiler")
    tile_search_share: float = Field(
        0.5, description="with a time limit: the share of the run's time left when the tiler's "
        "measured search starts that the search may spend (the roles after it and the report get "
        "the rest, and a run ends sooner); 1: the whole budget", gt=0, le=1)
    tuning_cache: str = Field(
        "", description="tuning cache file; empty: ~/.cache/egg/tuning.json; 'off': no cache")
    search_compile_check: bool = Field(
        True, description="compile the tiler's shortlist for the GPU (in parallel) before timing it")
    compile_jobs: int = Field(0, description="parallel compile-check processes; 0: the cores, at most 16", ge=0)
    compile_timeout_s: float = Field(300.0, description="wall-clock limit of one candidate's compile check")
    # -- optional review
    review: bool = Field(False, description="pause after the planner for a person to edit the plan")
    # -- LLM policy
    llm_model: str = Field("gpt-5.1", description="chat model name")
    llm_base_url: str = Field("", description="OpenAI-compatible base URL; empty: the client default")
    llm_api_key_env: str = Field(
        "OPENAI_API_KEY", description="name of the environment variable holding the API key"
    )
    llm_temperature: float = Field(0.2, description="sampling temperature")
    llm_max_tokens: int = Field(4096, description="max tokens per reply")
    llm_timeout_s: float = Field(120.0, description="request timeout")
    llm_retries: int = Field(2, description="retries of a failed request")
    llm_token_budget: int = Field(400_000, description="tokens a run may spend; 0: no limit")
    llm_price_per_1k_prompt: float = Field(0.0, description="price per 1k prompt tokens (USD)")
    llm_price_per_1k_completion: float = Field(0.0, description="price per 1k completion tokens")
    llm_replay_dir: str = Field("", description="folder of recorded exchanges to replay offline")
    llm_structured_method: Literal["function_calling", "json_schema", "json_mode"] = Field(
        "function_calling",
        description="how structured decisions are asked for: a tool call (the widest support among "
                    "OpenAI-compatible servers), a json_schema response format, or json mode")
    llm_streaming: bool = Field(
        False, description="stream replies (server-sent events): the timeout then bounds the gaps "
                           "between chunks, not the whole reply of a slow local model")
    llm_context_tokens: int = Field(
        12000, description="prompt size cap, estimated as characters / 4: the oldest and least "
                           "relevant context is trimmed first", ge=1000)

    @model_validator(mode="before")
    @classmethod
    def _env_fallback(cls, data: Any) -> Any:
        data = dict(data or {}) if not isinstance(data, BaseModel) else data.model_dump()
        for name in cls.model_fields:
            if name in data and data[name] not in (None,):
                continue
            env = os.environ.get(f"EGG_{name.upper()}")
            if env is not None and env != "":
                data[name] = env
        return data

    def time_left(self, started_at: float) -> float | None:
        """Seconds left of time_limit_s, counted from run_started_at, else from ``started_at``
        (the run's first start, from the state); None: no limit."""
        start = self.run_started_at or started_at
        if not self.time_limit_s or not start:
            return None
        import time

        return self.time_limit_s - (time.time() - start)

    def call_limit(self, started_at: float, limit: float) -> float | None:
        """The time limit of one verification or timing call: ``limit``, cut to what is left of
        the run's budget; None when less than MIN_CALL_S is left (the call would end past it)."""
        left = self.time_left(started_at)
        if left is None:
            return limit
        if left < MIN_CALL_S:
            return None
        return min(limit, left)

    def max_attempts(self, stage: str) -> int:
        return int(getattr(self, f"max_attempts_{stage}", 1))

    def resolved_device(self) -> str:
        """The concrete device: 'cuda' when asked, or under auto when a GPU is visible."""
        if self.device != "auto":
            return self.device
        return "cuda" if _cuda_visible() else "cpu"


def _cuda_visible() -> bool:
    """Whether a CUDA GPU is usable, without initializing CUDA in this process."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return False
    try:
        import torch

        return bool(torch.cuda.is_available())  # uses NVML, does not create a context
    except Exception:
        return False


def run_folder(settings: Settings, state) -> "pathlib.Path":
    """The run's folder: ``settings.run_dir``, or without one (Studio, plain invoke) a temp
    folder per problem, keyed by the problem's hash. Not created here."""
    import hashlib
    import pathlib
    import tempfile

    if settings.run_dir:
        return pathlib.Path(settings.run_dir)
    key = state.problem.sha256[:12] if state.problem else hashlib.sha256(
        (state.problem_path + state.problem_source).encode()).hexdigest()[:12]
    return pathlib.Path(tempfile.gettempdir()) / "egg-runs" / key
