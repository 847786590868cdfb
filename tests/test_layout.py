"""Convolutions in channels-last order (codegen.layout, principle mem-conv-channels-last): where
the rewrite applies, where it must not, what the generated ModelNew does with layouts, and the
memory optimizer's choice of it. GPU speed is measured on the device (docs/results/)."""
import pytest
import torch
import torch.nn.functional as F

from codegen import layout as L
from codegen import pipeline
from codegen.emit import emit_model
from harness.problem import load_module, load_problem
from harness.verify import verify
from policies.expert import LAYOUT_PRINCIPLE, ExpertPolicy
from state import Settings
from tests.helpers import fast_forward

HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
CONV_TAIL = HEAD + '''
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.shift = nn.Parameter(torch.randn(8, 1, 1) * 0.1)

    def forward(self, x):
        return F.gelu(self.conv(x) + self.shift) * 0.5

def get_inputs():
    return [torch.randn(2, 3, 19, 13)]

def get_init_inputs():
    return []
'''
CONVT3D_REDUCE = HEAD + '''
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.ConvTranspose3d(4, 6, 3, stride=2)

    def forward(self, x):
        y = self.conv(x)
        return y.mean(dim=(2, 3, 4)), y * 2.0

def get_inputs():
    return [torch.randn(2, 4, 5, 6, 7)]

def get_init_inputs():
    return []
'''
FUNCTIONAL = HEAD + '''
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(5, 2, 3, 3))

    def forward(self, x):
        return torch.relu(F.conv2d(x, self.w, padding=1)).view(x.shape[0], -1)

def get_inputs():
    return [torch.randn(3, 2, 9, 11)]

def get_init_inputs():
    return []
'''
CONV1D = HEAD + '''
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(3, 4, 3)

    def forward(self, x):
        return torch.relu(self.conv(x))

def get_inputs():
    return [torch.randn(2, 3, 30)]

def get_init_inputs():
    return []
'''


def _verified(path, cand) -> None:
    """The candidate passes EGG's verifier (two trials of each kind); the verdict's reason if not."""
    res = verify(str(path), str(cand), trials=2)
    assert res["passed"], f"[{res['category']}] {res['reason']}"


def _emit(write_problem, src, name):
    path = write_problem(src, name)
    prob = load_problem(path)
    plan, _rw, err = pipeline.analyze(prob, channels_last=True)
    assert err is None
    em = emit_model(prob.source, plan, {}, "# test")
    cand = path.with_name(f"{name}_new.py")
    cand.write_text(em.source)
    return path, cand, plan, em


def test_conv_with_pointwise_tail_runs_channels_last_and_returns_the_standard_layout(write_problem):
    """The tail reads the channels-last result and writes the standard layout itself (tiles read
    along C, written along the pixels): no conversion pass over the result."""
    path, cand, plan, em = _emit(write_problem, CONV_TAIL, "cl_tail")
    assert plan.channels_last_params == ["conv.weight"]
    fwd = fast_forward(em.source)
    assert "_egg_channels_last(x)" in fwd and "_egg_standard_layout(" not in fwd
    mod = load_module(cand, "candidate")
    torch.manual_seed(0)
    m = mod.ModelNew()
    assert m.conv.weight.is_contiguous(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 19, 13)
    conv = F.conv2d(x.contiguous(memory_format=torch.channels_last), m.conv.weight)
    bias = m.conv.bias.view(1, 8, 1, 1)  # rw-conv-bias-epilogue moved the bias into the tail
    seen = []
    tiled = mod._egg_k_g0_t
    mod._egg_k_g0_t = type("K", (), {"__getitem__": lambda self, g: seen.append(g) or tiled[g]})()
    tail = mod._egg_g0(conv, bias, m.shift)
    assert seen and tail.is_contiguous()  # the tiled walk ran and wrote the standard layout
    torch.testing.assert_close(tail, F.gelu(conv + bias + m.shift) * 0.5, atol=1e-5, rtol=1e-5)
    # a standard-layout input: the flat walk (and no conversion needed)
    std = mod._egg_g0(conv.contiguous(), bias, m.shift)
    assert len(seen) == 1 and std.is_contiguous()
    torch.testing.assert_close(std, tail)
    assert m(x).is_contiguous()
    _verified(path, cand)


def test_tail_whose_input_cannot_be_tiled_converts_after_the_walk(write_problem):
    """A per-row input (its spatial dims do not collapse into one stride): the tiled walk does
    not apply, the wrapper walks channels-last and converts its result; also a chain whose value
    is reduced as well as returned. Same values as eager either way."""
    src = CONV_TAIL.replace(
        "return F.gelu(self.conv(x) + self.shift) * 0.5",
        "return torch.relu(self.conv(x) + self.rowb) * 2.0").replace(
        "self.shift = nn.Parameter(torch.randn(8, 1, 1) * 0.1)",
        "self.rowb = nn.Parameter(torch.randn(17, 1) * 0.1)")
    path, cand, plan, em = _emit(write_problem, src, "cl_fallback")
    assert "o0 = _egg_standard_layout(o0)" in em.source  # in the wrapper, after the flat walk
    _verified(path, cand)
    mod = load_module(cand, "candidate")
    assert mod.ModelNew()(torch.randn(2, 3, 19, 13)).is_contiguous()
    src2 = src.replace("return torch.relu(self.conv(x) + self.rowb) * 2.0",
                       "y = torch.relu(self.conv(x) + self.rowb) * 2.0\n        return y, y.amax(dim=1)")
    path, cand, plan, em = _emit(write_problem, src2, "cl_fallback2")
    _verified(path, cand)


def test_reduction_consumer_reads_the_channels_last_result_through_its_nhwc_view(write_problem):
    """conv -> bias -> mean over space: the reduction runs over the (N, *S, C) view of the
    channels-last result with the bias add as its prologue: no layout conversion, one pass."""
    src = CONVT3D_REDUCE.replace("return y.mean(dim=(2, 3, 4)), y * 2.0",
                                 "return torch.relu(y).mean(dim=(2, 3, 4))")
    path, cand, plan, em = _emit(write_problem, src, "cl_red")
    assert "_egg_standard_layout(conv_nobias)" not in em.source
    assert "conv_nobias.permute(0, 2, 3, 4, 1)" in em.source
    (red,) = plan.groups
    assert red.kind == "reduction" and red.domain == (2, 11, 13, 15, 6)  # N, D, H, W, C
    assert [plan.nops[m].name for m in red.prologue()] == ["add", "relu"]  # bias + relu, fused
    _verified(path, cand)
    # the result also returned: the bias add is written once and read back by the reduction
    path, cand, plan, em = _emit(write_problem, CONVT3D_REDUCE, "cl_red2")
    assert "_egg_standard_layout(conv_nobias)" not in em.source
    _verified(path, cand)


def test_view_reductions_of_every_kind_and_escaping_values(write_problem):
    """min over C (values), mean over space (keepdim), softmax over C of a scaled value, and the
    chain's value returned itself: each consumer sees eager's shapes and values."""
    src = CONV_TAIL.replace(
        "return F.gelu(self.conv(x) + self.shift) * 0.5",
        "y = F.gelu(self.conv(x) + self.shift)\n        m = torch.min(y, dim=1, keepdim=True)[0]\n"
        "        return torch.tanh(m), y.mean(dim=(2, 3), keepdim=True) * 2.0, "
        "torch.softmax(y * 2.0, dim=1), y")
    path, cand, plan, em = _emit(write_problem, src, "cl_views")
    assert "_egg_standard_layout(conv" not in em.source
    assert {g.kind for g in plan.groups} >= {"reduction", "softmax"}
    _verified(path, cand)


def test_norm_consumer_gets_the_standard_layout_back(write_problem):
    src = CONV_TAIL.replace("return F.gelu(self.conv(x) + self.shift) * 0.5",
                            "return self.gn(torch.relu(self.conv(x)))").replace(
        "self.shift = nn.Parameter(torch.randn(8, 1, 1) * 0.1)",
        "self.shift = nn.Parameter(torch.randn(8, 1, 1) * 0.1)\n        self.gn = nn.GroupNorm(2, 8)")
    assert "self.gn(" in src and "nn.GroupNorm" in src
    path, cand, plan, em = _emit(write_problem, src, "cl_norm")
    assert "_egg_standard_layout(conv" in em.source
    _verified(path, cand)


def test_functional_conv_parameter_relaid_and_view_consumer_safe(write_problem):
    path, cand, plan, em = _emit(write_problem, FUNCTIONAL, "cl_fn")
    assert plan.channels_last_params == ["w"]
    _verified(path, cand)


def test_not_applied_to_1d_convolutions_or_models_without_one(write_problem):
    p1 = load_problem(write_problem(CONV1D, "c1d"))
    assert not pipeline.has_convolution(p1)
    plan, _rw, _err = pipeline.analyze(p1, channels_last=True)
    assert plan.channels_last_params == []
    assert not any(n.target is L.R._egg_channels_last for n in plan.gm.graph.nodes)
    p2 = load_problem(write_problem(HEAD + "class Model(nn.Module):\n    def forward(self, x):\n"
                                    "        return x.relu()\ndef get_inputs():\n    return "
                                    "[torch.randn(2, 3, 4, 5)]\ndef get_init_inputs():\n    return []\n",
                                    "noconv"))
    assert not pipeline.has_convolution(p2)


def test_memory_format_walk_of_the_pointwise_runtime():
    from knowledge.templates import _runtime as mod

    x = torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    assert mod._egg_memory_order(x.shape, [x]) == [0, 2, 3, 1]
    assert mod._egg_memory_order(x.shape, [torch.randn(3, 1, 1), x]) == [0, 2, 3, 1]
    assert mod._egg_memory_order(x.shape, [x.contiguous()]) == [0, 1, 2, 3]
    assert mod._egg_memory_order(x.shape, [x.contiguous(), x]) == [0, 1, 2, 3]  # the first decides
    assert torch.relu(torch.stack([x.contiguous(), x]).select(0, 0) + x).is_contiguous()  # as eager
    assert mod._egg_memory_order((2, 3, 4, 5), [x[:, :, :2]]) == [0, 1, 2, 3]  # not full-size
    e = mod._egg_empty((2, 3, 4, 5), [0, 2, 3, 1], torch.float32, "cpu")
    assert e.shape == (2, 3, 4, 5) and e.stride() == x.stride()
    e = mod._egg_empty(torch.Size((2, 3, 4, 5)), [0, 1, 2, 3], torch.float32, "cpu")
    assert e.shape == (2, 3, 4, 5) and e.is_contiguous()


def test_broadcast_shapes_remembered_per_operand_shapes():
    """The runtime's broadcast shape equals torch's for every call, also the ones whose shapes
    it remembered, and a pair that does not broadcast raises every time (never remembered)."""
    from knowledge.templates import _runtime as mod

    cases = [((4, 1, 3), (5, 1)), ((2, 3), (3,)), ((1,), (7, 1, 2)), ((2, 3), (2, 3)), ((), (4,)),
             ((1, 3), (4, 1)), ((1, 3), (3,))]  # one first shape, two results
    for _ in range(2):  # the second round reads the memo
        for a, b in cases:
            got = mod._egg_broadcast_shape([torch.empty(a), torch.empty(b)])
            assert got == torch.broadcast_shapes(a, b) and isinstance(got, torch.Size)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="must match"):
            mod._egg_broadcast_shape([torch.empty(2, 3), torch.empty(4)])
    assert all(k != (torch.Size((2, 3)), torch.Size((4,))) for k in mod._EGG_BSHAPES)


def test_memory_optimizer_offers_channels_last_once_on_a_gpu(write_problem):
    from tests.test_expert_stage2 import _state

    st = _state(write_problem(CONV_TAIL, "mo"))
    pol = ExpertPolicy()
    first = pol.optimize_memory(st, Settings(device="cpu"))  # the pointwise tail has no loop
    assert LAYOUT_PRINCIPLE in first.principle_ids and "_egg_channels_last" in first.source
    from state import Candidate

    done = Candidate(id="c2", stage="memory", author="memory_optimizer", source=first.source,
                     principle_ids=first.principle_ids)
    st2 = st.model_copy(update={"candidates": st.candidates + [done]})
    assert "tried" in pol.optimize_memory(st2, Settings(device="cpu")).reason
    cpu = st.model_copy(update={"hardware": st.hardware.model_copy(update={"interpreter": True})})
    assert "CPU interpreter" in pol.optimize_memory(cpu, Settings(device="cpu")).reason


def test_layout_conversions_are_exact_tiled_transposes():
    from knowledge.templates import _runtime as R

    for shape in [(2, 3, 5, 7), (3, 70, 9, 11), (2, 4, 3, 5, 6), (2, 129, 1, 1)]:
        x = torch.randn(*shape)
        fmt = R._EGG_CL[x.dim()]
        y = R._egg_channels_last(x)
        assert y.is_contiguous(memory_format=fmt) and torch.equal(y, x)
        assert R._egg_channels_last(y) is y  # already channels-last: no copy
        z = R._egg_standard_layout(y)
        assert z.is_contiguous() and torch.equal(z, x)
    odd = torch.randn(4, 6, 5, 3).transpose(2, 3)  # neither layout: torch's copy
    assert torch.equal(R._egg_standard_layout(odd), odd)


def test_shape_queries_do_not_force_the_standard_layout(write_problem):
    src = HEAD + '''
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)

    def forward(self, x):
        y = self.conv(x)
        return torch.relu(y) * (1.0 / y.size(1)) + y.shape[0]

def get_inputs():
    return [torch.randn(2, 3, 9, 9)]

def get_init_inputs():
    return []
'''
    path, cand, plan, em = _emit(write_problem, src, "cl_size")
    assert "_egg_standard_layout(conv" not in em.source
    _verified(path, cand)


def test_hybrid_policy_offers_the_layout_variant_when_the_reference_is_best(write_problem):
    from policies.llm import LLMPolicy
    from state import Candidate
    from tests.test_expert_stage2 import _state

    st = _state(write_problem(CONV_TAIL, "hy"))
    ref = Candidate(id="c0", stage="plan", author="planner", source="", fallback=True)
    st = st.model_copy(update={"candidates": [ref], "best_id": "c0"})
    res = LLMPolicy(hybrid=True).optimize_memory(st, Settings(device="cpu", policy="hybrid"))
    assert LAYOUT_PRINCIPLE in res.principle_ids and "_egg_channels_last" in res.source
    assert "_egg_g" not in fast_forward(res.source)  # no kernel


def test_channels_last_variant_keeps_tuned_tiles_only_where_the_geometry_is_unchanged(write_problem):
    """conv -> bias -> mean over pixels (the reduction moves to the NHWC view: another mapping)
    and a separate pointwise result: the tiler's rows config of the reduction must not be reused
    on the strided view (seen on the H200: 6.5 ms vs 0.6 ms), the pointwise one is."""
    from state import Candidate, KernelConfig
    from tests.test_expert_stage2 import _state

    src = CONV_TAIL.replace("return F.gelu(self.conv(x) + self.shift) * 0.5",
                            "return (self.conv(x) * 2.0).mean(dim=(2, 3)), torch.relu(x) + 1.0")
    st = _state(write_problem(src, "keep"))
    base = st.candidate("c1")
    kinds = {c.group_id: c.template for c in base.configs}
    red = next(g for g, t in kinds.items() if t == "reduction")
    pw = next(g for g, t in kinds.items() if t == "pointwise")
    tuned = [KernelConfig(group_id=red, template="reduction", params={"BLOCK_O": 1, "BLOCK_R": 4096,
                                                                      "num_warps": 8, "num_stages": 3}),
             KernelConfig(group_id=pw, template="pointwise", params={"BLOCK": 4096, "num_warps": 16})]
    tiled = Candidate(id="c2", stage="tiling", author="tiler", source=base.source, configs=tuned,
                      kernels=base.kernels)
    st = st.model_copy(update={"candidates": st.candidates + [tiled], "best_id": "c2"})
    draft = ExpertPolicy()._channels_last(st, tiled)
    got = {c.group_id: c.params for c in draft.configs}
    assert got[pw] == tuned[1].params  # same geometry: the tuned tiles stay
    assert got[red].get("BLOCK_R") != 4096 and got[red].get("BLOCK_I")  # the cols mapping's own


def test_global_average_pool_after_the_chain_reduces_over_the_view(write_problem):
    """F.adaptive_avg_pool2d(y, 1) is a mean over space: over the NHWC view it becomes a mean
    over the view's pixel dims (its second argument is a size: mapping it like dims made a
    (N, 2, W) result, rejected by the verifier on the H200)."""
    src = CONV_TAIL.replace("return F.gelu(self.conv(x) + self.shift) * 0.5",
                            "y = F.gelu(self.conv(x))\n        return F.adaptive_avg_pool2d(y, 1).squeeze(-1).squeeze(-1)")
    path, cand, plan, em = _emit(write_problem, src, "cl_gap")
    assert "conv_nobias.permute(0, 2, 3, 1)" in em.source and "adaptive_avg_pool2d" not in fast_forward(em.source)
    (red,) = plan.groups
    assert red.kind == "reduction" and red.rdims == [1, 2]
    _verified(path, cand)
