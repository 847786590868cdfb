"""The expert policy's stage-2 decisions that need no GPU timing: every template kind gets a
memory-optimizer answer (a draft or a reasoned decline), never an exception."""
import pytest

from harness.problem import describe_problem
from policies.expert import ExpertPolicy
from state import Candidate, EggState, HardwareInfo, KernelConfig, Settings

def _state(path) -> EggState:
    _prob, spec = describe_problem(path)
    hw = HardwareInfo(device="cuda", name="NVIDIA H200", profile_id="h200", interpreter=False, sm_count=132,
                      mem_bandwidth_gbs=4800, peak_tflops={"fp32": 67})
    st = EggState(problem_path=str(path), problem=spec, hardware=hw)
    analysis, plan = ExpertPolicy().plan(st, Settings(device="cpu"))
    st = st.model_copy(update={"analysis": analysis, "plan": plan})
    draft = ExpertPolicy().design(st, Settings(device="cpu"))
    cand = Candidate(id="c1", stage="algorithm", author="algorithm_designer", source=draft.source,
                     configs=draft.configs, kernels=draft.kernels)
    return st.model_copy(update={"candidates": [cand], "best_id": "c1"})


@pytest.mark.parametrize("body", [
    "        return self.p(x * 2.0)\n",
    "        return torch.cumsum(x, dim=-1) + 1.0\n",
    "        return torch.softmax(x, dim=-1)\n",
    "        return self.ln(x)\n",
])
def test_memory_optimizer_answers_for_every_kind(body, write_problem):
    src = ("import torch\nimport torch.nn as nn\nclass Model(nn.Module):\n    def __init__(self):\n"
           "        super().__init__()\n        self.p = nn.MaxPool1d(4, 1, 2, 3)\n        self.ln = nn.LayerNorm(50)\n"
           "    def forward(self, x):\n" + body +
           "def get_inputs():\n    return [torch.randn(2, 3, 50)]\ndef get_init_inputs():\n    return []\n")
    st = _state(write_problem(src, "k"))
    res = ExpertPolicy().optimize_memory(st, Settings(device="cpu"))
    assert hasattr(res, "source") or res.reason


def test_policy_exception_ends_the_stage_not_the_run(monkeypatch, write_problem):
    """A bug inside a policy decision becomes a declined stage with the reason, and the run
    keeps its best verified candidate (seen on the H200: a KeyError in the memory optimizer
    crashed a whole run)."""
    from nodes.common import author_step

    src = ("import torch\nimport torch.nn as nn\nclass Model(nn.Module):\n    def forward(self, x):\n"
           "        return torch.relu(x)\ndef get_inputs():\n    return [torch.randn(4, 8)]\n"
           "def get_init_inputs():\n    return []\n")
    st = _state(write_problem(src, "boom"))

    def boom(self, state, settings):
        raise KeyError("r")

    monkeypatch.setattr(ExpertPolicy, "optimize_memory", boom)
    upd = author_step(st, None, "memory", lambda p: p.optimize_memory)
    ctx = upd["stage_context"]["memory"]
    assert ctx.finished and "KeyError" in ctx.finish_reason and "kept" in ctx.finish_reason
    assert upd["current_id"] is None and "candidates" not in upd


@pytest.mark.parametrize("ms,tiled,expect", [(10.5, False, "c1"), (11.5, False, None), (10.5, True, None)])
def test_tiler_starts_from_a_near_miss_when_the_reference_is_best(ms, tiled, expect):
    """A verified stage-1 kernel within 10% of the reference is still tuned (once): the search
    gained 1.14-1.20x on every large product of dev40 on the H200."""
    from state import ProblemSpec, TimingRecord, VerificationRecord

    ref = Candidate(id="c0", stage="plan", author="planner", source="x", fallback=True)
    c1 = Candidate(id="c1", stage="algorithm", author="algorithm_designer", source="x",
                   kernels=["_egg_k_g0"])
    cands = [ref, c1] + ([Candidate(id="c2", stage="tiling", author="tiler", source="x",
                                    kernels=["_egg_k_g0"])] if tiled else [])
    st = EggState(problem_path="p.py", problem=ProblemSpec(path="p.py", name="p", source="", sha256="0"),
                  candidates=cands, best_id="c0",
                  verifications=[VerificationRecord(candidate_id="c1", passed=True)],
                  timings=[TimingRecord(candidate_id="c0", device="cuda", interpreter=False,
                                        candidate_ms=10.0),
                           TimingRecord(candidate_id="c1", device="cuda", interpreter=False,
                                        candidate_ms=ms, verdict="regressed")])
    got = ExpertPolicy()._near_miss(st)
    assert (got.id if got else None) == expect
