"""nodes/verifier.py: the verification record it files, and its "declares Triton kernels but
launched none" flag (a kernel candidate whose forward runs plain torch is verified, but it is
not what it claims to be)."""
import importlib
from types import SimpleNamespace

import pytest

from state import Candidate, EggState, HardwareInfo, ProblemSpec, Settings

ver_mod = importlib.import_module("nodes.verifier")
FLAG = "declares Triton kernels but launched none"

PROBLEM = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0


def get_inputs():
    return [torch.randn(8, 33)]


def get_init_inputs():
    return []
"""
#: a kernel is defined (and named in the candidate record), but forward never launches it
NO_LAUNCH = """import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _egg_k_g0(X, Y, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    tl.store(Y + offs, tl.maximum(tl.load(X + offs, mask=m), 0.0) * 2.0, mask=m)


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0
"""
#: the same kernel, launched
LAUNCH = NO_LAUNCH.replace("        return torch.relu(x) * 2.0\n", """        x = x.contiguous()
        y = torch.empty_like(x)
        _egg_k_g0[(triton.cdiv(x.numel(), 512),)](x, y, x.numel(), BLOCK=512)
        return y
""")


def _state(tmp_path, source: str, kernels: list[str]) -> EggState:
    prob = tmp_path / "p.py"
    prob.write_text(PROBLEM)
    return EggState(
        problem_path=str(prob),
        problem=ProblemSpec(path=str(prob), name="p", source=PROBLEM, sha256="ab" * 32),
        hardware=HardwareInfo(device="cpu", name="cpu", profile_id="cpu-interpreter", interpreter=True),
        candidates=[Candidate(id="c0", stage="plan", author="planner", source="# c0", fallback=True),
                    Candidate(id="c1", stage="algorithm", author="algorithm_designer", source=source,
                              kernels=kernels)],
        stage="algorithm", best_id="c0", current_id="c1")


def _runtime(tmp_path):
    return SimpleNamespace(context=Settings(run_dir=str(tmp_path / "run"), device="cpu", trials=2))


@pytest.mark.parametrize("passed, kernels, launches, flagged", [
    (True, ["_egg_k_g0"], 0, True),   # claims a kernel, ran none
    (True, ["_egg_k_g0"], 3, False),  # its kernel ran
    (True, [], 0, False),             # the reference fallback claims none
    (False, ["_egg_k_g0"], 0, False),  # a rejected candidate: the rejection says it all
])
def test_launch_flag_from_the_verdict(passed, kernels, launches, flagged, tmp_path, monkeypatch):
    verdict = {"passed": passed, "reason": "" if passed else "trial 1: output 0: mismatch",
               "category": "" if passed else "mismatch", "trials": 2, "device": "cpu",
               "checks": ["static", "parameters"], "outputs": [], "flags": ["f0"], "launches": launches,
               "wall_s": 1.5}
    monkeypatch.setattr(ver_mod, "verify", lambda *a, **k: verdict)
    out = ver_mod.verifier(_state(tmp_path, "# c1", kernels), _runtime(tmp_path))
    (rec,) = out["verifications"]
    assert rec.candidate_id == "c1" and rec.passed is passed and rec.trials == 2
    assert rec.flags == (["f0", FLAG] if flagged else ["f0"])
    assert ("stage_context" in out) is (not passed)


def test_a_candidate_that_launches_no_kernel_is_flagged(tmp_path):
    """Through the real verifier (both at once): right answers from plain torch pass with 0
    launches counted and are flagged; the same kernel launched is not."""
    import concurrent.futures as cf

    assert LAUNCH != NO_LAUNCH

    def node(name, src):
        d = tmp_path / name
        d.mkdir()
        return ver_mod.verifier(_state(d, src, ["_egg_k_g0"]), _runtime(d))["verifications"][0]

    with cf.ThreadPoolExecutor(2) as pool:
        quiet, honest = pool.map(node, ("quiet", "honest"), (NO_LAUNCH, LAUNCH))
    assert quiet.passed and honest.passed, (quiet.reason, honest.reason)
    assert FLAG in quiet.flags and FLAG not in honest.flags


def test_a_verification_says_where_its_seconds_went(tmp_path):
    """The verdict's phases (judge process up, Model built, candidate process ready, state
    loaded, trials, done) are in order and add up to the whole; each trial has its seconds; the
    report renders them (on the H200 one verification took 76 s and nothing said where)."""
    from harness.verify import verify
    from nodes.reporter import _verification_seconds
    from state import TrialRecord, VerificationRecord

    (tmp_path / "p.py").write_text(PROBLEM)
    (tmp_path / "c.py").write_text("import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
                                   "    def forward(self, x):\n        return torch.relu(x) * 2.0\n")
    res = verify(str(tmp_path / "p.py"), str(tmp_path / "c.py"), device="cpu", trials=3, timeout_s=300)
    assert res["passed"], res["reason"]
    ph = res["phases"]
    order = ["judge_started", "model", "candidate_ready", "state_loaded", "trials", "done"]
    assert list(ph) == order
    assert all(ph[a] <= ph[b] for a, b in zip(order, order[1:])) and ph["judge_started"] > 0
    assert ph["candidate_ready"] - ph["model"] > 0.5  # a process start: python, torch, the sandbox
    assert all(t["s"] > 0 for t in res["trial_log"])
    assert sum(t["s"] for t in res["trial_log"]) <= ph["trials"] - ph["state_loaded"] + 0.01
    rec = VerificationRecord(candidate_id="c1", passed=True, phases=ph,
                             trial_log=[TrialRecord(**t) for t in res["trial_log"]])
    text = _verification_seconds(rec.model_dump())
    assert text.startswith(f"{ph['done']:.1f} s = ") and text.count("+") == 4 and "(trial " in text
