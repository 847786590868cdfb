"""A generated module whose kernel path is replayed from a CUDA graph (_egg_graphed, principle
alg-cuda-graph), on the CPU: the graph is a stand-in that re-runs the captured path on the same
static inputs and writes the same static outputs, as a replay does. What is checked is the
module's side: when it captures, what it copies in and out, that a call updates running
statistics once, that a replaced parameter is captured anew, and that a capture that fails
leaves plain calls."""
import pytest
import torch

from codegen.emit import emit_model
from codegen.pipeline import analyze
from harness.problem import load_module, load_problem

BN_BLOCK = '''
import torch, torch.nn as nn
class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.bn = nn.BatchNorm2d(c)
        self.scale = nn.Parameter(torch.randn(c, 1, 1))
    def forward(self, x):
        return (torch.relu(self.bn(x)) * self.scale + 1.0).sum(dim=(2, 3))
def get_inputs():
    return [torch.randn(8, 4, 6, 5)]
def get_init_inputs():
    return [4]
'''


def _copy_into(dst, src):
    if isinstance(dst, torch.Tensor):
        dst.copy_(src)
    elif isinstance(dst, (tuple, list)):
        for d, s in zip(dst, src):
            _copy_into(d, s)


class _Recorder:
    """Stands in for _egg_record: runs the path once (a real capture only records it; the
    module restores the buffers either way) and returns a graph whose replay runs it again on
    the same static inputs into the same output tensors."""

    def __init__(self, fail: bool = False):
        self.captures, self.replays, self.fail = 0, 0, fail

    def __call__(self, fn, static):
        self.captures += 1
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        out = fn(*static)
        rec = self

        class Graph:
            def replay(self):
                rec.replays += 1
                _copy_into(out, fn(*static))

        return Graph(), out


@pytest.fixture
def graphed(write_problem, tmp_path):
    prob = load_problem(write_problem(BN_BLOCK, "bnblock"))
    plan, _rw, err = analyze(prob)
    assert plan is not None, err
    path = tmp_path / "graphed.py"
    path.write_text(emit_model(prob.source, plan, {}, "", graph=True).source)
    mod = load_module(path, "graphed")
    mod._EGG_GRAPH_DEVICES = ("cpu",)
    return prob, mod


def _pair(prob, mod):
    torch.manual_seed(0)
    ref = prob.Model(*prob.init_inputs())
    new = mod.ModelNew(*prob.init_inputs())
    new.load_state_dict(ref.state_dict())
    return ref, new


def test_graph_replays_match_model_and_keep_earlier_outputs(graphed):
    prob, mod = graphed
    rec = mod._egg_record = _Recorder()
    ref, new = _pair(prob, mod)
    kept = []
    with torch.no_grad():
        for i in range(5):
            x = torch.randn(8, 4, 6, 5) * (i + 1)
            want, got = ref(x), new(x)
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
            kept.append((got, got.clone()))
            # one update of the running statistics per call, as Model's
            torch.testing.assert_close(new.bn.running_mean, ref.bn.running_mean, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(new.bn.running_var, ref.bn.running_var, atol=1e-5, rtol=1e-5)
            assert int(new.bn.num_batches_tracked) == int(ref.bn.num_batches_tracked) == i + 1
    assert rec.captures == 1 and rec.replays == 4  # the first call plain, then one capture
    for got, snapshot in kept:  # a later call never writes into an output a caller kept
        assert torch.equal(got, snapshot)
    new.eval()
    ref.eval()
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(8, 4, 6, 5)
            torch.testing.assert_close(new(x), ref(x), atol=1e-4, rtol=1e-4)
    assert rec.captures == 2  # eval() is a route of its own


def test_replaced_parameter_is_captured_anew(graphed):
    prob, mod = graphed
    rec = mod._egg_record = _Recorder()
    ref, new = _pair(prob, mod)
    x = torch.randn(8, 4, 6, 5)
    with torch.no_grad():
        for _ in range(3):
            ref(x), new(x)
        assert rec.captures == 1
        w = torch.randn(4, 1, 1)
        ref.scale = torch.nn.Parameter(w.clone())
        new.scale = torch.nn.Parameter(w.clone())  # a new tensor: the graph read the old one
        torch.testing.assert_close(new(x), ref(x), atol=1e-4, rtol=1e-4)
        assert rec.captures == 2
        new.scale.data = torch.randn(4, 1, 1)  # .data set: moved too
        ref.scale.data = new.scale.data.clone()
        torch.testing.assert_close(new(x), ref(x), atol=1e-4, rtol=1e-4)
        assert rec.captures == 3
        ref.load_state_dict(new.state_dict())  # in place: the graph stays valid
        new.load_state_dict(ref.state_dict())
        torch.testing.assert_close(new(x), ref(x), atol=1e-4, rtol=1e-4)
        assert rec.captures == 3
        bn = torch.nn.BatchNorm2d(4)  # a replaced submodule: its tensors are others
        torch.nn.init.normal_(bn.weight)
        ref.bn, new.bn = bn, torch.nn.BatchNorm2d(4)
        new.bn.load_state_dict(bn.state_dict())
        torch.testing.assert_close(new(x), ref(x), atol=1e-4, rtol=1e-4)
        assert rec.captures == 4
    new.double()  # .to() and friends drop the graphs
    assert new._egg_graphs == {}


def test_a_capture_that_fails_leaves_plain_calls(graphed):
    prob, mod = graphed
    rec = mod._egg_record = _Recorder(fail=True)
    ref, new = _pair(prob, mod)
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(8, 4, 6, 5)
            torch.testing.assert_close(new(x), ref(x), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(new.bn.running_var, ref.bn.running_var, atol=1e-5, rtol=1e-5)
    assert rec.captures == 1 and rec.replays == 0  # tried once, not again


def test_other_devices_and_the_reference_path_never_capture(graphed):
    prob, mod = graphed
    rec = mod._egg_record = _Recorder()
    mod._EGG_GRAPH_DEVICES = ("cuda",)  # CPU tensors: plain calls
    ref, new = _pair(prob, mod)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(8, 4, 6, 5)
            torch.testing.assert_close(new(x), ref(x), atol=1e-4, rtol=1e-4)
        mod._EGG_GRAPH_DEVICES = ("cpu",)
        y = torch.randn(8, 4, 6, 5, dtype=torch.float64)  # another dtype: Model's own ops
        for m in (ref, new, new, new):
            with pytest.raises(RuntimeError):
                m(y)
    assert rec.captures == 0


# ------------------------------------------------------------------ the expert's decision
def _state(write_problem, forward: str, inputs: str, members: str, name: str, device="cuda"):
    """An H200-like state with the expert's plan of a problem (no GPU needed)."""
    from harness.problem import describe_problem
    from policies.expert import ExpertPolicy
    from state import EggState, HardwareInfo, Settings

    src = ("import torch, torch.nn as nn\nclass Model(nn.Module):\n    def __init__(self):\n"
           "        super().__init__()\n" + members + "    def forward(self, " + forward
           + f"def get_inputs():\n    return {inputs}\ndef get_init_inputs():\n    return []\n")
    _prob, spec = describe_problem(write_problem(src, name))
    hw = HardwareInfo(device=device, name="NVIDIA H200", profile_id="h200", interpreter=device == "cpu",
                      sm_count=132, mem_bandwidth_gbs=4800, peak_tflops={"fp32": 67, "tf32": 495})
    st = EggState(problem_path=spec.path, problem=spec, hardware=hw)
    analysis, plan = ExpertPolicy().plan(st, Settings(device="cpu"))
    return st.model_copy(update={"analysis": analysis, "plan": plan})


DEEP = ("x):\n" + "".join(f"        x = torch.sort(self.l{i}(x), dim=-1)[0] * 0.5 + 1.0\n" for i in range(12))
        + "        return x\n",
        "[torch.randn(16, 32)]",
        "".join(f"        self.l{i} = nn.Linear(32, 32)\n" for i in range(12)))
WIDE = ("x):\n        return torch.relu(x * 0.5 + 1.0)\n", "[torch.randn(4096, 4096)]", "")


def test_a_launch_bound_plan_replays_from_a_graph_and_a_memory_bound_one_does_not(write_problem):
    """Twelve small blocks: ~1.1 ms of host time a call against microseconds of GPU work: the
    candidate is graphed (its file calls _egg_graphed; the decision and the principle are
    recorded). One pointwise op over 64 MB: launch-bound too, but copying its input in and its
    output out would cost twice its own traffic: not graphed. On the CPU interpreter: never."""
    from codegen.pipeline import analyze
    from harness.problem import load_problem
    from policies.base import GRAPH_PRINCIPLE
    from policies.expert import ExpertPolicy, graph_choice
    from state import Settings

    st = _state(write_problem, *DEEP, "deep")
    fplan, _rw, _err = analyze(load_problem(st.problem.path))
    assert len(fplan.groups) >= 12
    assert graph_choice(st, fplan, set())[0]
    draft = ExpertPolicy().design(st, Settings(device="cpu"))
    assert GRAPH_PRINCIPLE in draft.principle_ids and "_egg_graphed(self, _egg_key," in draft.source
    assert any("CUDA graph" in d for d in draft.decisions)
    assert not graph_choice(st, fplan, {"nograph"})[0]
    cpu = _state(write_problem, *DEEP, "deepcpu", device="cpu")
    assert not graph_choice(cpu, fplan, set())[0]
    assert "_egg_graphed(self" not in ExpertPolicy().design(cpu, Settings(device="cpu")).source
    wide = _state(write_problem, *WIDE, "wide")
    wplan, _rw, _err = analyze(load_problem(wide.problem.path))
    ok, why = graph_choice(wide, wplan, set())
    assert not ok and "copies" in why


def test_a_graph_candidate_that_fails_is_built_again_without_it_first(write_problem):
    from policies.base import GRAPH_PRINCIPLE
    from policies.expert import NO_GRAPH, ExpertPolicy
    from state import Candidate, VerificationRecord

    st = _state(write_problem, *DEEP, "deepfail")

    def backout(disabled, principles):
        cand = Candidate(id="c1", stage="algorithm", author="algorithm_designer", source="x",
                         disabled_groups=disabled, principle_ids=principles)
        ver = VerificationRecord(candidate_id="c1", passed=False, category="mismatch",
                                 reason="trial 2 (train): output 0: max abs error 0.5")
        return ExpertPolicy()._backout(st.model_copy(update={"candidates": [cand], "verifications": [ver]}),
                                       "algorithm")

    disabled, why = backout([], [GRAPH_PRINCIPLE])
    assert disabled == [NO_GRAPH] and "without the CUDA graph" in why
    disabled, why = backout([NO_GRAPH], [])  # without the graph it fails too: groups go
    assert NO_GRAPH in disabled and len(disabled) > 1 and "graph" not in why


def test_a_graphed_module_is_deep_copied_without_its_graphs(graphed):
    """copy.deepcopy (an EMA copy) of a module holding a CUDA graph: a graph cannot be copied
    (the stand-in refuses as torch's does) and reads the original's tensors; the copy gets
    none, captures its own, and computes with its own parameters. (Pickling the whole module,
    torch.save(model), still fails once a graph is held: the static check bans the pickling
    hooks that would leave it out; the state dict is what to save.)"""
    import copy
    import io

    prob, mod = graphed
    rec = mod._egg_record = _Recorder()
    ref, new = _pair(prob, mod)
    x = torch.randn(8, 4, 6, 5)
    with torch.no_grad():
        for _ in range(3):
            ref(x), new(x)
    assert rec.captures == 1 and new._egg_graphs

    def refuse(*_a):
        raise TypeError("cannot pickle 'torch._C._CUDAGraph' object")

    for entry in new._egg_graphs.values():
        type(entry[1]).__reduce_ex__ = refuse
    twin = copy.deepcopy(new)
    assert twin._egg_graphs == {} and new._egg_graphs  # the original keeps its graph
    ref2 = copy.deepcopy(ref)
    with torch.no_grad():
        twin.scale.mul_(2.0)
        ref2.scale.mul_(2.0)
        for _ in range(3):
            torch.testing.assert_close(twin(x), ref2(x), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(new(x), ref(x), atol=1e-4, rtol=1e-4)  # the original unchanged
    assert rec.captures == 2  # the twin's own
    # the state dict (what torch.save should be given) holds no graph either
    buf = io.BytesIO()
    torch.save(new.state_dict(), buf)
    buf.seek(0)
    twin.load_state_dict(torch.load(buf))
    with torch.no_grad():
        torch.testing.assert_close(twin(x), ref(x), atol=1e-4, rtol=1e-4)
