"""Typed shared state of an EGG run: the records, the graph state and the run settings."""
from state.records import (  # noqa: F401
    Analysis, Attempt, Candidate, FusionGroup, RegionRecord, HardwareInfo, KernelConfig, OpRecord,
    OutputError, Plan, TrialRecord, ProblemSpec, StageContext, TensorSpec, TimingRecord, VerificationRecord,
    LLMUsage, STAGES, STAGE_NODE, NEXT_STAGE, trial_variant,
)
from state.schema import EggState, EggInput, EggOutput, RECORD_TYPES  # noqa: F401
from state.settings import Settings, run_folder  # noqa: F401
