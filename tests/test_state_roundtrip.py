"""The typed state survives a SQLite checkpoint round trip unchanged, every record coming back as
its own type, with every record type registered: no "Deserializing unregistered type" or
"Blocked deserialization" log and no other serde warning."""
import logging
import sqlite3
import warnings

import pydantic

import pytest
from langgraph.checkpoint.serde import jsonplus
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite import SqliteSaver

from graph.build import build_graph
from graph.checkpoints import serializer, sqlite_saver
from state import (RECORD_TYPES, Analysis, Attempt, Candidate, EggState, FusionGroup, HardwareInfo,
                   KernelConfig, LLMUsage, OpRecord, OutputError, Plan, ProblemSpec, RegionRecord,
                   StageContext, TensorSpec, TimingRecord, TrialRecord, VerificationRecord)


def full_state() -> EggState:
    """A state with every record type and awkward values (unicode, None, nested dicts, floats)."""
    return EggState(
        problem_path="/p/x.py", problem_source="class Model: ...  # é",
        problem=ProblemSpec(path="/p/x.py", name="x", source="src", sha256="ab" * 32,
                            inputs=[TensorSpec(shape=[1823, 781], dtype="float16"), "3"],
                            init_args=["64", "0.5"], outputs=[TensorSpec(shape=[7], dtype="bfloat16")],
                            n_params=3),
        hardware=HardwareInfo(device="cuda", name="NVIDIA H200", profile_id="h200", interpreter=False,
                              sm_count=132, mem_bandwidth_gbs=4800.0, peak_tflops={"bf16": 989.5},
                              smem_per_block=232448, l2_bytes=50 << 20, arch="sm_90"),
        analysis=Analysis(capture="fx", ops=[OpRecord(name="relu", op="call_function", target="relu",
                                                      kind="pointwise", shape=[4, 5], dtype="float32",
                                                      args=["x"], flops=20.0, bytes=160.0)],
                          flops=20.0, bytes=160.0, floor_ms=1.5e-6, bound="memory",
                          regions=[RegionRecord(index=0, nodes=1, groups=["g0"], flops=20.0, bytes=160.0,
                                                est_ms=1.5e-6, measured_ms=None, share=1.0,
                                                ends_with="")]),
        plan=Plan(groups=[FusionGroup(id="g0", kind="pointwise", template="pointwise", nodes=["relu"],
                                      reason="r", principle_ids=["alg-fuse-pointwise-chain"],
                                      est_bytes_saved=1e9, enabled=False)],
                  rewrites=["rw"], goals={"algorithm": "fuse"}, notes=["n"], reviewed="edited"),
        stage="tiling",
        stage_context={"algorithm": StageContext(stage="algorithm", goal="g", attempts=[
            Attempt(candidate_id="c1", outcome="improved", summary="s")], failures=["f"],
            decisions=["d"], best_id="c1", finished=True, finish_reason="cap")},
        attempts={"algorithm": 2, "tiling": 1}, caps={"algorithm": 4},
        candidates=[Candidate(id="c0", stage="plan", author="planner", source="ref", fallback=True),
                    Candidate(id="c1", parent_id="c0", stage="algorithm", author="algorithm_designer",
                              source="k", path="/r/c1.py",
                              configs=[KernelConfig(group_id="g0", template="pointwise",
                                                    params={"BLOCK": 1024, "num_warps": 4,
                                                            "nested": {"a": [1, 2.5, None]}})],
                              disabled_groups=["g1"], kernels=["_egg_k_g0"], rationale="why",
                              principle_ids=["p"])],
        verifications=[VerificationRecord(candidate_id="c1", passed=True, reason="", category="",
                                          trials=5, device="cuda", checks=["static", "judge"],
                                          outputs=[OutputError(index=0, max_abs=1e-7, max_rel=2e-7,
                                                               eager_err_fp64=1e-8, cand_err_fp64=None,
                                                               passed_by="tolerance")],
                                          wall_s=1.25, flags=["flag"],
                                          trial_log=[TrialRecord(index=0, mode="eval", grad=True, inputs="x3",
                                                                 shapes=[[1823, 781]], shape_variant="batch 7",
                                                                 calls=3, max_abs=1e-7, note="n")],
                                          sandbox=["no-new-privileges"])],
        timings=[TimingRecord(candidate_id="c1", device="cuda", interpreter=False, candidate_ms=0.0123,
                              p20_ms=0.012, p80_ms=0.013, eager_ms=0.05, speedup_eager=4.06,
                              verdict="improved", compared_to="c0", flags=["x"])],
        current_id="c1", best_id="c1",
        llm_usage={"planner": LLMUsage(calls=1, prompt_tokens=10, completion_tokens=5, cost_usd=0.01)},
        error=None, report={"status": "ok", "nested": {"list": [1, "two", None, 3.5]}},
    )


def _clear_warned():
    """The serializer logs each unregistered / blocked type once per process: forget them."""
    for name, v in vars(jsonplus).items():
        if name.startswith("_warned_") and isinstance(v, set):
            v.clear()


@pytest.fixture
def unregistered_warnings(caplog):
    """What LangGraph logged (any logger of its, WARNING and up: "Deserializing unregistered
    type", "Blocked deserialization", "Could not reconstruct") or warned during the test."""
    _clear_warned()
    caplog.set_level(logging.WARNING)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield lambda: [r.getMessage() for r in caplog.records
                       if r.name.startswith("langgraph") and r.levelno >= logging.WARNING] + \
            [str(w.message) for w in caught if "langgraph" in (w.filename or "")
             or "unregistered" in str(w.message) or "deserializ" in str(w.message).lower()]
    _clear_warned()


def assert_same_types(got, want, where="state"):
    """Every record inside ``got`` is of the type it has in ``want`` (not a dict that
    model_validate would quietly rebuild), recursively."""
    if isinstance(want, pydantic.BaseModel):
        assert type(got) is type(want), f"{where}: {type(got).__name__}, not {type(want).__name__}"
        for f in type(want).model_fields:
            assert_same_types(getattr(got, f), getattr(want, f), f"{where}.{f}")
    elif isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same_types(g, w, f"{where}[{i}]")
    elif isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), where
        for k in want:
            assert_same_types(got[k], want[k], f"{where}[{k!r}]")


def record_types_in(obj, seen=None) -> set:
    seen = set() if seen is None else seen
    if isinstance(obj, pydantic.BaseModel):
        seen.add(type(obj))
        for f in type(obj).model_fields:
            record_types_in(getattr(obj, f), seen)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            record_types_in(x, seen)
    elif isinstance(obj, dict):
        for x in obj.values():
            record_types_in(x, seen)
    return seen


def test_every_record_type_is_registered():
    from state import records

    models = {v for v in vars(records).values()
              if isinstance(v, type) and issubclass(v, pydantic.BaseModel) and v is not pydantic.BaseModel}
    assert models <= set(RECORD_TYPES), models - set(RECORD_TYPES)
    # the round trip below holds one of each, so each is checked by type after reloading
    assert record_types_in(full_state()) == set(RECORD_TYPES)


def test_state_round_trip_through_sqlite(tmp_path, unregistered_warnings):
    st = full_state()
    path = tmp_path / "ck.sqlite"
    g = build_graph(checkpointer=sqlite_saver(path))
    cfg = {"configurable": {"thread_id": "t"}}
    values = {k: getattr(st, k) for k in EggState.model_fields}
    g.update_state(cfg, values, as_node="reporter")
    # a fresh connection: nothing is cached in memory
    g2 = build_graph(checkpointer=sqlite_saver(path))
    raw = g2.get_state(cfg).values
    assert isinstance(raw["plan"], Plan) and isinstance(raw["candidates"][1].configs[0], KernelConfig)
    for k in EggState.model_fields:  # every record, by type, before any model_validate
        assert_same_types(raw[k], getattr(st, k), k)
    back = EggState.model_validate(raw)
    assert back == st
    assert back.model_dump() == st.model_dump()
    assert unregistered_warnings() == []


def test_serializer_round_trip_and_the_check_can_fail(unregistered_warnings):
    st = full_state()
    s = serializer()
    back = s.loads_typed(s.dumps_typed(st))
    assert back == st
    assert_same_types(back, st)
    assert unregistered_warnings() == []
    plain = JsonPlusSerializer()  # without the allow-list: the warning the test guards against
    assert plain.loads_typed(plain.dumps_typed(st)) == st
    assert any("Deserializing unregistered type" in m for m in unregistered_warnings())


def test_a_type_left_off_the_allow_list_is_caught(unregistered_warnings):
    """What a record type missing from the allow-list looks like (a checkpoint holds the state's
    channels one by one): a "Blocked deserialization" log and a dict where the record was, which
    EggState.model_validate would rebuild unnoticed; both checks above see it."""
    st = full_state()
    values = {k: getattr(st, k) for k in EggState.model_fields}
    allowed = [(t.__module__, t.__name__) for t in RECORD_TYPES if t is not ProblemSpec]
    s = JsonPlusSerializer(allowed_msgpack_modules=allowed)
    back = s.loads_typed(s.dumps_typed(values))
    assert EggState.model_validate(back) == st  # what hid the hole
    assert any("Blocked deserialization" in m and "ProblemSpec" in m for m in unregistered_warnings())
    with pytest.raises(AssertionError, match="problem: dict, not ProblemSpec"):
        assert_same_types(back["problem"], st.problem, "problem")


def test_plain_sqlite_saver_with_our_serializer_reads_a_cli_run_db(tmp_path, unregistered_warnings):
    """What graph.checkpoints.sqlite_saver does, spelled out: any SqliteSaver with the serializer."""
    conn = sqlite3.connect(str(tmp_path / "x.sqlite"), check_same_thread=False)
    g = build_graph(checkpointer=SqliteSaver(conn, serde=serializer()))
    cfg = {"configurable": {"thread_id": "t"}}
    g.update_state(cfg, {"plan": full_state().plan, "candidates": full_state().candidates},
                   as_node="reporter")
    conn2 = sqlite3.connect(str(tmp_path / "x.sqlite"), check_same_thread=False)
    vals = build_graph(checkpointer=SqliteSaver(conn2, serde=serializer())).get_state(cfg).values
    assert vals["plan"] == full_state().plan and vals["candidates"] == full_state().candidates
    assert_same_types(vals["plan"], full_state().plan)
    assert_same_types(vals["candidates"], full_state().candidates)
    assert unregistered_warnings() == []
