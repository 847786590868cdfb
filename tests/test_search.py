"""The tiler's search (policies.search) on injected timings: a fake profiling session returns
scripted times, a fake compile check rejects chosen variants; the tuning cache in a temp file."""
import math
import re
import types

import pytest

from graph.bench import aggregate, report_markdown
from harness.compile_check import FileCheck, KernelCheck
from harness.problem import describe_problem
from harness.tuning_cache import TuningCache
from nodes.reporter import build_report
from nodes.tiler import tiler
from policies import search
from policies.expert import ExpertPolicy
from state import Candidate, EggState, Settings
from state.records import HardwareInfo

PROBLEM = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, y):
        return torch.relu(x * 2.0 + y) - 0.5


def get_inputs():
    return [torch.randn(4096, 1000), torch.randn(4096, 1000)]


def get_init_inputs():
    return []
'''


def h200(name="NVIDIA H200"):
    return HardwareInfo(device="cuda", name=name, profile_id="h200", interpreter=False, sm_count=132,
                        mem_bandwidth_gbs=4260, peak_tflops={"fp32": 51.0}, smem_per_block=232448,
                        l2_bytes=62914560, arch="sm_90")


def block_of(path) -> tuple[int, int]:
    src = open(path).read()
    return int(re.search(r"BLOCK = (\d+)", src).group(1)), int(re.search(r"num_warps=(\d+)", src).group(1))


class FakeSession:
    """time_candidate returns scripted times: a function of the pointwise kernel's config."""

    def __init__(self, script):
        self.script, self.calls = script, []

    def time_candidate(self, path):
        b, w = block_of(path)
        ms = self.script(b, w)
        self.calls.append(((b, w), ms))
        return {"median_ms": ms, "p20_ms": ms * 0.995, "p80_ms": ms * 1.005}


def reject(blocks):
    """A compile check that fails variants with the given BLOCKs (shared memory, say)."""
    def check(paths):
        out = []
        for p in paths:
            b, _ = block_of(p)
            bad = b in blocks
            out.append(FileCheck(p, not bad, [KernelCheck("_egg_k_g0", not bad,
                                                         "shared_memory" if bad else "", "too big" if bad else "",
                                                         shared=300000 if bad else 0)],
                                 "shared_memory" if bad else "", "too big" if bad else ""))
        check.seen.extend(block_of(p) for p in paths)
        return out
    check.seen = []
    return check


@pytest.fixture
def setup(write_problem, tmp_path):
    path = write_problem(PROBLEM, "pw")

    def make(hw=None, width=6):
        _prob, spec = describe_problem(path)
        settings = Settings(run_dir=str(tmp_path / "run"), search_width=width, device="cuda")
        st = EggState(problem_path=str(path), problem=spec, hardware=hw or h200())
        pol = ExpertPolicy()
        an, plan = pol.plan(st, settings)
        st = st.model_copy(update={"analysis": an, "plan": plan})
        d = pol.design(st, settings)
        c1 = Candidate(id="c1", stage="algorithm", author="algorithm_designer", source=d.source,
                       configs=d.configs, kernels=d.kernels)
        st = st.model_copy(update={"candidates": [c1], "best_id": "c1"})
        return pol, st, settings, c1
    return make


def faster_with_bigger_blocks(b, w):
    return 1.0 - 0.05 * math.log2(b / 256) - 0.005 * math.log2(w)


def test_search_takes_the_fastest_measured_variant_and_never_times_rejected_ones(setup, tmp_path):
    pol, st, settings, c1 = setup()
    base = c1.configs[0].params
    sess, check = FakeSession(faster_with_bigger_blocks), reject({8192})
    cache = TuningCache(tmp_path / "tuning.json")
    d = search.tile_search(pol, st, settings, c1, session=sess, checker=check, cache=cache)
    assert type(d).__name__ == "Draft", getattr(d, "reason", "")
    timed = {cfg for cfg, _ms in sess.calls}
    assert (base["BLOCK"], base["num_warps"]) in timed  # the incumbent is measured too
    assert (8192, 8) not in timed and all(b != 8192 for b, _w in timed)
    assert any(b == 8192 for b, _w in check.seen)  # ... though the shortlist offered it
    best = min(((ms, cfg) for cfg, ms in sess.calls))[1]
    got = d.configs[0].params
    assert (got["BLOCK"], got["num_warps"]) == best
    assert got != base
    # successive halving, not exhaustive: fewer timings than the space's configs
    assert d.stats["timed"] == len(sess.calls) < 24
    assert d.stats["searched"] == 1 and d.stats["cache_hits"] == 0
    assert d.stats["compile_rejected"] >= 1 and d.stats["pruned"] >= 1
    text = " ".join(d.decisions)
    assert "[tile-prune-rules]" in text and "[tile-block-size]" in text and "improved" in text
    assert set(d.principle_ids) >= {"tile-block-size", "tile-prune-rules"}

    # a second run of the same problem: from the cache, no search, no timing
    sess2 = FakeSession(faster_with_bigger_blocks)
    d2 = search.tile_search(pol, st, settings, c1, session=sess2, checker=reject(set()), cache=cache)
    assert sess2.calls == []
    assert d2.configs[0].params == got
    assert d2.stats["cache_hits"] == 1 and d2.stats["searched"] == 0 and d2.stats["timed"] == 0
    assert "tuning cache hit" in d2.decisions[0]

    # another GPU model misses the cache and searches
    pol3, st3, settings3, c13 = setup(hw=h200("NVIDIA H100 80GB HBM3"))
    sess3 = FakeSession(faster_with_bigger_blocks)
    d3 = search.tile_search(pol3, st3, settings3, c13, session=sess3, checker=reject(set()), cache=cache)
    assert d3.stats["cache_hits"] == 0 and sess3.calls
    assert len(cache.entries()) == 2


def test_incumbent_kept_within_noise_and_cached(setup, tmp_path):
    pol, st, settings, c1 = setup()
    flat = FakeSession(lambda b, w: 1.0)
    cache = TuningCache(tmp_path / "tuning.json")
    d = search.tile_search(pol, st, settings, c1, session=flat, checker=reject(set()), cache=cache)
    assert type(d).__name__ == "Decline" and "best within noise" in d.reason
    assert "noise" in " ".join(d.decisions)
    again = FakeSession(lambda b, w: 1.0)
    d2 = search.tile_search(pol, st, settings, c1, session=again, checker=reject(set()), cache=cache)
    assert type(d2).__name__ == "Decline" and "tuning cache" in d2.reason and again.calls == []


def test_tiler_node_records_tuning_stats_in_the_stage_context_and_the_reports(setup, tmp_path, monkeypatch):
    pol, st, settings, c1 = setup()
    settings = settings.model_copy(update={"tuning_cache": str(tmp_path / "tuning.json")})
    sess = FakeSession(faster_with_bigger_blocks)
    monkeypatch.setattr(search.P, "session", lambda *a, **k: sess)
    monkeypatch.setattr("harness.compile_check.check_files", lambda paths, **kw: reject(set())(paths))
    upd = tiler(st.model_copy(update={"stage": "tiling"}), types.SimpleNamespace(context=settings))
    assert upd["candidates"][0].stage == "tiling" and upd["current_id"] == upd["candidates"][0].id
    ctx = upd["stage_context"]["tiling"]
    assert ctx.stats["searched"] == 1 and ctx.stats["timed"] == len(sess.calls)
    assert any("successive halving" in x for x in ctx.decisions)
    st2 = st.model_copy(update={"stage_context": {"tiling": ctx}, "candidates": st.candidates + upd["candidates"]})
    rep = build_report(st2, settings)
    assert rep["tuning"]["searched"] == 1 and rep["tuning"]["cache_hits"] == 0
    rec = {"name": "pw.py", "verified": True, "correct": True, "fallback": False, "kernels": ["k"],
           "eager_ms": 1.0, "compile_ms": 1.0, "egg_ms": 0.5, "speedup_eager": 2.0, "speedup_compile": 2.0,
           "roofline_pct": 50.0, "stage1_ms": 0.6, "failure": None, "wall_s": 1.0,
           "tuning": {"cache_hits": 2, "searched": 1}}
    agg = aggregate([rec])
    assert agg["tuning_cache_hits"] == 2 and agg["tuning_searched"] == 1
    assert "2 hit / 1 searched" in report_markdown(agg, [rec])


def test_a_cached_config_that_failed_verification_is_dropped(setup, tmp_path):
    from state.records import KernelConfig, VerificationRecord

    pol, st, settings, c1 = setup()
    cache = TuningCache(tmp_path / "tuning.json")
    d = search.tile_search(pol, st, settings, c1, session=FakeSession(faster_with_bigger_blocks),
                           checker=reject(set()), cache=cache)
    assert len(cache.entries()) == 1
    c2 = Candidate(id="c2", stage="tiling", author="tiler", source=d.source, configs=d.configs,
                   kernels=d.kernels, parent_id="c1")
    st2 = st.model_copy(update={"candidates": [c1, c2], "verifications": [
        VerificationRecord(candidate_id="c2", passed=False, reason="mismatch", category="mismatch")]})
    sess = FakeSession(faster_with_bigger_blocks)
    d2 = search.tile_search(pol, st2, settings, c1, session=sess, checker=reject(set()), cache=cache)
    assert type(d2).__name__ == "Decline" and sess.calls == []
    assert "failed verification" in " ".join(d2.decisions)
    assert cache.entries() == {}
    assert isinstance(d.configs[0], KernelConfig)


def test_search_stops_when_the_run_time_limit_is_spent(setup, tmp_path):
    import time

    pol, st, settings, c1 = setup()
    sess = FakeSession(faster_with_bigger_blocks)
    cache = TuningCache(tmp_path / "tuning.json")
    late = settings.model_copy(update={"time_limit_s": 60.0})
    old = st.model_copy(update={"started_at": time.time() - 61})
    d = search.tile_search(pol, old, late, c1, session=sess, checker=reject(set()), cache=cache)
    # nothing is timed, not even the incumbent, nothing is cached as searched
    assert type(d).__name__ == "Decline" and d.stats["searched"] == 0 and not sess.calls
    assert d.reason == "time limit (60 s) reached before the search"
    # within the limit the same search runs
    fresh = st.model_copy(update={"started_at": time.time()})
    d2 = search.tile_search(pol, fresh, late, c1, session=FakeSession(faster_with_bigger_blocks),
                            checker=reject(set()), cache=TuningCache(tmp_path / "t2.json"))
    assert d2.stats["searched"] == 1
    assert Settings().time_left(time.time()) is None and late.time_left(0.0) is None
    # a resume or replay (graph.runs.stream sets run_started_at) counts from its own start
    again = late.model_copy(update={"run_started_at": time.time()})
    assert again.time_left(old.started_at) > 59


def test_search_ends_inside_the_budget_when_it_runs_out_mid_search(setup, tmp_path):
    """The budget runs out while the variants are timed (the H200: a matmul's search took its run
    70 s past the budget, into the problem's timeout): no call starts with less than MIN_CALL_S
    left, each started call is cut at the budget's end, and the stage-1 configuration is kept."""
    import time

    from state.settings import MIN_CALL_S

    pol, st, settings, c1 = setup()
    limit = 60.0
    start = time.time()

    class Clock(FakeSession):
        timeout_s = 900.0

        def time_candidate(self, path):
            self.timeouts = getattr(self, "timeouts", []) + [self.timeout_s]
            out = super().time_candidate(path)
            nonlocal start
            start -= 20.0  # each timing takes 20 s of the run's budget
            return out

    sess = Clock(faster_with_bigger_blocks)
    run = settings.model_copy(update={"time_limit_s": limit, "tile_search_share": 1.0})
    state = st.model_copy(update={"started_at": start})
    real_left = type(run).time_left

    def left(self, started_at):
        return self.time_limit_s - (time.time() - start)

    type(run).time_left = left
    try:
        d = search.tile_search(pol, state, run, c1, session=sess, checker=reject(set()),
                               cache=TuningCache(tmp_path / "t.json"))
    finally:
        type(run).time_left = real_left
    assert len(sess.calls) == 3  # 60 s: the incumbent and two variants, then under MIN_CALL_S
    assert all(t <= limit + 1e-6 for t in sess.timeouts) and sess.timeouts[-1] < 21 + MIN_CALL_S
    assert any("reached while searching g0" in x for x in d.decisions), d.decisions
    # the two variants it timed still compete: the faster one (bigger blocks) is the answer
    best = min(sess.calls[1:], key=lambda c: c[1])
    assert type(d).__name__ == "Draft" and block_of_config(d) == best[0]


def test_search_spends_its_share_of_the_time_left_and_keeps_what_it_measured(setup, tmp_path):
    """tile_search_share 0.5 of a 120 s budget, 20 s per timing: the search stops after ~60 s
    (the incumbent and two variants), leaving the rest of the budget to the roles after it; the
    variants it measured still compete (the faster one beyond noise wins), and a search cut
    short writes nothing to the tuning cache. With the whole budget it times more."""
    import time

    pol, st, settings, c1 = setup()

    def run_with(share):
        start = time.time()

        class Clock(FakeSession):
            def time_candidate(self, path):
                nonlocal start
                start -= 20.0
                return super().time_candidate(path)

        sess = Clock(faster_with_bigger_blocks)
        run = settings.model_copy(update={"time_limit_s": 120.0, "tile_search_share": share})
        real_left = type(run).time_left
        type(run).time_left = lambda self, _s: self.time_limit_s - (time.time() - start)
        cache = TuningCache(tmp_path / f"t{share}.json")
        try:
            d = search.tile_search(pol, st.model_copy(update={"started_at": start}), run, c1,
                                   session=sess, checker=reject(set()), cache=cache)
        finally:
            type(run).time_left = real_left
        return d, sess, cache

    d, sess, cache = run_with(0.5)
    assert len(sess.calls) == 3, sess.calls
    assert any("share (0.5)" in x and "measured so far compete" in x for x in d.decisions), d.decisions
    best = min(sess.calls[1:], key=lambda c: c[1])
    assert best[1] < sess.calls[0][1]  # a measured variant beat the incumbent: it is the answer
    assert type(d).__name__ == "Draft" and block_of_config(d) == best[0]
    assert cache.entries() == {}
    _d, more, _c = run_with(1.0)
    assert len(more.calls) > 3


def block_of_config(d) -> tuple[int, int]:
    (cfg,) = [c.params for c in d.configs if c.group_id == "g0"]
    return cfg["BLOCK"], cfg["num_warps"]
