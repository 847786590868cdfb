"""Products with an added input (codegen.rewrites, canonical forms addmm_as_product and
flattened_products): ``torch.addmm`` / ``baddbmm`` become a product plus an epilogue, and a
product whose rows are reshaped (Hugging Face GPT-2's ``Conv1D``: ``addmm(bias, x.view(-1, K),
W).view(size_out)``) gives the reshaped result itself, so the bias and the activation after it
are the matmul template's epilogue. Values against eager, drop-in trials, and the calls that
must stay PyTorch's."""
import pytest
import torch

from codegen import pipeline
from codegen.pipeline import compile_problem
from harness.problem import load_module, load_problem
from harness.verify import static_findings_src
from tests.dropin import check_dropin

HEAD = "import math\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"

# Hugging Face transformers' GPT-2 MLP: Conv1D (weight [in, out], addmm) -> gelu_new -> Conv1D
GPT2_MLP = HEAD + '''
class Conv1D(nn.Module):
    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        x = x.view(size_out)
        return x


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class Model(nn.Module):
    def __init__(self, d=32, inner=128):
        super().__init__()
        self.c_fc = Conv1D(inner, d)
        self.c_proj = Conv1D(d, inner)

    def forward(self, x):
        return self.c_proj(gelu_new(self.c_fc(x)))


def get_inputs():
    return [torch.randn(2, 8, 32, dtype=DTYPE)]


def get_init_inputs():
    return []
'''


def gpt2(dtype: str = "torch.float32") -> str:
    """The MLP in dtype (parameters and input)."""
    src = GPT2_MLP.replace("class Conv1D", f"DTYPE = {dtype}\n\n\nclass Conv1D", 1)
    if dtype != "torch.float32":
        src += ("\n\n_Model = Model\n\n\nclass Model(_Model):\n    def __init__(self):\n"
                "        super().__init__()\n        self.to(DTYPE)\n")
    return src


def plan_of(write_problem, src: str, name: str):
    plan, applied, err = pipeline.analyze(load_problem(write_problem(src, name)))
    assert plan is not None, err
    return plan, applied


def library_names(plan) -> list[str]:
    return sorted(op.name for op in plan.nops.values() if op.kind == "library" and "tuple" not in op.why)


def test_gpt2_mlp_is_two_products_with_bias_and_gelu_in_the_epilogue(write_problem):
    src = gpt2()
    plan, _ = plan_of(write_problem, src, "gpt2_mlp")
    assert [g.kind for g in plan.groups] == ["matmul", "matmul"]
    fc, proj = plan.groups
    names = [plan.nops[m].name for m in fc.members]
    assert names[0] == "matmul" and "add" in names and "tanh" in names and "pow" in names, names
    assert [plan.nops[m].name for m in proj.members] == ["matmul", "add"]
    assert library_names(plan) == []  # no addmm left, and the reshapes are views
    comp = compile_problem(load_problem(write_problem(src, "gpt2_mlp_c")))
    assert comp.emitted is not None, comp.error
    assert static_findings_src(comp.emitted.source, src) == []
    # train/eval, another batch, one more leading dim, scaled inputs, other layouts
    report = check_dropin(src, comp.emitted.source, calls=1)
    assert all(report.fast(t, mode) for t in ("own", "batch", "rank", "x3", "x100") for mode in ("train", "eval"))
    # x.view(-1, K) refuses the transposed layout: Model raises, and so does ModelNew
    assert [t.raised for t in report.trials if t.name == "transposed"] == [True, True]


@pytest.mark.parametrize("dtype", ["torch.bfloat16", "torch.float16"])
def test_gpt2_mlp_in_16_bits_keeps_the_template_for_its_epilogues(write_problem, dtype):
    """A lone 16-bit product stays cuBLAS's; these carry a bias (and GELU): the template."""
    plan, _ = plan_of(write_problem, gpt2(dtype), "gpt2_16")
    assert [g.kind for g in plan.groups] == ["matmul", "matmul"]
    assert library_names(plan) == []


def _addmm_problem(call: str, bias: str, members: str = "", inputs: str = "torch.randn(6, 16)") -> str:
    return (HEAD + "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            "        self.w = nn.Parameter(torch.randn(16, 24))\n"
            f"        self.b = nn.Parameter({bias})\n" + members
            + f"\n    def forward(self, x):\n        return torch.relu({call})\n\n"
            f"def get_inputs():\n    return [{inputs}]\n\ndef get_init_inputs():\n    return []\n")


ADDMM_FORMS = {
    "vector_bias": ("torch.addmm(self.b, x, self.w)", "torch.randn(24)"),
    "row_bias": ("torch.addmm(self.b, x, self.w)", "torch.randn(1, 24)"),
    "full_bias": ("torch.addmm(self.b, x, self.w)", "torch.randn(6, 24)"),
    "column_bias": ("torch.addmm(self.b, x, self.w)", "torch.randn(6, 1)"),
    "scalar_bias": ("torch.addmm(self.b, x, self.w)", "torch.randn(())"),
    "scaled": ("torch.addmm(self.b, x, self.w, beta=0.5, alpha=-2.0)", "torch.randn(24)"),
    "int_factors": ("torch.addmm(self.b, x, self.w, beta=3, alpha=2)", "torch.randn(24)"),
    "method": ("self.b.addmm(x, self.w, alpha=0.25)", "torch.randn(24)"),
    "beta0_nan_bias": ("torch.addmm(self.b, x, self.w, beta=0)", "torch.full((24,), float('nan'))"),
    "baddbmm_vector": ("torch.baddbmm(self.b, x.view(2, 3, 16), self.w.expand(2, 16, 24))",
                       "torch.randn(24)"),
}


@pytest.mark.parametrize("name", sorted(ADDMM_FORMS))
def test_addmm_forms_are_a_product_and_an_epilogue(write_problem, name):
    call, bias = ADDMM_FORMS[name]
    src = _addmm_problem(call, bias)
    plan, _ = plan_of(write_problem, src, f"addmm_{name}")
    assert [g.kind for g in plan.groups] == ["matmul"], [g.kind for g in plan.groups]
    assert library_names(plan) == []
    assert ("add" in [plan.nops[m].name for m in plan.groups[0].members]) is (name != "beta0_nan_bias")
    comp = compile_problem(load_problem(write_problem(src, f"addmm_{name}_c")))
    assert static_findings_src(comp.emitted.source, src) == []
    # values (NaN of a beta=0 bias not read), modes, scalings, layouts; the fixed shapes refuse
    # other sizes as addmm does
    report = check_dropin(src, comp.emitted.source, calls=1)
    assert report.fast("own")


NEAR_MISSES = {
    # an alpha only known per call: addmm does not read the product when it is 0
    "traced_alpha": "torch.addmm(self.b, x, self.w, alpha=1.0 / x.size(0))",
    "alpha0": "torch.addmm(self.b, x, self.w, alpha=0)",
    "out": "torch.addmm(self.b, x, self.w, out=torch.empty(6, 24, device=x.device))",
    "bool_beta": "torch.addmm(self.b, x, self.w, beta=True)",
}


@pytest.mark.parametrize("name", sorted(NEAR_MISSES))
def test_addmm_near_misses_stay_torch(write_problem, name):
    src = _addmm_problem(NEAR_MISSES[name], "torch.randn(24)")
    path = write_problem(src, f"near_{name}")
    plan, _ = plan_of(write_problem, src, f"near_{name}")
    assert any(n.startswith("fn:torch.addmm") for n in library_names(plan)), library_names(plan)
    assert all(g.kind != "matmul" for g in plan.groups)
    comp = compile_problem(load_problem(path))
    mod = load_module(write_problem(comp.emitted.source, f"near_{name}_new"), "cand")
    torch.manual_seed(0)
    ref, new = mod.Model(), mod.ModelNew()
    new.load_state_dict(ref.state_dict())
    x = torch.randn(6, 16)
    with torch.no_grad():  # out= refuses a result that requires grad
        torch.testing.assert_close(new(x), ref(x))


def test_addmm_alpha0_does_not_read_the_product():
    """Why alpha = 0 stays addmm's: PyTorch skips the product (an inf in it gives no NaN)."""
    a = torch.randn(3, 4)
    a[0, 0] = float("inf")
    assert not torch.isnan(torch.addmm(torch.zeros(5), a, torch.randn(4, 5), alpha=0)).any()


def test_addmm_beta0_with_a_bias_of_another_shape_still_raises(write_problem):
    """beta = 0: the bias is not read, but addmm still checks that it broadcasts: a call with a
    bias of another size takes the reference and raises as Model does."""
    src = (HEAD + "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
           "        self.w = nn.Parameter(torch.randn(16, 24))\n\n"
           "    def forward(self, x, b):\n        return torch.relu(torch.addmm(b, x, self.w, beta=0.0))\n\n"
           "def get_inputs():\n    return [torch.randn(6, 16), torch.randn(24)]\n\n"
           "def get_init_inputs():\n    return []\n")
    plan, _ = plan_of(write_problem, src, "beta0_input")
    assert [g.kind for g in plan.groups] == ["matmul"]
    comp = compile_problem(load_problem(write_problem(src, "beta0_input_c")))
    mod = load_module(write_problem(comp.emitted.source, "beta0_input_new"), "cand")
    torch.manual_seed(0)
    ref, new = mod.Model(), mod.ModelNew()
    new.load_state_dict(ref.state_dict())
    x = torch.randn(6, 16)
    torch.testing.assert_close(new(x, torch.full((24,), float("nan"))), ref(x, torch.randn(24)))
    for bad in (torch.randn(23), torch.randn(2, 6, 24)):
        with pytest.raises(RuntimeError):
            ref(x, bad)
        with pytest.raises(RuntimeError):
            new(x, bad)


FLATTENED = {
    # the product's rows reshaped back (the shape from x's, or written out): one kernel
    "view_back": ("(x.view(-1, x.size(-1)) @ self.w).view(x.shape[0], x.shape[1], -1)", True),
    "reshape_scaled": ("torch.matmul(x.reshape(-1, 16), self.w).mul(0.5).reshape(2, 3, 24)", True),
    "mm_bias": ("(torch.mm(x.view(6, 16), self.w) + self.b).view(2, 3, 24)", True),
    # the reshape cuts the last dim, or a bias per row: the reshape stays between the two
    "cuts_last": ("(x.view(-1, 16) @ self.w).view(2, 3, 2, 12)", False),
    "row_bias": ("(x.view(-1, 16) @ self.w + self.r).view(2, 3, 24)", False),
}


@pytest.mark.parametrize("name", sorted(FLATTENED))
def test_flattened_products(write_problem, name):
    expr, one = FLATTENED[name]
    src = _addmm_problem(expr, "torch.randn(24)", members="        self.r = nn.Parameter(torch.randn(6, 1))\n",
                         inputs="torch.randn(2, 3, 16)")
    plan, _ = plan_of(write_problem, src, f"flat_{name}")
    kinds = [g.kind for g in plan.groups]
    assert (kinds == ["matmul"]) is one, kinds
    comp = compile_problem(load_problem(write_problem(src, f"flat_{name}_c")))
    assert static_findings_src(comp.emitted.source, src) == []
    report = check_dropin(src, comp.emitted.source, calls=1, variants=("own", "x3", "batch", "transposed"))
    assert report.fast("own")
