"""Generated ModelNew modules are drop-ins (docs/dropin.md): for every template family a small
problem (tests/dropin_cases.py), compiled by EGG, passes tests/dropin.check_dropin (random parameters,
train() and eval(), other sizes and ranks, scaled inputs, grad mode, moved with .to()); the
known failures of issue 16 stay fixed; and the checker catches modules that are not drop-ins."""
import copy

import pytest
import torch
import torch.nn as nn

from codegen import dropin as D
from codegen.pipeline import compile_problem
from harness.problem import load_module, load_problem
from tests.dropin import check_dropin, load_sources
from tests.dropin_cases import (CONFIGS, CONV_BN_RELU, FAMILIES, LAYER_NORM, LOG_SOFTMAX,
                                ONE_SPLIT, problem)


def compiled(write_problem, src: str, name: str, configs=None):
    comp = compile_problem(load_problem(write_problem(src, name)), configs=configs)
    assert comp.emitted is not None, comp.error
    return comp


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_family_is_a_drop_in(name, write_problem):
    src, kinds, fast = FAMILIES[name]
    comp = compiled(write_problem, src, name, CONFIGS.get(name))
    assert kinds <= {g.kind for g in comp.plan.groups}
    same = comp.plan.dropin.same  # one set of kernels for both modes: eval() needs fewer trials
    report = check_dropin(src, comp.emitted.source, calls=2,
                          eval_variants=("own", "batch", "rank") if same else None)
    for mode in ("train", "eval"):
        for trial in fast if mode == "train" or not same else [t for t in fast if t in ("own", "batch", "rank")]:
            assert report.fast(trial, mode), (name, trial, mode)  # the kernels ran (not Model's ops)


# ---------------------------------------------------------------- the failures of issue 16
def test_conv_batchnorm_relu_in_eval_and_at_another_batch_size(write_problem):
    """Was off by 25 in eval() (batch statistics), and its running variance drifted at another
    batch size (the unbiased factor's count baked in from the traced shape)."""
    comp = compiled(write_problem, CONV_BN_RELU, "cbr", ONE_SPLIT)
    src = comp.emitted.source
    assert "_egg_fast_eval" in src and "_egg_fast_train" in src  # a plan per mode
    report = check_dropin(CONV_BN_RELU, src, calls=2, variants=("own", "batch"))
    assert report.fast("own", "eval") and report.fast("batch", "train")
    # the running statistics after train() calls at two batch sizes, exactly as nn.BatchNorm
    prob, cand = load_sources(CONV_BN_RELU, src)
    torch.manual_seed(0)
    ref = prob.Model()
    new = cand.ModelNew()
    new.load_state_dict(ref.state_dict())
    for n in (3, 5, 2):
        x = torch.randn(n, 2, 5, 4)
        with torch.no_grad():
            torch.testing.assert_close(new(x), ref(x), atol=1e-5, rtol=1e-5)
        for k in ("running_mean", "running_var", "num_batches_tracked"):
            torch.testing.assert_close(getattr(new.bn, k), getattr(ref.bn, k), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("momentum", [0.1, None])
def test_bn_update_counts_the_call(momentum):
    """The running-statistics bookkeeping against nn.BatchNorm1d, for any batch size and the
    cumulative average (momentum=None); a single value per channel raises as torch does."""
    from knowledge.templates import _runtime as R

    bn = nn.BatchNorm1d(3, momentum=momentum)
    rm, rv, nbt = bn.running_mean.clone(), bn.running_var.clone(), bn.num_batches_tracked.clone()
    for n in (4, 7, 2):
        x = torch.randn(n, 3) * 2 + 1
        bn(x)
        mean, var, count = R._egg_chanstats(x)
        R._egg_bn_update(mean, var, count, rm, rv, nbt, momentum)
        torch.testing.assert_close(rm, bn.running_mean)
        torch.testing.assert_close(rv, bn.running_var)
        assert int(nbt) == int(bn.num_batches_tracked)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        R._egg_bn_update(*R._egg_chanstats(torch.randn(1, 3)), rm, rv, nbt, momentum)
    with pytest.raises(ValueError):
        bn(torch.randn(1, 3))


def test_layer_norm_other_leading_dims_and_a_wrong_width(write_problem):
    """Returned NaN and values near 1e37 for (4, 5, 257) (rows counted with the traced rank),
    and a result at (7, 256) where torch raises."""
    comp = compiled(write_problem, LAYER_NORM, "ln")
    prob, cand = load_sources(LAYER_NORM, comp.emitted.source)
    torch.manual_seed(0)
    ref, new = prob.Model(), cand.ModelNew()
    with torch.no_grad():
        ref.ln.weight.normal_()
        ref.ln.bias.normal_()
    new.load_state_dict(ref.state_dict())
    x = torch.randn(4, 5, 257) * 3
    with torch.no_grad():
        torch.testing.assert_close(new(x), ref(x), atol=1e-4, rtol=1e-4)
        with pytest.raises(RuntimeError, match="normalized_shape"):
            ref(torch.randn(7, 256))
        with pytest.raises(RuntimeError, match="normalized_shape"):
            new(torch.randn(7, 256))
    # the kernel itself refuses a wrong width as torch does (not only the dispatch)
    with pytest.raises(RuntimeError, match=r"normalized_shape=\[257\]"):
        cand._egg_g0(torch.randn(7, 256), new.ln.weight, new.ln.bias)
    report = check_dropin(LAYER_NORM, comp.emitted.source, modes=("train",),
                          variants=("own", "batch", "rank", "dim257"))
    assert report.fast("rank") and report.fast("batch")


FLATTEN_LINEAR = problem("        self.fc = nn.Linear(3 * 4, 5)\n        self.mp = nn.MaxPool2d(4)\n",
                         "    def forward(self, x):\n"
                         "        return torch.relu(self.fc(torch.flatten(self.mp(torch.relu(x * 2.0)), 1)))\n",
                         "[torch.randn(4, 3, 8, 8)]")


def test_a_product_behind_a_flatten_refuses_what_linear_refuses(write_problem):
    """AlexNet on the H200: the guard frees the image size (a pooling floor gives the same file
    at 8 and 10), but at 12 the flattened width no longer matches the linear layer's: Model
    raises, and the matrix-product kernel (K read from A alone) returned a result: every
    candidate failed its verification. The wrapper refuses it as torch does."""
    comp = compiled(write_problem, FLATTEN_LINEAR, "flatlin")
    assert [g.kind for g in comp.plan.groups] == ["pool", "matmul"]
    prob, cand = load_sources(FLATTEN_LINEAR, comp.emitted.source)
    torch.manual_seed(0)
    ref, new = prob.Model(), cand.ModelNew()
    new.load_state_dict(ref.state_dict())
    with torch.no_grad():
        for size in (8, 10):  # a size the guard frees: the kernels, matching eager
            x = torch.randn(2, 3, size, size)
            torch.testing.assert_close(new(x), ref(x), atol=1e-4, rtol=1e-4)
        for shape in ((2, 3, 12, 12), (2, 3, 12, 8)):
            x = torch.randn(shape)
            with pytest.raises(RuntimeError, match="cannot be multiplied"):
                ref(x)
            with pytest.raises(RuntimeError, match="cannot be multiplied"):
                new(x)
    # the kernel itself refuses operands that do not fit: K, a 3-d weight, the bias
    g = cand._egg_g1  # the plan's second group: the product with its ReLU
    w, b = new.fc.weight, new.fc.bias
    with pytest.raises(RuntimeError, match=r"\(2x13 and 12x5\)"):
        g(torch.randn(2, 13), w, b)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        g(torch.randn(2, 12), w.unsqueeze(0), b)
    with pytest.raises(RuntimeError, match="bias has 4 elements"):
        g(torch.randn(2, 12), w, b[:4])


def test_log_softmax_of_a_3d_input(write_problem):
    """Raised "kernel built for innermost reduction, got strided" for a 3-d input: the reduced
    dim was the traced rank's, not the last."""
    comp = compiled(write_problem, LOG_SOFTMAX, "lsm")
    prob, cand = load_sources(LOG_SOFTMAX, comp.emitted.source)
    x = torch.randn(2, 3, 40) * 10
    with torch.no_grad():
        torch.testing.assert_close(cand.ModelNew()(x), prob.Model()(x))
    report = check_dropin(LOG_SOFTMAX, comp.emitted.source, modes=("eval",), variants=("own", "rank"))
    assert report.fast("rank", "eval")


# ---------------------------------------------------------------- the generated file
def test_the_file_is_lean_and_says_what_it_is(write_problem):
    src, _kinds, _fast = FAMILIES["pointwise"]
    out = compiled(write_problem, src, "lean").emitted.source
    gen = out.split("# ======== EGG generated below this line ========")[1]
    assert "# ModelNew: a drop-in for Model" in gen
    assert gen.index("@triton.jit") < gen.index("def _egg_bstrides")  # kernels first
    for used in ("def _egg_index4", "def _egg_pointwise_layout", "def _egg_route"):
        assert used in gen
    for unused in ("_egg_welford_combine", "_egg_transpose_kernel", "_egg_bn_update", "_egg_k_major",
                   "import math", "fx_pytree"):
        assert unused not in gen, unused
    assert "class ModelNew(Model):" in gen and "def _egg_reference(self, x, y):" in gen


def test_guards_fix_what_the_kernels_bake_in(write_problem):
    """A dim whose size a kernel holds as a constant (rotate-half's width) is fixed; the batch
    dim stays free; a size-1 dim is fixed; another dtype, a submodule in another mode or a
    parameter of another dtype takes Model's ops."""
    src = problem("", "    def forward(self, x, c):\n"
                  "        h = x.shape[-1] // 2\n"
                  "        return x * c + torch.cat((-x[..., h:], x[..., :h]), dim=-1)\n",
                  "[torch.randn(3, 1, 16), torch.randn(16)]")
    comp = compiled(write_problem, src, "rope")
    g = comp.plan.dropin.train
    assert g.args[0]["dims"][0] == "s0" and g.args[0]["dims"][1:] == [1, 16], g.args
    prob, cand = load_sources(src, comp.emitted.source)
    m = cand.ModelNew()
    x, c = torch.randn(5, 1, 16), torch.randn(16)
    assert cand._egg_admit(m, cand._EGG_GUARDS[True], (x, c))
    assert not cand._egg_admit(m, cand._EGG_GUARDS[True], (torch.randn(5, 1, 18), torch.randn(18)))
    assert not cand._egg_admit(m, cand._EGG_GUARDS[True], (torch.randn(5, 2, 16), c))
    assert not cand._egg_admit(m, cand._EGG_GUARDS[True], (x.double(), c.double()))
    with torch.no_grad():
        y = m(torch.randn(5, 1, 18), torch.randn(18))  # the reference path: right, not a crash
    assert y.shape == (5, 1, 18)


def test_dispatch_follows_modes_and_moves(write_problem):
    comp = compiled(write_problem, CONV_BN_RELU, "cbr2", ONE_SPLIT)
    prob, cand = load_sources(CONV_BN_RELU, comp.emitted.source)
    m = cand.ModelNew()
    x = torch.randn(3, 2, 5, 4)
    with torch.no_grad():
        m(x)
    m.bn.eval()  # a submodule alone in another mode: Model's ops (batch norm's own check)
    assert not cand._egg_admit(m, cand._EGG_GUARDS[True], (x,))
    m.train()
    m2 = copy.deepcopy(m).double()
    assert m2._egg_pstate[0] is False  # parameters of another dtype: re-checked by .to()
    m2.float()
    assert m2._egg_pstate[0] is True and m2._egg_mode_modules[0] is m2.bn


# ---------------------------------------------------------------- the checker can fail
SUM_ROWS = problem("", "    def forward(self, x):\n        return x.sum(-1) * 2.0\n", "[torch.randn(5, 8)]")
BAKED_SHAPE = SUM_ROWS + '''
class ModelNew(Model):
    def forward(self, x):
        return x.reshape(5, 8).sum(-1) * 2.0
'''
BN_MODEL = problem("        self.bn = nn.BatchNorm1d(4)\n",
                   "    def forward(self, x):\n        return self.bn(x)\n", "[torch.randn(6, 4)]")
EVAL_IGNORED = BN_MODEL + '''
class ModelNew(Model):
    def forward(self, x):  # right in train(), batch statistics in eval() too
        b = self.bn
        if self.training:
            b.num_batches_tracked.add_(1)
        return F.batch_norm(x, b.running_mean, b.running_var, b.weight, b.bias, True, b.momentum, b.eps)
'''
LN_MODEL = problem("        self.ln = nn.LayerNorm(8)\n",
                   "    def forward(self, x):\n        return self.ln(x)\n", "[torch.randn(5, 8)]")
WEIGHT_IGNORED = LN_MODEL + '''
class ModelNew(Model):
    def forward(self, x):
        return F.layer_norm(x, (8,), None, None, self.ln.eps)
'''
SNAPSHOT = LN_MODEL + '''
class ModelNew(Model):
    def __init__(self):
        super().__init__()
        self.w = self.ln.weight.detach().clone()
    def forward(self, x):
        return F.layer_norm(x, (8,), self.w, self.ln.bias, self.ln.eps)
'''
MUTATES = LN_MODEL + '''
class ModelNew(Model):
    def forward(self, x):  # right output, then a parameter changed for the next call
        y = self.ln(x)
        with torch.no_grad():
            self.ln.weight.mul_(1.0001)
        return y
'''
HONEST = LN_MODEL + '''
class ModelNew(Model):
    def forward(self, x):
        return F.layer_norm(x, self.ln.normalized_shape, self.ln.weight, self.ln.bias, self.ln.eps)
'''


@pytest.mark.parametrize("src, source, match", [
    (SUM_ROWS, BAKED_SHAPE, "inputs batch"),
    (BN_MODEL, EVAL_IGNORED, r"eval\(\), inputs own"),
    (LN_MODEL, WEIGHT_IGNORED, "inputs own"),
    (LN_MODEL, SNAPSHOT, "tensor attributes outside parameters"),
    (LN_MODEL, MUTATES, "state ln.weight differs"),
], ids=["baked_shape", "eval_ignored", "weight_ignored", "snapshot", "mutates"])
def test_the_checker_catches_modules_that_are_not_drop_ins(src, source, match):
    with pytest.raises(AssertionError, match=match):
        check_dropin(src, source, grad=False, move=False)


def test_the_checker_passes_an_honest_module():
    report = check_dropin(LN_MODEL, HONEST)
    assert {"own", "x3", "x0.01", "neg", "batch", "rank", "grad"} <= report.names()


def test_exact_guard_without_probes():
    g = D.derive_guard([torch.empty(4, 1, 6, device="meta"), 0.5], lambda xs: None, None)
    assert g.args == [{"dtype": torch.float32, "dims": [4, 1, 6]}, {"value": 0.5}] and g.lead == []


def test_sizes_valid_only_together_stay_free():
    """Grouped-query attention's shapes: each class may move alone (query heads 4 -> 6 against
    key/value heads 2, 2 -> 4 against 4, the length, the head dim), but not all at once (6 query
    heads over 4 key/value heads raises). The classes that hold together stay free (query heads
    at twice their size), where dropping them all fixed attention to its traced length; a probe
    that bakes a size in still fixes that size (mutant guard-accumulate-none)."""
    q, k = torch.empty(1, 4, 32, 16, device="meta"), torch.empty(1, 2, 32, 16, device="meta")

    def probe(xs, baked=None):
        h, hk, n, d = xs[0].shape[1], xs[1].shape[1], xs[0].shape[2], xs[0].shape[3]
        if h % hk or xs[1].shape[2] != n or xs[1].shape[3] != d:
            raise RuntimeError("heads must divide")
        return f"file {baked and n}"

    g = D.derive_guard([q, k, k], probe, probe([q, k, k]), shapes_ok=lambda xs: True)
    assert g.args[0]["dims"][0] == 1 and all(isinstance(w, str) for w in g.args[0]["dims"][1:])
    assert g.args[0]["dims"][1] != g.args[1]["dims"][1]  # query and key/value heads: two classes
    assert g.args[0]["dims"][2] == g.args[1]["dims"][2] == g.args[2]["dims"][2]  # one length
    b = D.derive_guard([q, k, k], lambda xs: probe(xs, True), probe([q, k, k], True),
                       shapes_ok=lambda xs: True)
    assert b.args[0]["dims"][2] == 32 and isinstance(b.args[0]["dims"][1], str)  # the length baked in


FROZEN_BN = problem("        self.bn = nn.BatchNorm1d(4)\n        self.bn.eval()  # frozen at construction\n",
                    "    def forward(self, x):\n        return torch.relu(self.bn(x)) * 2.0\n",
                    "[torch.randn(6, 4)]")


def test_a_submodule_frozen_at_construction(write_problem):
    """Traced as built (the frozen batch norm on running statistics), the same file as the
    model in eval(): the kernels serve the model as built and in eval(), and a call with every
    module in train() (never traced) takes Model's ops, which update the statistics."""
    comp = compiled(write_problem, FROZEN_BN, "frozen")
    assert comp.plan.dropin.same
    prob, cand = load_sources(FROZEN_BN, comp.emitted.source)
    ref, new = prob.Model(), cand.ModelNew()
    x = torch.randn(6, 4)
    assert cand._egg_admit(new, cand._EGG_GUARDS[True], (x,))  # as built
    new.eval()
    assert cand._egg_admit(new, cand._EGG_GUARDS[False], (x,))
    ref.train()
    new.train()  # the batch norm in train() too: not what was traced
    assert not cand._egg_admit(new, cand._EGG_GUARDS[True], (x,))
    with torch.no_grad():
        torch.testing.assert_close(new(x), ref(x))
    torch.testing.assert_close(new.bn.running_mean, ref.bn.running_mean)
    assert int(new.bn.num_batches_tracked) == 1


OPTIONAL_ARG = problem("        self.w = nn.Parameter(torch.randn(6))\n",
                       "    def forward(self, x, h0=None, scale=2.0):\n"
                       "        if h0 is None:\n"
                       "            h0 = torch.zeros_like(x)\n"
                       "        return torch.tanh(x * self.w + h0) * scale\n",
                       "[torch.randn(3, 6)]")


def test_a_forward_argument_left_at_its_default_takes_the_kernels(write_problem):
    """forward(self, x, h0=None, scale=2.0) called with x alone (get_inputs() gives x): the file
    was built for h0 None and scale 2.0, and takes its kernels for such calls (before, the guard
    listed x alone and no call matched it: Mamba-2's and NetVLAD's files never ran a kernel);
    another h0 or scale takes Model's own code (a copy of its forward: the traced reference holds
    the defaults), by position or by keyword."""
    comp = compiled(write_problem, OPTIONAL_ARG, "optional_arg")
    assert comp.plan.dropin.train.args[1:] == [{"value": None}, {"value": 2.0}]
    report = check_dropin(OPTIONAL_ARG, comp.emitted.source, calls=1, variants=("own", "batch", "padded"))
    assert report.fast("own") and report.fast("batch") and report.fast("padded", "eval")
    prob, cand = load_sources(OPTIONAL_ARG, comp.emitted.source)
    torch.manual_seed(0)
    ref, new = prob.Model(), cand.ModelNew()
    new.load_state_dict(ref.state_dict())
    x, h = torch.randn(3, 6), torch.randn(3, 6)
    assert cand._egg_admit(new, cand._EGG_GUARDS[True], (x, None, 2.0))
    with torch.no_grad():
        torch.testing.assert_close(new(x), ref(x))
        # another value: the traced reference was specialized to the default (fx: "h0 has been
        # specialized to have value None"), so the call takes the copy of Model.forward
        assert not cand._egg_admit(new, cand._EGG_GUARDS[True], (x, None, 3.0))
        for args, kw in (((x, None, 3.0), {}), ((x, h), {}), ((x,), {"h0": h, "scale": 0.5}),
                         ((x,), {"scale": 2.0})):
            torch.testing.assert_close(new(*args, **kw), ref(*args, **kw))


QKV_NAMES = problem("",
                    "    def forward(self, query, key, value, fast=1.0):\n"
                    "        return F.softmax(query @ key.transpose(-1, -2) * fast, dim=-1) @ value\n",
                    "[torch.randn(2, 8, 16), torch.randn(2, 8, 16), torch.randn(2, 8, 16)]")


def test_forward_parameters_named_like_the_dispatch_locals(write_problem):
    """forward(self, query, key, value, fast=1.0): the dispatch's own locals (the route's key,
    whether to take the kernels) once shadowed parameters so named, and the kernels got a tuple
    for ``key``; the signature is Model's, so keyword calls work."""
    comp = compiled(write_problem, QKV_NAMES, "qkv_names")
    report = check_dropin(QKV_NAMES, comp.emitted.source, calls=1, variants=("own", "batch"))
    assert report.fast("own") and report.fast("batch", "eval")
    prob, cand = load_sources(QKV_NAMES, comp.emitted.source)
    ref, new = prob.Model(), cand.ModelNew()
    q, k, v = (torch.randn(2, 8, 16) for _ in range(3))
    with torch.no_grad():
        torch.testing.assert_close(new(q, key=k, value=v), ref(q, key=k, value=v))
        torch.testing.assert_close(new(q, k, v, fast=0.5), ref(q, k, v, fast=0.5))


BAKED_ARGS = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, vocab, temperature=0.7, *, min_p=0.1):
        super().__init__()
        self._shape = (-1, vocab)  # private: not an attribute the file compares
        self.temperature = temperature
        self.min_p = min_p

    def forward(self, logits):
        x = logits.reshape(self._shape) / self.temperature
        probs = torch.softmax(x, dim=-1)
        keep = probs >= self.min_p * probs.amax(dim=-1, keepdim=True)
        return x.masked_fill(~keep, -1e4)


def get_inputs():
    return [torch.randn(4, 64)]


def get_init_inputs():
    return [64]
'''


def test_constructor_arguments_and_attributes_the_trace_baked_in(write_problem):
    """The trace bakes Model's constructor arguments in (a reshape to (-1, 64), a temperature
    of 0.7, a min-p of 0.1): a ModelNew built with others, or whose attribute changed after,
    takes Model's own code (before: the kernels' answer for the built values, or an error from
    a reshape to the old size); built with the same values, by keyword or with the defaults
    spelled out, it takes the kernels."""
    assert "_shape" not in D.literal_attrs(load_sources(BAKED_ARGS, "")[0].Model(64))
    comp = compiled(write_problem, BAKED_ARGS, "baked_args")
    assert comp.plan.dropin.init == {"vocab": 64, "temperature": 0.7, "min_p": 0.1}
    prob, cand = load_sources(BAKED_ARGS, comp.emitted.source)
    x = torch.randn(4, 64)
    calls = []
    for args, kw in (((64,), {}), ((), {"vocab": 64, "temperature": 0.7, "min_p": 0.1})):
        new = cand.ModelNew(*args, **kw)
        new._egg_fast = lambda *a, _f=new._egg_fast: calls.append(1) or _f(*a)
        torch.testing.assert_close(new(x), prob.Model(*args, **kw)(x))
    assert len(calls) == 2  # both took the kernels
    for args, kw in (((32,), {}), ((64, 1.3), {}), ((64,), {"min_p": 0.05})):
        new, ref = cand.ModelNew(*args, **kw), prob.Model(*args, **kw)
        new._egg_fast = lambda *a: pytest.fail("kernels built for other constructor arguments")
        xs = torch.randn(4, args[0])
        torch.testing.assert_close(new(xs), ref(xs))
    new, ref = cand.ModelNew(64), prob.Model(64)
    new.temperature = ref.temperature = 2.0  # a sampling setting changed per request
    torch.testing.assert_close(new(x), ref(x))
    assert cand._EGG_INIT == {"vocab": 64, "temperature": 0.7, "min_p": 0.1}


def test_literal_attributes_the_file_compares():
    m = nn.Module()
    m.top_p, m.sizes, m.name, m._private, m.table = 0.9, (1, 2), "x", 3, list(range(500))
    setattr(m, "lambda", 1.0)  # a keyword: no `self.lambda` in generated source
    m.w = torch.ones(2)
    assert D.literal_attrs(m) == {"top_p": 0.9, "sizes": (1, 2), "name": "x"}


def test_init_records_only_literal_arguments():
    class M(nn.Module):
        def __init__(self, n, w=None, *rest, **kw):
            super().__init__()

    assert D.built_with(M, [3]) == {"n": 3, "w": None, "rest": (), "kw": {}}
    assert D.built_with(M, [3, torch.ones(2)]) is None  # a tensor: not compared
    assert D.built_with(M, [float("nan")]) is None
    assert D.built_with(M, []) is None  # does not bind
