"""Attention whose scores are modified before the softmax: Gemma's soft capping
(``cap * tanh(scores / cap)``), an additive bias inside a causal mask (ALiBi's per-head slopes,
Hugging Face's padding mask with soft capping), a padding mask filling the scores it marks
(masked_fill(mask == 0, -inf), where(mask, s, -1e9)) and a scale of c / sqrt(head dim). Each is one
attention kernel (flash for prefill, split-KV for decode) that applies the modification per
tile and never writes the scores; each file is a drop-in (tests/dropin.check_dropin) and passes
the verifier's static check. A kernel that skips the cap or the causal mask fails; spellings
whose masks are not masks (inside the tanh) or whose order the kernel does not keep (a bias
added outside the causal mask) keep the reference."""
import re

import pytest

from codegen.pipeline import analyze, compile_problem
from harness.problem import load_problem
from harness.verify import static_findings_src
from tests.dropin import check_dropin
from tests.test_attention_mask import (FLASH, HEAD, PAD_CAUSAL, PAD_DECODE, REPEAT_KV, SPLIT, _inputs,
                                      runs_and_is_a_drop_in)

#: Hugging Face's Gemma-2 eager attention: scaling by query_pre_attn_scalar, soft capping,
#: the additive mask (an input), the softmax in fp32
GEMMA2 = REPEAT_KV + '''
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.scaling = 24 ** -0.5
        self.softcap = 20.0
        self.num_key_value_groups = {groups}

    def forward(self, query, key, value, attention_mask):
        key_states = repeat_kv(key, self.num_key_value_groups)
        value_states = repeat_kv(value, self.num_key_value_groups)
        attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * self.scaling
        attn_weights = attn_weights / self.softcap
        attn_weights = torch.tanh(attn_weights)
        attn_weights = attn_weights * self.softcap
        causal_mask = attention_mask[:, :, :, : key_states.shape[-2]]
        attn_weights = attn_weights + causal_mask
        attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
        return torch.matmul(attn_weights, value_states).transpose(1, 2).contiguous()
'''

#: soft capping with a causal mask built in forward and sdpa's default scale written out
CAPPED_CAUSAL = '''
class Model(nn.Module):
    def forward(self, q, k, v):
        T = q.shape[-2]
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        s = (s / 3.0).tanh() * 3.0
        s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool, device=q.device), 1), float("-inf"))
        return torch.matmul(torch.softmax(s.float(), dim=-1).to(q.dtype), v)
def get_inputs():
    return [torch.randn(2, 3, 24, 16, dtype=torch.{dtype}) for _ in range(3)]
def get_init_inputs():
    return []
'''

#: ALiBi (BLOOM / MPT style): per-head slopes times the key's distance, added to the scaled
#: scores, then the causal mask
ALIBI = '''
class Model(nn.Module):
    def __init__(self, heads=4):
        super().__init__()
        self.register_buffer("slopes", torch.tensor([2 ** (-8 * (h + 1) / heads) for h in range(heads)]))

    def forward(self, q, k, v):
        T = q.shape[-2]
        pos = torch.arange(T, device=q.device)
        bias = self.slopes[:, None, None] * (pos[None, :] - pos[:, None]).float()[None]
        s = q @ k.transpose(-1, -2) * 0.25 + bias
        keep = torch.ones(T, T, device=q.device, dtype=torch.bool).tril()
        s = s.masked_fill(~keep, float("-inf"))
        return torch.softmax(s, dim=-1) @ v
def get_inputs():
    return [torch.randn(2, 4, 24, 16) for _ in range(3)]
def get_init_inputs():
    return []
'''

#: a scale of 2 / sqrt(head dim): a number times sdpa's default
HALF_HEAD = '''
class Model(nn.Module):
    def forward(self, q, k, v):
        s = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1)) * 2.0
        return s.softmax(-1) @ v
def get_inputs():
    return [torch.randn(2, 2, 24, 16) for _ in range(3)]
def get_init_inputs():
    return []
'''

#: a padding mask (an input of 1 and 0) turned into a fill: masked_fill(mask == 0, -inf)
# (the mask's comparison, mask == 0 of an int64 mask, is a pointwise kernel g0 before the
# attention's g1)
PAD_FILL = '''
class Model(nn.Module):
    def forward(self, q, k, v, mask):
        s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        s = s.masked_fill(mask == 0, float("-inf"))
        return torch.softmax(s, dim=-1) @ v
def get_inputs():
    m = torch.ones({mshape}, dtype=torch.long)
    m[0, ..., {cut}] = 0
    return [torch.randn({q}), torch.randn({kv}), torch.randn({kv}), m]
def get_init_inputs():
    return []
'''

#: a finite fill kept where the mask is (where(m, s, -1e9)) inside a causal mask: the queries
#: whose every visible key is padded attend uniformly, as in eager
WHERE_FINITE_CAUSAL = '''
class Model(nn.Module):
    def forward(self, q, k, v, mask):
        T = q.shape[-2]
        s = torch.matmul(q, k.transpose(-2, -1)) * 0.25
        s = torch.where(mask.bool(), s, torch.tensor(-1e9, dtype=s.dtype, device=s.device))
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool, device=q.device))
        s = s.masked_fill(~causal, float("-inf"))
        return torch.softmax(s.float(), dim=-1).to(q.dtype) @ v
def get_inputs():
    m = torch.ones(2, 1, 1, 24)
    m[0, ..., :5] = 0
    return [torch.randn(2, 4, 24, 16, dtype=torch.bfloat16) for _ in range(3)] + [m]
def get_init_inputs():
    return []
'''

CASES = {
    # name: (source, configs, kernel that must run, tolerance, (causal, mask, softcap))
    "gemma2_prefill_bf16_gqa": (
        GEMMA2.format(groups=2) + _inputs("2, 4, 24, 24", "2, 2, 24, 24", PAD_CAUSAL, "bfloat16"),
        FLASH, "_egg_k_g0", 2e-2, (False, "add", 20.0)),
    "gemma2_decode_fp32": (
        GEMMA2.format(groups=1) + _inputs("2, 2, 1, 24", "2, 2, 40, 24", PAD_DECODE, "float32"),
        SPLIT, "_egg_k_g0_merge", 1e-4, (False, "add", 20.0)),
    "capped_causal_bf16": (CAPPED_CAUSAL.format(dtype="bfloat16"), FLASH, "_egg_k_g0", 2e-2, (True, "", 3.0)),
    "capped_causal_fp32": (CAPPED_CAUSAL.format(dtype="float32"), FLASH, "_egg_k_g0", 1e-4, (True, "", 3.0)),
    "alibi_fp32": (ALIBI, FLASH, "_egg_k_g0", 1e-4, (True, "add", None)),
    "two_over_sqrt_d_fp32": (HALF_HEAD, FLASH, "_egg_k_g0", 1e-4, (False, "", None)),
    "padding_fill_prefill_fp32": (PAD_FILL.format(mshape="2, 1, 1, 40", cut="30:", q="2, 4, 24, 16",
                                                  kv="2, 4, 40, 16"), FLASH, "_egg_k_g1", 1e-4, (False, "drop", None)),
    "padding_fill_decode_fp32": (PAD_FILL.format(mshape="2, 1, 1, 40", cut=":7", q="2, 2, 1, 16",
                                                 kv="2, 2, 40, 16"), SPLIT, "_egg_k_g1_merge", 1e-4, (False, "drop", None)),
    "where_finite_causal_bf16": (WHERE_FINITE_CAUSAL, FLASH, "_egg_k_g0", 2e-2, (True, "drop", None)),
}


def _compiled(name, write_problem):
    src, configs, kernel, tol, want = CASES[name]
    src = HEAD + src
    path = write_problem(src, name)
    plan, applied, err = analyze(load_problem(path))
    assert plan is not None, err
    comp = compile_problem(load_problem(path), configs=configs)
    assert comp.emitted is not None, comp.error
    return src, plan, applied, comp.emitted.source, kernel, tol, want


@pytest.mark.parametrize("name", sorted(CASES))
def test_modified_scores_are_one_kernel_and_a_drop_in(name, write_problem):
    src, plan, applied, emitted, kernel, tol, (causal, mask, cap) = _compiled(name, write_problem)
    assert [g.kind for g in plan.groups if g.kind == "attention"] == ["attention"], [g.kind for g in plan.groups]
    assert "rw-attention" in applied
    op = plan.nops[next(g for g in plan.groups if g.kind == "attention").red]
    assert (op.p["causal"], op.p["mask"], op.p.get("softcap")) == (causal, mask, cap)
    assert runs_and_is_a_drop_in(src, emitted, kernel, tol).fast("x100")


#: the kernel's modification edited out: each candidate must fail the drop-in check
BROKEN = [
    ("the soft cap skipped", "capped_causal_fp32", "s = 3.0 * _egg_tanh(s)", "s = s"),
    ("the cap's tanh clipped instead", "gemma2_decode_fp32", "s = 20.0 * _egg_tanh(s)",
     "s = tl.minimum(tl.maximum(s, -1.0), 1.0) * 20.0"),
    ("the causal mask dropped with a bias", "alibi_fp32", "keep = keep & (rn[None, :] <= rm[:, None])",
     "keep = keep"),
    ("the padding fill ignored", "padding_fill_decode_fp32", 's = tl.where(am_t != 0, float("-inf"), s)', "s = s"),
    ("a finite fill made -inf (NaN rows where eager is uniform)", "where_finite_causal_bf16",
     "s = tl.where(am_t != 0, -1000000000.0, s)", 's = tl.where(am_t != 0, float("-inf"), s)'),
]


@pytest.mark.parametrize("why,name,old,new", BROKEN, ids=[b[0] for b in BROKEN])
def test_a_kernel_that_skips_the_modification_fails(why, name, old, new, write_problem):
    src, _plan, _applied, emitted, _k, tol, _want = _compiled(name, write_problem)
    assert old in emitted, why
    with pytest.raises(AssertionError):
        check_dropin(src, emitted.replace(old, new), calls=1, atol=tol, rtol=tol, shapes=False,
                     rank=False, grad=False, move=False, modes=("train",))


NEAR = {
    "the causal mask inside the tanh (no mask then)": (
        "        s = (q @ k.transpose(-2, -1) * 0.1).masked_fill(~keep, float('-inf'))\n"
        "        s = torch.tanh(s) * 20.0\n"),
    "a bias added outside the causal mask": (
        "        s = (q @ k.transpose(-2, -1) * 0.25).masked_fill(~keep, float('-inf')) + mask\n"),
    "a cap of 1/sqrt(head dim)": (
        "        s = torch.tanh(q @ k.transpose(-2, -1) * 0.1) / math.sqrt(q.shape[-1])\n"),
    "the capped scores read elsewhere": (
        "        t = torch.tanh(q @ k.transpose(-2, -1) * 0.05)\n"
        "        s = t * 20.0\n"
        "        return torch.softmax(s, dim=-1) @ v + t.sum()\n"),
    "a finite fill inside the causal mask": (
        "        s = (q @ k.transpose(-2, -1) * 0.25).masked_fill(~keep, float('-inf'))\n"
        "        s = s.masked_fill(mask < -1.0, -1e9)\n"),
    "a finite fill scaled after": (
        "        s = (q @ k.transpose(-2, -1)).masked_fill(mask < -1.0, -1e9) * 0.25\n"),
    "a fill and a bias (one mask tensor)": (
        "        s = (q @ k.transpose(-2, -1) * 0.25 + mask).masked_fill(mask < -1.0, float('-inf'))\n"),
    "a fill mask that grows the scores": (
        "        s = (q @ k.transpose(-2, -1) * 0.25).masked_fill((mask < -1.0).expand(2, 3, 12, 12), float('-inf'))\n"),
    "a fill mask made from the scores": (
        "        s = q @ k.transpose(-2, -1) * 0.25\n"
        "        s = s.masked_fill(s < 0, float('-inf'))\n"),
    "a sigmoid in place of the tanh": (
        "        s = torch.sigmoid(q @ k.transpose(-2, -1) * 0.05) * 20.0\n"),
}


@pytest.mark.parametrize("why", sorted(NEAR))
def test_modifications_the_kernel_does_not_make_keep_the_reference(why, write_problem):
    body = NEAR[why]
    if "return" not in body:
        body += "        return torch.softmax(s, dim=-1) @ v\n"
    src = (HEAD + "class Model(nn.Module):\n    def forward(self, q, k, v, mask):\n"
           "        keep = torch.ones(12, 12, dtype=torch.bool, device=q.device).tril()\n" + body
           + "def get_inputs():\n    m = torch.zeros(2, 1, 12, 12)\n    m[0, :, :, 9:] = -1e9\n"
           "    return [torch.randn(2, 1, 12, 8) for _ in range(3)] + [m]\n"
           "def get_init_inputs():\n    return []\n")
    plan, applied, err = analyze(load_problem(write_problem(src, "near")))
    assert plan is not None, err
    assert "rw-attention" not in applied, why
    assert "attention" not in [g.kind for g in plan.groups], why


def test_capped_attention_kept_on_pytorch_is_eager_attention(write_problem):
    """A candidate that backs the group out calls _egg_masked_attention with the cap, the
    causal flag and the factor: eager's values."""
    src = HEAD + CAPPED_CAUSAL.format(dtype="float32")
    comp = compile_problem(load_problem(write_problem(src, "backed_out")), disabled={"g0", "eg0"})
    assert re.search(r"_egg_masked_attention\(q, k, v, None, None, is_causal ?= ?True, softcap ?= ?3\.0, "
                     r"factor ?= ?0\.333", comp.emitted.source)
    assert static_findings_src(comp.emitted.source, src) == []
    check_dropin(src, comp.emitted.source, calls=1, atol=1e-4, rtol=1e-4, shapes=False, rank=False)
