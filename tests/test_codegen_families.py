"""Generated kernels for the op families of the foundation: pointwise chains (scalars,
broadcast tensors, activations, clamp) and reductions over a dim (sum, mean, max, min,
softmax, log_softmax), on problems the examples do not contain, in the CPU interpreter."""
import pytest
import torch

from tests.helpers import generated_matches

POINTWISE = '''
import torch, torch.nn as nn, torch.nn.functional as F
class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.b = nn.Parameter(torch.randn(1, c))
        self.s = nn.Parameter(torch.randn(c) * 0.1)
    def forward(self, x, y):
        z = (x - 0.3) * 1.5 + self.b
        z = F.leaky_relu(z, 0.2) + y * self.s
        z = torch.where(z > 0.5, F.silu(z), torch.tanh(z))
        z = torch.clamp(F.hardswish(z), min=-1.0) / 2.0
        return F.softplus(z) - F.elu(-z) + torch.sigmoid(y).pow(2)
def get_inputs():
    return [torch.randn(93, 131), torch.randn(93, 131)]
def get_init_inputs():
    return [131]
'''

ACTIVATIONS = '''
import torch, torch.nn as nn, torch.nn.functional as F
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = nn.GELU(approximate="tanh")
        self.m = nn.Mish()
        self.h = nn.Hardtanh(-0.7, 0.9)
    def forward(self, x):
        a = self.act(x) + F.gelu(x) + F.selu(x) + F.softsign(x) + F.hardsigmoid(x)
        b = self.m(x) * torch.exp(-x.abs()) + torch.rsqrt(x * x + 1.0) + torch.log1p(x.abs())
        return self.h(a - b), F.relu6(x * 4.0), x.abs().sqrt()
def get_inputs():
    return [torch.randn(2, 7, 61)]
def get_init_inputs():
    return []
'''

CHANNEL_BIAS = '''
import torch, torch.nn as nn
class Model(nn.Module):
    def __init__(self, c, scale):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(c, 1, 1))
        self.scale = scale
    def forward(self, x):
        return torch.relu(x * self.scale + self.bias) - torch.min(x, torch.zeros_like(x))
def get_inputs():
    return [torch.randn(3, 5, 9, 11)]
def get_init_inputs():
    return [5, 0.25]
'''

REDUCTIONS = '''
import torch, torch.nn as nn
class Model(nn.Module):
    def __init__(self):
        super().__init__()
    def forward(self, x):
        y = x * 2.0 - 1.0
        return (y.sum(dim=-1), torch.mean(x, dim=-1, keepdim=True) * 3.0,
                torch.amax(x, dim=-1) - torch.amin(x, dim=-1), x.max(dim=-1)[0] + 1.0,
                torch.argmin(x, dim=-1), torch.max(x, dim=1).indices)
def get_inputs():
    return [torch.randn(37, 1023)]
def get_init_inputs():
    return []
'''

MIDDLE_DIM = '''
import torch, torch.nn as nn
class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim
    def forward(self, x):
        return torch.sum(torch.exp(x), dim=self.dim) / 4.0, torch.argmax(x, dim=self.dim)
def get_inputs():
    return [torch.randn(3, 301, 17)]
def get_init_inputs():
    return [1]
'''

SOFTMAX = '''
import torch, torch.nn as nn
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.sm = nn.Softmax(dim=1)
    def forward(self, x, bias):
        z = x + bias
        return self.sm(z) * 0.5, torch.log_softmax(z * 2.0, dim=-1), torch.softmax(x, dim=0)
def get_inputs():
    return [torch.randn(29, 517), torch.randn(517)]
def get_init_inputs():
    return []
'''

LONG_ROW_SOFTMAX = '''
import torch, torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1), torch.logsumexp(x, dim=-1)
def get_inputs():
    return [torch.randn(3, 9001) * 3.0]
def get_init_inputs():
    return []
'''

CASES = {
    "pointwise": (POINTWISE, {"pointwise"}),
    "activations": (ACTIVATIONS, {"pointwise"}),
    "channel_bias": (CHANNEL_BIAS, {"pointwise"}),
    "reductions": (REDUCTIONS, {"reduction"}),
    "middle_dim": (MIDDLE_DIM, {"reduction"}),
    "softmax": (SOFTMAX, {"softmax"}),
    "long_row_softmax": (LONG_ROW_SOFTMAX, {"softmax", "reduction"}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_generated_model_matches_reference(name, write_problem, tmp_path):
    src, kinds = CASES[name]
    comp = generated_matches(write_problem(src, name), tmp_path)
    made = {g.kind for g in comp.plan.groups}
    assert kinds <= made, made
    assert comp.emitted.kernels, "no Triton kernel was generated"
    assert "@triton.jit" in comp.emitted.source


def test_pointwise_chain_is_one_kernel(write_problem, tmp_path):
    comp = generated_matches(write_problem(CHANNEL_BIAS, "cb"), tmp_path)
    assert len(comp.plan.groups) == 1 and comp.plan.groups[0].kind == "pointwise"


def test_prologue_fused_into_reduction(write_problem, tmp_path):
    src = '''
import torch, torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        return (torch.relu(x) * 2.0 + 1.0).sum(dim=-1) * 0.5
def get_inputs():
    return [torch.randn(16, 300)]
def get_init_inputs():
    return []
'''
    comp = generated_matches(write_problem(src, "pro"), tmp_path)
    assert [g.kind for g in comp.plan.groups] == ["reduction"]
    g = comp.plan.groups[0]
    assert len(g.members) == 5  # relu, mul, add, sum, mul epilogue


def test_library_ops_stay_torch(write_problem, tmp_path):
    src = '''
import torch, torch.nn as nn
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(24, 40)
    def forward(self, x):
        return torch.sigmoid(self.lin(x)) * 2.0
def get_inputs():
    return [torch.randn(8, 24)]
def get_init_inputs():
    return []
'''
    comp = generated_matches(write_problem(src, "lib"), tmp_path)
    assert "self.lin(" in comp.emitted.source
    assert len(comp.plan.groups) == 1


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_inputs(dtype, write_problem, tmp_path):
    src = f'''
import torch, torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x * 1.3, dim=-1), torch.nn.functional.gelu(x) + 1.0
def get_inputs():
    return [torch.randn(8, 200).to(torch.{dtype})]
def get_init_inputs():
    return []
'''
    # the interpreter truncates on bf16 downcasts: allow one bf16 ulp (ENVIRONMENT.md)
    path = write_problem(src, f"lowp_{dtype}")
    from codegen.pipeline import compile_problem
    from harness.problem import load_problem

    kernels = compile_problem(load_problem(path)).emitted.kernels
    comp = generated_matches(path, tmp_path, atol=2e-2, rtol=2e-2, launched=kernels)
    # the softmax and the pointwise chain are Triton kernels (not left to PyTorch), and both
    # ran: generated_matches checked that their outputs have the input's dtype
    assert {g.kind for g in comp.plan.groups} == {"softmax", "pointwise"} and len(kernels) == 2


def test_tensor_constant_created_in_forward(write_problem, tmp_path):
    """fx keeps torch.tensor(python value) of forward as _tensor_constantN: ModelNew recreates it."""
    src = '''
import torch, torch.nn as nn
class Model(nn.Module):
    def __init__(self, v):
        super().__init__()
        self.v = v
    def forward(self, x):
        return (torch.min(x, torch.tensor(self.v)) + 0.5) * 2.0
def get_inputs():
    return [torch.randn(4, 37)]
def get_init_inputs():
    return [0.3]
'''
    comp = generated_matches(write_problem(src, "const"), tmp_path)
    assert "register_buffer('_tensor_constant0'" in comp.emitted.source
    assert [g.kind for g in comp.plan.groups] == ["pointwise"]


@pytest.mark.parametrize("body, inputs, kinds", [
    # the reduced value is returned too: it must be written, so the reduction stays its own kernel
    ("        m = x.mean(1, keepdim=True)\n        return x - m, m\n",
     "[torch.randn(2, 5, 40, 30)]", ["pointwise", "reduction"]),
    # a handful of long reductions: the split reduction and a pointwise pass keep every SM busy
    ("        return x - x.mean()\n", "[torch.randn(40, 50)]", ["pointwise", "reduction"]),
    # the chain on the reduced value reads another tensor of the reduced shape
    ("        return x / (x.sum(-1, keepdim=True) + b)\n", "[torch.rand(1100, 37), torch.rand(1100, 1)]",
     ["pointwise", "reduction"]),
    # nothing else reads it: one kernel
    ("        return x / (x.sum(-1, keepdim=True) + 1.0)\n", "[torch.rand(1100, 37), torch.rand(1100, 1)]",
     ["softmax"]),
])
def test_broadcast_reduction_only_where_the_reduced_value_stays_inside(body, inputs, kinds,
                                                                      write_problem, tmp_path):
    """A reduction read back over its reduced dims joins the reading ops' kernel only when
    nothing else needs the reduced value written (principle alg-reduce-broadcast); every plan
    matches torch."""
    src = ("import torch\nimport torch.nn as nn\nclass Model(nn.Module):\n"
           "    def forward(self, x, b=None):\n" + body
           + f"def get_inputs():\n    return {inputs}\ndef get_init_inputs():\n    return []\n")
    comp = generated_matches(write_problem(src, "bcast"), tmp_path)
    assert sorted(g.kind for g in comp.plan.groups) == kinds


def test_broadcast_reduction_leaves_long_rows_to_two_kernels(write_problem, tmp_path):
    """Rows longer than one pass over registers (8192 elements) would be read twice by the fused
    kernel as well: the reduction and the division stay two kernels."""
    src = ("import torch\nimport torch.nn as nn\nclass Model(nn.Module):\n"
           "    def forward(self, x):\n        return x / x.abs().sum(-1, keepdim=True)\n"
           "def get_inputs():\n    return [torch.rand(1024, 8193)]\ndef get_init_inputs():\n    return []\n")
    from codegen import pipeline
    from harness.problem import load_problem

    plan, _rw, err = pipeline.analyze(load_problem(write_problem(src, "long")))
    assert err is None
    assert sorted(g.kind for g in plan.groups) == ["pointwise", "reduction"]


REPEATED_BLOCKS = '''
import torch, torch.nn as nn
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(24, 40)
        self.l2 = nn.Linear(40, 56)
        self.l3 = nn.Linear(56, 56)
        self.b1 = nn.Parameter(torch.randn(40))
        self.b2 = nn.Parameter(torch.randn(56))
        self.b3 = nn.Parameter(torch.randn(56))
    def forward(self, x):
        h = torch.relu(torch.sort(self.l1(x), dim=-1)[0] * 0.5 + self.b1)
        h = torch.relu(torch.sort(self.l2(h), dim=-1)[0] * 0.5 + self.b2)
        h = torch.relu(torch.sort(self.l3(h), dim=-1)[0] * 0.25 + self.b3)
        return h
def get_inputs():
    return [torch.randn(33, 24)]
def get_init_inputs():
    return []
'''


def test_repeated_blocks_share_their_kernels(write_problem, tmp_path):
    """Groups whose kernels differ only in names (and the graph's value names) call one Triton
    function (emit.share_kernels): three linears of other shapes one matmul kernel, the two
    blocks scaled by 0.5 one pointwise kernel; the block scaled by 0.25 keeps its own. Each
    block's values stay its own: the module matches Model."""
    import re

    comp = generated_matches(write_problem(REPEATED_BLOCKS, "blocks"), tmp_path,
                             launched=("_egg_k_g0", "_egg_k_g1", "_egg_k_g5"))
    kinds = [(g.id, g.kind) for g in comp.plan.groups]
    assert kinds == [("g0", "matmul"), ("g1", "pointwise"), ("g2", "matmul"), ("g3", "pointwise"),
                     ("g4", "matmul"), ("g5", "pointwise")]
    src = comp.emitted.source
    defined = set(re.findall(r"@triton.jit\ndef (_egg_k_\w+)", src))
    assert defined == {"_egg_k_g0", "_egg_k_g0_sum", "_egg_k_g1", "_egg_k_g5"}
    launched = {i["id"]: i["kernels"] for i in comp.emitted.groups}
    assert launched["g2"] == launched["g4"] == launched["g0"] and launched["g3"] == ["_egg_k_g1"]
    assert launched["g5"] == ["_egg_k_g5"]
    assert comp.emitted.kernels == ["_egg_k_g0", "_egg_k_g1", "_egg_k_g5"]
    for wrapper, kernel in (("_egg_g3", "_egg_k_g1"), ("_egg_g4", "_egg_k_g0")):
        # the wrapper (a pointwise one: its first call, then the planned calls)
        body = src[src.index(f"def {wrapper}"):]
        body = body[:body.index("\ndef ", body.index(f"def {wrapper}(") + 1)]
        # (a pointwise wrapper launches kernel[grid](...); a recorded one rec.launch(kernel, grid))
        assert (f"{kernel}[" in body or f"rec.launch({kernel}," in body) and f"_egg_k_{wrapper[5:]}" not in body


def test_kernels_differing_in_more_than_names_are_not_shared():
    """What share_kernels compares: names of functions and of computed values are not the
    kernel; a constant, an operand's role or a dtype is."""
    from codegen.emit import _canonical, share_kernels
    from knowledge.templates import Rendered

    k = ("@triton.jit\ndef {k}(P0, O0, N, BLOCK: tl.constexpr):\n    x0 = tl.load(P0)\n"
         "    {v} = x0 * {c}\n    tl.store(O0, {v}.to({t}))\n")
    a = k.format(k="_egg_k_g1", v="v_mul", c="0.5", t="tl.float32")
    b = k.format(k="_egg_k_g7", v="v_mul_3", c="0.5", t="tl.float32")
    assert _canonical(a)[0] == _canonical(b)[0]
    for other in (k.format(k="_egg_k_g7", v="v_mul_3", c="0.25", t="tl.float32"),
                  k.format(k="_egg_k_g7", v="v_mul_3", c="0.5", t="tl.bfloat16")):
        assert _canonical(a)[0] != _canonical(other)[0]
    seen: dict = {}
    w = "def _egg_g{i}(a0):\n    _egg_k_g{i}[(1,)](a0, o0, 1, BLOCK=8)\n"
    assert share_kernels(Rendered(a, w.format(i=1), "_egg_k_g1", "_egg_g1"), seen)[0] == a
    kernel, wrapper, names = share_kernels(Rendered(b, w.format(i=7), "_egg_k_g7", "_egg_g7"), seen)
    assert kernel == "" and names == ["_egg_k_g1"]
    assert wrapper == "def _egg_g7(a0):\n    _egg_k_g1[(1,)](a0, o0, 1, BLOCK=8)\n"


ROWS_CASES = {
    # RoPE over (2, 3, 40, 64) with (40, 64) tables: rows of 2560, rotate-half in the row
    "rope": ("q, c, s", "        h = q.shape[-1] // 2\n"
             "        return q * c + torch.cat((-q[..., h:], q[..., :h]), dim=-1) * s\n",
             "[torch.randn(2, 3, 40, 64), torch.randn(40, 64), torch.randn(40, 64)]", True),
    # interleaved pairs over rows of 2560
    "pairs": ("q, c, s", "        r = torch.stack((-q[..., 1::2], q[..., ::2]), dim=-1).flatten(-2)\n"
              "        return q * c + r * s\n",
              "[torch.randn(2, 3, 40, 64), torch.randn(40, 64), torch.randn(40, 64)]", True),
    # a bias over rows of 300 (block cut to 512), and one over rows of 3: the flat walk
    "bias_rows": ("x, b", "        return torch.relu(x + b) * 2.0\n", "[torch.randn(7, 300), torch.randn(300)]", True),
    "short_rows": ("x, y", "        return x * y - 1.0\n", "[torch.randn(6, 50, 3), torch.randn(6, 1, 3)]", False),
    # broadcast over a middle dim: rows of 1200 under two outer dims that do not merge (4 x 5)
    "middle": ("x, y", "        return x - y * 0.5\n", "[torch.randn(4, 5, 6, 200), torch.randn(4, 1, 6, 200)]", True),
    # Meta's RoPE layout: (seq, 1, d) tables broadcast over the heads, rows of 130 that do not
    # merge: 4 rows a program (the block 1024 over rows of 256), 30 rows (the last program half
    # empty)
    "short_rows_many": ("q, c, s", "        r = torch.stack((-q[..., 1::2], q[..., ::2]), dim=-1).flatten(-2)\n"
                        "        return q * c + r * s\n",
                        "[torch.randn(2, 5, 3, 130), torch.randn(5, 1, 130), torch.randn(5, 1, 130)]", True),
    # rotate-half with a half of 5 columns (the two masked loads of the rolled column end
    # mid-vector) over rows of 70: the flat walk
    "rope_odd_half": ("q, c, s", "        h = q.shape[-1] // 2\n"
                      "        return q * c + torch.cat((-q[..., h:], q[..., :h]), dim=-1) * s\n",
                      "[torch.randn(3, 7, 10), torch.randn(7, 10), torch.randn(7, 10)]", False),
    # rotate-half of a transposed q ((batch, seq, heads, d) read as (batch, heads, seq, d)):
    # each rolled load through the 4-d strided index (rows of 64 do not merge: the flat walk)
    "rope_permuted": ("q, c, s", "        q = q.transpose(1, 2)\n        h = q.shape[-1] // 2\n"
                      "        return q * c + torch.cat((-q[..., h:], q[..., :h]), dim=-1) * s\n",
                      "[torch.randn(2, 40, 3, 64), torch.randn(40, 64), torch.randn(40, 64)]", False),
    # a permuted operand: strided, rows of the walk's inner dim
    "permuted": ("x, y", "        return x.transpose(0, 1) * 3.0 + y\n", "[torch.randn(300, 129), torch.randn(129, 300)]", True),
}


@pytest.mark.parametrize("name", sorted(ROWS_CASES))
def test_pointwise_rows_of_the_inner_dim(name, write_problem, tmp_path):
    """An operand indexed through strides (a broadcast table or bias, a permuted view, a rolled
    RoPE column) over an inner dim of >= 128 elements: the kernel walks rows of that dim, the
    outer index split once per program (no division per element); shorter rows keep the flat
    walk. Values match torch either way."""
    from harness.problem import load_module, load_problem

    args, body, inputs, rows = ROWS_CASES[name]
    src = (f"import torch, torch.nn as nn\nclass Model(nn.Module):\n    def forward(self, {args}):\n{body}"
           f"def get_inputs():\n    return {inputs}\ndef get_init_inputs():\n    return []\n")
    path = write_problem(src, name)
    comp = generated_matches(path, tmp_path, seeds=(0, 1))
    assert [g.kind for g in comp.plan.groups] == ["pointwise"]
    mod = load_module(tmp_path / f"cand_{name}.py", f"rows_{name}")
    seen = []
    kernel = mod._egg_k_g0

    class Spy:
        def __getitem__(self, grid):
            def launch(*a, **k):
                seen.append((k["ROWS"], k["BLOCK"], k["RB"]))
                return kernel[grid](*a, **k)
            return launch

    mod._egg_k_g0 = Spy()
    prob = load_problem(path)
    with torch.no_grad():
        got = mod.ModelNew()(*prob.inputs())
    assert seen and seen[0][0] is rows
    if name == "bias_rows":
        assert seen[0][1] == 512  # the block cut to the row's 300 (a power of two)
    if name == "short_rows_many":
        assert seen[0][1:] == (256, 4)  # rows of 130 in blocks of 256, 4 rows a program
    assert got.shape == prob.Model()(*prob.inputs()).shape


def test_step_ops_read_16_bit_values_as_eager_rounds_them(write_problem, tmp_path):
    """A comparison or floor of a bf16 value computed inside a kernel reads it rounded to bf16,
    and a Python scalar it is compared with is rounded to bf16 too, as torch does: over every
    bf16 value in [0.125, 4), the kernel's steps land where eager's do, bit for bit (unrounded,
    x * 1.01 <= 1.0 differs at x = 0.992, x * 0.5 <= 0.1 at x = 0.2002: mutants
    step-ops-unrounded and step-literal-unrounded)."""
    src = '''
import torch, torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        return x * 1.01 <= 1.0, x * 0.5 <= 0.1, torch.floor(x * 3.3), (x * 0.7).ceil() > x
def get_inputs():
    return [torch.arange(0x3E00, 0x4080, dtype=torch.int16).view(torch.bfloat16).reshape(40, 16)]
def get_init_inputs():
    return []
'''
    path = write_problem(src, "steps_bf16")
    comp = generated_matches(path, tmp_path, seeds=(0,), atol=0.0, rtol=0.0,
                             launched=["_egg_k_g0"])
    assert [g.kind for g in comp.plan.groups] == ["pointwise"]
    assert "<= 0.10009765625" in comp.emitted.source  # the scalar as bf16 holds it


def test_nan_passes_through_max_and_min_as_in_eager(write_problem, tmp_path):
    """relu, relu6, hardswish, clamp, maximum and minimum give NaN for a NaN operand, as torch
    does (Triton's max/min give the other operand unless told to propagate: a module that
    turned a NaN activation into 0 would hide it from the user); fmax/fmin give the number."""
    from harness.problem import load_module

    src = '''
import torch, torch.nn as nn, torch.nn.functional as F
class Model(nn.Module):
    def forward(self, x, y):
        return (torch.relu(x), F.relu6(x * 2.0), F.hardswish(x), x.clamp(-0.5, 0.5),
                torch.maximum(x, y), torch.minimum(x, y), torch.fmax(x, y), torch.fmin(x, y))
def get_inputs():
    return [torch.randn(6, 8), torch.randn(6, 8)]
def get_init_inputs():
    return []
'''
    comp = generated_matches(write_problem(src, "nan_max"), tmp_path, seeds=(0,))
    assert [g.kind for g in comp.plan.groups] == ["pointwise"]
    (tmp_path / "nan_max_new.py").write_text(comp.emitted.source)
    new = load_module(tmp_path / "nan_max_new.py", "nan_max_new").ModelNew()
    x, y = torch.randn(6, 8), torch.randn(6, 8)
    x[0, :4] = float("nan")
    y[1, :4] = float("nan")
    for got, want in zip(new._egg_fast(x, y), new._egg_reference(x, y)):
        torch.testing.assert_close(got, want, equal_nan=True)


def test_operands_constant_along_a_row_are_loaded_once_a_row(write_problem, tmp_path):
    """Rows of 160 columns (the rows walk): a per-row scale (innermost stride 0, over three outer
    dims) and a 0-d buffer are loaded once per row and broadcast along it; values as torch's
    (mutant row-operand-drops-r2: the row's innermost outer index left out)."""
    src = '''
import torch, torch.nn as nn
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("c", torch.tensor(0.75))
    def forward(self, x, s, b):
        return x * s * self.c + b
def get_inputs():
    return [torch.randn(2, 3, 5, 160), torch.randn(2, 3, 5, 1), torch.randn(160)]
def get_init_inputs():
    return []
'''
    comp = generated_matches(write_problem(src, "row_const"), tmp_path, seeds=(0, 1))
    assert [g.kind for g in comp.plan.groups] == ["pointwise"]
    assert "if ROWS and B1:" in comp.emitted.source


@pytest.mark.parametrize("dims", ["rows", "cols"])
def test_max_min_and_arg_reductions_take_nan_as_torch_does(dims, write_problem, tmp_path):
    """amax / amin / max(dim) give NaN where a NaN is reduced, argmax / argmin the first NaN's
    index, over the innermost dim (rows walk) and another (columns walk), as torch does (Triton's
    max / min give the other operand); max pooling too."""
    from harness.problem import load_module

    d = -1 if dims == "rows" else 1
    src = f'''
import torch, torch.nn as nn, torch.nn.functional as F
class Model(nn.Module):
    def forward(self, x):
        return (x.amax({d}), x.amin({d}), torch.argmax(x, {d}), torch.argmin(x, {d}),
                torch.max(x * 2.0, {d})[0], F.max_pool1d(x, 2))
def get_inputs():
    return [torch.randn(5, 6, 8)]
def get_init_inputs():
    return []
'''
    comp = generated_matches(write_problem(src, f"nan_red_{dims}"), tmp_path, seeds=(0,))
    assert comp.plan.groups and all(g.kind in ("reduction", "pool") for g in comp.plan.groups)
    (tmp_path / f"nan_red_{dims}.py").write_text(comp.emitted.source)
    new = load_module(tmp_path / f"nan_red_{dims}.py", f"nan_red_{dims}").ModelNew()
    x = torch.randn(5, 6, 8)
    x[0, 1, 3] = x[1, 2, 5] = x[1, 2, 6] = x[2, 4, 0] = float("nan")
    for got, want in zip(new._egg_fast(x), new._egg_reference(x)):
        torch.testing.assert_close(got, want, equal_nan=True)


def test_round_is_ties_to_even_in_the_kernel(write_problem, tmp_path):
    """torch.round (per-token int8 quantization: round(x / scale).clamp(-128, 127)) joins the
    pointwise kernel (it was a torch op splitting the chain in two): ties go to the even
    integer (0.5 -> 0, 1.5 -> 2, -2.5 -> -2), values from 2^23 on are integers already, NaN and
    inf stay; bf16 inputs rounded as eager rounds them (a step op). Bit for bit."""
    src = '''
import torch, torch.nn as nn
class Model(nn.Module):
    def forward(self, x, y):
        return torch.round(x * 2.0).clamp(-128, 127), (y * 1.5).round(), torch.round(x)
def get_inputs():
    h = torch.arange(-40, 40, dtype=torch.float32) / 4
    big = torch.tensor([8388607.5, 8388608.0, -8388609.0, 3e9, float("nan"), float("inf"), -float("inf"), -0.25])
    y = torch.arange(0x3E00, 0x4080, dtype=torch.int16).view(torch.bfloat16)
    return [torch.cat([h, big]).reshape(8, 11), y.reshape(40, 16)]
def get_init_inputs():
    return []
'''
    path = write_problem(src, "round_even")
    comp = generated_matches(path, tmp_path, seeds=(0,), atol=0.0, rtol=0.0, launched=["_egg_k_g0"])
    assert [g.kind for g in comp.plan.groups] == ["pointwise", "pointwise"]
    assert "torch.round" not in comp.emitted.source.split("def _egg_fast")[1].split("def _egg_reference")[0]


def test_casts_to_and_from_integers_in_the_kernel(write_problem, tmp_path):
    """Per-token int8 quantization as vLLM's reference writes it: an amax, then round(x / scale)
    .clamp(-128, 127).to(int8) and the dequantized q.float() * scale. The int8 cast and its
    float cast back were torch ops (three passes more), and x.float() a kernel of its own
    writing an fp32 copy for the amax and the scaling to read: now an amax kernel reading the
    bf16 input and one pointwise kernel storing q (int8) and the dequantized bf16. A loaded
    int16 read as a float joins too, and a bf16 product cast to int32 is truncated as eager
    rounds it first (over every bf16 value in [0.125, 4)). Bit for bit."""
    src = '''
import torch, torch.nn as nn
class Model(nn.Module):
    def forward(self, x, k, y):
        xf = x.float()
        scale = xf.abs().amax(dim=-1, keepdim=True).clamp(min=1e-5) / 127.0
        q = torch.round(xf / scale).clamp(-128, 127).to(torch.int8)
        return (q, scale, (q.to(torch.float32) * scale).to(x.dtype), k.to(torch.float32) * 0.5 + 1.0,
                (y * 3.3).to(torch.int32))
def get_inputs():
    return [torch.randn(16, 96, dtype=torch.bfloat16), torch.randint(-30000, 30000, (8, 33), dtype=torch.int16),
            torch.arange(0x3E00, 0x4080, dtype=torch.int16).view(torch.bfloat16).reshape(40, 16)]
def get_init_inputs():
    return []
'''
    path = write_problem(src, "int8_quant")
    comp = generated_matches(path, tmp_path, seeds=(0, 1), atol=0.0, rtol=0.0)
    assert sorted(g.kind for g in comp.plan.groups) == ["pointwise", "pointwise", "pointwise", "reduction"]
    fast = comp.emitted.source.split("def _egg_fast")[1].split("def _egg_reference")[0]
    assert ".to(" not in fast and "float()" not in fast, fast
