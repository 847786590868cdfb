"""Cross-entropy written the other ways users write it (codegen.rewrites.losses.
cross_entropy_spellings): nll_loss of log_softmax, per-token log-probabilities by a gather of
log_softmax, TRL's selective_log_softmax (gather minus logsumexp) and the loss as logsumexp
minus the gathered logit get the plan of the
F.cross_entropy program they equal, the fused LM-head loss after an nn.Linear head included, and
each compiled file is a drop-in (tests/dropin.check_dropin). Where the pattern is not exactly
that (the log-softmax read elsewhere, another dim, another index or logsumexp operand, an
in-place write in between) the graph is left as it was."""
import pytest
import torch

from codegen import rewrites as RW
from codegen.pipeline import analyze, compile_problem
from codegen.rewrites import losses as RL
from harness.problem import load_module, load_problem
from tests.dropin import check_dropin

HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
Z2 = "[torch.randn(6, 11), torch.randint(0, 11, (6,))]"
Z3 = "[torch.randn(2, 3, 11), torch.randint(0, 11, (2, 3))]"
Z3_BF16 = "[torch.randn(2, 3, 11, dtype=torch.bfloat16), torch.randint(0, 11, (2, 3))]"
#: the per-token log-probabilities as cross_entropy, in t's shape (what the form writes)
PER_TOKEN = ("-F.cross_entropy(z.reshape(-1, z.shape[-1]), t.reshape(-1), "
             "reduction='none').reshape(t.shape)")
LOSS_PER_TOKEN = PER_TOKEN[1:]


def source(body: str, inputs: str, members: str = "", args: str = "z, t") -> str:
    init = ("    def __init__(self):\n        super().__init__()\n" + members) if members else ""
    return (HEAD + "class Model(nn.Module):\n" + init + f"    def forward(self, {args}):\n" + body
            + f"def get_inputs():\n    return {inputs}\ndef get_init_inputs():\n    return []\n")


def ret(expr: str) -> str:
    return f"        return {expr}\n"


#: name -> (the spelling's forward, the F.cross_entropy program it equals, inputs, members)
WRITTEN_OUT = {
    "nll_functional": (ret("F.nll_loss(F.log_softmax(z, dim=-1), t)"), ret("F.cross_entropy(z, t)"), Z2, ""),
    # log_softmax as a method over dim 1, ignore_index and reduction passed on (targets hit it)
    "nll_method_ignore_none": (
        ret("F.nll_loss(z.log_softmax(1), t, ignore_index=2, reduction='none')"),
        ret("F.cross_entropy(z, t, ignore_index=2, reduction='none')"),
        "[torch.randn(6, 11), torch.randint(0, 11, (6,)).index_fill(0, torch.tensor([0, 3]), 2)]", ""),
    "nll_module_sum": (ret("self.loss(torch.log_softmax(z, 1), t)"),
                       ret("F.cross_entropy(z, t, reduction='sum')"), Z2,
                       "        self.loss = nn.NLLLoss(reduction='sum')\n"),
    # modules both, the loss's class weights a buffer of its own
    "nll_modules_weighted": (ret("self.loss(self.logsm(z), t)"),
                             ret("F.cross_entropy(z, t, weight=self.loss.weight)"), Z2,
                             "        self.loss = nn.NLLLoss(weight=torch.rand(11) + 0.5)\n"
                             "        self.logsm = nn.LogSoftmax(dim=1)\n"),
    "nll_class_weights": (ret("F.nll_loss(F.log_softmax(z, 1), t, self.w)"),
                          ret("F.cross_entropy(z, t, self.w)"), Z2,
                          "        self.register_buffer('w', torch.rand(11) + 0.5)\n"),
    # a 16-bit z read by log_softmax in fp32 (dtype=): the cast comes first
    "nll_dtype_fp32": (ret("F.nll_loss(F.log_softmax(z, -1, dtype=torch.float32), t)"),
                       ret("F.cross_entropy(z.float(), t)"),
                       "[torch.randn(6, 11, dtype=torch.bfloat16), torch.randint(0, 11, (6,))]", ""),
    "gather_2d": (ret("torch.log_softmax(z, -1).gather(-1, t.unsqueeze(-1)).squeeze(-1)"),
                  ret("-F.cross_entropy(z, t, reduction='none')"), Z2, ""),
    "gather_3d": (ret("torch.log_softmax(z, -1).gather(-1, t.unsqueeze(-1)).squeeze(-1)"),
                  ret(PER_TOKEN), Z3, ""),
    "gather_last_dim_by_number": (ret("z.log_softmax(dim=-1).gather(2, t.unsqueeze(2)).squeeze(2)"),
                                  ret(PER_TOKEN), Z3, ""),
    # torch.gather with keywords, the index as t[..., None], no squeeze; of z.float()
    "torch_gather_unsqueezed": (
        "        z = z.float()\n" + ret("torch.gather(F.log_softmax(z, dim=-1), dim=-1, index=t[..., None])"),
        "        z = z.float()\n" + ret(f"({PER_TOKEN}).unsqueeze(-1)"), Z3_BF16, ""),
    "gather_mean": (ret("-torch.log_softmax(z, -1).gather(-1, t.unsqueeze(-1)).squeeze(-1).mean()"),
                    ret("F.cross_entropy(z, t, reduction='none').mean()"), Z2, ""),
    "selective_log_softmax": (
        ret("torch.gather(z, -1, t.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, dim=-1)"),
        ret(PER_TOKEN), Z3, ""),
    "selective_keepdim": (ret("z.gather(-1, t[:, None]) - z.logsumexp(-1, keepdim=True)"),
                          ret("(-F.cross_entropy(z, t, reduction='none')).unsqueeze(-1)"), Z2, ""),
    # the loss itself: logsumexp minus the target's logit, not negated
    "logsumexp_minus_picked": (
        ret("torch.logsumexp(z, dim=-1) - torch.gather(z, -1, t.unsqueeze(-1)).squeeze(-1)"),
        ret(LOSS_PER_TOKEN), Z3, ""),
}

WEIGHTED = {"nll_class_weights", "nll_modules_weighted"}


def plan_of(path, canonical=None, monkeypatch=None):
    if canonical is not None:
        monkeypatch.setattr(RW, "CANONICAL", canonical)
    plan, _rw, err = analyze(load_problem(path))
    assert plan is not None, err
    return plan


def signature(plan) -> tuple:
    """The group kinds in order and the ops left to torch (what decides the kernels)."""
    return ([g.kind for g in plan.groups],
            sorted(op.name for op in plan.nops.values() if op.kind == "library"))


def without_form():
    return [f for f in RW.CANONICAL if f is not RW.cross_entropy_spellings]


@pytest.mark.parametrize("name", sorted(WRITTEN_OUT))
def test_a_spelling_gets_the_plan_of_its_cross_entropy(name, write_problem, monkeypatch):
    """The same kernels as the F.cross_entropy program it equals, and compiled, a drop-in for
    the original (values, train and eval, scaled inputs, other sizes and layouts, float64).
    Without the canonical form the plan is another."""
    body, ce_body, inputs, members = WRITTEN_OUT[name]
    src = source(body, inputs, members)
    path = write_problem(src, f"spelling_{name}")
    base = signature(plan_of(write_problem(source(ce_body, inputs, members), f"ce_{name}")))
    assert signature(plan_of(path)) == base
    comp = compile_problem(load_problem(path))
    # class weights: cross_entropy's library call, as in F.cross_entropy's own plan
    assert ("rw-loss-decompose" in comp.rewrites) == (name not in WEIGHTED)
    report = check_dropin(src, comp.emitted.source, calls=1)
    assert report.fast("own") == report.fast("own", "eval") == (name not in WEIGHTED)
    assert signature(plan_of(path, without_form(), monkeypatch)) != base


LM_MEMBERS = "        self.lm_head = nn.Linear(16, 11, bias={bias}, dtype=torch.{dtype})\n"
H2 = "[torch.randn(7, 16{dt}), torch.randint(0, 11, (7,))]"
H3 = "[torch.randn(2, 3, 16{dt}), torch.randint(0, 11, (2, 3))]"
#: name -> (forward after z = the head's fp32 logits, the cross_entropy program, inputs)
LM_SPELLINGS = {
    "nll": (ret("F.nll_loss(F.log_softmax(z, dim=-1), t)"), ret("F.cross_entropy(z, t)"), H2),
    "nll_flat_ignore_sum": (
        ret("F.nll_loss(F.log_softmax(z.view(-1, z.shape[-1]), 1), t.view(-1), ignore_index=4, "
            "reduction='sum')"),
        ret("F.cross_entropy(z.view(-1, z.shape[-1]), t.view(-1), ignore_index=4, reduction='sum')"), H3),
    "gather": (ret("torch.log_softmax(z, -1).gather(-1, t.unsqueeze(-1)).squeeze(-1)"), ret(PER_TOKEN), H3),
    "gather_mean": (ret("-torch.log_softmax(z, -1).gather(-1, t.unsqueeze(-1)).squeeze(-1).mean()"),
                    ret(f"({PER_TOKEN}).mean()"), H3),
    "selective_log_softmax": (
        ret("torch.gather(z, -1, t.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, dim=-1)"),
        ret(PER_TOKEN), H3),
    "logsumexp_minus_picked_mean": (
        ret("(torch.logsumexp(z, dim=-1) - z.gather(-1, t[..., None]).squeeze(-1)).mean()"),
        ret(f"({LOSS_PER_TOKEN}).mean()"), H3),
}


def lm_source(body: str, inputs: str, dtype: str, bias: bool) -> str:
    head = "        z = self.lm_head(h).float()\n" if dtype == "bfloat16" else "        z = self.lm_head(h)\n"
    dt = ", dtype=torch.bfloat16" if dtype == "bfloat16" else ""
    return source(head + body, inputs.format(dt=dt), LM_MEMBERS.format(bias=bias, dtype=dtype), "h, t")


@pytest.mark.parametrize("dtype,bias", [("bfloat16", False), ("float32", True)])
@pytest.mark.parametrize("name", sorted(LM_SPELLINGS))
def test_after_an_lm_head_a_spelling_is_the_fused_linear_cross_entropy(name, dtype, bias, write_problem,
                                                                       monkeypatch):
    """nn.Linear head then the spelling: the one LM-head-and-loss op (its logits never written),
    as F.cross_entropy(lm_head(h).float(), t) gets. bf16 weights: check_dropin's float64 move
    is left out (it compares a candidate moved back to fp32 weights, which F.linear refuses with
    bf16 inputs, with a reference whose bf16 weights were loaded: F.cross_entropy's own file
    fails it the same way)."""
    body, ce_body, inputs = LM_SPELLINGS[name]
    src = lm_source(body, inputs, dtype, bias)
    path = write_problem(src, f"lm_{name}_{dtype}")
    base = signature(plan_of(write_problem(lm_source(ce_body, inputs, dtype, bias), f"lm_ce_{name}_{dtype}")))
    assert "linear_ce" in base[0]
    assert signature(plan_of(path)) == base
    comp = compile_problem(load_problem(path))
    assert "rw-linear-cross-entropy" in comp.rewrites
    report = check_dropin(src, comp.emitted.source, calls=1, move=dtype == "float32",
                          atol=1e-2 if dtype == "bfloat16" else 1e-4,
                          rtol=1e-2 if dtype == "bfloat16" else 1e-4)
    assert report.fast("own")
    assert "linear_ce" not in signature(plan_of(path, without_form(), monkeypatch))[0]


#: name -> (forward, inputs): like a spelling, but not the same math (or not only it)
NOT_TAKEN = {
    "log_softmax_also_returned": (
        "        lp = torch.log_softmax(z, -1)\n" + ret("lp.gather(-1, t.unsqueeze(-1)).squeeze(-1), lp.exp()"), Z2),
    "nll_log_softmax_also_returned": ("        lp = F.log_softmax(z, 1)\n" + ret("F.nll_loss(lp, t), lp"), Z2),
    "nll_of_log_softmax_over_dim_0": (ret("F.nll_loss(F.log_softmax(z, 0), t)"),
                                      "[torch.randn(6, 6), torch.randint(0, 6, (6,))]"),
    "gather_along_dim_0": (ret("torch.log_softmax(z, -1).gather(0, t.unsqueeze(-1)).squeeze(-1)"),
                           "[torch.randn(6, 6), torch.randint(0, 6, (6,))]"),
    "log_softmax_over_dim_0": (ret("torch.log_softmax(z, 0).gather(-1, t.unsqueeze(-1)).squeeze(-1)"),
                               "[torch.randn(6, 6), torch.randint(0, 6, (6,))]"),
    "index_unsqueezed_at_0": (ret("torch.log_softmax(z, -1).gather(-1, t.unsqueeze(0))"), Z2),
    "index_expanded": (ret("torch.log_softmax(z, -1).gather(-1, t.unsqueeze(-1).expand(6, 3))"), Z2),
    "index_also_read": ("        i = t.unsqueeze(-1)\n"
                        + ret("torch.log_softmax(z, -1).gather(-1, i).squeeze(-1), i * 2"), Z2),
    "logsumexp_of_another_tensor": (
        ret("torch.gather(z, -1, t.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z * 2.0, dim=-1)"), Z2),
    "logsumexp_over_dim_0": (
        ret("torch.gather(z, -1, t.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, dim=0)"),
        "[torch.randn(6, 6), torch.randint(0, 6, (6,))]"),
    "logsumexp_kept_dim_against_squeezed": (  # [6] - [6, 1]: a [6, 6] difference
        ret("torch.gather(z, -1, t.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, -1, keepdim=True)"), Z2),
    # fewer targets than rows: the gather reads the first 4 rows (an index may be smaller)
    "targets_of_another_shape": (ret("torch.log_softmax(z, -1).gather(-1, t.unsqueeze(-1)).squeeze(-1)"),
                                 "[torch.randn(6, 11), torch.randint(0, 11, (4,))]"),
    # an in-place write between the log-softmax and the gather: the rewrite would read z later
    "written_in_place_between": ("        y = z * 1.0\n        lp = torch.log_softmax(y, -1)\n"
                                 "        y.mul_(2.0)\n"
                                 + ret("lp.gather(-1, t.unsqueeze(-1)).squeeze(-1), y"), Z2),
}


@pytest.mark.parametrize("name", sorted(NOT_TAKEN))
def test_what_is_not_the_pattern_keeps_its_plan(name, write_problem, monkeypatch):
    body, inputs = NOT_TAKEN[name]
    path = write_problem(source(body, inputs), f"not_{name}")
    plan = plan_of(path)
    assert not any(n.target is torch.nn.functional.cross_entropy for n in plan.gm.graph.nodes)
    assert signature(plan) == signature(plan_of(path, without_form(), monkeypatch))


def test_an_in_place_write_between_would_change_the_values(write_problem, monkeypatch):
    """The in-place guard is what keeps the case above right: without it the form applies and
    the file reads z after y.mul_(2.0), which the drop-in check rejects."""
    body, inputs = NOT_TAKEN["written_in_place_between"]
    src = source(body, inputs)
    path = write_problem(src, "in_place")
    check_dropin(src, compile_problem(load_problem(path)).emitted.source, calls=1,
                 variants=("own",), shapes=False, move=False)
    monkeypatch.setattr(RL, "_no_writes_between", lambda first, last, gm: True)
    comp = compile_problem(load_problem(path))
    assert "rw-loss-decompose" in comp.rewrites
    with pytest.raises(AssertionError, match="differs"):
        check_dropin(src, comp.emitted.source, calls=1, variants=("own",), shapes=False, move=False)


# ---------------------------------------------------------------- targets outside [0, V)
GATHER = ret("torch.log_softmax(z, -1).gather(-1, t.unsqueeze(-1)).squeeze(-1)")


def _compiled(write_problem, src: str, name: str):
    path = write_problem(src, name)
    comp = compile_problem(load_problem(path))
    cand = path.with_name(f"{name}_new.py")
    cand.write_text(comp.emitted.source)
    return load_module(path, f"{name}_ref").Model(), load_module(cand, f"{name}_cand").ModelNew(), comp


def _targets(n: int, bad: int) -> torch.Tensor:
    t = torch.randint(0, 11, (n,), generator=torch.Generator().manual_seed(n))
    t[2] = bad
    return t


#: targets outside [0, 11): the vocabulary's end, -1, cross_entropy's default ignore_index, the
#: least int64
OUTSIDE = (11, -1, -100, -2 ** 63)


@pytest.mark.parametrize("ignore", [RL.NO_IGNORE, -100])
def test_a_gathered_target_outside_the_vocabulary_is_never_a_number(ignore, write_problem, monkeypatch):
    """The gather raises for every target outside [0, V); the rewritten program (the
    decomposition's gather, read by a kernel: rw-take) cannot raise inside a kernel, so such a
    target's loss is NaN, -100 included, but for the form's ignore_index NO_IGNORE, which gives
    0: the one target it lets through. Had the form passed cross_entropy's default (the second
    case), -100 would give 0 where eager raises."""
    monkeypatch.setattr(RL, "NO_IGNORE", ignore)
    ref, new, comp = _compiled(write_problem, source(GATHER, Z2), f"oob_{-ignore}")
    assert "rw-loss-decompose" in comp.rewrites
    z = torch.randn(6, 11)
    keep = torch.arange(6) != 2
    with torch.no_grad():
        good = _targets(6, 4)
        assert torch.allclose(new(z, good), ref(z, good), atol=1e-5)
        for bad in OUTSIDE:
            with pytest.raises((RuntimeError, IndexError)):
                ref(z, _targets(6, bad))
            out = new(z, _targets(6, bad))
            assert torch.allclose(out[keep], ref(z, good)[keep], atol=1e-5)
            assert out[2] == 0 if bad == ignore else torch.isnan(out[2]), bad


@pytest.mark.parametrize("ignore", [RL.NO_IGNORE, -100])
def test_after_an_lm_head_such_a_target_is_nan_never_a_number(ignore, write_problem, monkeypatch):
    """The fused LM-head op gives NaN for a kept target outside the vocabulary (eager raises;
    principle rw-linear-cross-entropy), -100 included for the gather spelling; the form's
    NO_IGNORE gives 0. Had the form passed cross_entropy's default (the second case), -100
    would be a number."""
    monkeypatch.setattr(RL, "NO_IGNORE", ignore)
    ref, new, comp = _compiled(write_problem, lm_source(GATHER, H2, "float32", False), f"lm_oob_{-ignore}")
    assert "rw-linear-cross-entropy" in comp.rewrites
    new.load_state_dict(ref.state_dict())
    h = torch.randn(7, 16)
    keep = torch.arange(7) != 2
    with torch.no_grad():
        good = _targets(7, 4)
        assert torch.allclose(new(h, good), ref(h, good), atol=1e-5)
        for bad in OUTSIDE:
            with pytest.raises((RuntimeError, IndexError)):
                ref(h, _targets(7, bad))
            out = new(h, _targets(7, bad))
            assert torch.allclose(out[keep], ref(h, good)[keep], atol=1e-5)
            assert (out[2] == 0) if bad == ignore else torch.isnan(out[2]), bad
