"""Attention with a mask tensor: Hugging Face's eager attention (an additive mask, an input of
forward, 0 or torch.finfo(dtype).min) and scaled_dot_product_attention with attn_mask (float
added, bool: True attends) are one attention kernel that reads the mask per tile through its
broadcast strides (flash for prefill, split-KV for decode). Each file is a drop-in
(tests/dropin.check_dropin: train/eval, other batch and sizes, scaled inputs, where x3 and x100
turn finfo.min into -inf) and passes the verifier's static check; a kernel that ignores the
mask, clamps nothing or gives the other answer for a row with no key left fails them. Masks the
rule cannot prove causal but that are not an additive bias of the scores keep the reference."""
import pytest
import torch

from codegen.pipeline import analyze, compile_problem
from harness.problem import load_problem
from harness.verify import static_findings_src
from tests.dropin import check_dropin, load_sources

HEAD = "import math\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"

REPEAT_KV = '''
def repeat_kv(hidden_states, n_rep):
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)
'''

#: Hugging Face's eager_attention_forward (transformers' Llama), the softmax in fp32
HF_EAGER = REPEAT_KV + '''
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.scaling = {scaling}
        self.num_key_value_groups = {groups}
        self.attention_dropout = 0.0

    def forward(self, query, key, value, attention_mask):
        key_states = repeat_kv(key, self.num_key_value_groups)
        value_states = repeat_kv(value, self.num_key_value_groups)
        attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * self.scaling
        if attention_mask is not None:
            causal_mask = attention_mask[:, :, :, : key_states.shape[-2]]
            attn_weights = attn_weights + causal_mask
        attn_weights = {softmax}
        attn_weights = nn.functional.dropout(attn_weights, p=self.attention_dropout, training=self.training)
        attn_output = torch.matmul(attn_weights, value_states)
        return attn_output.transpose(1, 2).contiguous()
'''

#: Hugging Face's sdpa_attention_forward: is_causal a bool of a traced shape (a graph break)
HF_SDPA = '''
class Model(nn.Module):
    def forward(self, query, key, value, attention_mask):
        causal_mask = attention_mask
        if attention_mask is not None:
            causal_mask = causal_mask[:, :, :, : key.shape[-2]]
        is_causal = query.shape[2] > 1 and causal_mask is None
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=causal_mask, dropout_p=0.0,
                                             scale={scaling}, is_causal=is_causal)
        return out.transpose(1, 2).contiguous()
'''

SDPA = '''
class Model(nn.Module):
    def forward(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask{extra})
'''

FP32_SOFTMAX = "attn_weights.float().softmax(-1).to(query.dtype)"


def _inputs(q, kv, mask_code, dtype) -> str:
    return (f"def get_inputs():\n    torch.manual_seed(0)\n    dt = torch.{dtype}\n"
            f"    q = torch.randn({q}, dtype=dt)\n    k = torch.randn({kv}, dtype=dt)\n"
            f"    v = torch.randn({kv}, dtype=dt)\n    lo = torch.finfo(dt).min\n{mask_code}"
            "    return [q, k, v, m]\ndef get_init_inputs():\n    return []\n")


#: causal plus padding, Hugging Face's 4-d mask: batch row 1 has its first 5 keys padded
PAD_CAUSAL = ("    m = torch.full((24, 24), lo, dtype=dt).triu(1)[None, None].repeat(2, 1, 1, 1)\n"
              "    m[1, :, :, :5] = lo\n")
#: a row of every query of batch 0 masked whole (uniform attention in eager), padding in batch 1
FULL_ROW = ("    m = torch.zeros(2, 1, 24, 24, dtype=dt)\n    m[0, :, 3] = lo\n    m[1, :, :, 17:] = lo\n")
#: decode: one query row, the cache's first keys padded in batch 0
PAD_DECODE = "    m = torch.zeros(2, 1, 1, 40, dtype=dt)\n    m[0, :, :, :7] = lo\n"
BOOL_PREFILL = ("    m = torch.ones(24, 24, dtype=torch.bool).tril()[None, None].repeat(2, 1, 1, 1)\n"
                "    m[0, :, :, 20:] = False\n    m[1, :, :, 2] = False\n")
BOOL_DECODE = "    m = torch.ones(2, 1, 1, 40, dtype=torch.bool)\n    m[1, :, :, 30:] = False\n"
#: a bool mask with a row of no key (SDPA gives 0 there)
BOOL_EMPTY_ROW = "    m = torch.ones(2, 1, 24, 24, dtype=torch.bool).tril()\n    m[1, :, 6] = False\n"
#: a 2-d float mask broadcast over batch and heads (stride 0 for both)
FLOAT_2D = "    m = torch.randn(24, 24, dtype=dt)\n    m[:, 9] = lo\n"

#: flash (query blocks of 16 rows past DECODE_ROWS, a full and a partial key block) and
#: split-KV decode (the cache in chunks, merged)
FLASH = {f"{p}g{i}": {"BLOCK_M": 16, "BLOCK_N": 16, "DECODE_ROWS": 16} for i in range(4) for p in ("", "e")}
SPLIT = {f"{p}g{i}": {"BLOCK_N": 16, "SPLIT_PROGRAMS": 8} for i in range(4) for p in ("", "e")}

CASES = {
    # name: (source, configs, kernel that must run, tolerance)
    "hf_padding_prefill_fp32": (
        HF_EAGER.format(scaling=16 ** -0.5, groups=1, softmax=FP32_SOFTMAX)
        + _inputs("2, 2, 24, 16", "2, 2, 24, 16", PAD_CAUSAL, "float32"), FLASH, "_egg_k_g0", 1e-4),
    "hf_padding_prefill_bf16_gqa": (
        HF_EAGER.format(scaling=16 ** -0.5, groups=2, softmax=FP32_SOFTMAX)
        + _inputs("2, 4, 24, 16", "2, 2, 24, 16", PAD_CAUSAL, "bfloat16"), FLASH, "_egg_k_g0", 1e-2),
    "hf_full_row_fp32": (
        HF_EAGER.format(scaling=16 ** -0.5, groups=1, softmax=FP32_SOFTMAX)
        + _inputs("2, 2, 24, 16", "2, 2, 24, 16", FULL_ROW, "float32"), FLASH, "_egg_k_g0", 1e-4),
    "hf_full_row_bf16": (
        HF_EAGER.format(scaling=16 ** -0.5, groups=1, softmax=FP32_SOFTMAX)
        + _inputs("2, 2, 24, 16", "2, 2, 24, 16", FULL_ROW, "bfloat16"), FLASH, "_egg_k_g0", 1e-2),
    "hf_padding_decode_bf16_gqa": (
        HF_EAGER.format(scaling=16 ** -0.5, groups=2, softmax=FP32_SOFTMAX)
        + _inputs("2, 4, 1, 16", "2, 2, 40, 16", PAD_DECODE, "bfloat16"), SPLIT, "_egg_k_g0_merge", 1e-2),
    "hf_padding_decode_fp32": (
        HF_EAGER.format(scaling=16 ** -0.5, groups=1, softmax=FP32_SOFTMAX)
        + _inputs("2, 2, 1, 16", "2, 2, 40, 16", PAD_DECODE, "float32"), SPLIT, "_egg_k_g0_merge", 1e-4),
    "hf_sdpa_path_fp32": (
        HF_SDPA.format(scaling=0.25) + _inputs("2, 2, 24, 16", "2, 2, 24, 16", PAD_CAUSAL, "float32"),
        FLASH, "_egg_k_g0", 1e-4),
    "sdpa_bool_prefill_fp32": (
        SDPA.format(extra="") + _inputs("2, 2, 24, 16", "2, 2, 24, 16", BOOL_PREFILL, "float32"),
        FLASH, "_egg_k_g0", 1e-4),
    "sdpa_bool_decode_bf16": (
        SDPA.format(extra="") + _inputs("2, 2, 1, 16", "2, 2, 40, 16", BOOL_DECODE, "bfloat16"),
        SPLIT, "_egg_k_g0_merge", 1e-2),
    "sdpa_bool_empty_row_fp32": (
        SDPA.format(extra=", scale=0.3") + _inputs("2, 2, 24, 16", "2, 2, 24, 16", BOOL_EMPTY_ROW, "float32"),
        FLASH, "_egg_k_g0", 1e-4),
    "sdpa_float_2d_bf16": (
        SDPA.format(extra="") + _inputs("2, 2, 24, 16", "2, 2, 24, 16", FLOAT_2D, "bfloat16"),
        FLASH, "_egg_k_g0", 1e-2),
}


def _compiled(name, write_problem):
    src, configs, kernel, tol = CASES[name]
    src = HEAD + src
    path = write_problem(src, name)
    plan, _rw, err = analyze(load_problem(path))
    assert plan is not None, err
    comp = compile_problem(load_problem(path), configs=configs)
    assert comp.emitted is not None, comp.error
    return src, plan, comp.emitted.source, kernel, tol


class _Launches:
    def __init__(self, kernel, box):
        self.kernel, self.box = kernel, box

    def __getitem__(self, grid):
        self.box.append(grid)
        return self.kernel[grid]


@pytest.mark.parametrize("name", sorted(CASES))
def test_masked_attention_is_one_kernel_and_a_drop_in(name, write_problem):
    src, plan, emitted, kernel, tol = _compiled(name, write_problem)
    assert [g.kind for g in plan.groups] == ["attention"], [g.kind for g in plan.groups]
    op = plan.nops[plan.groups[0].red]
    assert op.p["mask"] in ("add", "bool") and not op.p["causal"]
    assert op.p["empty"] == ("nan" if name.startswith("hf_") and "sdpa" not in name else "zero")
    report = runs_and_is_a_drop_in(src, emitted, kernel, tol)
    assert report.fast("x3") and report.fast("x100")  # finfo.min * 3 is -inf: NaN rows in eager


def runs_and_is_a_drop_in(src: str, emitted: str, kernel: str, tol: float):
    """The emitted file passes the static check, the kernel the configuration asks for runs
    (flash, or split-KV with its merge) on the problem's inputs with eager's values, and the file
    is a drop-in, its kernels running in train() and eval(): the drop-in report."""
    assert static_findings_src(emitted, src) == []
    pm, cm = load_sources(src, emitted)
    box: list = []
    setattr(cm, kernel, _Launches(getattr(cm, kernel), box))
    ins = pm.get_inputs()
    with torch.no_grad():
        ref, got = pm.Model()(*ins), cm.ModelNew()(*ins)
    assert box, f"{kernel} did not run"
    torch.testing.assert_close(got, ref, atol=tol, rtol=tol, equal_nan=True)
    report = check_dropin(src, emitted, calls=1, atol=tol, rtol=tol)
    assert report.fast("own") and report.fast("own", "eval")
    return report


def test_a_row_masked_whole_by_finfo_min_is_uniform_as_in_eager(write_problem):
    """Every score of the row torch.finfo.min: eager's softmax is uniform (the mean of V), not
    NaN: finfo.min * log2(e) overflows fp32, so the kernel keeps finite sums finite."""
    src, _plan, emitted, _k, _tol = _compiled("hf_full_row_fp32", write_problem)
    pm, cm = load_sources(src, emitted)
    q, k, v, m = pm.get_inputs()
    with torch.no_grad():
        ref, got = pm.Model()(q, k, v, m), cm.ModelNew()(q, k, v, m)
    mean_v = v[0].mean(-2)  # [heads, D]: batch 0, query row 3 of every head
    torch.testing.assert_close(ref[0, 3], mean_v, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[0, 3], mean_v, atol=1e-5, rtol=1e-5)
    with torch.no_grad():  # -inf: NaN rows in eager's softmax written out
        ref, got = pm.Model()(q, k, v, m * 3), cm.ModelNew()(q, k, v, m * 3)
    assert ref[0, 3].isnan().all() and got[0, 3].isnan().all()
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4, equal_nan=True)


#: the kernel's mask step edited out (name, case, text in the kernel, replacement): each
#: candidate must fail the drop-in check
BROKEN = [
    ("the additive mask ignored", "hf_padding_prefill_fp32",
     "s = s + tl.load(arow", "s = s + 0.0 * tl.load(arow"),
    ("the bool mask ignored", "sdpa_bool_decode_bf16",
     's = tl.where(am_t != 0, s, float("-inf"))', "s = s"),
    ("scores taken to log2 units (finfo.min * log2(e) overflows)", "hf_full_row_fp32",
     "p = tl.exp(s - m_use[:, None])",
     "p = tl.exp2(s * 1.4426950408889634 - m_use[:, None] * 1.4426950408889634)"),
    ("a row with no key left NaN for SDPA", "sdpa_bool_empty_row_fp32",
     "tl.where(l_i[:, None] == 0.0, 0.0, acc / l_i[:, None])", "acc / l_i[:, None]"),
]


@pytest.mark.parametrize("why,name,old,new", BROKEN, ids=[b[0] for b in BROKEN])
def test_a_kernel_that_mishandles_the_mask_fails(why, name, old, new, write_problem):
    src, _plan, emitted, _k, tol = _compiled(name, write_problem)
    assert old in emitted, why
    with pytest.raises(AssertionError):
        check_dropin(src, emitted.replace(old, new), calls=1, atol=tol, rtol=tol, shapes=False,
                     rank=False, grad=False, move=False, modes=("train",))


def test_the_wrapper_raises_for_a_mask_that_does_not_broadcast(write_problem):
    src, _plan, emitted, _k, _tol = _compiled("sdpa_bool_prefill_fp32", write_problem)
    _pm, cm = load_sources(src, emitted)
    q = k = v = torch.randn(2, 2, 24, 16)
    for bad in (torch.ones(3, 1, 24, 24, dtype=torch.bool), torch.ones(2, 1, 24, 23, dtype=torch.bool)):
        with pytest.raises(RuntimeError):
            torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bad)
        with pytest.raises(RuntimeError):
            cm._egg_g0(q, k, v, bad)


def test_hf_sdpa_without_a_mask_is_causal_and_one_query_row_is_not(write_problem):
    """is_causal = query.shape[2] > 1 and attention_mask is None: a graph break whose value at
    the traced size (True) is the kernel's; a one-row call (False in Model) takes the reference."""
    body = HF_SDPA.format(scaling=0.25).replace("def forward(self, query, key, value, attention_mask):",
                                                "def forward(self, query, key, value):\n"
                                                "        attention_mask = None")
    src = HEAD + body + ("def get_inputs():\n    return [torch.randn(2, 2, 24, 16) for _ in range(3)]\n"
                         "def get_init_inputs():\n    return []\n")
    path = write_problem(src, "hf_sdpa_no_mask")
    plan, _rw, err = analyze(load_problem(path))
    assert [g.kind for g in plan.groups] == ["attention"], err
    op = plan.nops[plan.groups[0].red]
    assert op.p["causal"] is True and not op.p["mask"]
    emitted = compile_problem(load_problem(path), configs=FLASH).emitted.source
    pm, cm = load_sources(src, emitted)
    for m in (24, 1, 5):
        q, k, v = torch.randn(2, 2, m, 16), torch.randn(2, 2, 24, 16), torch.randn(2, 2, 24, 16)
        torch.testing.assert_close(cm.ModelNew()(q, k, v), pm.Model()(q, k, v), atol=1e-4, rtol=1e-4)


def test_a_causal_additive_mask_keeps_the_causal_plan(write_problem):
    """An additive mask the rule proves causal is is_causal (no mask read), as before."""
    body = ("class Model(nn.Module):\n    def forward(self, q, k, v):\n"
            "        T = q.shape[-2]\n"
            "        s = torch.matmul(q, k.transpose(-2, -1)) * 0.25\n"
            "        s = s + torch.full((T, T), float('-inf'), device=q.device).triu(1)\n"
            "        return torch.matmul(s.softmax(-1), v)\n"
            "def get_inputs():\n    return [torch.randn(2, 2, 12, 16) for _ in range(3)]\n"
            "def get_init_inputs():\n    return []\n")
    plan, applied, err = analyze(load_problem(write_problem(HEAD + body, "causal_add")))
    assert [g.kind for g in plan.groups] == ["attention"] and "rw-attention" in applied, err
    op = plan.nops[plan.groups[0].red]
    assert op.name == "sdpa" and op.p["causal"] is True and not op.p["mask"]


NEAR = {
    "the mask added before the scale": "        s = (q @ k.transpose(-2, -1) + mask) * 0.25\n",
    "the mask multiplied": "        s = (q @ k.transpose(-2, -1)) * 0.25 * mask\n",
    "the mask subtracted": "        s = (q @ k.transpose(-2, -1)) * 0.25 - mask\n",
    "a mask made from the scores": ("        s = (q @ k.transpose(-2, -1)) * 0.25\n"
                                    "        s = s + (s < 0).float() * -1e9\n"),
    "a mask that grows the scores": "        s = (q @ k.transpose(-2, -1)) * 0.25 + mask.expand(2, 2, 12, 12)\n",
    "an fp64 mask": ("        s = (q @ k.transpose(-2, -1)) * 0.25 + mask.double()\n"
                     "        return torch.softmax(s, dim=-1).float() @ v\n"),
    "the masked scores read elsewhere": ("        s = (q @ k.transpose(-2, -1)) * 0.25 + mask\n"
                                         "        return torch.softmax(s.float(), dim=-1).to(v.dtype) @ v, s\n"),
    "a softmax over the queries": ("        s = (q @ k.transpose(-2, -1)) * 0.25 + mask\n"
                                   "        return torch.softmax(s, dim=-2) @ v\n"),
}


@pytest.mark.parametrize("why", sorted(NEAR))
def test_masks_that_are_not_an_additive_bias_keep_the_reference(why, write_problem):
    body = NEAR[why]
    if "return" not in body:
        body += "        return torch.softmax(s, dim=-1) @ v\n"
    src = (HEAD + "class Model(nn.Module):\n    def forward(self, q, k, v, mask):\n" + body
           + "def get_inputs():\n    m = torch.zeros(2, 1, 12, 12)\n    m[0, :, :, 9:] = -1e9\n"
           "    return [torch.randn(2, 1, 12, 8) for _ in range(3)] + [m]\n"
           "def get_init_inputs():\n    return []\n")
    plan, applied, err = analyze(load_problem(write_problem(src, "near")))
    assert plan is not None, err
    assert "rw-attention" not in applied, why
    assert "attention" not in [g.kind for g in plan.groups], why


def test_masked_attention_kept_on_pytorch_is_eager_attention(write_problem):
    """A candidate that backs the group out calls _egg_masked_attention (the node is named
    apart from the helper it calls): eager's values, NaN rows included."""
    src, _configs, _kernel, tol = CASES["hf_padding_decode_bf16_gqa"]
    src = HEAD + src
    comp = compile_problem(load_problem(write_problem(src, "backed_out")), disabled={"g0", "eg0"})
    assert "_egg_masked_attention(" in comp.emitted.source
    assert static_findings_src(comp.emitted.source, src) == []
    check_dropin(src, comp.emitted.source, calls=1, atol=tol, rtol=tol, shapes=False, rank=False)
