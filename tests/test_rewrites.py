"""Algebraic rewrites (codegen.rewrites, stage 1): for each rule a program where it applies (the
rewritten ModelNew equals the Model on fresh inputs) and one where it must not."""
import pytest
import torch

from codegen import pipeline
from codegen.emit import emit_model
from harness.problem import load_module, load_problem

HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"


def _problem(body: str, inputs: str, init: str = "", members: str = "") -> str:
    return (HEAD + "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            + (members or "        pass\n") + "\n    def forward(self, x):\n" + body
            + f"\ndef get_inputs():\n    return [{inputs}]\n\ndef get_init_inputs():\n    return [{init}]\n")


def _run(write_problem, src: str, name: str) -> list[str]:
    """Rules applied; the rewritten program matches the reference on three fresh inputs."""
    path = write_problem(src, name)
    prob = load_problem(path)
    plan, applied, err = pipeline.analyze(prob)
    assert err is None
    cand = path.with_name(f"{name}_new.py")
    cand.write_text(emit_model(prob.source, plan, {}, "# test").source)
    mod = load_module(cand, "candidate")
    for seed in range(3):
        torch.manual_seed(seed)
        ref = mod.Model()
        torch.manual_seed(seed)
        new = mod.ModelNew()
        xs = mod.get_inputs()
        a, b = ref(*xs), new(*xs)
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    return applied


LINEAR = "        self.linear = nn.Linear(37, 23)\n"


@pytest.mark.parametrize("body, applies", [
    ("        return torch.sum(self.linear(x), dim=1, keepdim=True)\n", True),
    ("        return self.linear(x).mean(-1)\n", True),
    ("        return F.linear(x, self.linear.weight, self.linear.bias).sum(dim=-1)\n", True),
    # over the batch dim, or the layer's output used twice: a GEMM is still needed
    ("        return torch.sum(self.linear(x), dim=0)\n", False),
    ("        y = self.linear(x)\n        return y.sum(dim=1) + y[:, 0]\n", False),
])
def test_linear_reduce(write_problem, body, applies):
    applied = _run(write_problem, _problem(body, "torch.randn(19, 37)", members=LINEAR), "lin")
    assert ("rw-linear-reduce" in applied) is applies


@pytest.mark.parametrize("body, applies", [
    ("        return torch.sum(x, dim=1, keepdim=True)\n", True),
    ("        return torch.max(x, dim=1)[0] * 3.0\n", True),
    ("        return torch.logsumexp(x, dim=1, keepdim=False)\n", True),
    ("        return torch.logsumexp(x, dim=(1, 2))\n", False),  # dim 2 has size 7
    ("        return x.mean(dim=1).amax(-1)\n", True),  # the mean's dim has size 1, not amax's
    ("        return torch.sum(x, dim=2)\n", False),
    ("        return torch.max(x, dim=1)[1]\n", False),  # indices are used
])
def test_size1_reduction(write_problem, body, applies):
    applied = _run(write_problem, _problem(body, "torch.randn(5, 1, 7)"), "s1")
    assert ("rw-size1-reduction" in applied) is applies


@pytest.mark.parametrize("body, applies", [
    ("        return torch.softmax(x, dim=1)\n", True),
    ("        return F.log_softmax(x, dim=-2) + x\n", True),
    ("        return torch.softmax(x, dim=2)\n", False),
])
def test_softmax_size1(write_problem, body, applies):
    applied = _run(write_problem, _problem(body, "torch.randn(5, 1, 7)"), "sm1")
    assert ("rw-softmax-size1" in applied) is applies


def test_softmax_size1_keeps_eager_nan_for_infinite_inputs(write_problem):
    path = write_problem(_problem("        return torch.softmax(x, dim=1)\n", "torch.randn(3, 1)"), "smi")
    prob = load_problem(path)
    plan, applied, _ = pipeline.analyze(prob)
    assert "rw-softmax-size1" in applied  # what is tested is the rewrite, not a softmax kernel
    assert not any(g.kind == "softmax" for g in plan.groups)
    cand = path.with_name("smi_new.py")
    cand.write_text(emit_model(prob.source, plan, {}, "").source)
    mod = load_module(cand, "candidate")
    x = torch.tensor([[1.0], [float("inf")], [float("nan")]])
    torch.testing.assert_close(mod.ModelNew()(x), torch.softmax(x, dim=1), equal_nan=True)


@pytest.mark.parametrize("body, applies", [
    ("        return torch.clamp(torch.relu(x), max=0.5)\n", True),
    ("        return F.hardtanh(torch.clamp(x, -2.0, 0.3), -0.5, 2.0)\n", True),
    ("        return torch.clamp(torch.clamp(x, min=0.5), max=0.2)\n", False),  # crossing bounds
    ("        y = torch.relu(x)\n        return torch.clamp(y, max=0.5) + y\n", False),  # used twice
])
def test_merge_clamps(write_problem, body, applies):
    applied = _run(write_problem, _problem(body, "torch.randn(8, 9)"), "cl")
    assert ("rw-merge-clamps" in applied) is applies


@pytest.mark.parametrize("body, applies", [
    ("        return x * 2.0 / 4.0\n", True),
    ("        return (x + 1.0 - 0.25) * 3.0\n", True),
    ("        return 2.0 * (x / 5.0)\n", True),
    ("        y = x * 2.0\n        return y / 4.0 + y\n", False),  # the intermediate is used twice
    ("        return (x * 2.0) + 1.0\n", False),  # a multiply and an add do not fold together
])
def test_fold_scalar_chain(write_problem, body, applies):
    applied = _run(write_problem, _problem(body, "torch.randn(8, 9)"), "fold")
    assert ("rw-fold-scalar-chain" in applied) is applies


def test_rules_compose_on_a_chain_of_reductions(write_problem):
    body = ("        x = torch.sum(self.linear(x), dim=1, keepdim=True)\n"
            "        x = torch.max(x, dim=1, keepdim=True)[0]\n"
            "        x = torch.logsumexp(x, dim=1, keepdim=True)\n"
            "        return torch.clamp(torch.relu(x * 2.0 / 4.0), max=3.0)\n")
    applied = _run(write_problem, _problem(body, "torch.randn(19, 37)", members=LINEAR), "chain")
    assert {"rw-linear-reduce", "rw-size1-reduction", "rw-merge-clamps",
            "rw-fold-scalar-chain"} <= set(applied)


def test_every_rule_has_a_principle():
    from codegen.rewrites import RULES
    from knowledge import principle

    for rid, _fn in RULES:
        assert principle(rid).stage == "algorithm"


def test_a_forward_assigning_module_state_is_a_graph_break(write_problem):
    """forward assigning a module attribute (seen on a level-3 RNN of the dev set): fx would drop
    the update; the assignment becomes a graph break (docs/capture.md), the rest is planned."""
    src = _problem("        self.h = self.h.to(x.device)\n        return torch.cat([x, self.h], 1).relu()\n",
                   "torch.randn(4, 3)", members="        self.h = torch.randn(4, 5)\n")
    plan, applied, err = pipeline.analyze(load_problem(write_problem(src, "mutates")))
    assert err is None and plan.capture.method == "fx-breaks"
    assert [b.stmt for b in plan.capture.breaks] == ["self.h = self.h.to(x.device)"]
    assert plan.capture.attr_buffers == ["h"]
    assert [[m.name for m in g.members] for g in plan.groups] == [["relu"]]


RMS_W = "        self.w = nn.Parameter(torch.randn(48) * 0.1 + 1.0)\n"


@pytest.mark.parametrize("body, applies", [
    ("        h = x.float()\n        v = h.pow(2).mean(-1, keepdim=True)\n"
     "        return self.w * (h * torch.rsqrt(v + 1e-5))\n", True),
    ("        return x / torch.sqrt(torch.mean(x ** 2, dim=-1, keepdim=True) + 1e-6)\n", True),
    ("        return torch.rsqrt(1e-6 + (x * x).mean(dim=2, keepdim=True)) * x\n", True),
    # the weight multiplied in first: (w * x) * rsqrt(...)
    ("        return self.w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)\n", True),
    # over the channels of a 4-d tensor (not the last dim), or the mean also used elsewhere
    ("        y = x.view(2, 3, 4, 48)\n"
     "        return y / torch.sqrt(torch.mean(y ** 2, dim=1, keepdim=True) + 1e-6)\n", False),
    ("        v = (x * x).mean(-1, keepdim=True)\n        return x * torch.rsqrt(v + 1e-6) + v\n", False),
])
def test_rms_norm_pattern(write_problem, body, applies):
    applied = _run(write_problem, _problem(body, "torch.randn(6, 4, 48)", members=RMS_W), "rms")
    assert ("rw-rms-norm" in applied) is applies


def test_rms_norm_pattern_makes_one_norm_kernel_of_a_llama_rmsnorm():
    prob = load_problem("workloads/llm/01_rms_norm.py")
    plan, applied, err = pipeline.analyze(prob)
    assert err is None and "rw-rms-norm" in applied
    assert [g.kind for g in plan.groups] == ["norm"]


CONVS = ("        self.c2 = nn.Conv2d(3, 6, 3, padding=1)\n"
         "        self.t3 = nn.ConvTranspose3d(2, 4, 3, stride=2, output_padding=1)\n"
         "        self.nb = nn.Conv2d(3, 6, 3, bias=False)\n"
         "        self.next = nn.Conv2d(6, 2, 1, bias=False)\n")


@pytest.mark.parametrize("body, inputs, applies", [
    ("        return F.mish(self.c2(x) - 0.5)\n", "torch.randn(2, 3, 11, 9)", True),
    ("        return torch.amin(self.c2(x), dim=1, keepdim=True)\n", "torch.randn(2, 3, 11, 9)", True),
    ("        return self.t3(x).mean(dim=(2, 3, 4)) * 2.0\n", "torch.randn(2, 2, 4, 5, 3)", True),
    # no bias; the result returned as it is; the result also going to another library op
    ("        return torch.relu(self.nb(x))\n", "torch.randn(2, 3, 11, 9)", False),
    ("        return self.c2(x)\n", "torch.randn(2, 3, 11, 9)", False),
    ("        y = self.c2(x)\n        return torch.relu(y).sum() + self.next(y)\n",
     "torch.randn(2, 3, 11, 9)", False),
])
def test_conv_bias_epilogue(write_problem, body, inputs, applies):
    applied = _run(write_problem, _problem(body, inputs, members=CONVS), "cbias")
    assert ("rw-conv-bias-epilogue" in applied) is applies


def test_conv_bias_epilogue_joins_the_tail_kernel(write_problem):
    src = _problem("        return F.mish(self.c2(x) - 0.5)\n", "torch.randn(2, 3, 11, 9)", members=CONVS)
    plan, applied, err = pipeline.analyze(load_problem(write_problem(src, "cbias_plan")))
    assert [g.kind for g in plan.groups] == ["pointwise"]
    assert len(plan.groups[0].members) == 3  # bias add, the folded subtract, mish


def test_every_rule_is_documented():
    import pathlib

    from codegen.rewrites import RULES

    doc = (pathlib.Path(__file__).resolve().parent.parent / "docs" / "stage1.md").read_text()
    for rid, _fn in RULES:
        assert f"| {rid} |" in doc, rid


def test_a_plan_failure_reaches_the_run_report(write_problem, tmp_path):
    """The expert's stage 1 says why there is no kernel (the report's Stages line shows it):
    here a branch on data over an input too large to run for shapes (harness.capture)."""
    from harness.problem import describe_problem
    from policies.expert import ExpertPolicy
    from state import EggState, HardwareInfo, Settings

    src = _problem("        if x.sum() > 0:\n            x = x * 2\n        return x.relu()\n",
                   "torch.randn(8192, 8192)")
    path = write_problem(src, "branch_run")
    _prob, spec = describe_problem(path)
    hw = HardwareInfo(device="cpu", name="cpu", profile_id="cpu-interpreter", interpreter=True)
    st = EggState(problem_path=str(path), problem=spec, hardware=hw)
    analysis, plan = ExpertPolicy().plan(st, Settings(device="cpu"))
    st = st.model_copy(update={"analysis": analysis, "plan": plan})
    res = ExpertPolicy().design(st, Settings(device="cpu"))
    assert "too large" in res.reason and "reference stays" in res.reason


def test_residual_add_and_rms_norm_are_one_norm_kernel(write_problem, tmp_path):
    """Residual add + RMSNorm: the sum is returned and also normalized; the norm template
    stores it as a second output, so one kernel reads x and the residual once and writes both
    results (seen on the H200 before: an fp32 copy of the residual stream written and read back
    between two kernels)."""
    from codegen.fusion import group_outputs
    from tests.helpers import generated_matches

    src = ("import torch\nimport torch.nn as nn\nclass Model(nn.Module):\n"
           "    def __init__(self):\n        super().__init__()\n"
           "        self.weight = nn.Parameter(torch.ones(64) + 0.1 * torch.randn(64))\n"
           "    def forward(self, x, residual):\n        residual = x + residual\n"
           "        h = residual.to(torch.float32)\n"
           "        variance = h.pow(2).mean(-1, keepdim=True)\n"
           "        h = h * torch.rsqrt(variance + 1e-5)\n"
           "        return self.weight * h.to(residual.dtype), residual\n"
           "def get_inputs():\n    return [torch.randn(2, 8, 64), torch.randn(2, 8, 64)]\n"
           "def get_init_inputs():\n    return []\n")
    path = write_problem(src, "addrms")
    plan, _rw, err = pipeline.analyze(load_problem(path))
    (g,) = plan.groups
    assert g.kind == "norm"
    assert [plan.nops[m].name for m in g.members] == ["add", "cast", "rms", "cast", "mul"]
    assert len(group_outputs(g)) == 2  # the residual sum and the normalized result
    generated_matches(path, tmp_path, seeds=(0, 1))


def test_prologue_members_only_the_reduction_uses_move_into_it(write_problem):
    """y = 2x is returned, exp(y) only feeds the sum: exp moves into the reduction's prologue
    (nothing of it is written), the multiply stays a pointwise kernel."""
    src = _problem("        y = x * 2.0\n        return y, torch.exp(y).sum(-1)\n", "torch.randn(6, 40)")
    plan, _rw, err = pipeline.analyze(load_problem(write_problem(src, "partial")))
    assert err is None
    by_kind = {g.kind: g for g in plan.groups}
    assert [plan.nops[m].name for m in by_kind["pointwise"].members] == ["mul"]
    assert [plan.nops[m].name for m in by_kind["reduction"].prologue()] == ["exp"]


LOSS_PROBLEM = HEAD + '''class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.smooth = nn.SmoothL1Loss(beta=0.5)
        self.ce = nn.CrossEntropyLoss(reduction="sum")

    def forward(self, x, t, a, b, c):
        return (F.cross_entropy(x, t), self.ce(x, t), F.kl_div(torch.log(a), b, reduction="batchmean"),
                F.kl_div(a, torch.log(b), None, None, "mean", True), self.smooth(a, b),
                F.triplet_margin_loss(a, b, c, margin=0.5), F.mse_loss(a, b, reduction="sum"),
                F.binary_cross_entropy_with_logits(a - 0.5, b), F.huber_loss(a, b, delta=0.3),
                F.binary_cross_entropy(torch.sigmoid(a), b), F.soft_margin_loss(a, c - 0.5),
                F.l1_loss(a, b, reduction="none"), F.smooth_l1_loss(a, b, beta=0.0))


def get_inputs():
    t = torch.randint(0, 37, (23,))
    t[3] = -100  # ignored by cross_entropy
    return [torch.randn(23, 37), t, torch.rand(19, 41).softmax(-1), torch.rand(19, 41).softmax(-1),
            torch.rand(19, 41)]


def get_init_inputs():
    return []
'''


def test_loss_decompose_matches_every_loss(write_problem, tmp_path):
    """Every decomposed loss (functional and module, each reduction) against torch on three
    seeds; no loss call is left, and the elementwise parts became reduction prologues."""
    from codegen import losses as LS
    from tests.helpers import generated_matches

    comp = generated_matches(write_problem(LOSS_PROBLEM, "losses"), tmp_path, seeds=(0, 1, 2))
    assert "rw-loss-decompose" in comp.rewrites
    left = [n for n in comp.plan.gm.graph.nodes
            if n.target in LS.FUNCTIONALS or (n.op == "call_module" and n.target in ("smooth", "ce"))]
    assert not left
    assert sum(g.kind == "reduction" for g in comp.plan.groups) >= 12


@pytest.mark.parametrize("call,inputs", [
    ("F.cross_entropy(x, t, label_smoothing=0.1)", "torch.randn(8, 5), torch.randint(0, 5, (8,))"),
    ("F.cross_entropy(x, t.softmax(-1))", "torch.randn(8, 5), torch.randn(8, 5)"),  # soft targets
    ("F.cross_entropy(x, t)", "torch.randn(8, 5, 3), torch.randint(0, 5, (8, 3))"),  # not 2-d
    ("F.mse_loss(x, t)", "torch.randn(8, 5), torch.randn(5)"),  # broadcast
    ("F.triplet_margin_loss(x, t, t + 1, p=1)", "torch.randn(8, 5), torch.randn(8, 5)"),
])
def test_loss_decompose_leaves_other_arguments_alone(call, inputs, write_problem):
    src = (HEAD + f"class Model(nn.Module):\n    def forward(self, x, t):\n        return {call}\n"
           f"def get_inputs():\n    return [{inputs}]\ndef get_init_inputs():\n    return []\n")
    plan, applied, err = pipeline.analyze(load_problem(write_problem(src, "keep")))
    assert err is None and "rw-loss-decompose" not in applied


def test_loss_module_with_class_weights_keeps_the_library_call(write_problem):
    src = (HEAD + "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
           "        self.ce = nn.CrossEntropyLoss(weight=torch.linspace(0.5, 1.5, 5))\n"
           "    def forward(self, x, t):\n        return self.ce(x, t)\n"
           "def get_inputs():\n    return [torch.randn(8, 5), torch.randint(0, 5, (8,))]\n"
           "def get_init_inputs():\n    return []\n")
    plan, applied, err = pipeline.analyze(load_problem(write_problem(src, "wce")))
    assert err is None and "rw-loss-decompose" not in applied


ROPE = HEAD + '''class Model(nn.Module):
    def forward(self, x, cos, sin):
        h = x.shape[-1] // 2
        r1 = torch.cat((-x[..., h:], x[..., :h]), dim=-1)
        a, b = (x * 2.0).chunk(2, dim=-1)
        r2 = torch.cat([-b, a], -1)
        return x * cos + r1 * sin, r2 * sin + 1.0
def get_inputs():
    return [torch.randn(2, 3, 7, 10), torch.randn(7, 10), torch.randn(7, 10)]
def get_init_inputs():
    return []
'''


def test_rotate_half_is_a_rolled_load(write_problem, tmp_path):
    """RoPE's rotate-half, by slices at a shape-derived half and by chunk: no cat or slice is
    left, x * cos + rotate_half(x) * sin is one kernel; the half of a computed value (2x) is
    rolled from memory (the multiply's result), never inside the kernel that computes it."""
    from tests.helpers import generated_matches

    path = write_problem(ROPE, "rope")
    plan, applied, err = pipeline.analyze(load_problem(path))
    assert err is None and "rw-rotate-half" in applied
    names = [plan.nops[n].name for n in plan.gm.graph.nodes]
    assert "cat" not in " ".join(str(n.target) for n in plan.gm.graph.nodes)
    assert names.count("rotate_half") == 2
    for g in plan.groups:
        for m in g.members:
            if plan.nops[m].name == "rotate_half":
                assert plan.nops[m].operands[0] not in g.members
    generated_matches(path, tmp_path, seeds=(0, 1))


@pytest.mark.parametrize("cat", [
    "torch.cat((x[..., 5:], -x[..., :5]), dim=-1)",  # the sign on the other half
    "torch.cat((-x[..., 4:], x[..., :4]), dim=-1)",  # not the halves
    "torch.cat((-x[:, :, :3], x[:, :, 3:]), dim=2)",  # another dim, wrong order
    "torch.cat((-y[..., 5:], x[..., :5]), dim=-1)",  # halves of two tensors
])
def test_rotate_half_left_alone(cat, write_problem):
    src = (HEAD + f"class Model(nn.Module):\n    def forward(self, x, y):\n        return {cat} * 2.0\n"
           "def get_inputs():\n    return [torch.randn(2, 3, 6, 10), torch.randn(2, 3, 6, 10)]\n"
           "def get_init_inputs():\n    return []\n")
    plan, applied, err = pipeline.analyze(load_problem(write_problem(src, "norot")))
    assert err is None and "rw-rotate-half" not in applied


def test_device_query_of_an_intermediate_reads_the_input(write_problem):
    """torch.min(y, torch.full(..., device=y.device)): the query reads x's device, so the chain
    is one kernel (it was cut in two, the query being a user of y before min); past a .to()
    (which may move the tensor) the query stays on y. (A 0-d torch.tensor constant is the
    number itself: test_scalar_constants.)"""
    src = _problem("        y = torch.relu(x) * 2.0\n"
                   "        return torch.min(y, torch.full((41,), 0.5, device=y.device)) + 1.0\n",
                   "torch.randn(37, 41)")
    _run(write_problem, src, "devq")
    plan, _rw, _err = pipeline.analyze(load_problem(write_problem(src, "devq2")))
    (g,) = plan.groups
    assert [plan.nops[m].name for m in g.members] == ["relu", "mul", "minimum", "add"]
    q = next(n for n in plan.gm.graph.nodes if n.target is getattr and n.args[1] == "device")
    assert q.args[0].op == "placeholder"
    moved = src.replace("y = torch.relu(x) * 2.0", "y = torch.relu(x.to(torch.float64)) * 2.0")
    plan, _rw, _err = pipeline.analyze(load_problem(write_problem(moved, "devq3")))
    q = next(n for n in plan.gm.graph.nodes if n.target is getattr and n.args[1] == "device")
    assert q.args[0].op != "placeholder"


VEC = "        self.w = nn.Parameter(torch.randn(23))\n        self.c = nn.Parameter(torch.randn(19, 1))\n"


@pytest.mark.parametrize("body, applies", [
    # a per-column vector in a mean over the whole matrix: no single stride over (19, 23)
    ("        return torch.mean(torch.clamp(1 - x * self.w, min=0))\n", True),
    ("        return torch.sum(torch.relu(x + self.c), dim=(0, 1), keepdim=True)\n", True),
    ("        return torch.amax(x * self.w, dim=(-2, -1))\n", True),
    # every input covers the reduced dims evenly, or one dim only: nothing to nest
    ("        return torch.mean(torch.clamp(1 - x * 2.0, min=0))\n", False),
    ("        return torch.sum(x * self.w, dim=1)\n", False),
    ("        return torch.sum(torch.sigmoid(x) * self.w, dim=0)\n", False),
])
def test_nest_uneven_reduction(write_problem, body, applies):
    applied = _run(write_problem, _problem(body, "torch.rand(19, 23)", members=VEC), "nest")
    assert ("rw-nest-reduction" in applied) is applies


def test_shape_query_of_an_elementwise_result_reads_its_source(write_problem):
    """kl_div(log(p), t, reduction="batchmean") divides by log(p).size(0): the query reads p, so
    log(p) is the reduction's prologue (one kernel) instead of a kernel output of its own; a
    query of a chain that starts at another op's result stays where it was."""
    src = (HEAD + "class Model(nn.Module):\n    def forward(self, p, t):\n"
           "        return F.kl_div(torch.log(p), t, reduction='batchmean')\n"
           "def get_inputs():\n    return [torch.rand(13, 57).softmax(-1), torch.rand(13, 57).softmax(-1)]\n"
           "def get_init_inputs():\n    return []\n")
    plan, applied, err = pipeline.analyze(load_problem(write_problem(src, "kld")))
    assert err is None and "rw-loss-decompose" in applied
    assert [g.template for g in plan.groups] == ["reduction"]
    assert "log" in [plan.nops[m].name for m in plan.groups[0].members]
    q = next(n for n in plan.gm.graph.nodes if n.target is getattr and n.args[1] == "shape")
    assert q.args[0].op == "placeholder"
    cand = write_problem(src, "kld").with_name("kld_new.py")
    prob = load_problem(write_problem(src, "kld"))
    cand.write_text(emit_model(prob.source, plan, {}, "# test").source)
    mod = load_module(cand, "candidate")
    xs = mod.get_inputs()
    torch.testing.assert_close(mod.ModelNew()(*xs), mod.Model()(*xs), atol=1e-5, rtol=1e-5)
    src2 = _problem("        y = torch.sum(x, dim=1) * 2.0\n        return y / y.shape[0]\n", "torch.randn(7, 9)")
    plan, _rw, _err = pipeline.analyze(load_problem(write_problem(src2, "shq")))
    q = next(n for n in plan.gm.graph.nodes if n.target is getattr and n.args[1] == "shape")
    from codegen.ops import classify

    assert classify(q.args[0], plan.gm).name == "mul"


@pytest.mark.parametrize("body, copies_left", [
    # the copy's users read x: one kernel, no copy
    ("        y = x * 2.0\n        z = y.clone().detach()\n        return (y + 1.0) * z + z\n", 0),
    ("        z = torch.clone(x)\n        return torch.relu(z) + x\n", 0),
    # an in-place op somewhere: copies keep their meaning
    ("        y = x + 1.0\n        z = y.clone()\n        y.mul_(2.0)\n        return z * 3.0 + y\n", 1),
    # a returned copy stays a copy
    ("        return x.clone()\n", 1),
])
def test_value_copies(write_problem, body, copies_left):
    src = _problem(body, "torch.randn(6, 11)")
    if "mul_" not in body:  # (the fusion reads in-place ops as pure ones: the verifier's job)
        _run(write_problem, src, "cpy")
    plan, _rw, _err = pipeline.analyze(load_problem(write_problem(src, "cpy2")))
    left = [n for n in plan.gm.graph.nodes
            if getattr(n.target, "__name__", n.target) in ("clone", "detach")]
    assert len(left) == copies_left


@pytest.mark.parametrize("body, exclusive", [
    ("        c = torch.cumsum(x.narrow(dim=1, start=0, length=x.size(1) - 1), dim=1)\n"
     "        return torch.cat((torch.zeros_like(x.select(1, 0).unsqueeze(1)), c), dim=1) * 2.0\n", True),
    ("        c = (x * 0.5).narrow(-1, 0, x.shape[-1] - 1).cumprod(-1)\n"
     "        return torch.cat([torch.ones_like(x[:, :1]), c], dim=-1)\n", True),
    # the slice does not start at 0, or the head is not the scan's identity: left alone
    ("        c = torch.cumsum(x.narrow(1, 1, x.size(1) - 1), dim=1)\n"
     "        return torch.cat((torch.zeros_like(x[:, :1]), c), dim=1)\n", False),
    ("        c = torch.cumsum(x.narrow(1, 0, x.size(1) - 1), dim=1)\n"
     "        return torch.cat((torch.ones_like(x[:, :1]), c), dim=1)\n", False),
])
def test_exclusive_scan(write_problem, body, exclusive):
    src = _problem(body, "torch.rand(5, 300)")
    _run(write_problem, src, "exs")
    plan, _rw, _err = pipeline.analyze(load_problem(write_problem(src, "exs2")))
    scans = [g for g in plan.groups if g.kind == "scan"]
    assert len(scans) == 1
    assert bool(plan.nops[scans[0].red].p.get("exclusive")) is exclusive
    cats = [n for n in plan.gm.graph.nodes if getattr(n.target, "__name__", "") == "cat"]
    assert (not cats) is exclusive


@pytest.mark.parametrize("body, reductions", [
    ("        return x / torch.norm(x, p=2, dim=1, keepdim=True)\n", ["sum"]),
    ("        return x.norm(dim=-1), torch.linalg.vector_norm(x, ord=1, dim=0)\n", ["sum", "sum"]),
    ("        return torch.norm(x), torch.linalg.vector_norm(x, float('inf'), dim=1)\n", ["sum", "amax"]),
    ("        return F.normalize(x, dim=0) * 2.0, F.normalize(x, p=1.0, eps=0.5)\n", ["sum", "sum"]),
    # a dtype, a p-norm of another order, a matrix norm: the library call stays
    ("        return torch.norm(x, p=3, dim=1), torch.linalg.norm(x, ord=2)\n", []),
    ("        return torch.linalg.vector_norm(x, dim=1, dtype=torch.float64)\n", []),
])
def test_vector_norms_are_reductions(write_problem, body, reductions):
    """Vector norms (and F.normalize) as the reductions they are, so they fuse with the ops
    around them; the rewritten program matches the reference (rows of small norm included:
    F.normalize's eps clamp)."""
    src = _problem(body, "torch.randn(9, 23) * torch.rand(9, 1) ** 6")
    _run(write_problem, src, "vnorm")
    plan, _rw, _err = pipeline.analyze(load_problem(write_problem(src, "vnorm2")))
    red = sorted(plan.nops[g.red].name for g in plan.groups if g.red is not None)
    assert red == sorted(reductions)
    left = [n for n in plan.gm.graph.nodes if getattr(n.target, "__name__", n.target) in
            ("norm", "linalg_vector_norm", "linalg_norm", "normalize")]
    assert bool(left) is (not reductions)


@pytest.mark.parametrize("body, constants_left", [
    ("        return torch.min(x, torch.tensor(0.25, device=x.device)) * 2.0\n", 0),
    ("        y = torch.relu(x)\n        t = torch.tensor(-0.5, device=y.device)\n"
     "        return torch.maximum(y - 1.0, t), x + t, t * x, x.sub(t)\n", 0),
    # a dtype, a constant that is the first operand of a torch function, or not a number: kept
    ("        return torch.min(x, torch.tensor(0.25, dtype=torch.float64, device=x.device))\n", 1),
    ("        return torch.sub(torch.tensor(1.0, device=x.device), x)\n", 1),
])
def test_scalar_constants(write_problem, body, constants_left):
    """torch.tensor(c, device=...) read by an elementwise op of a float tensor is the number c
    (no host-to-device copy per call): min/max against it become clamps; the rewritten program
    matches the reference."""
    src = _problem(body, "torch.randn(7, 13)")
    _run(write_problem, src, "scal")
    plan, _rw, _err = pipeline.analyze(load_problem(write_problem(src, "scal2")))
    # a constant kept is built per call, or once at init when it is a table (codegen.constants)
    nodes = list(plan.gm.graph.nodes) + [n for f in plan.folds for n in f.graph.nodes]
    left = [n for n in nodes if n.target is torch.tensor]
    assert len(left) == constants_left


MHA = "        self.attn = nn.MultiheadAttention(16, 4)\n"


@pytest.mark.parametrize("body, applies", [
    ("        out, _ = self.attn(x, x, x)\n        return out * 2.0\n", True),
    ("        return self.attn(x, x, x, need_weights=True)[0] + x\n", True),
    ("        return self.attn(x, x, x, None, True)[0] + x\n", True),  # need_weights given by place
    # the weights are read, or the tuple goes out whole
    ("        out, w = self.attn(x, x, x)\n        return out * 2.0, w\n", False),
    ("        return self.attn(x, x, x)\n", False),
])
def test_mha_weights_unused(write_problem, body, applies):
    """rw-mha-no-weights: the call asks for no weights when nothing reads them (level 3's
    VisionAttention: eager writes a 2 x 4 x 16384 x 16384 fp32 softmax to average it)."""
    src = _problem(body, "torch.randn(10, 3, 16)", members=MHA)
    applied = _run(write_problem, src, "mha")
    assert ("rw-mha-no-weights" in applied) is applies
    plan, _applied, _err = pipeline.analyze(load_problem(write_problem(src, "mha2")))
    text = emit_model(src, plan, {}, "# test").source
    assert ("need_weights = False" in text or "x, None, False)" in text) is applies


DEAD_MEMBERS = ("        self.conv = nn.Conv1d(4, 4, 3)\n        self.bn = nn.BatchNorm1d(4)\n"
                "        self.drop = nn.Dropout(0.5)\n")


def test_dead_library_ops_are_dropped_and_effects_kept(write_problem):
    """rw-dead-code drops library ops nothing reads (an einsum, a convolution, a cat: Mamba-2's
    forward that returns only the final state still computes its diagonal blocks' einsum in
    eager) but keeps what has an effect: batch norm's statistics update in train(), a dropout's
    draw (the random numbers of later draws depend on it), an in-place op."""
    body = ("        y = torch.relu(x)\n"
            "        _a = torch.einsum('bcl,bdl->bcd', x, y)\n"
            "        _b = self.conv(x)\n"
            "        _c = torch.cat([x, y], dim=1)\n"
            "        _d = self.bn(x)\n"
            "        _e = F.dropout(x, 0.5, training=True)\n"
            "        return y * 2.0\n")
    src = _problem(body, "torch.randn(2, 4, 9)", members=DEAD_MEMBERS)
    path = write_problem(src, "dead_lib")
    plan, applied, err = pipeline.analyze(load_problem(path))
    assert err is None and "rw-dead-code" in applied
    code = plan.gm.code
    for gone in ("einsum", "self.conv", "torch.cat"):
        assert gone not in code, gone
    for kept in ("self.bn", "dropout"):
        assert kept in code, kept
    # the emitted module keeps batch norm's running statistics in step with Model's
    cand = path.with_name("dead_lib_new.py")
    cand.write_text(emit_model(load_problem(path).source, plan, {}, "# test").source)
    mod = load_module(cand, "candidate")
    ref, new = mod.Model(), mod.ModelNew()
    new.load_state_dict(ref.state_dict())
    x = torch.randn(2, 4, 9)
    torch.testing.assert_close(new(x), ref(x))
    torch.testing.assert_close(new.bn.running_mean, ref.bn.running_mean)


def test_dead_code_purity_of_library_calls():
    """The rule's purity test on bare nodes: an einsum and a shape method are pure; a call for
    its effect on autograd (retain_grad), a random draw, ``out=`` and a dropout module are not."""
    import torch.fx as fx
    import torch.nn as nn

    from codegen.rewrites.deadcode import _pure_library

    class Holder(nn.Module):
        def __init__(self):
            super().__init__()
            self.drop, self.lin, self.bn = nn.Dropout(0.1), nn.Linear(2, 2), nn.BatchNorm1d(2)

    g = fx.Graph()
    x = g.placeholder("x")
    nodes = {"einsum": g.call_function(torch.einsum, ("ij->i", x)),
             "size": g.call_method("size", (x,)),
             "retain_grad": g.call_method("retain_grad", (x,)),
             "randn_like": g.call_function(torch.randn_like, (x,)),
             "out=": g.call_function(torch.add, (x, x), {"out": x}),
             "drop": g.call_module("drop", (x,)), "lin": g.call_module("lin", (x,)),
             "bn": g.call_module("bn", (x,))}
    g.output(x)
    gm = fx.GraphModule(Holder(), g)
    pure = {k for k, n in nodes.items() if _pure_library(n)}
    assert pure == {"einsum", "size", "lin"}


HEAD_MEMBERS = "        self.lm_head = nn.Linear(24, 40, bias=False)\n        self.w = nn.Parameter(torch.randn(3, 24))\n"


@pytest.mark.parametrize("body, applies", [
    # the next token's logits, spelled three ways, and through a temperature and an activation
    ("        return self.lm_head(x)[:, -1, :]\n", True),
    ("        return self.lm_head(x)[:, -1]\n", True),
    ("        return (self.lm_head(x) / 0.7)[..., -1, :].relu()\n", True),
    ("        return torch.matmul(x, self.lm_head.weight.t())[:, 1:3]\n", True),
    ("        return torch.einsum('bzc,bcp->bzp', x[..., :6], x[..., 6:])[:, -1]\n", True),
    ("        return torch.exp(torch.einsum('bzc,bcp->bpz', x[..., :6], x[..., 6:]))[1:, :, 2:4]\n", True),
    # the index cuts the product's last dim; the full result has another reader
    ("        return self.lm_head(x)[:, -1, :5]\n", False),
    ("        y = self.lm_head(x)\n        return y[:, -1] + y.mean(1)\n", False),
])
def test_select_first(write_problem, body, applies):
    """rw-select-first: an index of a product's, an einsum's or a pointwise op's result (that
    nothing else reads) is taken of the operands first, the values the same."""
    src = _problem(body, "torch.randn(2, 6, 24)", members=HEAD_MEMBERS)
    applied = _run(write_problem, src, "select")
    assert ("rw-select-first" in applied) is applies


def test_select_first_computes_only_the_selected_rows(write_problem):
    """The LM head runs on one row per sequence: the product's input is the selected slice (the
    plan's matmul group sees [2, 24], not [2, 6, 24]); an einsum's indexed letter leaves it."""
    src = _problem("        return self.lm_head(x)[:, -1, :] * 2.0\n", "torch.randn(2, 6, 24)",
                   members=HEAD_MEMBERS)
    plan, applied, err = pipeline.analyze(load_problem(write_problem(src, "sel_rows")))
    assert err is None and "rw-select-first" in applied
    from codegen.ops import node_shape

    lin = [n for n in plan.gm.graph.nodes if n.op == "call_function" and n.target is torch.nn.functional.linear]
    assert len(lin) == 1 and tuple(node_shape(lin[0].args[0])) == (2, 24)
    body = ("        s = x.reshape(2, 3, 4, 4, 2)\n"
            "        w = s.sum((3, 4))\n"  # (2, 3, 4): b h c
            "        return torch.einsum('bhc,bchp->bhp', w, s.permute(0, 2, 1, 3, 4).reshape(2, 4, 3, 8))[:, 1]\n")
    src = _problem(body, "torch.randn(2, 6, 16)")
    plan, applied, err = pipeline.analyze(load_problem(write_problem(src, "sel_einsum")))
    assert err is None and "rw-select-first" in applied
    # the smaller einsum 'bc,bcp->bp' (h selected), then written as a product (einsums.py):
    # [2, 1, 4] @ [2, 4, 8], the selected head only
    assert not [n for n in plan.gm.graph.nodes if n.op == "call_function" and n.target is torch.einsum]
    mm = [n for n in plan.gm.graph.nodes if n.op == "call_function" and n.target is torch.matmul]
    assert [(tuple(node_shape(m.args[0])), tuple(node_shape(m.args[1]))) for m in mm] == [((2, 1, 4), (2, 4, 8))]
    _run(write_problem, src, "sel_einsum_values")


LN_MEMBERS = "        self.w = nn.Parameter(torch.randn(24))\n        self.b = nn.Parameter(torch.randn(24))\n"


@pytest.mark.parametrize("body, applies", [
    ("        mu = x.mean(-1, keepdim=True)\n        var = ((x - mu) ** 2).mean(-1, keepdim=True)\n"
     "        return (x - mu) / torch.sqrt(var + 1e-5) * self.w + self.b\n", True),
    ("        mu = x.mean(dim=-1, keepdim=True)\n        d = x - mu\n"
     "        return self.w * d * torch.rsqrt(d.pow(2).mean(-1, keepdim=True) + 1e-6) + self.b\n", True),
    ("        mu = x.mean(-1, keepdim=True)\n        var = x.var(-1, keepdim=True, unbiased=False)\n"
     "        return (x - mu) * torch.rsqrt(var + 1e-5)\n", True),
    ("        mu = x.mean(-1, keepdim=True)\n        var = torch.var(x, dim=-1, keepdim=True, correction=0)\n"
     "        return (x - mu) / torch.sqrt(var + 1e-5)\n", True),
    # an unbiased variance is another normalization; statistics over another dim
    ("        mu = x.mean(-1, keepdim=True)\n        var = x.var(-1, keepdim=True)\n"
     "        return (x - mu) * torch.rsqrt(var + 1e-5)\n", False),
    ("        mu = x.mean(1, keepdim=True)\n        var = ((x - mu) ** 2).mean(1, keepdim=True)\n"
     "        return (x - mu) / torch.sqrt(var + 1e-5)\n", False),
])
def test_layer_norm_pattern(write_problem, body, applies):
    """rw-layer-norm: layer norm written out over the last dim is one norm kernel."""
    src = _problem(body, "torch.randn(3, 5, 24)", members=LN_MEMBERS)
    applied = _run(write_problem, src, "lnp")
    assert ("rw-layer-norm" in applied) is applies
    if applies:
        plan, _a, _e = pipeline.analyze(load_problem(write_problem(src, "lnp2")))
        assert [g.kind for g in plan.groups] == ["norm"]  # the affine epilogue in the same kernel


@pytest.mark.parametrize("body, applies", [
    ("        e = torch.exp(x - x.amax(dim=-1, keepdim=True))\n        return e / e.sum(dim=-1, keepdim=True)\n", True),
    ("        e = (x - torch.max(x, 1, keepdim=True)[0]).exp()\n        return e / torch.sum(e, 1, keepdim=True)\n", True),
    ("        z = x - x.amax(-1, keepdim=True)\n        return z - torch.log(torch.exp(z).sum(-1, keepdim=True))\n", True),
    ("        return x - torch.logsumexp(x, dim=-1, keepdim=True)\n", True),
    # the unstable form overflows where softmax does not: eager's behaviour is kept
    ("        e = torch.exp(x)\n        return e / e.sum(dim=-1, keepdim=True)\n", False),
    ("        e = torch.exp(x - x.amax(dim=-1, keepdim=True))\n        return e / e.sum(dim=1, keepdim=True)\n", False),
])
def test_softmax_pattern(write_problem, body, applies):
    """rw-softmax: softmax and log-softmax written out (max subtracted) are one softmax kernel."""
    src = _problem(body, "torch.randn(4, 6, 33)")
    applied = _run(write_problem, src, "smp")
    assert ("rw-softmax" in applied) is applies
    if applies:
        plan, _a, _e = pipeline.analyze(load_problem(write_problem(src, "smp2")))
        assert [g.kind for g in plan.groups] == ["softmax"]
