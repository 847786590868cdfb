"""Capture that survives whole models (docs/capture.md): graph breaks, regions, plain tensor
attributes as buffers, tables computed once at init, recurrent layers on meta tensors, budgets.

The problems under tests/capture_cases are the project's own (a GPT block with a sliced mask
buffer, RoPE with tables built in forward and kept as attributes, transformers' LlamaDecoderLayer
at a tiny config, a data-dependent branch)."""
import pathlib
import time

import pytest
import torch

from codegen import pipeline
from codegen.pipeline import compile_problem
from harness.capture import capture
from harness.problem import load_module, load_problem
from tests.helpers import outputs

CASES = pathlib.Path(__file__).parent / "capture_cases"
HEAD = "import torch\nimport torch.nn as nn\n"


def _problem(body: str, inputs: str, members: str = "", args: str = "x", init: str = "") -> str:
    return (HEAD + "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            + (members or "        pass\n") + f"\n    def forward(self, {args}):\n" + body
            + f"\ndef get_inputs():\n    return [{inputs}]\n\ndef get_init_inputs():\n    return [{init}]\n")


def _new_module(prob, tmp_path, name="cand"):
    comp = compile_problem(prob)
    assert comp.emitted is not None, comp.error
    path = tmp_path / f"{name}.py"
    path.write_text(comp.emitted.source)
    return comp, load_module(path, "candidate")


def _pair(prob, mod, seed=3):
    init = prob.init_inputs()
    torch.manual_seed(seed)
    ref = prob.Model(*init)
    torch.manual_seed(seed)
    new = mod.ModelNew(*init)
    return ref, new


def _same(ref, new, xs, atol=1e-5):
    with torch.no_grad():
        r, g = outputs(ref(*xs)), outputs(new(*xs))
    assert len(r) == len(g)
    for a, b in zip(r, g):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(b, a, atol=atol, rtol=atol)


# ------------------------------------------------------------------------------------- capture
def test_symbolic_fx_first_and_whole():
    """A problem fx traces whole keeps today's capture: one graph, no break."""
    cap = capture(load_problem(CASES / "rope_forward.py"))
    assert cap.method == "fx" and cap.breaks == [] and cap.regions == 1


def test_sliced_mask_buffer_is_a_graph_op():
    """self.bias[:, :, :T, :T] (T from x.size()): fx fails; the buffer is traced as a graph value,
    so the whole block is one graph without a break."""
    cap = capture(load_problem(CASES / "gpt_block.py"))
    assert cap.gm is not None, cap.error
    assert cap.method == "fx-breaks" and cap.breaks == []
    slices = [n for n in cap.gm.graph.nodes if n.op == "call_function" and "getitem" in str(n.target)
              and any(a.op == "get_attr" and a.target == "attn.bias" for a in n.all_input_nodes)]
    assert slices, "the mask buffer is not sliced in the graph"


def test_tensor_attributes_become_buffers():
    cap = capture(load_problem(CASES / "rope_attrs.py"))
    assert cap.gm is not None, cap.error
    assert sorted(cap.attr_buffers) == ["cos_cached", "sin_cached"]


#: a plain 0-d tensor attribute read in forward, in a model fx traces whole
SCALE_ATTR = """import torch
import torch.nn as nn
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.tensor(0.25)
    def forward(self, x):
        return torch.softmax(x * self.scale, -1) * 2.0
def get_inputs():
    return [torch.randn(8, 40)]
def get_init_inputs():
    return []
"""


def test_a_plain_tensor_attribute_of_a_whole_trace_is_a_buffer_the_kernels_read(write_problem):
    """fx traced the attribute as a constant of its own name and ModelNew looked for a parameter
    or buffer of that name, found none, and routed every call to Model's code (its kernels never
    ran). The attribute is a non-persistent buffer in both captures now; the file's kernels run
    and it stays a drop-in (state_dict keys as Model's; a changed attribute is read)."""
    from tests.dropin import check_dropin, load_sources

    path = write_problem(SCALE_ATTR, "scale_attr")
    cap = capture(load_problem(path))
    assert cap.method == "fx" and cap.attr_buffers == ["scale"]
    comp = compile_problem(load_problem(path))
    assert comp.emitted is not None, comp.error
    report = check_dropin(SCALE_ATTR, comp.emitted.source, calls=1)
    assert report.fast("own") and report.fast("own", "eval")
    pm, cm = load_sources(SCALE_ATTR, comp.emitted.source)
    ref, new = pm.Model(), cm.ModelNew()
    ref.scale, new.scale = torch.tensor(0.5), torch.tensor(0.5)
    x = torch.randn(8, 40)
    torch.testing.assert_close(new(x), ref(x))


RESERVED_NAMES = {
    # a submodule, a parameter and a buffer named as fx's GraphModule's own attributes
    "whole trace": ("        return torch.relu(self.graph(x) * self.meta + self.code)\n",
                    "torch.randn(8, 64)",
                    "        self.graph = nn.Linear(64, 32)\n        self.meta = nn.Parameter(torch.randn(32))\n"
                    "        self.register_buffer('code', torch.randn(32))\n"),
    # bitsandbytes-style NF4: a 16-entry table named ``code`` read by index (buffers traced as
    # graph values: the graph-break tracer), the weight computed in the product's registers
    "code table": ("        q = torch.stack(((self.qweight & 15).long(), (self.qweight >> 4).long()), -1).reshape(48, 64)\n"
                   "        w = self.code[q].view(48, 4, 16) * self.absmax[..., None]\n"
                   "        return x @ w.reshape(48, 64).t()\n",
                   "torch.randn(3, 64, dtype=torch.bfloat16)",
                   "        self.register_buffer('code', torch.linspace(-1, 1, 16, dtype=torch.bfloat16))\n"
                   "        self.register_buffer('qweight', torch.randint(0, 256, (48, 32), dtype=torch.uint8))\n"
                   "        self.register_buffer('absmax', torch.rand(48, 4, dtype=torch.bfloat16) + 0.5)\n"),
}


@pytest.mark.parametrize("case", sorted(RESERVED_NAMES))
def test_state_named_like_a_graph_module_attribute(case, write_problem):
    """A GraphModule cannot hold state named ``code``, ``graph`` or ``meta`` (its own attributes
    answer first: "Code has not been generated!"), so such a model got no file at all. The graphs
    read it under an alias and the file reads it by the model's own name: kernels, a drop-in."""
    from tests.dropin import check_dropin

    body, inputs, members = RESERVED_NAMES[case]
    src = _problem(body, inputs, members)
    comp = compile_problem(load_problem(write_problem(src, "reserved")))
    assert comp.emitted is not None, comp.error
    assert comp.plan.groups and "self._egg_attr_" not in comp.emitted.source
    if case == "code table":
        assert [g.kind for g in comp.plan.groups] == ["matmul"]  # rw-dequant-program
    report = check_dropin(src, comp.emitted.source, calls=1, atol=2e-2, rtol=2e-2)
    assert report.fast("own") and report.fast("own", "eval")


def test_data_dependent_branch_is_a_break_between_two_regions():
    prob = load_problem(CASES / "branchy.py")
    cap = capture(prob)
    assert cap.method == "fx-breaks" and [b.stmt for b in cap.breaks] == ["if y.mean() > 1.5:"]
    plan, _rw, err = pipeline.analyze(prob)
    assert err is None
    regions = sorted({plan.regions[g.members[0]] for g in plan.groups})
    assert regions == [0, 1], "a fused group on each side of the branch"


def test_no_kernel_spans_a_graph_break(write_problem):
    """y and z are one pointwise chain in program order; a statement between them that fx cannot
    trace (it may have effects) keeps them in two kernels."""
    src = _problem("        y = x * 2.0\n        if x.sum() > 0:\n            self.n += 1\n"
                   "        return (y + 1.0).relu()\n", "torch.randn(5, 7)",
                   members="        self.n = 0\n")
    plan, _rw, err = pipeline.analyze(load_problem(write_problem(src, "barrier")))
    assert err is None and len(plan.capture.breaks) == 1
    groups = [[m.name for m in g.members] for g in plan.groups]
    assert groups == [["mul"], ["add", "relu"]]
    # the same chain without the break is one kernel
    src2 = _problem("        y = x * 2.0\n        return (y + 1.0).relu()\n", "torch.randn(5, 7)")
    plan2, _rw, _err = pipeline.analyze(load_problem(write_problem(src2, "nobarrier")))
    assert [[m.name for m in g.members] for g in plan2.groups] == [["mul", "add", "relu"]]


def test_llama_decoder_layer_captures_whole():
    """transformers' LlamaAttention builds ``hidden_shape = (*input_shape, -1, self.head_dim)``
    from ``input_shape = hidden_states.shape[:-1]``: fx raised "Proxy object cannot be iterated"
    (two graph breaks around the attention). The traced shape's length is the traced rank, so
    the layer is one graph."""
    pytest.importorskip("transformers")
    cap = capture(load_problem(CASES / "llama_layer.py"))
    assert cap.gm is not None, cap.error
    assert cap.breaks == [], [b.describe() for b in cap.breaks]


def test_a_traced_shape_unpacks_to_the_traced_rank(write_problem, tmp_path):
    """``x.reshape(*x.shape[:-1], 2, -1)``, a tuple built with ``*x.shape[:-1]``, ``len`` of a
    shape and ``x.ndim`` / ``x.dim()`` in a list comprehension are traced (the sizes stay graph
    values: the file runs at other batch sizes; a call of another rank takes a copy of
    Model.forward, since the trace took the rank as a number); iterating a tensor's rows is still a graph
    break (its length is data the trace would fix)."""
    body = ("        lead = x.shape[:-1]\n"
            "        y = x.reshape(*lead, 2, -1).sum(-1)\n"
            "        shape = [d if i == x.ndim - 1 or i == 0 else 1 for i, d in enumerate(x.shape)]\n"
            "        w = x.mean(dim=tuple(range(1, x.dim())), keepdim=True).view(*shape[:-1], 1)\n"
            "        return y.reshape((*lead, -1)) * len(lead) + w\n")
    prob = load_problem(write_problem(_problem(body, "torch.randn(3, 5, 8)"), "unpack"))
    cap = capture(prob)
    assert cap.gm is not None and cap.breaks == [], (cap.error, [b.describe() for b in cap.breaks])
    comp, mod = _new_module(prob, tmp_path, "unpack_new")
    ref, new = _pair(prob, mod)
    _same(ref, new, prob.inputs())
    _same(ref, new, [torch.randn(6, 5, 8)])
    # one more dim: the traced graph (the reference too) took the rank as a number (len(lead)
    # is 2 there, 3 here): the call takes Model's own code
    _same(ref, new, [torch.randn(2, 6, 5, 8)])
    rows = ("        out = []\n        for row in x:\n            out.append(row * 2.0)\n"
            "        return torch.stack(out)\n")
    cap = capture(load_problem(write_problem(_problem(rows, "torch.randn(3, 8)"), "rows")))
    assert cap.breaks and "iterated" in cap.breaks[0].reason


def test_a_value_the_graph_cannot_carry_is_passed_between_two_breaks():
    """transformers' default (SDPA) attention: ``attention_interface`` is a function chosen at
    run time; the break that calls it needs it, so its assignment becomes a break too (before
    this, capture failed: "argument of type: <class 'function'>", and the layer got no kernel)."""
    pytest.importorskip("transformers")
    cap = capture(load_problem(CASES / "llama_sdpa.py"))
    assert cap.gm is not None, cap.error
    opaque = [b for b in cap.breaks if "needs attention_interface, a function" in b.reason]
    assert len(opaque) == 1 and opaque[0].stmt.lstrip().startswith("attention_interface")
    assert any(b.stmt.lstrip().startswith("attn_output, attn_weights = attention_interface(") for b in cap.breaks)


def test_unsupplied_defaults_are_traced_as_constants(write_problem):
    """forward(self, x, h=None) called with x alone: the h-is-None way is traced."""
    src = _problem("        if h is None:\n            h = torch.zeros_like(x)\n        return (x + h).relu()\n",
                   "torch.randn(3, 4)", args="x, h=None")
    cap = capture(load_problem(write_problem(src, "defaults")))
    assert cap.method == "fx" and cap.gm is not None, cap.error


def test_recurrent_layers_on_meta_are_answered_by_shape():
    """nn.LSTM / nn.GRU on meta tensors: the shapes a real call gives, without the per-step
    decomposition (a 6-layer LSTM over 512 steps took 180 s on meta before)."""
    from harness.metarun import FastMeta

    for make, x_shape, h in [
        (lambda: torch.nn.LSTM(8, 16, 2, batch_first=True, proj_size=4), (3, 5, 8), None),
        (lambda: torch.nn.GRU(8, 16, 3, bidirectional=True), (5, 3, 8), None),
        (lambda: torch.nn.RNN(8, 16, 1), (5, 8), None),
    ]:
        torch.manual_seed(0)
        real = make()
        want = real(torch.randn(*x_shape))
        with torch.device("meta"):
            meta = make()
        with FastMeta():
            got = meta(torch.randn(*x_shape, device="meta"))
        flat = lambda o: [o] if isinstance(o, torch.Tensor) else [t for x in o for t in flat(x)]  # noqa: E731
        assert [t.shape for t in flat(got)] == [t.shape for t in flat(want)]
    with torch.device("meta"):
        big = torch.nn.LSTM(128, 256, 6, batch_first=True)
    t0 = time.time()
    with FastMeta():
        big(torch.randn(10, 512, 128, device="meta"))
    assert time.time() - t0 < 5.0


def test_recurrent_flops_are_counted():
    """roofline.count charges an LSTM 2 * steps * batch * rows * cols per weight matrix."""
    from harness import roofline

    class P:  # a LoadedProblem stand-in
        pass

    src = ("import torch\nimport torch.nn as nn\nclass Model(nn.Module):\n    def __init__(self):\n"
           "        super().__init__()\n        self.rnn = nn.LSTM(8, 16, 1)\n"
           "    def forward(self, x):\n        return self.rnn(x)[0]\n"
           "def get_inputs():\n    return [torch.randn(5, 3, 8)]\ndef get_init_inputs():\n    return []\n")
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = pathlib.Path(d) / "lstm.py"
        p.write_text(src)
        cnt = roofline.count(load_problem(p))
    want = 2.0 * 5 * 3 * (64 * 8 + 64 * 16)
    assert cnt.ops.get("lstm") == pytest.approx(want)
    del P


# ----------------------------------------------------------------------------- generated files
def test_branch_model_matches_on_both_ways(tmp_path):
    prob = load_problem(CASES / "branchy.py")
    comp, mod = _new_module(prob, tmp_path)
    assert len(comp.emitted.kernels) == 2
    ref, new = _pair(prob, mod)
    for scale in (0.1, 4.0):  # the mean stays under, or goes over, the branch's threshold
        torch.manual_seed(7)
        xs = [x * scale for x in prob.inputs()]
        with torch.no_grad():
            taken = bool((torch.relu(xs[0]) + 1.0).mean() > 1.5)
        assert taken is (scale > 1)
        _same(ref, new, xs)


def test_module_state_updated_by_forward_matches_over_calls(write_problem, tmp_path):
    """A recurrent cell that keeps its hidden state as a plain attribute and replaces it in
    forward: the assignment is a graph break, so every call sees the state the last one left."""
    src = _problem("        self.h = self.h.to(x.device)\n        z = torch.cat((x, self.h), dim=1)\n"
                   "        self.h = torch.tanh(self.lin(z))\n        return self.out(self.h) * 2.0 + 1.0\n",
                   "torch.randn(4, 6)",
                   members="        self.h = torch.randn(4, 5)\n        self.lin = nn.Linear(11, 5)\n"
                           "        self.out = nn.Linear(5, 3)\n")
    prob = load_problem(write_problem(src, "state"))
    comp, mod = _new_module(prob, tmp_path)
    assert comp.plan.capture.attr_buffers == ["h"]
    ref, new = _pair(prob, mod)
    assert set(new.state_dict()) == set(ref.state_dict())
    for seed in range(3):  # the second and third calls depend on the state the first left
        torch.manual_seed(seed)
        _same(ref, new, prob.inputs())


def test_rope_tables_built_in_forward_are_buffers_at_init(tmp_path):
    prob = load_problem(CASES / "rope_forward.py")
    comp, mod = _new_module(prob, tmp_path)
    assert comp.plan.folds, "the cos/sin tables are not folded"
    ref, new = _pair(prob, mod)
    tables = {k for k, _ in new.named_buffers() if k.startswith("_egg_table_")}
    assert tables and set(new.state_dict()) == set(ref.state_dict())
    torch.manual_seed(1)
    _same(ref, new, prob.inputs())
    # another sequence length: the tables are computed as the forward did
    q, k = torch.randn(2, 4, 17, 32), torch.randn(2, 2, 17, 32)
    _same(ref, new, [q, k])
    # the buffer is what a call at the problem's shapes reads: a changed buffer changes the output
    name = sorted(tables)[0]
    with torch.no_grad():
        before = outputs(new(*prob.inputs()))[0].clone()
        getattr(new, name).mul_(0.5)
        after = outputs(new(*prob.inputs()))[0]
    assert not torch.allclose(before, after)


def test_rope_attribute_tables_move_with_the_module(tmp_path):
    prob = load_problem(CASES / "rope_attrs.py")
    comp, mod = _new_module(prob, tmp_path)
    ref, new = _pair(prob, mod)
    names = {k for k, _ in new.named_buffers()}
    assert {"cos_cached", "sin_cached"} <= names
    assert set(new.state_dict()) == set(ref.state_dict())
    torch.manual_seed(2)
    _same(ref, new, prob.inputs())
    # .to() converts and moves registered buffers (a plain attribute would stay as it was)
    new.to(torch.float64)
    assert new.cos_cached.dtype == torch.float64 and ref.double().cos_cached.dtype == torch.float32
    new.to(torch.float32)
    torch.manual_seed(4)
    _same(ref.float(), new, prob.inputs())


# ------------------------------------------------------------------------- through the graph
def _run(problem, tmp_path, **extra):
    from graph.build import build_graph
    from graph.checkpoints import sqlite_saver
    from state import EggState, Settings

    settings = Settings(device="cpu", run_dir=str(tmp_path / "run"), trials=1, timing_rep_ms=5.0,
                        max_attempts_algorithm=2, **extra)
    g = build_graph(checkpointer=sqlite_saver(tmp_path / "run" / "checkpoints.sqlite"))
    config = {"configurable": {"thread_id": "t"}}
    g.invoke({"problem_path": str(problem)}, config, context=settings)
    return EggState.model_validate(g.get_state(config).values)


@pytest.mark.parametrize("case", ["gpt_block", "rope_forward", "rope_attrs", "llama_layer", "branchy"])
def test_whole_model_ends_with_a_verified_kernel(case, tmp_path):
    """Through the graph on the CPU: the best candidate launches Triton kernels and the verifier
    (harness.verify) passed it; the reference stays the fallback."""
    if case == "llama_layer":
        pytest.importorskip("transformers")
    st = _run(CASES / f"{case}.py", tmp_path)
    best = st.candidate(st.best_id)
    assert best is not None and not best.fallback and best.kernels, st.stage_context["algorithm"]
    ver = st.verification(best.id)
    assert ver is not None and ver.passed, ver
    if case == "branchy":
        assert st.analysis.capture == "fx-breaks" and len(st.analysis.regions) == 2


# ------------------------------------------------------------------------------------- budget
def _state_with_groups(n: int, device: str = "cuda"):
    from state import EggState, FusionGroup, HardwareInfo, Plan

    hw = HardwareInfo(device=device, name="x", profile_id="h200", interpreter=device == "cpu")
    groups = [FusionGroup(id=f"g{i}", kind="pointwise", est_bytes_saved=float(i),
                          est_us_saved=float((i * 7) % n)) for i in range(n)]
    groups.append(FusionGroup(id="lib_x", kind="library"))
    return EggState(problem_path="p.py", hardware=hw, plan=Plan(groups=groups), started_at=time.time())


def test_budget_keeps_the_largest_savings_first():
    from knowledge import heuristics as H
    from policies.expert import budget_deferred
    from state import Settings

    st = _state_with_groups(40)
    deferred, note = budget_deferred(st, Settings(time_limit_s=60.0), set())
    keep = 40 - len(deferred)  # the time left is a little under 60 s by now
    assert H.stage1_group_budget(59.0, "cuda") <= keep <= H.stage1_group_budget(60.0, "cuda") < 40
    kept = [g for g in st.plan.groups if g.kind != "library" and g.id not in deferred]
    worst_kept = min(g.est_us_saved for g in kept)
    assert all(g.est_us_saved <= worst_kept for g in st.plan.groups if g.id in deferred)
    assert "deferred" in note
    # no time limit: every group is fused; more time: more groups
    assert budget_deferred(st, Settings(time_limit_s=0.0), set()) == (set(), "")
    more, _ = budget_deferred(st, Settings(time_limit_s=300.0), set())
    assert len(more) < len(deferred)


def test_budget_counts_shared_kernels_once():
    """Groups with one kernel key compile one set of kernels (emit.share_kernels): a budget
    that holds 12 distinct groups holds more groups of a repeated block, and the groups kept
    are still the largest savings first."""
    from knowledge import heuristics as H
    from policies.expert import budget_deferred
    from state import Settings

    distinct = H.stage1_group_budget(120.0, "cuda", [f"k{i}" for i in range(40)])
    assert distinct == H.stage1_group_budget(120.0, "cuda") == 12
    repeated = H.stage1_group_budget(120.0, "cuda", [f"k{i % 3}" for i in range(40)])
    assert repeated > 2 * distinct
    assert H.stage1_group_budget(120.0, "cuda", [""] * 40) == distinct  # no key: its own kernel
    st = _state_with_groups(40)
    for g in st.plan.groups:
        g.kernel_key = "" if g.kind == "library" else f"k{int(g.id[1:]) % 3}"
    deferred, _ = budget_deferred(st, Settings(time_limit_s=60.0), set())
    alone = H.stage1_group_budget(60.0, "cuda")  # 6 distinct groups
    assert deferred and 40 - len(deferred) > 2 * alone  # 3 kernels + ~18 repeats
    kept = [g for g in st.plan.groups if g.kind != "library" and g.id not in deferred]
    assert all(g.est_us_saved <= min(k.est_us_saved for k in kept)
               for g in st.plan.groups if g.id in deferred)


def test_no_verification_starts_once_the_budget_is_spent(tmp_path):
    """A candidate made just before the time limit is not verified past it: the verifier says
    so at once (a run ends inside its budget with its best verified candidate)."""
    from nodes.common import call_budget
    from nodes.verifier import verifier
    from state import Candidate, EggState, HardwareInfo, ProblemSpec, Settings

    spec = ProblemSpec(path=str(CASES / "branchy.py"), name="branchy", source="", sha256="x")
    hw = HardwareInfo(device="cpu", name="cpu", profile_id="cpu-interpreter", interpreter=True)
    cand = Candidate(id="c1", stage="algorithm", author="algorithm_designer",
                     source="class ModelNew: pass\n")
    st = EggState(problem_path=spec.path, problem=spec, hardware=hw, candidates=[cand],
                  current_id="c1", started_at=time.time() - 100, stage="algorithm")
    s = Settings(device="cpu", run_dir=str(tmp_path), time_limit_s=105.0)
    assert call_budget(s, st, 600.0) is None
    t0 = time.time()

    class R:
        context = s

    out = verifier(st, R())
    assert time.time() - t0 < 5.0
    (rec,) = out["verifications"]
    assert not rec.passed and rec.category == "timeout" and "budget" in rec.reason
    # with time left, the call is cut to what is left
    s2 = Settings(device="cpu", time_limit_s=160.0)
    assert 50.0 < call_budget(s2, st, 600.0) <= 60.0


def test_regions_are_measured_node_by_node():
    """harness.regionprof times every node of the captured graph on a real run (the wall clock
    on the CPU, CUDA events on a GPU) and sums them per region."""
    from harness import regionprof

    got = regionprof.measure(str(CASES / "branchy.py"), "cpu", runs=2)
    assert got["method"] == "fx-breaks" and len(got["regions"]) == 2
    assert "_egg_break_0_out" in got["nodes"] and all(ms > 0 for ms in got["regions"])
    assert got["total_ms"] == pytest.approx(sum(got["nodes"].values()))


def test_region_times_of_a_launch_bound_model_are_eagers_not_the_interpreters(write_problem):
    """Node by node, 300 tiny ops add up to the interpreter's host time between them, far above
    eager's own call (ResNet-18 on the H200: 8.6 ms against 2.3 ms, so the CUDA-graph decision
    read a GPU time four times too long): the regions are scaled to eager's whole call, with the
    shares kept."""
    from harness import regionprof

    body = "".join("        x = x + 1.0\n" for _ in range(300))
    src = ("import torch\nimport torch.nn as nn\nclass Model(nn.Module):\n"
           "    def forward(self, x):\n" + body + "        return x\n"
           "def get_inputs():\n    return [torch.randn(4)]\ndef get_init_inputs():\n    return []\n")
    got = regionprof.measure(str(write_problem(src, "tiny_ops")), "cpu", runs=3)
    assert got["interpreted_ms"] > got["eager_ms"] > 0
    assert sum(got["regions"]) == pytest.approx(got["eager_ms"])
    assert got["total_ms"] == pytest.approx(sum(got["nodes"].values()))


def test_a_table_follows_its_source_buffer_changed_in_place(tmp_path):
    """The frequencies a RoPE table is built from change in place: the table is built again."""
    prob = load_problem(CASES / "rope_forward.py")
    _comp, mod = _new_module(prob, tmp_path)
    ref, new = _pair(prob, mod)
    with torch.no_grad():
        ref.inv_freq.mul_(1.5)
        new.inv_freq.mul_(1.5)
    torch.manual_seed(5)
    _same(ref, new, prob.inputs())


# ------------------------------------------------------------------------------------ drop-in
@pytest.mark.parametrize("case", ["gpt_block", "rope_forward", "rope_attrs", "llama_layer", "llama_sdpa",
                                  "branchy"])
def test_whole_model_file_is_a_drop_in(case):
    """The file a whole model gets (breaks, buffers from attributes, tables at init) is a drop-in
    (tests/dropin.check_dropin: random state, train() and eval(), scaled inputs, other sizes and
    ranks, grad mode, moved to float64 and back), and its kernels run for the problem's inputs."""
    from tests.dropin import check_dropin

    if case.startswith("llama"):
        pytest.importorskip("transformers")
    path = CASES / f"{case}.py"
    comp = compile_problem(load_problem(path))
    assert comp.emitted is not None and comp.emitted.kernels, comp.error
    report = check_dropin(path.read_text(), comp.emitted.source, calls=1)
    assert report.fast("own", "train") and report.fast("own", "eval")


def test_a_value_computed_from_a_buffer_is_read_at_run_time(write_problem):
    """fx reads a buffer as a tensor, so ``self.mask == 0`` became a constant computed at trace
    time (on meta tensors: no file could be written; on real ones, a load_state_dict would not
    reach it): such a forward is traced with buffers as graph values, and the file reads the
    buffer (check_dropin loads random values into it)."""
    from tests.dropin import check_dropin

    src = _problem("        s = x @ x.transpose(-2, -1)\n"
                   "        return torch.softmax(s.masked_fill(self.mask == 0, float('-inf')), dim=-1)\n",
                   "torch.randn(2, 6, 4)",
                   members="        self.register_buffer('mask', torch.tril(torch.ones(6, 6)))\n")
    path = write_problem(src, "bufmask")
    cap = capture(load_problem(path))
    assert cap.method == "fx-breaks" and cap.breaks == []
    assert not [n for n in cap.gm.graph.nodes if n.op == "get_attr"
                and str(n.target).startswith("_tensor_constant")]
    comp = compile_problem(load_problem(path))
    assert comp.emitted is not None and comp.emitted.kernels, comp.error
    report = check_dropin(src, comp.emitted.source, calls=1, variants=("own", "x3"), grad=False)
    assert report.fast("own", "train")


FUNCTION_MODULE = '''import torch
import torch.nn as nn


class _Rotate(nn.Module):
    """A function made a module at import, as the `kernels` package makes transformers'
    apply_rotary_pos_emb (transformers >= 5.25 installs it)."""

    def forward(self, x, c):
        return x * c + torch.cat((-x[..., 4:], x[..., :4]), -1) * (1.0 - c)


rotate = _Rotate()


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(rotate(self.lin(x), 0.25))


def get_inputs():
    return [torch.randn(4, 8)]


def get_init_inputs():
    return []
'''


def test_a_module_that_is_not_a_submodule_is_traced_like_a_function(write_problem, tmp_path):
    """fx refuses a call of a module the model does not own ("module is not installed as a
    submodule"): with transformers 5.25 and `kernels`, LlamaAttention's RoPE became such a call
    and a third graph break. Its ops are traced inline now: no break, and a kernel covers them."""
    prob = load_problem(write_problem(FUNCTION_MODULE, "fnmod"))
    cap = capture(prob)
    assert cap.gm is not None and not cap.breaks, (cap.error, [b.reason for b in cap.breaks])
    comp, mod = _new_module(prob, tmp_path)
    assert comp.emitted.kernels
    torch.manual_seed(0)
    ref = mod.Model()
    torch.manual_seed(0)
    new = mod.ModelNew()
    x = torch.randn(4, 8)
    torch.testing.assert_close(new(x), ref(x))


def test_a_mask_built_in_forward_from_traced_sizes_is_captured(write_problem, tmp_path):
    """``torch.ones(T, T, device=x.device, dtype=bool)`` with T = x.size(-1) (a causal mask built
    in forward; Mamba-2's segment sum) made fx fail ("ones() takes 1 positional argument but 2
    were given") and the statement a graph break, left to PyTorch. Now it is one graph; the mask
    is folded (computed once per size), the arithmetic around it a kernel, and the result
    matches at the traced length and another; a plain size keeps PyTorch's own call."""
    body = ("        T = x.size(-1)\n"
            "        c = torch.cumsum(x, dim=-1)\n"
            "        seg = c[..., :, None] - c[..., None, :]\n"
            "        mask = torch.tril(torch.ones(T, T, device=x.device, dtype=bool), diagonal=0)\n"
            "        z = torch.zeros(x.shape[0], T, device=x.device) + torch.ones(size=(T,), device=x.device)\n"
            "        return torch.exp(seg.masked_fill(~mask, -torch.inf)) * 2.0, z * x\n")
    prob = load_problem(write_problem(_problem(body, "torch.randn(3, 8)"), "segsum"))
    cap = capture(prob)
    assert cap.gm is not None and cap.breaks == [], (cap.error, cap.breaks)
    ones = [n for n in cap.gm.graph.nodes if n.op == "call_function" and n.target is torch.ones]
    assert ones and ones[0].kwargs["dtype"] is torch.bool
    assert torch.ones(2, 3).shape == (2, 3) and torch.ones.__module__ == "torch"  # restored
    comp, mod = _new_module(prob, tmp_path, "segsum_new")
    assert comp.plan.groups and comp.plan.folds
    ref, new = _pair(prob, mod)
    torch.manual_seed(2)
    _same(ref, new, prob.inputs())
    _same(ref, new, [torch.randn(5, 11)])


def test_the_eager_attention_llama_workload_gets_the_flash_kernel(tmp_path):
    """workloads/models/llama3_8b_decoder_layer_eager.py (issue 21's configuration: eager
    attention, the causal mask as transformers builds it, the dtype's lowest value above the
    diagonal), written out at a tiny config: Hugging Face's eager_attention_forward (repeat_kv,
    scores + mask, fp32 softmax) is planned as one flash-attention kernel, and the file is a
    drop-in with its kernels taken for the problem's own call."""
    pytest.importorskip("transformers")
    import re

    from tests.dropin import check_dropin

    src = (pathlib.Path(__file__).resolve().parents[1] / "workloads" / "models"
           / "llama3_8b_decoder_layer_eager.py").read_text()
    tiny, n = re.subn(r"(# --- shapes[^\n]*\n).*?(# --- end shapes)",
                      r"\1BATCH, TOKENS = 2, 8\nHIDDEN, HEADS, KV_HEADS, INTER = 32, 4, 2, 64\n\2",
                      src, flags=re.S)
    assert n == 1
    path = tmp_path / "llama_eager_tiny.py"
    path.write_text(tiny.replace("torch.bfloat16", "torch.float32"))  # fp32: the CPU's tolerance
    comp = compile_problem(load_problem(path))
    assert comp.emitted is not None, comp.error
    assert "rw-attention" in comp.rewrites and any(g.kind == "attention" for g in comp.plan.groups)
    report = check_dropin(path.read_text(), comp.emitted.source, calls=1)
    assert report.fast("own", "train") and report.fast("own", "eval")


def test_a_break_that_differs_between_modes_is_refused_with_both_lines(write_problem):
    """Each break's function is written once into the file, so the train() and eval() traces
    (kernels and references) must agree on it; when they do not, the error says which two
    disagree and where (the Llama layer's tiler once failed on this with no more to go on)."""
    from codegen.emit import EmitError, emit_model

    src = _problem("        h = torch.nn.functional.dropout(x, p=0.1, training=self.training)\n"
                   "        if h.sum() > 0:\n            h = h * 2.0\n"
                   "        return h.relu()\n",
                   "torch.randn(8, 16)")
    prob = load_problem(write_problem(src, "dropbreak"))
    plan, _rw, err = pipeline.analyze(prob)
    assert plan is not None, err
    refs = plan.dropin.reference
    assert set(refs) == {"train", "eval"}
    (name, body), = refs["eval"].meta["egg_break_sources"].items()
    assert emit_model(prob.source, plan, {}, "# ok").source  # as traced: one function each
    refs["eval"].meta["egg_break_sources"][name] = body.replace("2.0", "3.0")
    with pytest.raises(EmitError, match=r"train\(\) (kernels|reference) vs eval\(\) reference: line \d+"):
        emit_model(prob.source, plan, {}, "# changed")


def test_dtype_information_of_a_traced_tensor_is_captured_and_folded(write_problem, tmp_path):
    """``torch.finfo(s.dtype).max`` (a mask's fill) and ``torch.iinfo(i.dtype).max`` of traced
    tensors were graph breaks ("finfo() requires a floating point input type"): now one graph;
    the canonical forms write the numbers in place, the values match in fp32 and after
    ``.to(float64)`` (the fill then float64's), and finfo is the class again after the trace."""
    body = ("        s = x.masked_fill(x > 1.0, -torch.finfo(x.dtype).max)\n"
            "        n = torch.iinfo(torch.int32).bits + 0 * x.sum()\n"
            "        return s.softmax(-1) * torch.finfo(x.dtype).eps, n\n")
    prob = load_problem(write_problem(_problem(body, "torch.randn(3, 8)"), "finfo"))
    cap = capture(prob)
    assert cap.gm is not None and cap.breaks == [], (cap.error, cap.breaks)
    assert [n for n in cap.gm.graph.nodes if n.target is torch.finfo]
    assert isinstance(torch.finfo, type) and torch.finfo(torch.float16).max == 65504.0  # restored
    comp, mod = _new_module(prob, tmp_path, "finfo_new")
    assert not [n for n in comp.plan.gm.graph.nodes if n.target in (torch.finfo, torch.iinfo)]
    ref, new = _pair(prob, mod)
    torch.manual_seed(2)
    _same(ref, new, prob.inputs())
    _same(ref.to(torch.float64), new.to(torch.float64), [torch.randn(3, 8, dtype=torch.float64) * 3])


def test_autocast_turned_off_on_a_traced_device_is_traced_through(write_problem):
    """Hugging Face's rotary embedding without its isinstance guard: ``with
    torch.autocast(device_type=x.device.type, enabled=False)`` around the tables' product and
    their cos / sin. fx refused the traced device type and the whole block was a graph break
    (the tables in PyTorch). Now it is traced through (a no-op where autocast is off); a call
    under autocast takes the copy of Model.forward, where the block holds: check_dropin's
    autocast call gets Model's dtypes and values. Turning autocast on stays a break."""
    from tests.dropin import check_dropin

    members = ("        inv = 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8))\n"
               "        self.register_buffer('inv_freq', inv, persistent=False)\n")
    body = ("        inv = self.inv_freq[None, :, None].expand(pos.shape[0], -1, 1)\n"
            "        p = pos[:, None, :].float()\n"
            "        with torch.autocast(device_type=x.device.type, enabled=False):\n"
            "            freqs = (inv.float() @ p).transpose(1, 2)\n"
            "            emb = torch.cat((freqs, freqs), dim=-1)\n"
            "            cos, sin = emb.cos(), emb.sin()\n"
            "        return x * cos.to(x.dtype) + x * sin.to(x.dtype)\n")
    src = _problem(body, "torch.randn(2, 6, 8), torch.arange(6).repeat(2, 1)", members, args="x, pos")
    prob = load_problem(write_problem(src, "rotary_amp"))
    cap = capture(prob)
    assert cap.gm is not None and cap.breaks == [], (cap.error, [b.describe() for b in cap.breaks])
    assert torch.autocast is torch.amp.autocast_mode.autocast  # restored after the trace
    comp = compile_problem(prob)
    assert comp.emitted is not None and "_egg_k_" in comp.emitted.source, comp.error
    assert not any(n.target is torch.matmul for n in comp.plan.gm.graph.nodes)  # a product of one term
    report = check_dropin(src, comp.emitted.source, calls=1)
    assert report.fast("own", "train")
    on = body.replace("enabled=False", "dtype=torch.bfloat16")
    cap = capture(load_problem(write_problem(_problem(on, "torch.randn(2, 6, 8), torch.arange(6).repeat(2, 1)",
                                                      members, args="x, pos"), "rotary_amp_on")))
    assert len(cap.breaks) == 1


ENCODER = HEAD + '''
class Model(nn.Module):
    def __init__(self, p: float, norm_first: bool, batch_first: bool):
        super().__init__()
        layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=48, dropout=p,
                                           activation="gelu", norm_first=norm_first, batch_first=batch_first)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, norm=nn.LayerNorm(32),
                                             enable_nested_tensor=False)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        return self.head(self.encoder(x)[0])


def get_inputs():
    return [torch.randn(5, 3, 32)]


def get_init_inputs():
    return [{p}, {norm_first}, {batch_first}]
'''


@pytest.mark.parametrize("p, norm_first, batch_first", [(0.0, False, False), (0.1, True, True)])
def test_a_transformer_encoder_is_written_out_into_kernels(p, norm_first, batch_first, write_problem, tmp_path):
    """nn.TransformerEncoder(Layer) (ViT, the convolutional ViT of level 3) was one library call:
    no kernel at all. Written out as the calls PyTorch's own path makes, its residual adds join
    the norms and its activation its product; MultiheadAttention stays a call. With dropout in
    train() the submodules are called in eager's order, so the same seed draws the same masks:
    the file verifies in both modes and is a drop-in."""
    from harness.verify import verify
    from tests.dropin import check_dropin

    src = ENCODER.replace("{p}", str(p)).replace("{norm_first}", str(norm_first)).replace(
        "{batch_first}", str(batch_first))
    path = write_problem(src, f"encoder_{int(p * 10)}_{norm_first}")
    comp = compile_problem(load_problem(path))
    assert comp.emitted is not None, comp.error
    kinds = [g.kind for g in comp.plan.groups]
    assert kinds.count("norm") >= 4 and not any(
        isinstance(comp.plan.gm.get_submodule(n.target), (torch.nn.TransformerEncoder, torch.nn.TransformerEncoderLayer))
        for n in comp.plan.gm.graph.nodes if n.op == "call_module"), kinds
    cand = tmp_path / "cand.py"
    cand.write_text(comp.emitted.source)
    res = verify(str(path), str(cand), device="cpu", trials=2, problem_source=src)
    assert res["passed"], res["reason"]
    report = check_dropin(src, comp.emitted.source, calls=1, atol=1e-4, rtol=1e-4)
    assert report.fast("own", "train")
