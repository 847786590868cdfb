"""The LLM policy's parts, driven through the real ChatOpenAI client against a local scripted
OpenAI-compatible server: code extraction, structured outputs and their repair, transport
errors, accounting, the token budget, prompt assembly, the tiler, hybrid fallbacks, replay."""
from __future__ import annotations

import json
import socket

import pytest
from langgraph.runtime import Runtime

from tests.llm_fake_server import FakeOpenAI
from tests.llm_scripts import BAD, GOOD, PLAN, PROBLEM

from harness.hardware import detect
from harness.problem import describe_problem
from policies import get_policy, prompts as PR
from policies.base import Decline, Draft
from policies.llm import (LLMPolicy, PlanProposal, complete_file, egg_configs, extract_code,
                          is_expert_built, is_llm_built, jit_kernels, replace_configs, CodeError)
from policies.llm_io import LLMClient, LLMError
from state import (Attempt, Candidate, EggState, HardwareInfo, LLMUsage, Settings, StageContext,
                   VerificationRecord)

pytestmark = pytest.mark.timeout(120)


# --------------------------------------------------------------------------- fixtures
@pytest.fixture
def problem(tmp_path):
    p = tmp_path / "relu_scale.py"
    p.write_text(PROBLEM)
    return p


def base_state(problem, hardware: HardwareInfo | None = None, **kw) -> EggState:
    _prob, spec = describe_problem(str(problem))
    return EggState(problem_path=spec.path, problem=spec, hardware=hardware or detect("cpu"), **kw)


def planned_state(problem, **kw) -> EggState:
    """A state after an expert planner step (analysis + plan, c0 = the reference)."""
    from codegen.pipeline import fallback_source
    from policies.expert import ExpertPolicy

    st = base_state(problem, **kw)
    analysis, plan = ExpertPolicy().plan(st, Settings())
    ref = Candidate(id="c0", stage="plan", author="planner", source=fallback_source(st.problem.source),
                    fallback=True)
    return st.model_copy(update={"analysis": analysis, "plan": plan, "candidates": [ref],
                                 "best_id": "c0", "stage": "algorithm"})


def settings_for(server: FakeOpenAI | None, tmp_path, **kw) -> Settings:
    base = {"policy": "llm", "llm_model": "fake-model", "run_dir": str(tmp_path / "run"),
            "llm_base_url": server.base_url if server else "http://127.0.0.1:9/v1",
            "llm_retries": 1, "llm_timeout_s": 20}
    base.update(kw)
    return Settings(**base)


def dead_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


GPU = HardwareInfo(device="cuda", name="NVIDIA H200", profile_id="h200", interpreter=False,
                   sm_count=132, mem_bandwidth_gbs=4800, peak_tflops={"fp32": 67},
                   smem_per_block=232448, l2_bytes=62914560, arch="sm_90")


# --------------------------------------------------------------------------- code replies
def test_extract_code_variants():
    code = extract_code(GOOD)
    assert code.startswith("import torch") and "class ModelNew(Model)" in code
    # the whole reply when there is no fence
    assert "class ModelNew" in extract_code("class ModelNew(Model):\n    pass\n")
    # several blocks: the last one defining ModelNew wins
    two = "```python\nx = 1\n```\nthen\n```py\nclass ModelNew(Model):\n    y = 2\n```\n```\nz = 3\n```"
    assert "y = 2" in extract_code(two)
    # an unclosed fence (a reply cut at max_tokens) still yields its code
    assert "class ModelNew" in extract_code("Here:\n```python\nclass ModelNew(Model):\n    pass\n")
    with pytest.raises(CodeError, match="does not parse: line 2"):
        extract_code("```python\nclass ModelNew(Model):\ndef f(:\n```")
    with pytest.raises(CodeError, match="no top-level `class ModelNew`"):
        extract_code("```python\nclass Other:\n    pass\n```")


def test_complete_file_prepends_problem_and_marks_llm_code():
    src = complete_file(extract_code(GOOD), PROBLEM, "m1")
    assert src.startswith(PROBLEM.rstrip()) and PR.GENERATED_LINE in src
    assert PR.LLM_MARK in src and "(m1)" in src
    assert jit_kernels(src) == ["_egg_k_g0"]
    assert egg_configs(src) == {"_egg_k_g0": {"BLOCK": 4096, "num_warps": 4}}
    full = PROBLEM + "\n" + extract_code(GOOD)  # a complete file is kept as it is
    assert complete_file(full, PROBLEM, "m1").count("class Model(nn.Module)") == 1
    c = Candidate(id="c1", stage="algorithm", author="x", source=src)
    assert is_llm_built(c) and not is_expert_built(c)


def test_replace_configs_changes_only_the_dict():
    src = complete_file(extract_code(GOOD), PROBLEM, "m")
    new = replace_configs(src, {"_egg_k_g0": {"BLOCK": 1024, "num_warps": 8}})
    assert egg_configs(new) == {"_egg_k_g0": {"BLOCK": 1024, "num_warps": 8}}
    assert new.replace(" ", "").count("defforward") == src.replace(" ", "").count("defforward")
    assert len(new.splitlines()) - len(src.splitlines()) == 2  # the dict is now 3 lines


def test_style_example_passes_the_verifier(tmp_path):
    """The example shown to the model in every design prompt is itself correct EGG-style code."""
    from harness.verify import verify

    prob = tmp_path / "style_problem.py"
    prob.write_text(PR.STYLE_PROBLEM)
    cand = tmp_path / "style_candidate.py"
    cand.write_text(PR.STYLE_PROBLEM + "\n\n" + PR.STYLE_EXAMPLE)
    res = verify(str(prob), str(cand), device="cpu", trials=2, problem_source=PR.STYLE_PROBLEM)
    assert res["passed"], res["reason"]


# --------------------------------------------------------------------------- structured outputs
def test_malformed_plan_is_fed_back_then_valid_one_used(problem, tmp_path):
    bad_node = dict(PLAN, groups=[dict(PLAN["groups"][0], nodes=["relu", "mul", "nonexistent"])])
    script = [{"tool_args": '{"groups": [{"id": "g0", '},  # not JSON
              {"tool_args": {"groups": "all of them"}},  # JSON, wrong fields
              {"tool_args": bad_node},  # fits the schema, names a node the op graph lacks
              {"tool_args": PLAN}]
    with FakeOpenAI(script) as srv:
        pol = LLMPolicy()
        analysis, plan = pol.plan(base_state(problem), settings_for(srv, tmp_path, llm_retries=3))
    assert analysis.capture == "fx" and [o.name for o in analysis.ops if o.kind != "io"] == ["relu", "mul", "add"]
    assert [g.nodes for g in plan.groups] == [["relu", "mul", "add"]]
    assert plan.goals["memory"] == "stream x once" and "memory-bound" in plan.notes
    assert len(srv.requests) == 4
    fed = [r["messages"][-1]["content"] for r in srv.requests[1:]]
    assert "not valid JSON" in fed[0]
    assert "does not fit PlanProposal" in fed[1] and "groups" in fed[1]
    assert "'nonexistent' is not in the op graph" in fed[2]
    usage = pol.take_usage()
    assert usage["planner"].calls == 4 and usage["planner"].prompt_tokens > 100
    assert pol.take_usage() == {}  # taken once
    files = sorted(p.name for p in (tmp_path / "run" / "llm").glob("*.json"))
    assert files == ["000_planner.json", "001_planner.json", "002_planner.json", "003_planner.json"]
    rec = json.loads((tmp_path / "run" / "llm" / "003_planner.json").read_text())
    assert rec["parsed"]["groups"][0]["id"] == "g0" and rec["parse_error"] is None
    assert rec["messages"][0]["type"] == "system" and rec["usage"]["estimated"] is False


def test_unusable_plan_after_retries(problem, tmp_path):
    with FakeOpenAI([{"content": "I would fuse everything."}] * 2) as srv:
        _a, plan = LLMPolicy().plan(base_state(problem), settings_for(srv, tmp_path))
        _a, hplan = LLMPolicy(hybrid=True).plan(base_state(problem), settings_for(None, tmp_path, llm_token_budget=1))
    assert plan.groups == [] and "unusable" in plan.notes[0] and "no PlanProposal" in plan.notes[0]
    assert "expert's plan is used" in hplan.notes[0] and hplan.groups[0].template == "pointwise"


def test_json_schema_method_retries_invalid_json(problem, tmp_path):
    script = [{"content": "not json at all"}, {"content": json.dumps(PLAN)}]
    with FakeOpenAI(script) as srv:
        pol = LLMPolicy()
        _a, plan = pol.plan(base_state(problem), settings_for(srv, tmp_path, llm_structured_method="json_schema"))
    assert srv.requests[0]["response_format"]["type"] == "json_schema"
    assert [g.id for g in plan.groups] == ["g0"]
    assert "not valid PlanProposal" in srv.requests[1]["messages"][-1]["content"]
    assert pol.take_usage()["planner"].calls == 2


# --------------------------------------------------------------------------- transport
def test_http_500_is_retried_then_succeeds(problem, tmp_path):
    with FakeOpenAI([{"status": 500, "message": "overloaded"}, {"content": "hello"}]) as srv:
        client = LLMClient(settings_for(srv, tmp_path, llm_retries=2), base_state(problem))
        r = client.ask("planner", [PR.HumanMessage("hi")])
    assert r.text == "hello" and len(srv.requests) == 2
    assert client.usage()["planner"].calls == 1


@pytest.mark.parametrize("item,match", [
    ({"status": 429, "message": "slow down"}, "rate limiting \\(HTTP 429\\)"),
    ({"status": 503, "message": "down for maintenance"}, "HTTP 503 after 2 attempt"),
    ({"status": 401, "message": "bad key"}, "refused the API key"),
])
def test_http_errors_end_in_one_clear_llm_error(problem, tmp_path, item, match):
    with FakeOpenAI([item, item]) as srv:
        client = LLMClient(settings_for(srv, tmp_path, llm_retries=1), base_state(problem))
        with pytest.raises(LLMError, match=match):
            client.ask("planner", [PR.HumanMessage("hi")])


def test_timeout_and_dead_endpoint(problem, tmp_path):
    with FakeOpenAI([{"delay_s": 3, "content": "late"}]) as srv:
        client = LLMClient(settings_for(srv, tmp_path, llm_retries=0, llm_timeout_s=0.5), base_state(problem))
        with pytest.raises(LLMError, match="timed out"):
            client.ask("planner", [PR.HumanMessage("hi")])
    dead = settings_for(None, tmp_path, llm_retries=0, llm_base_url=f"http://127.0.0.1:{dead_port()}/v1")
    with pytest.raises(LLMError, match="cannot reach the LLM endpoint"):
        LLMClient(dead, base_state(problem)).ask("planner", [PR.HumanMessage("hi")])


def test_api_key_from_named_variable_is_sent_but_never_recorded(problem, tmp_path, monkeypatch):
    monkeypatch.setenv("EGG_TEST_KEY", "sk-test-do-not-store-42")
    with FakeOpenAI([{"content": "ok"}]) as srv:
        s = settings_for(srv, tmp_path, llm_api_key_env="EGG_TEST_KEY")
        LLMClient(s, base_state(problem)).ask("planner", [PR.HumanMessage("hi")])
    assert srv.headers[0]["authorization"] == "Bearer sk-test-do-not-store-42"
    assert "sk-test" not in s.model_dump_json()
    for f in (tmp_path / "run").rglob("*"):
        if f.is_file():
            assert "sk-test" not in f.read_text()
    with pytest.raises(LLMError, match="set the environment variable EGG_NO_SUCH_KEY"):
        LLMClient(settings_for(None, tmp_path, llm_base_url="", llm_api_key_env="EGG_NO_SUCH_KEY"),
                  base_state(problem)).ask("planner", [PR.HumanMessage("hi")])


def test_streaming_reply_and_usage(problem, tmp_path):
    with FakeOpenAI([{"content": GOOD, "usage": [1234, 321]}]) as srv:
        pol = LLMPolicy()
        res = pol.design(planned_state(problem), settings_for(srv, tmp_path, llm_streaming=True))
    assert srv.requests[0]["stream"] is True
    assert isinstance(res, Draft) and res.kernels == ["_egg_k_g0"]
    assert res.configs[0].params == {"BLOCK": 4096, "num_warps": 4}
    assert "alg-fuse-pointwise-chain" in res.principle_ids
    u = pol.take_usage()["algorithm_designer"]
    assert (u.calls, u.prompt_tokens, u.completion_tokens) == (1, 1234, 321)


def test_cost_and_token_budget(problem, tmp_path):
    with FakeOpenAI([{"content": GOOD, "usage": [1000, 500]}]) as srv:
        pol = LLMPolicy()
        st = planned_state(problem, llm_usage={"planner": LLMUsage(calls=1, prompt_tokens=100, completion_tokens=10)})
        pol.design(st, settings_for(srv, tmp_path, llm_price_per_1k_prompt=0.5, llm_price_per_1k_completion=2.0))
    u = pol.take_usage()
    assert "planner" not in u  # only roles this step used; the state keeps the others
    assert u["algorithm_designer"].cost_usd == pytest.approx(0.5 + 1.0)
    assert (u["total"].calls, u["total"].prompt_tokens, u["total"].completion_tokens) == (2, 1100, 510)
    # a spent budget: the role declines with the reason, without any request
    spent = planned_state(problem, llm_usage={"planner": LLMUsage(calls=3, prompt_tokens=900, completion_tokens=200)})
    with FakeOpenAI([]) as srv:
        res = LLMPolicy().design(spent, settings_for(srv, tmp_path, llm_token_budget=1000))
    assert isinstance(res, Decline) and "token budget exhausted: 1100 of 1000" in res.reason
    assert srv.requests == []


# --------------------------------------------------------------------------- prompts
def test_design_prompt_selects_principles_and_carries_the_failure(problem):
    st = planned_state(problem)
    bad_src = complete_file(extract_code(BAD), PROBLEM, "m")
    c1 = Candidate(id="c1", stage="algorithm", author="algorithm_designer", source=bad_src,
                   parent_id="c0", kernels=["_egg_k_g0"])
    msg = "trial 1: output 0: max abs error 1 exceeds atol=0.0001 (verifier's own words)"
    st = st.model_copy(update={
        "candidates": st.candidates + [c1],
        "verifications": [VerificationRecord(candidate_id="c1", passed=False, category="mismatch", reason=msg)],
        "stage_context": {"algorithm": StageContext(stage="algorithm", goal="one kernel", attempts=[
            Attempt(candidate_id="c1", outcome="failed", summary=f"[mismatch] {msg}")])},
        "attempts": {"algorithm": 1}})
    system, human = PR.design_messages(st, Settings())
    text = human.content
    assert "alg-fuse-pointwise-chain" in text and "alg-fp32-accumulate" in text
    assert "mem-pipelining" not in text and "tile-block-size" not in text and "alg-online-softmax" not in text
    assert msg in text and "Code of c1 (the failed attempt)" in text and "* SCALE\n" in text
    assert "class ModelNew(Model)" in text and "EGG_CONFIGS" in text  # the style example
    assert "fix what made c1 fail" in text
    assert "CPU interpreter" in text  # the hardware note


def test_prompt_stays_within_budget_dropping_oldest_first(problem):
    st = planned_state(problem)
    attempts = [Attempt(candidate_id=f"c{i}", outcome="failed", summary=f"[compile] old failure number {i} " + "x" * 300)
                for i in range(1, 60)]
    st = st.model_copy(update={"stage_context": {
        "plan": StageContext(stage="plan", decisions=[f"plan decision {i} " + "y" * 200 for i in range(40)]),
        "algorithm": StageContext(stage="algorithm", attempts=attempts)}})
    s = Settings(llm_context_tokens=4000)
    system, human = PR.design_messages(st, s)
    total = len(system.content) + len(human.content)
    assert total <= 4000 * 4 + 200
    text = human.content
    assert "old failure number 59" in text and "old failure number 58" in text  # newest kept
    assert "old failure number 1 " not in text  # oldest dropped
    assert "plan decision 0 " not in text  # earlier stages go first
    assert "Context trimmed" in text
    assert "def forward(self, x):" in text  # the problem is never dropped


def test_planner_prompt_has_op_graph_and_roofline(problem):
    st = planned_state(problem)
    system, human = PR.plan_messages(st.model_copy(update={"plan": None}), Settings(), PlanProposal)
    assert "relu | relu | pointwise | [37, 301]" in human.content
    assert "plan-roofline-floor" in human.content and "PlanProposal tool" in human.content


# --------------------------------------------------------------------------- roles through nodes
def _with_best(st: EggState, source: str, configs=None) -> EggState:
    from state import KernelConfig

    c1 = Candidate(id="c1", stage="algorithm", author="algorithm_designer", source=source, parent_id="c0",
                   kernels=["_egg_k_g0"], configs=configs or [])
    return st.model_copy(update={"candidates": st.candidates + [c1], "best_id": "c1", "stage": "tiling",
                                 "verifications": [VerificationRecord(candidate_id="c1", passed=True)]})


def test_tiler_node_applies_the_llm_configs_after_a_bad_proposal(problem, tmp_path):
    from graph.build import graph
    from harness.verify import verify

    st = _with_best(planned_state(problem, hardware=GPU), complete_file(extract_code(GOOD), PROBLEM, "m"))
    script = [{"tool_args": {"change": True, "kernels": [{"kernel": "_egg_k_g0", "params": [
                  {"name": "BLOCK_SIZE", "value": 2048}]}], "rationale": "x"}},
              {"tool_args": {"change": True, "kernels": [{"kernel": "_egg_k_g0", "params": [
                  {"name": "BLOCK", "value": 1024}, {"name": "num_warps", "value": 8}]}],
                  "rationale": "more programs fill the SMs (tile-block-size)"}}]
    with FakeOpenAI(script) as srv:
        s = settings_for(srv, tmp_path)
        upd = graph.nodes["tiler"].invoke(st, {"configurable": {"__pregel_runtime": Runtime(context=s)}})
    assert "unknown parameter 'BLOCK_SIZE'" in srv.requests[1]["messages"][-1]["content"]
    cand = upd["candidates"][0]
    assert cand.stage == "tiling" and cand.author == "tiler" and cand.parent_id == "c1"
    assert egg_configs(cand.source) == {"_egg_k_g0": {"BLOCK": 1024, "num_warps": 8}}
    assert "tile-block-size" in cand.principle_ids
    assert upd["llm_usage"]["tiler"].calls == 2
    res = verify(str(problem), cand.path, device="cpu", trials=1, problem_source=PROBLEM)
    assert res["passed"], res["reason"]


def test_tiler_retunes_an_expert_built_candidate(problem, tmp_path):
    from policies.expert import ExpertPolicy

    st = planned_state(problem, hardware=GPU)
    draft = ExpertPolicy().design(st, Settings())
    st = _with_best(st, draft.source, draft.configs)
    assert is_expert_built(st.candidate("c1"))
    group = draft.configs[0].group_id
    script = [{"tool_args": {"change": True, "kernels": [{"kernel": group, "params": [
        {"name": "BLOCK", "value": 2048}]}], "rationale": "tile-block-size"}}]
    with FakeOpenAI(script) as srv:
        res = LLMPolicy().tile(st, settings_for(srv, tmp_path))
    assert isinstance(res, Draft) and "BLOCK = 2048" in res.source, res
    assert res.configs[0].params["BLOCK"] == 2048 and res.configs[0].template == "pointwise"
    # on the CPU interpreter, stage 2 declines without asking
    with FakeOpenAI([]) as srv:
        cpu = st.model_copy(update={"hardware": detect("cpu")})
        assert isinstance(LLMPolicy().tile(cpu, settings_for(srv, tmp_path)), Decline)
        assert isinstance(LLMPolicy().optimize_memory(cpu, settings_for(srv, tmp_path)), Decline)
    assert srv.requests == []


def test_memory_optimizer_no_change_declines(problem, tmp_path):
    st = _with_best(planned_state(problem, hardware=GPU), complete_file(extract_code(GOOD), PROBLEM, "m"))
    with FakeOpenAI([{"content": "NO_CHANGE: one load and one store per element already"}]) as srv:
        res = LLMPolicy().optimize_memory(st, settings_for(srv, tmp_path))
    assert isinstance(res, Decline) and "one load and one store" in res.reason
    assert "mem-eviction-hints" in srv.requests[0]["messages"][1]["content"]


def test_hybrid_expert_fills_in(problem, tmp_path):
    st = planned_state(problem)
    # the model's replies are unusable: the expert's stage-1 draft is used instead
    with FakeOpenAI([{"content": "I cannot write code today."}] * 2) as srv:
        pol = get_policy("hybrid")
        res = pol.design(st, settings_for(srv, tmp_path, policy="hybrid"))
    assert isinstance(res, Draft) and res.kernels and "expert fills in" in res.rationale
    assert PR.LLM_MARK not in res.source and pol.take_usage()["algorithm_designer"].calls == 2
    # the last attempt of the stage goes to the expert when no LLM candidate has won it
    bad = Candidate(id="c1", stage="algorithm", author="algorithm_designer", parent_id="c0",
                    source=complete_file(extract_code(BAD), PROBLEM, "m"), kernels=["_egg_k_g0"])
    late = st.model_copy(update={"candidates": st.candidates + [bad], "attempts": {"algorithm": 1},
                                 "verifications": [VerificationRecord(candidate_id="c1", passed=False)]})
    with FakeOpenAI([]) as srv:
        res = LLMPolicy(hybrid=True).design(late, settings_for(srv, tmp_path, policy="hybrid",
                                                                max_attempts_algorithm=2))
    assert isinstance(res, Draft) and "last attempt" in res.rationale and srv.requests == []
    assert res.source.splitlines()[0] != "" and "# candidate c2 " in res.source


def test_replay_serves_recorded_replies_and_detects_divergence(problem, tmp_path):
    with FakeOpenAI([{"tool_args": PLAN}]) as srv:
        LLMPolicy().plan(base_state(problem), settings_for(srv, tmp_path))
    rec_dir = tmp_path / "run"
    s = settings_for(None, tmp_path / "again", llm_replay_dir=str(rec_dir),
                     llm_base_url=f"http://127.0.0.1:{dead_port()}/v1")
    pol = LLMPolicy()
    _a, plan = pol.plan(base_state(problem), s)
    assert [g.nodes for g in plan.groups] == [["relu", "mul", "add"]]
    assert pol.take_usage()["planner"].calls == 1
    again = json.loads((tmp_path / "again" / "run" / "llm" / "000_planner.json").read_text())
    assert again["replayed_from"] == str(rec_dir / "llm") and again["parsed"] == json.loads(
        (rec_dir / "llm" / "000_planner.json").read_text())["parsed"]
    # the next question is a design, but exchange 1 was never recorded
    st = planned_state(problem, llm_usage={"planner": LLMUsage(calls=1)})
    with pytest.raises(LLMError, match="recorded run has 1 exchange"):
        LLMPolicy().design(st, s)
    # asking another role at a recorded index: the replay diverged
    with pytest.raises(LLMError, match="replay diverged at exchange 0"):
        LLMPolicy().design(planned_state(problem), s)


def test_plan_items_tell_the_model_which_groups_review_turned_off():
    from policies.prompts import plan_items
    from state import EggState, FusionGroup, Plan

    plan = Plan(groups=[FusionGroup(id="g0", kind="pointwise", nodes=["relu"]),
                        FusionGroup(id="g1", kind="softmax", nodes=["softmax"], enabled=False)])
    items = plan_items(EggState(plan=plan))
    assert "TURNED OFF" not in items[0]
    assert "g1" in items[1] and "TURNED OFF" in items[1] and "PyTorch" in items[1]
