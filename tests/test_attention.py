"""Which scaled_dot_product_attention calls the attention template takes, and why not the
others. Its numerics (causal, GQA, 3-d, irregular lengths, bf16 flash and split-KV decode) are in
tests/test_templates.py and tests/test_llm_kernels.py."""
import pytest
import torch

from codegen.pipeline import analyze, group_geometry
from harness.problem import load_problem
from knowledge import heuristics as H

HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"


def _plan(write_problem, call: str, inputs: str, name: str):
    src = (HEAD + "class Model(nn.Module):\n    def forward(self, q, k, v):\n"
           f"        return {call}\n"
           f"def get_inputs():\n    return {inputs}\ndef get_init_inputs():\n    return []\n")
    plan, _rw, err = analyze(load_problem(write_problem(src, name)))
    assert plan is not None, err
    return plan


def test_fp32_attention_is_one_flash_kernel(write_problem):
    plan = _plan(write_problem, "F.scaled_dot_product_attention(q, k, v, is_causal=True)",
                 "[torch.randn(2, 3, 50, 32)] * 3", "ok")
    (g,) = plan.groups
    assert g.kind == "attention" and plan.nops[g.red].p["causal"] is True
    geo = group_geometry(plan, g, 1)
    assert (geo["M"], geo["N"], geo["head_dim"], geo["batch_heads"]) == (50, 50, 32, 6)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_sixteen_bit_attention_is_one_kernel_too(dtype, write_problem):
    """bf16/fp16 attention runs on tensor cores with fp32 accumulation (flash or split-KV)."""
    plan = _plan(write_problem, "F.scaled_dot_product_attention(q, k, v, enable_gqa=True)",
                 f"[torch.randn(2, 4, 50, 32, dtype=torch.{dtype}), "
                 f"torch.randn(2, 2, 50, 32, dtype=torch.{dtype}), "
                 f"torch.randn(2, 2, 50, 32, dtype=torch.{dtype})]", dtype)
    (g,) = plan.groups
    assert g.kind == "attention"
    geo = group_geometry(plan, g, 3)
    assert (geo["group"], geo["itemsize"]) == (2, 2)


@pytest.mark.parametrize("call,inputs,why", [
    ("F.scaled_dot_product_attention(q, k, v)",
     "[torch.randn(2, 3, 50, 32, dtype=torch.float64)] * 3", "no tensor-core path"),
    ("F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)",
     "[torch.randn(2, 3, 50, 50)] * 3", "dropout"),
    ("F.scaled_dot_product_attention(q, k, v)", "[torch.randn(1, 2, 8, 512)] * 3", "head dim 512"),
    ("F.scaled_dot_product_attention(q, k, v)",
     "[torch.randn(1, 2, 8, 16), torch.randn(1, 2, 9, 16), torch.randn(1, 2, 9, 24)]",
     "key/value shapes"),
])
def test_attention_the_template_does_not_take_says_why(call, inputs, why, write_problem):
    plan = _plan(write_problem, call, inputs, "no")
    assert not [g for g in plan.groups if g.kind == "attention"]
    reasons = {n.name: op.why for n, op in plan.nops.items() if op.kind == "library"}
    assert any(why in r for r in reasons.values()), reasons


def test_attention_heuristic_keeps_the_gpu_busy():
    assert H.attention_config(4096, 4096, 128, 64)["BLOCK_M"] == 64  # fp32: 3xTF32 tiles
    bf16 = H.attention_config(2048, 2048, 128, 64, 132, itemsize=2)  # one warpgroup, 3 stages
    assert (bf16["BLOCK_M"], bf16["BLOCK_N"], bf16["num_warps"], bf16["num_stages"]) == (64, 64, 4, 3)
    wide = H.attention_config(2048, 2048, 256, 64, 132, itemsize=2)  # 256-wide heads: 2 stages
    assert (wide["BLOCK_M"], wide["BLOCK_N"], wide["num_stages"]) == (64, 32, 2)
    decode = H.attention_config(16, 8192, 128, 32)  # few query rows: smaller query blocks
    assert decode["BLOCK_M"] == 16
    assert H.attention_config(1024, 1024, 256, 64)["BLOCK_N"] == 32
    assert H.attention_config(1, 8192, 128, 256, sm_count=132)["SPLIT_PROGRAMS"] == 4 * 132


WRITTEN_OUT = {
    # GPT-2 style: the mask applied with torch.where and a full_like fill
    "where_full_like": (
        "        T = q.size(-2)\n"
        "        att = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(k.size(-1)))\n"
        "        causal = torch.tril(torch.ones(T, T, device=q.device)).view(1, 1, T, T)\n"
        "        att = torch.where(causal == 0, torch.full_like(att, float('-inf')), att)\n"
        "        return torch.matmul(F.softmax(att, dim=-1), v)\n", True),
    # Bloom / GPT-NeoX style: scores by baddbmm with beta 0, heads folded into the batch
    "baddbmm": (
        "        b, h, t, d = q.shape\n"
        "        qf, kf, vf = q.reshape(b * h, t, d), k.reshape(b * h, t, d), v.reshape(b * h, t, d)\n"
        "        s = torch.baddbmm(torch.zeros(b * h, t, t, dtype=q.dtype, device=q.device), qf,\n"
        "                          kf.transpose(1, 2), beta=0.0, alpha=1.0 / math.sqrt(d))\n"
        "        return torch.bmm(torch.softmax(s, dim=-1), vf).reshape(b, h, t, d)\n", True),
    # the softmax written out (rw-softmax first)
    "manual_softmax": (
        "        s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])\n"
        "        T = q.shape[-2]\n"
        "        s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool, device=q.device), 1), float('-inf'))\n"
        "        e = torch.exp(s - s.amax(dim=-1, keepdim=True))\n"
        "        return (e / e.sum(dim=-1, keepdim=True)) @ v\n", True),
    # einsum, the mask of the scores' own size (i, j = s.shape[-2:]; bottom-right aligned,
    # causal where i == j) filled with -finfo.max (lucidrains style)
    "einsum_finfo": (
        "        s = torch.einsum('bhid,bhjd->bhij', q, k) * q.shape[-1] ** -0.5\n"
        "        i, j = s.shape[-2:]\n"
        "        mask = torch.ones((i, j), dtype=torch.bool, device=q.device).triu(j - i + 1)\n"
        "        s = s.masked_fill(mask, -torch.finfo(s.dtype).max)\n"
        "        return torch.einsum('bhij,bhjd->bhid', s.softmax(dim=-1), v)\n", True),
    # baddbmm adding a real input (beta 1): the added tensor is the kernel's additive mask,
    # read through its strides (an expanded column: stride 0 along the keys)
    "baddbmm_bias": (
        "        b, h, t, d = q.shape\n"
        "        qf, kf, vf = q.reshape(b * h, t, d), k.reshape(b * h, t, d), v.reshape(b * h, t, d)\n"
        "        s = torch.baddbmm(vf[:, :, :1].expand(b * h, t, t), qf, kf.transpose(1, 2))\n"
        "        return torch.bmm(torch.softmax(s, dim=-1), vf).reshape(b, h, t, d)\n", True),
}


@pytest.mark.parametrize("name", sorted(WRITTEN_OUT))
def test_attention_written_other_ways_is_one_kernel(name, write_problem):
    """Attention spelled as the libraries' authors spell it gets the attention kernel, and the
    file is a drop-in (tests/dropin.check_dropin)."""
    from codegen.pipeline import compile_problem
    from tests.dropin import check_dropin

    body, one = WRITTEN_OUT[name]
    src = (HEAD + "import math\nclass Model(nn.Module):\n    def forward(self, q, k, v):\n" + body
           + "def get_inputs():\n    return [torch.randn(2, 3, 12, 8) for _ in range(3)]\n"
           + "def get_init_inputs():\n    return []\n")
    path = write_problem(src, f"written_{name}")
    plan, _rw, err = analyze(load_problem(path))
    assert plan is not None, err
    assert ([g.kind for g in plan.groups] == ["attention"]) is one, [g.kind for g in plan.groups]
    comp = compile_problem(load_problem(path))
    report = check_dropin(src, comp.emitted.source, calls=1, variants=("own", "x3", "batch", "padded"))
    assert report.fast("own")


def test_bottom_right_mask_at_other_lengths_is_the_reference(write_problem):
    """The einsum file's mask is bottom-right aligned (triu(j - i + 1)): causal top-left only
    where the query and key lengths are equal, as traced. Called with other lengths (a decode
    step), the file must give Model's values: the guard keeps those calls on the reference."""
    from codegen.pipeline import compile_problem
    from tests.dropin import load_sources

    body, _one = WRITTEN_OUT["einsum_finfo"]
    src = (HEAD + "import math\nclass Model(nn.Module):\n    def forward(self, q, k, v):\n" + body
           + "def get_inputs():\n    return [torch.randn(2, 3, 12, 8) for _ in range(3)]\n"
           + "def get_init_inputs():\n    return []\n")
    comp = compile_problem(load_problem(write_problem(src, "bottom_right")))
    pm, cm = load_sources(src, comp.emitted.source)
    ref, new = pm.Model(), cm.ModelNew()
    for tq, tk in ((12, 12), (5, 12), (1, 12), (7, 7)):
        q, k, v = torch.randn(2, 3, tq, 8), torch.randn(2, 3, tk, 8), torch.randn(2, 3, tk, 8)
        torch.testing.assert_close(new(q, k, v), ref(q, k, v), atol=1e-5, rtol=1e-5)
