"""LLM operators written the ways a probe of hand-written operators found the compiler missing
(2026-12-05): multi-query decode attention by broadcasting matmuls (one key/value head,
[B, 1, T, D]), a softmax whose maximum is read as ``.max(d, keepdim=True).values``, the upcast
written at each use, Gemma's norm (``x.float() * torch.rsqrt(x.float().pow(2).mean(-1, ...))``
times ``1.0 + w.float()``: one norm kernel computing 1 + w per column), T5's norm (the input
itself times the rsqrt of its upcast's mean square, a branch on the weight's dtype),
``F.layer_norm`` with the normalized shape read from the input (``x.shape[-1:]``,
``(x.size(-1),)``, no weight), MLA-style latent attention by einsum (the head letter the cache
lacks broadcast), and cross-entropy as ``logsumexp(z) - z.gather(t)`` after an LM head. Each gets the kernels of its usual spelling; each emitted file passes the verifier's static
check, runs its kernels with eager's values, and is a drop-in (tests/dropin.check_dropin). The
canonical forms behind them keep what they must not merge (two dropouts, values read across an
in-place write, two outputs of one value), and a call at another dtype than a branch was traced
at takes Model's own code."""
import pytest
import torch

from codegen import rewrites as RW
from codegen.pipeline import analyze, compile_problem
from harness.problem import load_problem
from harness.verify import static_findings_src
from tests.dropin import check_dropin, load_sources
from tests.test_attention_mask import SPLIT, _Launches, runs_and_is_a_drop_in

HEAD = "import math\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"

#: multi-query decode: q [B, H, 1, D] against one key/value head [B, 1, T, D]
MQA_DECODE = HEAD + '''
class Model(nn.Module):
    def forward(self, q, k, v):
        s = torch.matmul(q, k.transpose(2, 3)) * (q.shape[-1] ** -0.5)
        p = F.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(p, v)
def get_inputs():
    return [torch.randn(2, 4, 1, 16, dtype=torch.{dtype}), torch.randn(2, 1, 40, 16, dtype=torch.{dtype}),
            torch.randn(2, 1, 40, 16, dtype=torch.{dtype})]
def get_init_inputs():
    return []
'''

SOFTMAX_VALUES = HEAD + '''
class Model(nn.Module):
    def forward(self, x):
        xf = x.float()
        m = xf.max(dim=-1, keepdim=True).values
        e = torch.exp(xf - m)
        return (e / e.sum(-1, keepdim=True)).to(x.dtype)
def get_inputs():
    return [torch.randn(4, 300, dtype=torch.bfloat16)]
def get_init_inputs():
    return []
'''

#: Gemma's RMS norm: the upcast written twice, the weight as (1 + w)
GEMMA_NORM = HEAD + '''
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(64))
    def forward(self, x):
        out = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
        return (out * (1.0 + self.weight.float())).type_as(x)
def get_inputs():
    return [torch.randn(2, 8, 64, dtype=torch.bfloat16)]
def get_init_inputs():
    return []
'''

LAYER_NORM_FROM_INPUT = HEAD + '''
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(96, dtype=torch.bfloat16))
    def forward(self, x, r):
        h = x + r
        return F.layer_norm(h, {ns}, {weight}, None, 1e-5), h
def get_inputs():
    return [torch.randn(16, 96, dtype=torch.bfloat16), torch.randn(16, 96, dtype=torch.bfloat16)]
def get_init_inputs():
    return []
'''

#: the LM head and its loss, the loss as logsumexp minus the picked logit
LSE_MINUS_PICKED = HEAD + '''
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lm_head = nn.Linear(64, 300, bias=False, dtype=torch.bfloat16)
    def forward(self, h, t):
        logits = self.lm_head(h).float()
        return {loss}
def get_inputs():
    return [torch.randn(16, 64, dtype=torch.bfloat16), torch.randint(0, 300, (16,))]
def get_init_inputs():
    return []
'''


def _kinds(path) -> list[str]:
    plan, _rw, err = analyze(load_problem(path))
    assert plan is not None, err
    return sorted(g.kind for g in plan.groups)


def _emitted(path, configs=None) -> str:
    comp = compile_problem(load_problem(path), configs=configs)
    assert comp.emitted is not None, comp.error
    return comp.emitted.source


def _kernels_agree_and_drop_in(src: str, emitted: str, tol: float) -> None:
    assert static_findings_src(emitted, src) == []
    pm, cm = load_sources(src, emitted)
    ins = pm.get_inputs()
    torch.manual_seed(0)
    ref = pm.Model(*pm.get_init_inputs())
    torch.manual_seed(0)
    new = cm.ModelNew(*pm.get_init_inputs())
    new.load_state_dict(ref.state_dict())
    with torch.no_grad():
        a, b = ref(*ins), new(*ins)
    for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
        torch.testing.assert_close(y, x, atol=tol, rtol=tol)
    report = check_dropin(src, emitted, calls=1, atol=tol, rtol=tol)
    assert report.fast("own") and report.fast("own", "eval")


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-4), ("bfloat16", 1e-2)])
def test_multi_query_decode_by_broadcast_is_split_kv_attention(dtype, tol, write_problem):
    src = MQA_DECODE.format(dtype=dtype)
    path = write_problem(src, f"mqa_{dtype}")
    plan, rw, err = analyze(load_problem(path))
    assert plan is not None, err
    assert [g.kind for g in plan.groups] == ["attention"] and "rw-attention" in rw
    op = plan.nops[plan.groups[0].red]
    assert [t.op for t in op.operands[:3]] == ["placeholder"] * 3  # the one head, not a copy per head
    runs_and_is_a_drop_in(src, _emitted(path, SPLIT), "_egg_k_g0_merge", tol)


def test_a_key_head_that_is_not_one_keeps_the_products(write_problem):
    """Two key heads against four query heads do not broadcast (torch.matmul raises), and a
    batch of one key set against two query batches is not grouped-query attention: neither is
    taken."""
    src = MQA_DECODE.format(dtype="float32").replace("torch.randn(2, 1, 40, 16", "torch.randn(1, 1, 40, 16")
    path = write_problem(src, "mqa_batch_broadcast")
    assert "attention" not in _kinds(path)


def test_softmax_with_max_values_is_one_softmax_kernel(write_problem, monkeypatch):
    path = write_problem(SOFTMAX_VALUES, "softmax_values")
    assert _kinds(path) == ["softmax"]
    _kernels_agree_and_drop_in(SOFTMAX_VALUES, _emitted(path), 1e-2)
    monkeypatch.setattr(RW, "CANONICAL", [f for f in RW.CANONICAL if f is not RW.named_fields])
    assert _kinds(path) != ["softmax"]


def test_gemma_norm_is_one_norm_kernel_with_its_weight(write_problem, monkeypatch):
    """Gemma's norm: the upcast written twice, the weight as (1 + w) in fp32: one norm kernel
    that computes 1 + w per column in its epilogue (fusion's parameter chains); without them
    the (1 + w) vector and the product are a kernel of their own."""
    from codegen import fusion as FU

    path = write_problem(GEMMA_NORM, "gemma_norm")
    plan, rw, err = analyze(load_problem(path))
    assert plan is not None and "rw-rms-norm" in rw, err
    assert [g.kind for g in plan.groups] == ["norm"]
    _kernels_agree_and_drop_in(GEMMA_NORM, _emitted(path), 1e-2)
    monkeypatch.setattr(FU, "_parameter_chains_into_norms", lambda *a: None)
    assert _kinds(path) == ["norm", "pointwise"]


#: a softmax written out over the upcast, the upcast written at each use
SOFTMAX_UPCAST_TWICE = HEAD + '''
class Model(nn.Module):
    def forward(self, x):
        e = torch.exp(x.float() - x.float().amax(-1, keepdim=True))
        return (e / e.sum(-1, keepdim=True)).to(x.dtype)
def get_inputs():
    return [torch.randn(4, 300, dtype=torch.bfloat16)]
def get_init_inputs():
    return []
'''


def test_the_same_upcast_written_twice_is_one_value(write_problem, monkeypatch):
    """rw-softmax matches the maximum subtracted from the value it was taken of: two x.float()
    nodes are one value only through the common-subexpression form."""
    path = write_problem(SOFTMAX_UPCAST_TWICE, "softmax_upcast_twice")
    assert _kinds(path) == ["softmax"]
    _kernels_agree_and_drop_in(SOFTMAX_UPCAST_TWICE, _emitted(path), 1e-2)
    monkeypatch.setattr(RW, "CANONICAL", [f for f in RW.CANONICAL if f is not RW.common_subexpressions])
    assert _kinds(path) != ["softmax"]


def test_a_parameter_chain_read_before_the_norm_stays_its_own(write_problem):
    """(1 + w) read by the norm's prologue too (x * (1 + w) normalized, then times (1 + w)) is
    not moved after the norm: the kernel would read a value it computes later."""
    src = HEAD + '''
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(64))
    def forward(self, x):
        s = 1.0 + self.weight
        return F.rms_norm(x * s, (64,), None, 1e-6) * s
def get_inputs():
    return [torch.randn(2, 8, 64)]
def get_init_inputs():
    return []
'''
    path = write_problem(src, "chain_before_norm")
    plan, _rw, err = analyze(load_problem(path))
    assert plan is not None, err
    (norm,) = [g for g in plan.groups if g.kind == "norm"]
    assert not any(m.name.startswith("add") for m in norm.members)  # s is computed before it
    _kernels_agree_and_drop_in(src, _emitted(path), 1e-4)


@pytest.mark.parametrize("ns,weight", [("h.shape[-1:]", "self.weight"), ("(h.size(-1),)", "self.weight"),
                                       ("[h.shape[-1]]", "None"), ("h.shape[1:]", "None")])
def test_layer_norm_shape_read_from_its_input_is_a_norm_kernel(ns, weight, write_problem):
    src = LAYER_NORM_FROM_INPUT.format(ns=ns, weight=weight)
    path = write_problem(src, "ln_from_input")
    assert _kinds(path) == ["norm"]
    _kernels_agree_and_drop_in(src, _emitted(path), 1e-2)


@pytest.mark.parametrize("ns", ["h.shape[:1]", "(h.size(0),)", "h.shape"])
def test_a_shape_that_is_not_the_last_dims_is_not_taken(ns, write_problem):
    """The leading dim read as the normalized shape (the same size as the last here, so torch
    normalizes the last dim; at another batch size it raises), or every dim: not the pattern,
    the norm stays torch's."""
    src = LAYER_NORM_FROM_INPUT.format(ns=ns, weight="None").replace("torch.randn(16, 96", "torch.randn(96, 96")
    assert "norm" not in _kinds(write_problem(src, "ln_not_last"))


def test_logsumexp_minus_the_picked_logit_is_the_fused_lm_head_loss(write_problem):
    """(logsumexp(z) - z.gather(t)).mean() of an LM head's logits is cross_entropy: the fused LM
    head + loss kernel (rw-linear-cross-entropy), no logits written, as F.cross_entropy gets;
    without the spelling's canonical form the logits are a product of their own."""
    src = LSE_MINUS_PICKED.format(
        loss="(torch.logsumexp(logits, -1) - logits.gather(-1, t[:, None]).squeeze(-1)).mean()")
    path = write_problem(src, "lse_minus_picked")
    ce = write_problem(LSE_MINUS_PICKED.format(loss="F.cross_entropy(logits, t)"), "ce_plain")
    kinds = _kinds(path)
    assert "linear_ce" in kinds and "matmul" not in kinds, kinds
    # F.cross_entropy's mean is inside the fused kernel; here the mean of the losses is a
    # small reduction of its own (one value per token)
    assert [k for k in kinds if k != "reduction"] == _kinds(ce) == ["linear_ce"]
    _kernels_agree_and_drop_in(src, _emitted(path), 1e-2)


# the canonical forms' own limits: what they must not merge

def _canonical(src: str, write_problem, name: str):
    from harness.capture import capture

    prob = load_problem(write_problem(src, name))
    cap = capture(prob)
    RW.canonicalize(cap.gm, cap.inputs)
    return cap.gm


def test_two_dropouts_of_one_value_stay_two(write_problem):
    src = HEAD + '''
class Model(nn.Module):
    def forward(self, x):
        return F.dropout(x, 0.5, True) + F.dropout(x, 0.5, True)
def get_inputs():
    return [torch.randn(8, 8)]
def get_init_inputs():
    return []
'''
    gm = _canonical(src, write_problem, "two_dropouts")
    assert sum("dropout" in str(n.target) for n in gm.graph.nodes) == 2


def test_values_read_across_an_in_place_write_are_not_merged(write_problem):
    src = HEAD + '''
class Model(nn.Module):
    def forward(self, x):
        a = x * 2
        x.add_(1)
        return a + x * 2
def get_inputs():
    return [torch.randn(8, 8)]
def get_init_inputs():
    return []
'''
    gm = _canonical(src, write_problem, "in_place")
    assert sum(n.op == "call_function" and n.target.__name__ == "mul" for n in gm.graph.nodes) == 2


def test_two_outputs_of_one_value_stay_two_tensors(write_problem):
    src = HEAD + '''
class Model(nn.Module):
    def forward(self, x):
        return x.float() * 2, x.float() * 2
def get_inputs():
    return [torch.randn(8, 8, dtype=torch.bfloat16)]
def get_init_inputs():
    return []
'''
    path = write_problem(src, "two_outputs")
    emitted = _emitted(path)
    pm, cm = load_sources(src, emitted)
    a, b = cm.ModelNew()(*pm.get_inputs())
    assert a.data_ptr() != b.data_ptr()
    torch.testing.assert_close(a, b)


# branches on dtypes (harness.capture.DTYPE_FIXED): T5's norm and feed-forward

#: transformers' T5LayerNorm: the variance of the upcast, the input itself scaled, a branch on
#: the weight's dtype
T5_NORM = HEAD + '''
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(64, dtype=torch.bfloat16))
        self.variance_epsilon = 1e-6
    def forward(self, hidden_states):
        variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        if self.weight.dtype in [torch.float16, torch.bfloat16]:
            hidden_states = hidden_states.to(self.weight.dtype)
        return self.weight * hidden_states
def get_inputs():
    return [torch.randn(2, 8, 64, dtype=torch.bfloat16)]
def get_init_inputs():
    return []
'''

#: a branch on an input's dtype (T5's feed-forward clamps fp16 activations)
INPUT_DTYPE_BRANCH = HEAD + '''
class Model(nn.Module):
    def forward(self, x):
        y = x * 3.0
        if x.dtype == torch.float16:
            y = torch.clamp(y, min=-1.0, max=1.0)
        return torch.relu(y) + 1.0
def get_inputs():
    return [torch.randn(8, 32)]
def get_init_inputs():
    return []
'''


def test_t5_norm_branching_on_the_weight_dtype_is_one_norm_kernel(write_problem):
    from harness.capture import DTYPE_FIXED, capture

    path = write_problem(T5_NORM, "t5_norm")
    cap = capture(load_problem(path))
    assert cap.gm is not None and not cap.breaks, cap.error
    assert cap.gm.meta[DTYPE_FIXED] == {("attr", "weight"): torch.bfloat16}
    assert _kinds(path) == ["norm"]
    emitted = _emitted(path)
    assert "self.weight.dtype != torch.bfloat16" in emitted
    # the move trials take the weight to float64 and back to float32: Model's own code then
    _kernels_agree_and_drop_in(T5_NORM, emitted, 1e-2)


def test_a_call_at_another_dtype_takes_model_code_with_its_branch(write_problem):
    path = write_problem(INPUT_DTYPE_BRANCH, "input_dtype_branch")
    assert _kinds(path) == ["pointwise"]
    emitted = _emitted(path)
    _kernels_agree_and_drop_in(INPUT_DTYPE_BRANCH, emitted, 1e-4)
    pm, cm = load_sources(INPUT_DTYPE_BRANCH, emitted)
    x = torch.randn(8, 32).half()
    got, ref = cm.ModelNew()(x), pm.Model()(x)
    assert float(got.max()) <= 2.0  # the clamp of the fp16 branch ran
    torch.testing.assert_close(got, ref)


def test_without_the_dtype_route_the_file_would_be_wrong(write_problem, monkeypatch):
    """The route is what keeps a call at another dtype right: without it, the traced graph
    (no clamp) answers an fp16 call."""
    from codegen import emit as E

    path = write_problem(INPUT_DTYPE_BRANCH, "input_dtype_branch_off")
    real = E._dispatch
    monkeypatch.setattr(E, "_dispatch", lambda *a, **k: real(*a[:7]))
    emitted = _emitted(path)
    pm, cm = load_sources(INPUT_DTYPE_BRANCH, emitted)
    x = torch.randn(8, 32).half()
    assert not torch.allclose(cm.ModelNew()(x).float(), pm.Model()(x).float())


@pytest.mark.parametrize("cond", ["(x * 2).dtype == torch.float16", "x.shape[0] > 4",
                                  "x.dtype == torch.float32 and x.shape[0] > 4"])
def test_a_branch_not_on_dtypes_alone_is_a_graph_break(cond, write_problem):
    from harness.capture import DTYPE_FIXED, capture

    src = INPUT_DTYPE_BRANCH.replace("x.dtype == torch.float16", cond)
    cap = capture(load_problem(write_problem(src, "other_branch")))
    assert cap.gm is not None and cap.breaks
    assert not cap.gm.meta.get(DTYPE_FIXED) or cond.startswith("x.dtype")


@pytest.mark.parametrize("configs", [None, {"g0": {"ONE_MAX": 16, "SPLIT_CHUNK": 32}}], ids=["one", "split"])
def test_a_parameter_chain_after_a_residual_norm_reads_the_sum_too(configs, write_problem):
    """``rms_norm(x + r) * (1 + w) + (x + r)``: the chain reads the norm's result and the sum of
    its prologue; it joins the norm kernel, which holds both (rows in registers, or Welford
    partials of row chunks and a second pass)."""
    src = HEAD + '''
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(64))
    def forward(self, x, r):
        s = x + r
        return F.rms_norm(s, (64,), None, 1e-6) * (1.0 + self.weight) + s
def get_inputs():
    return [torch.randn(2, 8, 64), torch.randn(2, 8, 64)]
def get_init_inputs():
    return []
'''
    path = write_problem(src, "residual_chain")
    assert _kinds(path) == ["norm"]
    emitted = _emitted(path, configs)
    _kernels_agree_and_drop_in(src, emitted, 1e-4)
    pm, cm = load_sources(src, emitted)
    kernel = "_egg_k_g0_one" if configs is None else "_egg_k_g0_apply"
    box: list = []
    setattr(cm, kernel, _Launches(getattr(cm, kernel), box))
    cm.ModelNew()(*pm.get_inputs())
    assert box, f"{kernel} did not run"


#: latent attention as MLA's absorbed decode writes it: one latent cache, keys and values both,
#: the head letter missing from it (einsum broadcasts it)
LATENT_EINSUM = HEAD + '''
class Model(nn.Module):
    def forward(self, q, kv):
        s = torch.einsum("bhqr,btr->bhqt", q, kv) * 0.125
        p = s.float().softmax(-1).to(q.dtype)
        return torch.einsum("bhqt,btr->bhqr", p, kv)
def get_inputs():
    return [torch.randn(2, 4, 1, 32, dtype=torch.{dtype}), torch.randn(2, 40, 32, dtype=torch.{dtype})]
def get_init_inputs():
    return []
'''


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-4), ("bfloat16", 1e-2)])
def test_latent_attention_by_einsum_is_multi_query_attention(dtype, tol, write_problem):
    """The einsum form writes the head letter the latent cache lacks as a size-1 dim the product
    broadcasts (not a permuted product over a leading head dim), so the attention rule reads
    it as multi-query attention: one split-KV kernel reading the cache once for all heads."""
    src = LATENT_EINSUM.format(dtype=dtype)
    path = write_problem(src, f"latent_{dtype}")
    plan, rw, err = analyze(load_problem(path))
    assert plan is not None, err
    assert [g.kind for g in plan.groups] == ["attention"] and "rw-attention" in rw
    runs_and_is_a_drop_in(src, _emitted(path, SPLIT), "_egg_k_g0_merge", tol)


@pytest.mark.parametrize("eq,shapes", [
    ("bhqr,btr->bhqt", "(2, 4, 3, 8), (2, 5, 8)"),   # the right operand lacks h
    ("btr,bhqr->bhqt", "(2, 5, 8), (2, 4, 3, 8)"),   # the same, operands swapped
    ("bqr,bhtr->bhqt", "(2, 3, 8), (2, 4, 5, 8)"),   # the left operand lacks h
    ("bhrq,brt->bhqt", "(2, 4, 8, 3), (2, 8, 5)"),   # the left stored (k, row), the right (k, col)
])
def test_broadcast_einsums_are_products_with_eager_values(eq, shapes, write_problem):
    src = HEAD + f'''
class Model(nn.Module):
    def forward(self, a, b):
        return torch.einsum("{eq}", a, b)
def get_inputs():
    return [torch.randn{shapes.split("), ")[0]}), torch.randn{shapes.split("), ")[1]}]
def get_init_inputs():
    return []
'''
    gm = _canonical(src, write_problem, "bcast_einsum")
    assert not any(n.target is torch.einsum for n in gm.graph.nodes)
    pm = load_sources(src, src.replace("class Model", "class ModelNew"))[0]
    ins = pm.get_inputs()
    gm.recompile()
    torch.testing.assert_close(gm(*ins), pm.Model()(*ins))


@pytest.mark.parametrize("expr,shapes", [
    ('torch.einsum("i,j->ij", a, b)', "(7,), (5,)"),            # RoPE's frequency table
    ("torch.outer(a, b)", "(7,), (5,)"),
    ('torch.einsum("bi,bj->bij", a, b)', "(3, 7), (3, 5)"),     # a batch letter in both
    ('torch.einsum("ij,k->kji", a, b)', "(3, 7), (5,)"),        # the output in another order
    ("a[:, :, None] @ b[:, None, :]", "(3, 7), (3, 5)"),       # HF rotary: a product over one term
    ("a[None, :, None] @ b[:, None, :]", "(7,), (3, 5)"),       # batch dims broadcast
])
def test_outer_products_are_a_broadcast_multiply_with_eager_values(expr, shapes, write_problem):
    """An einsum that contracts nothing (and torch.outer) is one product per element: a
    pointwise multiply of the operands permuted and unsqueezed to the output's letters. As a
    library call no pointwise kernel could take it (partial RoPE's tables: a kernel of its own)."""
    a_shape, b_shape = shapes.split("), ")
    src = HEAD + f'''
class Model(nn.Module):
    def forward(self, a, b):
        return {expr} * 2.0
def get_inputs():
    return [torch.randn{a_shape}), torch.randn{b_shape}]
def get_init_inputs():
    return []
'''
    gm = _canonical(src, write_problem, "outer")
    assert not any(n.target in (torch.einsum, torch.outer) for n in gm.graph.nodes)
    pm = load_sources(src, src.replace("class Model", "class ModelNew"))[0]
    ins = pm.get_inputs()
    gm.recompile()
    assert torch.equal(gm(*ins), pm.Model()(*ins))  # one rounding per element in both
    plan, _rw, err = analyze(load_problem(write_problem(src, "outer_plan")))
    assert plan is not None, err
    assert [g.kind for g in plan.groups] == ["pointwise"] and not any(
        op.kind == "library" for op in plan.nops.values())


def test_a_contracting_einsum_is_not_an_outer_product(write_problem):
    src = HEAD + '''
class Model(nn.Module):
    def forward(self, a, b):
        return torch.einsum("ij,j->i", a, b)
def get_inputs():
    return [torch.randn(3, 7), torch.randn(7)]
def get_init_inputs():
    return []
'''
    gm = _canonical(src, write_problem, "contract")
    import operator

    assert not any(n.target is operator.mul for n in gm.graph.nodes)


PARTIAL_ROPE = HEAD + '''
class Model(nn.Module):
    def forward(self, q, cos, sin):
        rd = 8
        rot_half = q[..., :rd]
        x1, x2 = rot_half[..., : rd // 2], rot_half[..., rd // 2 :]
        rotated = torch.cat((-x2, x1), dim=-1)
        cos, sin = cos[None, None].to(q.dtype), sin[None, None].to(q.dtype)
        out = rot_half * cos + rotated * sin
        return torch.cat((out, q[..., rd:]), dim=-1)
def get_inputs():
    return [torch.randn(2, 3, 6, 24, dtype=torch.bfloat16), torch.randn(6, 8), torch.randn(6, 8)]
def get_init_inputs():
    return []
'''


def test_partial_rope_reads_q_in_one_kernel(write_problem):
    """GPT-NeoX / Phi partial rotary: the first rd columns rotated, the rest passed through.
    ``rot_half * cos`` reads a table computed by a kernel of its own (a cast, over [T, rd]):
    it could not join that kernel (another domain) and, having a producer in a group, did not
    look for an open group either, so it was a kernel of its own beside the one computing
    ``rotated * sin``, the sum and the cat: q's rotated columns read twice, a [B, H, T, rd]
    temporary written and read. Now it joins that open group: one kernel over q."""
    path = write_problem(PARTIAL_ROPE, "partial_rope")
    plan, rw, err = analyze(load_problem(path))
    assert plan is not None, err
    over_q = [g for g in plan.groups if tuple(g.domain[:2]) == (2, 3)]
    assert len(over_q) == 1 and {plan.nops[m].name for m in over_q[0].members} >= {"rotate_half", "cat", "add"}
    comp = compile_problem(load_problem(path))
    report = check_dropin(PARTIAL_ROPE, comp.emitted.source, calls=1, atol=1e-2, rtol=1e-2)
    assert report.fast("own", "train")
