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


@pytest.mark.parametrize("shape", [(64, 48), (3000,), (5, 7, 11), (257, 1)])
def test_random_state_moves_every_value_of_a_large_tensor(monkeypatch, shape):
    """Above EXACT_PERM_MAX elements the judge's random state shuffles by a roll and row/column
    permutations (a full randperm of a 2-layer MLP's 2 x 10^9 weights took 66 s of an 85 s
    verification on the H200): the values are the same multiset, their places change, the
    jitter stays within 0.75x-1.25x with the sign kept, and two seeds give two states."""
    import torch

    from harness import worker as W

    monkeypatch.setattr(W, "EXACT_PERM_MAX", 100)
    x = torch.arange(1, 1 + torch.Size(shape).numel(), dtype=torch.float32).reshape(shape)
    g = torch.Generator().manual_seed(1)
    y = W._shuffled(x, g)
    assert y.shape == x.shape
    assert torch.equal(torch.sort(y.reshape(-1)).values, x.reshape(-1))
    assert (y != x).float().mean() > 0.9
    lin = torch.nn.Linear(shape[-1], 40)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(lin.weight.shape))
    s1 = W.random_state(lin, torch.Generator().manual_seed(1))
    s2 = W.random_state(lin, torch.Generator().manual_seed(2))
    w = lin.weight
    assert not torch.equal(s1["weight"], s2["weight"])
    ratio = torch.sort(s1["weight"].abs().reshape(-1)).values / torch.sort(w.abs().reshape(-1)).values
    assert ratio.min() > 0.5 and ratio.max() < 1.5  # the same values up to the jitter
    assert (s1["weight"] > 0).sum() == (w > 0).sum()


SLOW_INIT = PROBLEM.replace("class Model(nn.Module):\n",
                            "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                            "        import time\n        time.sleep(6)\n\n")


def test_a_judge_past_its_deadline_reports_a_timeout_itself(tmp_path):
    """The judge counts its deadline from the caller's clock (its start-up included) and checks it
    after its own steps: a reference that takes longer to build than the whole time limit ends
    as a timeout verdict naming the step, soon after, not when the caller kills the process
    (on the H200 a 10 s verification ran 80 s past its run's budget: the bench's problem timeout)."""
    import time

    from harness.verify import KILL_GRACE_S, verify

    (tmp_path / "p.py").write_text(SLOW_INIT)
    (tmp_path / "c.py").write_text(SLOW_INIT.replace("class Model(", "class ModelNew("))
    t0 = time.time()
    res = verify(str(tmp_path / "p.py"), str(tmp_path / "c.py"), device="cpu", trials=2, timeout_s=3,
                 static=False)  # the candidate copies the sleep (the static check refuses `time`)
    wall = time.time() - t0
    assert not res["passed"] and res["category"] == "timeout", res
    assert "building the reference model" in res["reason"], res["reason"]
    assert wall < 3 + KILL_GRACE_S, wall


def test_an_output_that_is_a_view_of_an_input_crosses_as_a_copy():
    """The candidate process sends an output that lives in an input's memory (Model returning
    `qkv.split(...)[2]`) as a copy: CUDA memory received from the judge cannot be sent back
    (on the H100, workload 38's honest kernel failed every trial with torch's "Attempted to
    send CUDA tensor received from another process"). Its own memory goes as it is."""
    import torch

    from harness.candidate_proc import _storages, sendable

    x = torch.randn(4, 6)
    own = torch.randn(3)
    got = sendable(x[:, 2:], _storages([x]))
    assert torch.equal(got, x[:, 2:]) and got.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    assert sendable(own, _storages([x])).untyped_storage().data_ptr() == own.untyped_storage().data_ptr()
    assert sendable(x[:, 2:]).untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


def test_a_candidate_returning_a_view_of_its_input_is_verified(tmp_path):
    """End to end on the CPU: Model and ModelNew both return a view of the input among their
    outputs; the verdict passes (the copy changes no value the judge compares)."""
    prob = tmp_path / "split.py"
    prob.write_text(
        "import torch, torch.nn as nn\n"
        "class Model(nn.Module):\n"
        "    def forward(self, qkv):\n"
        "        q, k, v = qkv.split([8, 4, 4], dim=-1)\n"
        "        return q * 2.0, k + 1.0, v\n"
        "def get_inputs():\n    return [torch.randn(3, 5, 16)]\n"
        "def get_init_inputs():\n    return []\n")
    cand = tmp_path / "cand.py"
    cand.write_text(prob.read_text() + "\nclass ModelNew(Model):\n    pass\n")
    from harness.verify import verify

    res = verify(str(prob), str(cand), device="cpu", trials=2)
    assert res["passed"], res["reason"]
