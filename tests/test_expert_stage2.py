"""The expert policy's stage-2 decisions that need no GPU timing: the memory optimizer's decision
for each kind of kernel (a draft with the variant it applies, or the reasoned decline), one
draft through the verifier, never an exception."""
import pytest

from harness.problem import describe_problem
from policies.base import Decline, Draft
from policies.expert import LAYOUT_PRINCIPLE, PIPELINE_PRINCIPLE, ExpertPolicy
from state import Candidate, EggState, HardwareInfo, Settings

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


def _problem(body: str, inputs: str = "[torch.randn(2, 3, 50)]", members: str = "") -> str:
    return ("import torch\nimport torch.nn as nn\nclass Model(nn.Module):\n    def __init__(self):\n"
            "        super().__init__()\n" + (members or "        pass\n") +
            "    def forward(self, x):\n" + body +
            f"def get_inputs():\n    return {inputs}\ndef get_init_inputs():\n    return []\n")


TRIED = "every memory variant was tried"
PIPE = "software pipelining depth from loop trip counts (mem-pipelining)"
CONV = "        self.c = nn.Conv2d(3, 8, 3)\n"


@pytest.mark.parametrize("body, inputs, members, expect", [
    # templates without a pipelined loop: nothing to deepen, no convolution to lay out
    ("        return self.p(x * 2.0)\n", None, "        self.p = nn.MaxPool1d(4, 1, 2, 3)\n", TRIED),
    ("        return torch.cumsum(x, dim=-1) + 1.0\n", None, "", TRIED),
    ("        return self.ln(x)\n", None, "        self.ln = nn.LayerNorm(50)\n", TRIED),
    # a one-tile softmax already runs at the depth of its one iteration
    ("        return torch.softmax(x, dim=-1)\n", None, "", TRIED),
    # loops whose depth differs from the trip count's: one iteration (1), five tiles of a long row (3)
    ("        return torch.sum(x, dim=-1)\n", None, "", {"num_stages": 1}),
    ("        return torch.softmax(x, dim=-1)\n", "[torch.randn(4, 20000)]", "", {"num_stages": 3}),
    # a convolution: channels-last order, the pointwise tail's tiles kept
    ("        return torch.relu(self.c(x)) * 2.0\n", "[torch.randn(2, 3, 12, 12)]", CONV, "channels-last"),
], ids=["pool", "scan", "norm", "softmax-one-tile", "reduction-one-tile", "softmax-long-row", "conv"])
def test_memory_optimizer_decides_per_kernel_kind(body, inputs, members, expect, write_problem):
    """The memory optimizer's decision for each kind of kernel: a draft where a variant applies
    (the pipelining depth it sets, the layout it changes), the reasoned decline where none does;
    a second call after the variant was tried declines."""
    st = _state(write_problem(_problem(body, inputs or "[torch.randn(2, 3, 50)]", members), "k"))
    res = ExpertPolicy().optimize_memory(st, Settings(device="cpu"))
    if expect == TRIED:
        assert isinstance(res, Decline) and res.reason == TRIED, res
        return
    assert isinstance(res, Draft), res
    base = st.candidate("c1")
    if expect == "channels-last":
        assert LAYOUT_PRINCIPLE in res.principle_ids and "channels_last" in res.source
        assert [c.params for c in res.configs] == [c.params for c in base.configs]  # tiles kept
    else:
        assert res.decisions == [PIPE] and PIPELINE_PRINCIPLE in res.principle_ids
        (cfg,) = res.configs
        assert cfg.params == {**base.configs[0].params, **expect}
        assert f"num_stages={expect['num_stages']}" in res.source
    tried = Candidate(id="c2", parent_id="c1", stage="memory", author="memory_optimizer",
                      source=res.source, configs=res.configs, kernels=res.kernels,
                      principle_ids=res.principle_ids)
    again = ExpertPolicy().optimize_memory(st.model_copy(update={"candidates": st.candidates + [tried]}),
                                           Settings(device="cpu"))
    assert isinstance(again, Decline) and again.reason == TRIED, again


def test_memory_optimizer_declines_on_the_interpreter(write_problem):
    st = _state(write_problem(_problem("        return torch.sum(x, dim=-1)\n"), "interp"))
    st = st.model_copy(update={"hardware": st.hardware.model_copy(update={"interpreter": True})})
    res = ExpertPolicy().optimize_memory(st, Settings(device="cpu"))
    assert isinstance(res, Decline) and "CPU interpreter" in res.reason


def test_memory_variant_draft_verifies(write_problem, tmp_path):
    """The channels-last variant of a convolution with a fused tail passes the verifier."""
    from harness.verify import verify

    path = write_problem(_problem("        return torch.relu(self.c(x)) * 2.0\n", "[torch.randn(2, 3, 12, 12)]",
                                  CONV), "conv")
    res = ExpertPolicy().optimize_memory(_state(path), Settings(device="cpu"))
    assert isinstance(res, Draft) and LAYOUT_PRINCIPLE in res.principle_ids, res
    cand = tmp_path / "conv_memory.py"
    cand.write_text(res.source)
    ver = verify(str(path), str(cand), device="cpu", trials=2, problem_source=path.read_text())
    assert ver["passed"], ver["reason"]
    assert ver["launches"] > 0  # its Triton kernel ran


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
