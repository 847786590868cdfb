"""graph/routers.py: every branch, driven by injected verification and timing records
(EggState objects built directly; no GPU, no worker)."""
import pytest

from graph import routers as R
from state import Candidate, EggState, TimingRecord, VerificationRecord

AUTHOR = {"algorithm": "algorithm_designer", "tiling": "tiler", "memory": "memory_optimizer"}
NEXT = {"algorithm": "tiler", "tiling": "memory_optimizer", "memory": "reporter"}
AFTER_AUTHOR = {"algorithm": R.route_after_designer, "tiling": R.route_after_tiler,
                "memory": R.route_after_memory}


def state(stage="algorithm", attempts=1, cap=3, passed=None, verdict=None, **kw) -> EggState:
    cands = [Candidate(id="c0", stage="plan", author="planner", source="", fallback=True),
             Candidate(id="c1", stage=stage, author=AUTHOR[stage], source="")]
    vers = [] if passed is None else [VerificationRecord(candidate_id="c1", passed=passed)]
    tims = [TimingRecord(candidate_id="c0", device="cuda", interpreter=False, candidate_ms=1.0,
                         verdict="baseline")]
    if verdict is not None:
        tims.append(TimingRecord(candidate_id="c1", device="cuda", interpreter=False,
                                 candidate_ms=1.0, verdict=verdict))
    fields = dict(stage=stage, candidates=cands, verifications=vers, timings=tims, current_id="c1",
                  best_id="c0", attempts={stage: attempts}, caps={stage: cap})
    return EggState(**{**fields, **kw})


def test_after_planner():
    assert R.route_after_planner(EggState()) == "review"
    assert R.route_after_planner(EggState(error="no such file")) == "reporter"
    assert R.route_after_review(EggState()) == "algorithm_designer"
    assert R.route_after_review(EggState(error="aborted by the reviewer")) == "reporter"


@pytest.mark.parametrize("stage", ["algorithm", "tiling", "memory"])
def test_after_author(stage):
    route = AFTER_AUTHOR[stage]
    assert route(state(stage)) == "verifier"  # a new, unverified candidate
    assert route(state(stage, current_id=None)) == NEXT[stage]  # the stage declined / ended
    assert route(state(stage, passed=True)) == NEXT[stage]  # nothing new since the last verdict


@pytest.mark.parametrize("stage", ["algorithm", "tiling", "memory"])
def test_after_verifier(stage):
    assert R.route_after_verifier(state(stage, passed=True)) == "profiler"
    assert R.route_after_verifier(state(stage, passed=False, attempts=1, cap=3)) == AUTHOR[stage]
    assert R.route_after_verifier(state(stage, passed=False, attempts=3, cap=3)) == NEXT[stage]


@pytest.mark.parametrize("stage", ["algorithm", "tiling", "memory"])
def test_a_reference_that_cannot_judge_ends_the_run(stage):
    """``reference``: eager is not deterministic even from one seed; every candidate would fail
    the same way (a dropout model tried four stage-1 candidates before it ended)."""
    s = state(stage, passed=False, attempts=1, cap=3)
    s.verifications[0].category = "reference"
    assert R.route_after_verifier(s) == "reporter"
    s.verifications[0].category = "problem"  # Model.forward raised on get_inputs()
    assert R.route_after_verifier(s) == "reporter"
    s.verifications[0].category = "mismatch"
    assert R.route_after_verifier(s) == AUTHOR[stage]


@pytest.mark.parametrize("stage", ["algorithm", "tiling", "memory"])
@pytest.mark.parametrize("verdict,under_cap,at_cap", [
    ("regressed", "author", "next"),   # slower beyond noise: another variant while allowed
    ("failed", "author", "next"),      # could not be timed: likewise
    ("improved", "next", "next"),      # a win moves on
    ("noise", "next", "next"),         # inside the measured spread: neither win nor loss
    ("unmeasured", "next", "next"),    # the CPU interpreter: nothing to act on
])
def test_after_profiler(stage, verdict, under_cap, at_cap):
    want = {"author": AUTHOR[stage], "next": NEXT[stage]}
    if stage == "memory" and verdict in ("improved", "noise"):
        under_cap = "author"  # independent variants: the next one (the optimizer declines at the end)
    assert R.route_after_profiler(state(stage, passed=True, verdict=verdict, attempts=1)) == want[under_cap]
    assert R.route_after_profiler(state(stage, passed=True, verdict=verdict, attempts=3)) == want[at_cap]


def test_regressions_loop_back_until_the_cap():
    """tiler -> verifier -> profiler (regressed) -> tiler ... until the cap ends the loop."""
    path = []
    for attempt in range(1, 10):
        s = state("tiling", attempts=attempt, cap=3, passed=True, verdict="regressed")
        nxt = R.route_after_profiler(s)
        path.append(nxt)
        if nxt != "tiler":
            break
    assert path == ["tiler", "tiler", "memory_optimizer"]


def test_no_timing_record_moves_on():
    assert R.route_after_profiler(state("algorithm", passed=True)) == "tiler"


def _with_products(st: EggState, configs, disabled=(), kinds=("matmul", "pointwise"),
                   est_ms=None, dtype="bfloat16") -> EggState:
    from state import Analysis, FusionGroup, KernelConfig, OpRecord, Plan

    plan = Plan(groups=[FusionGroup(id=f"g{i}", kind=k, est_ms=est_ms, nodes=[f"op{i}"])
                        for i, k in enumerate(kinds)])
    ops = [OpRecord(name=f"op{i}", op="call_function", target=k, kind=k, dtype=dtype)
           for i, k in enumerate(kinds)]
    st = st.model_copy(update={"analysis": Analysis(ops=ops)})
    c1 = st.candidates[1].model_copy(update={
        "configs": [KernelConfig(group_id=g, template=t, params={}) for g, t in configs],
        "disabled_groups": list(disabled)})
    return st.model_copy(update={"plan": plan, "candidates": [st.candidates[0], c1]})


def test_stage1_products_to_try_on_library_get_one_more_try():
    """A stage-1 candidate whose Triton matrix products broke even is tried once more with them
    as cuBLAS calls (EggState.products_to_try_on_library); not once they are backed out, not for an
    LLM's own kernels, not for a win whose products' floor is unknown, not in later stages, not at
    the cap."""
    noise = state("algorithm", passed=True, verdict="noise")
    mine = [("g0", "matmul"), ("g1", "pointwise")]
    assert _with_products(noise, mine).products_to_try_on_library() == ["g0"]
    assert R.route_after_profiler(_with_products(noise, mine)) == "algorithm_designer"
    assert R.route_after_profiler(_with_products(noise, mine, disabled=["g0"])) == "tiler"
    assert R.route_after_profiler(_with_products(noise, [("g0", "llm")])) == "tiler"
    assert R.route_after_profiler(_with_products(noise, [("g1", "pointwise")])) == "tiler"
    won = state("algorithm", passed=True, verdict="improved")
    assert R.route_after_profiler(_with_products(won, mine)) == "tiler"  # floor unknown
    capped = state("algorithm", passed=True, verdict="noise", attempts=3)
    assert R.route_after_profiler(_with_products(capped, mine)) == "tiler"
    tiled = state("tiling", passed=True, verdict="noise")
    assert R.route_after_profiler(_with_products(tiled, mine)) == "memory_optimizer"


def test_a_gemm_bound_win_tries_its_products_on_cublas_once():
    """A stage-1 candidate that improved is tried once more with its Triton products as cuBLAS
    calls only when the products' roofline floor is a large share of its measured time
    (knowledge.heuristics.LIBRARY_PRODUCTS_SHARE): the Llama layer whose win came from a flash
    kernel, not a level-2 GEMM + epilogue whose products are a sliver of a launch-bound call."""
    from knowledge.heuristics import LIBRARY_PRODUCTS_SHARE as SHARE

    won = state("algorithm", passed=True, verdict="improved")  # c1 measured 1.0 ms
    mine = [("g0", "matmul"), ("g1", "pointwise")]
    heavy = _with_products(won, mine, est_ms=SHARE * 1.01)  # g0 (the matmul) at 25.3% of 1 ms
    assert heavy.products_to_try_on_library() == ["g0"]
    assert R.route_after_profiler(heavy) == "algorithm_designer"
    light = _with_products(won, mine, est_ms=SHARE * 0.99)
    assert light.products_to_try_on_library() == []
    assert R.route_after_profiler(light) == "tiler"
    # once backed out (the cuBLAS try itself), or timed in the interpreter, not again
    assert _with_products(won, mine, disabled=["g0"], est_ms=1.0).products_to_try_on_library() == []
    interp = heavy.model_copy(update={"timings": [t.model_copy(update={"interpreter": True})
                                                  for t in heavy.timings]})
    assert interp.products_to_try_on_library() == []
    # an fp32 product stays the template's (3xTF32; cuBLAS would keep eager's fp32 class)
    assert _with_products(won, mine, est_ms=1.0, dtype="float32").products_to_try_on_library() == []
    # ... though within noise every product is tried, whatever its dtype
    noise = state("algorithm", passed=True, verdict="noise")
    assert _with_products(noise, mine, dtype="float32").products_to_try_on_library() == ["g0"]
    # a regression is not a win
    lost = _with_products(state("algorithm", passed=True, verdict="regressed"), mine, est_ms=1.0)
    assert lost.products_to_try_on_library() == []
