"""LLM-inference kernels against torch in the interpreter (bf16 with its caveats: 16-bit dots run
on fp32 copies, downcasts truncate, so one bf16 ulp is allowed; fp32 too), and the rules that
bring the spellings users write to them: attention (flash prefill, split-KV decode, GQA),
hand-written attention, the LM head + cross-entropy, interleaved RoPE, canonical forms."""
import pytest
import torch

from codegen import rewrites as RW
from codegen.pipeline import analyze, compile_problem
from harness.capture import capture
from harness.problem import load_module, load_problem
from tests.dropin import check_dropin
from tests.helpers import generated_matches

HEAD = "import math\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
BF = "dtype=torch.bfloat16"


def problem(args: str, body: str, inputs: str, init: str = "", members: str = "") -> str:
    return (HEAD + "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            + (members or "        pass\n") + f"    def forward(self, {args}):\n{body}"
            + f"def get_inputs():\n    return {inputs}\n"
            + f"def get_init_inputs():\n    return [{init}]\n")


def plan_of(write_problem, src: str, name: str):
    plan, applied, err = analyze(load_problem(write_problem(src, name)))
    assert plan is not None, err
    return plan, applied


# ---------------------------------------------------------------------------------- attention
ATTN = {
    # prefill (flash): 2 x 37 packed rows per key/value head > DECODE_ROWS; causal with GQA,
    # keys shorter than queries with a scale, 3-d fp16 operands
    "flash": (problem(
        "q, k, v, q3, k3", "        return (F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),\n"
        "                F.scaled_dot_product_attention(q, k[:, :, :29], v[:, :, :29], scale=0.3, enable_gqa=True),\n"
        "                F.scaled_dot_product_attention(q3, k3, k3))\n",
        f"[torch.randn(2, 4, 37, 40, {BF}), torch.randn(2, 2, 37, 40, {BF}), torch.randn(2, 2, 37, 40, {BF}),"
        " torch.randn(3, 70, 16, dtype=torch.float16), torch.randn(3, 23, 16, dtype=torch.float16)]"),
        {g: {"BLOCK_M": 16, "BLOCK_N": 16} for g in ("g0", "g1", "g2")},
        ("_egg_k_g0",)),  # one kernel serves the three (causal and scale are arguments)
    # decode (split-KV): 3 query heads per key/value head, 3 or 1 query rows, the cache cut in
    # two chunks (SPLIT_PROGRAMS 8 over 4 (batch, kv head) pairs) and merged; causal decode
    # (top-left: query m sees keys <= m) in one chunk; fp32 decode (3xTF32 dots)
    "decode": (problem(
        "q, k, v, qf, kf", "        return (F.scaled_dot_product_attention(q, k, v, enable_gqa=True),\n"
        "                F.scaled_dot_product_attention(q[:, :, :1], k, v, enable_gqa=True),\n"
        "                F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),\n"
        "                F.scaled_dot_product_attention(qf, kf, kf))\n",
        f"[torch.randn(2, 6, 3, 16, {BF}), torch.randn(2, 2, 77, 16, {BF}), torch.randn(2, 2, 77, 16, {BF}),"
        " torch.randn(1, 2, 2, 24), torch.randn(1, 2, 45, 24)]"),
        {g: {"BLOCK_N": 16, "SPLIT_PROGRAMS": 8} for g in ("g0", "g1", "g2", "g3")},
        # g0-g2 share one set of kernels (emit.share_kernels), the fp32 g3 has its own
        ("_egg_k_g0_split", "_egg_k_g0_merge", "_egg_k_g3_merge")),
    # decode past DECODE_ROWS packed rows: 40 query heads on one key/value head (multi-query,
    # Falcon's form), one query row (40 rows: 3 tiles of 16) and 4 rows (speculative decoding's
    # few tokens: 160 rows, 10 tiles): split-KV in row tiles, never the flash kernel
    "decode_row_tiles": (problem(
        "q, k, v", "        return (F.scaled_dot_product_attention(q[:, :, :1], k, v, enable_gqa=True),\n"
        "                F.scaled_dot_product_attention(q, k, v, enable_gqa=True))\n",
        f"[torch.randn(2, 40, 4, 16, {BF}), torch.randn(2, 1, 77, 16, {BF}), torch.randn(2, 1, 77, 16, {BF})]"),
        {g: {"BLOCK_N": 16, "SPLIT_PROGRAMS": 8, "DECODE_ROWS": 16} for g in ("g0", "g1")},
        ("_egg_k_g0_split", "_egg_k_g0_merge")),
}


@pytest.mark.parametrize("name", sorted(ATTN))
def test_attention_kernels_match_torch(name, write_problem, tmp_path):
    src, configs, launched = ATTN[name]
    comp = generated_matches(write_problem(src, name), tmp_path, seeds=(0, 1), atol=1e-2, rtol=1e-2,
                             configs=configs, launched=launched)
    assert {g.kind for g in comp.plan.groups} == {"attention"}


def test_decode_rows_past_a_tile_are_split_kv_programs_per_row_tile(write_problem, tmp_path):
    """The packed rows of one key/value head in tiles of DECODE_ROWS: one split-KV program per
    (batch, kv head, row tile, key chunk) and never the flash kernel, whose tile would hold one
    query row of each head (each query head reading the cache alone)."""
    src, configs, _ = ATTN["decode_row_tiles"]
    generated_matches(write_problem(src, "tiles"), tmp_path, seeds=(0,), atol=1e-2, rtol=1e-2,
                      configs=configs)
    mod = load_module(tmp_path / "cand_tiles.py", "candidate_tiles")
    grids = []
    for name in ("_egg_k_g0", "_egg_k_g0_split"):
        kernel = getattr(mod, name)
        setattr(mod, name, type("L", (), {"__getitem__": lambda self, g, n=name, k=kernel: (grids.append((n, g)), k[g])[1]})())
    q, k = torch.randn(2, 40, 4, 16, dtype=torch.bfloat16), torch.randn(2, 1, 77, 16, dtype=torch.bfloat16)
    with torch.no_grad():
        mod.ModelNew()(q, k, k)
    # B * HKV = 2 pairs; 40 rows -> 3 tiles of 16, 160 rows -> 10; 8 programs wanted in all
    assert [(n, g[0]) for n, g in grids] == [("_egg_k_g0_split", 2 * 3), ("_egg_k_g0_split", 2 * 10)]


def test_attention_refuses_what_sdpa_refuses(write_problem, tmp_path):
    """Query heads that the key/value heads do not divide (a shape trial changed 32 query heads
    to 17 next to 8 key/value heads: the decode kernel returned a result where SDPA raises),
    and operands that do not match: the module raises as Model does, and so does the kernel's
    wrapper called directly (past the module's route)."""
    src, configs, _ = ATTN["decode"]
    comp = generated_matches(write_problem(src, "decode"), tmp_path, seeds=(0,), atol=1e-2, rtol=1e-2,
                             configs=configs)
    mod = load_module(tmp_path / "cand_decode.py", "candidate_refuses")
    prob = load_problem(tmp_path / "decode.py")
    ref, new = prob.Model(), mod.ModelNew()
    bf = torch.bfloat16
    q, k, v = torch.randn(2, 5, 3, 16, dtype=bf), torch.randn(2, 2, 77, 16, dtype=bf), torch.randn(2, 2, 77, 16, dtype=bf)
    qf, kf = torch.randn(1, 2, 2, 24), torch.randn(1, 2, 45, 24)
    for m in (ref, new):
        with pytest.raises(RuntimeError):
            m(q, k, v, qf, kf)
    wrapper = next(getattr(mod, f"_egg_{g.id}") for g in comp.plan.groups)
    with pytest.raises(RuntimeError, match="must divide"):
        wrapper(q, k, v)
    with pytest.raises(RuntimeError, match="do not match"):
        wrapper(torch.randn(2, 6, 3, 16, dtype=bf), k, v[:, :, :40])
    assert wrapper(torch.randn(2, 6, 3, 16, dtype=bf), k, v).shape == (2, 6, 3, 16)


#: hand-written attention the rule turns into sdpa: (forward args, body, inputs)
HAND = {
    "masked_fill_triu": ("q, k, v", """        s = q.shape[-2]
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
        mask = torch.triu(torch.ones((s, s), dtype=torch.bool, device=q.device), diagonal=1)
        probs = torch.softmax(scores.masked_fill(mask, float("-inf")).float(), dim=-1)
        return probs.to(q.dtype) @ v
""", f"[torch.randn(1, 2, 37, 16, {BF}) for _ in range(3)]"),
    # HF repeat_kv, the scale before the mask, an additive mask, head_dim ** -0.5
    "repeat_kv_additive": ("q, k, v", """        b, h, s, d = k.shape
        k = k[:, :, None].expand(b, h, 2, s, d).reshape(b, h * 2, s, d)
        v = v[:, :, None].expand(b, h, 2, s, d).reshape(b, h * 2, s, d)
        scores = (q @ k.transpose(2, 3)) * d ** -0.5
        mask = torch.full((s, s), float("-inf"), device=q.device).triu(1)
        return F.softmax((scores + mask).float(), dim=-1).type_as(q) @ v
""", f"[torch.randn(1, 4, 33, 16, {BF}), torch.randn(1, 2, 33, 16, {BF}), torch.randn(1, 2, 33, 16, {BF})]"),
    # where(keep, scores, fill) with tril keep, the mask before the scale, a finite fill
    "where_tril_decode": ("q, k, v, qd", """        s = q.shape[2]
        keep = torch.ones_like(q[0, 0, :, :1] @ k[0, 0, :, :1].transpose(0, 1)).tril().bool()
        scores = torch.where(keep, q @ k.permute(0, 1, 3, 2), -1e30) * 0.25
        out = torch.softmax(scores, dim=-1) @ v
        kr = k.repeat_interleave(2, dim=1)
        vr = v.repeat_interleave(2, dim=1)
        dec = torch.softmax((qd @ kr.transpose(-2, -1)).float() / 4.0, dim=-1).to(qd.dtype) @ vr
        return out, dec
""", "[torch.randn(1, 2, 24, 16), torch.randn(1, 2, 24, 16), torch.randn(1, 2, 24, 16), "
     "torch.randn(1, 4, 1, 16)]"),
}


@pytest.mark.parametrize("name", sorted(HAND))
def test_hand_written_attention_is_one_attention_kernel(name, write_problem, tmp_path):
    args, body, inputs = HAND[name]
    src = problem(args, body, inputs)
    plan, applied = plan_of(write_problem, src, name)
    assert "rw-attention" in applied
    kinds = sorted(g.kind for g in plan.groups)
    assert set(kinds) == {"attention"}, kinds
    for g in plan.groups:  # the GQA copies are gone: the kernel reads the inputs
        assert all(t.op == "placeholder" for t in plan.nops[g.red].operands[:3])
    configs = {g.id: {"BLOCK_M": 16, "BLOCK_N": 16} for g in plan.groups}
    generated_matches(write_problem(src, name + "_m"), tmp_path, seeds=(0,), atol=1e-2, rtol=1e-2,
                      configs=configs)


@pytest.mark.parametrize("why,body", [
    ("a fill a softmax does not zero", """        scores = q @ k.transpose(-2, -1)
        mask = torch.ones((q.shape[2], q.shape[2]), dtype=torch.bool, device=q.device).triu(diagonal=1)
        return torch.softmax(scores.masked_fill(mask, -100.0), dim=-1) @ v
"""),
    ("a negative factor on masked scores", """        scores = q @ k.transpose(-2, -1)
        mask = torch.ones((q.shape[2], q.shape[2]), dtype=torch.bool, device=q.device).triu(diagonal=1)
        return torch.softmax(scores.masked_fill(mask, float("-inf")) * -0.5, dim=-1) @ v
"""),
    ("the scores used twice", """        scores = q @ k.transpose(-2, -1)
        return torch.softmax(scores, dim=-1) @ v, scores
"""),
    ("a softmax over the queries", """        return torch.softmax(q @ k.transpose(-2, -1), dim=-2) @ v
"""),
])
def test_attention_rule_leaves_other_math_alone(why, body, write_problem):
    members = "        self.register_buffer('mask', torch.tril(torch.ones(12, 12)))\n"
    src = problem("q, k, v, pad", body, "[torch.randn(1, 2, 12, 8) for _ in range(3)] + "
                  "[torch.randint(0, 2, (12, 12))]", members=members)
    _plan, applied = plan_of(write_problem, src, "no_attn")
    assert "rw-attention" not in applied, why


#: masks that are not causal: each is read per tile as the kernel's fill mask (the bool mask
#: computed in PyTorch from the inputs, buffers and shapes of the call, -inf where True)
FILL_MASKS = [
    ("a padding mask read from an input", """        scores = q @ k.transpose(-2, -1)
        return torch.softmax(scores.masked_fill(pad == 0, float("-inf")), dim=-1) @ v
"""),
    ("a mask from a buffer and an input", """        scores = q @ k.transpose(-2, -1)
        return torch.softmax(scores.masked_fill((self.mask * pad) == 0, float("-inf")), dim=-1) @ v
"""),
    ("bottom-right alignment", """        scores = q[:, :, :5] @ k.transpose(-2, -1)
        keep = torch.ones((5, k.shape[-2]), dtype=torch.bool, device=q.device).tril(diagonal=7)
        return torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1) @ v
"""),
    ("a mask that hides the diagonal too", """        scores = q @ k.transpose(-2, -1)
        mask = torch.ones((q.shape[2], q.shape[2]), dtype=torch.bool, device=q.device).triu(diagonal=0)
        return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v
"""),
    ("a mask right at the traced size only", """        s = q.shape[2]
        scores = q @ k.transpose(-2, -1)
        mask = torch.ones((s, s), dtype=torch.bool, device=q.device).triu(diagonal=s - 11)
        return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v
"""),
]


@pytest.mark.parametrize("why,body", FILL_MASKS, ids=[w for w, _b in FILL_MASKS])
def test_masks_that_are_not_causal_are_read_as_fill_masks(why, body, write_problem):
    members = "        self.register_buffer('mask', torch.tril(torch.ones(12, 12)))\n"
    src = problem("q, k, v, pad", body, "[torch.randn(1, 2, 12, 8) for _ in range(3)] + "
                  "[torch.randint(0, 2, (12, 12))]", members=members)
    plan, applied = plan_of(write_problem, src, "fill")
    assert "rw-attention" in applied, why
    att = [g for g in plan.groups if g.kind == "attention"]
    assert len(att) == 1 and plan.nops[att[0].red].p["mask"] == "drop", why
    assert not plan.nops[att[0].red].p["causal"], why
    configs = {g.id: {"BLOCK_M": 16, "BLOCK_N": 16} for g in plan.groups}
    comp = compile_problem(load_problem(write_problem(src, "fill_m")), configs=configs)
    # eager's values (NaN rows where every key is masked, as in eager) in every drop-in trial
    report = check_dropin(src, comp.emitted.source, calls=1, atol=1e-4, rtol=1e-4)
    assert report.fast("own") and report.fast("own", "eval")


GPT_MEMBERS = ("        self.c_attn = nn.Linear(32, 96)\n"
               "        self.register_buffer('bias', torch.tril(torch.ones(64, 64)).view(1, 1, 64, 64))\n")


def gpt_attention(score: str) -> str:
    """minGPT's attention: the causal mask a registered buffer sliced to the sequence length,
    the scale 1/sqrt(k.size(-1)) from a head dim of C // n_head; softmax or ReLU."""
    return problem("x", f"""        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(32, dim=2)
        k = k.view(B, T, 2, C // 2).transpose(1, 2)
        q = q.view(B, T, 2, C // 2).transpose(1, 2)
        v = v.view(B, T, 2, C // 2).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf'))
        att = {score}
        y = att @ v
        return y.transpose(1, 2).contiguous().view(B, T, C)
""", "[torch.rand(2, 40, 32)]", members=GPT_MEMBERS)


@pytest.mark.parametrize("score,rule", [("F.softmax(att, dim=-1)", "rw-attention"),
                                        ("F.relu(att)", "rw-relu-attention")])
def test_a_causal_mask_kept_in_a_buffer_is_an_attention_kernel_while_it_is_causal(
        score, rule, write_problem, tmp_path):
    """minGPT keeps its causal mask in a registered buffer (KernelBench level 3's GPT blocks):
    rw-attention left it alone (load_state_dict may change a buffer), so the S x S scores were
    written. Now the rule takes it when the buffer is the lower-triangular ones (evaluated with
    such a stand-in at two sizes), and the file takes the kernel only while the buffer holds
    those values (checked once per version of the buffer); a sequence longer than the buffer
    raises as Model does. ReLU in place of the softmax is rw-relu-attention: the same kernels
    without the running maximum and sum."""
    src = gpt_attention(score)
    path = write_problem(src, f"gpt_{rule}")
    cfg = {"g1": {"BLOCK_M": 16, "BLOCK_N": 16, "DECODE_ROWS": 16}}  # 40 rows: flash
    comp = generated_matches(path, tmp_path, seeds=(0, 1), atol=1e-4, rtol=1e-4, configs=cfg,
                             launched=("_egg_k_g1",))
    assert rule in comp.rewrites and [g.kind for g in comp.plan.groups] == ["matmul", "attention"]
    assert "'tril': ['bias']" in comp.emitted.source
    cand = tmp_path / f"gpt_{rule}_new.py"
    cand.write_text(comp.emitted.source)
    mod = load_module(cand, "candidate")
    torch.manual_seed(0)
    ref, new = mod.Model(), mod.ModelNew()
    new.load_state_dict(ref.state_dict())
    with torch.no_grad():
        x = torch.rand(3, 23, 32)
        torch.testing.assert_close(new(x), ref(x), atol=1e-4, rtol=1e-4)
        assert list(new._egg_routes.values()) == [True]
        for m in (ref, new):  # a mask that is not causal: Model's ops, the same result
            m.bias[..., 3, 9] = 1.0
        torch.testing.assert_close(new(x), ref(x), atol=1e-5, rtol=1e-5)
        assert list(new._egg_routes.values()) == [True, False]
        x = torch.rand(2, 70, 32)  # longer than the buffer: Model raises, so does the file
        with pytest.raises(RuntimeError):
            ref(x)
        new.load_state_dict(mod.Model().state_dict())  # causal again: the kernels
        with pytest.raises(RuntimeError, match="must match"):
            new(x)
    assert mod._egg_is_tril_ones(torch.ones(2, 5, 5).tril()) and not mod._egg_is_tril_ones(torch.ones(5, 5))


def test_relu_attention_kernels_match_torch(write_problem, tmp_path):
    """rw-relu-attention's kernels on their own: no mask with a number for scale (flash), a
    causal mask built from the shapes, and decode (one query row: the split-KV kernel, two key
    chunks whose partial outputs add up), fp32 and bf16."""
    body = """        keep = torch.ones((q.shape[2], k.shape[2]), dtype=torch.bool, device=q.device).tril()
        a = torch.relu((q @ k.transpose(-2, -1)) * 0.3) @ v
        b = torch.relu((q @ k.transpose(-2, -1)).masked_fill(~keep, float("-inf")) / 4.0) @ v
        c = F.relu((qd @ kd.transpose(-2, -1)) * 0.25) @ kd
        return a, b, c
"""
    src = problem("q, k, v, qd, kd", body, f"[torch.randn(1, 2, 37, 16), torch.randn(1, 2, 37, 16), "
                  f"torch.randn(1, 2, 37, 16), torch.randn(2, 2, 1, 16, {BF}), torch.randn(2, 2, 77, 16, {BF})]")
    plan, applied = plan_of(write_problem, src, "relu_att")
    assert "rw-relu-attention" in applied and [g.kind for g in plan.groups] == ["attention"] * 3
    cfg = {g.id: {"BLOCK_M": 16, "BLOCK_N": 16, "SPLIT_PROGRAMS": 8,
                  "DECODE_ROWS": 16 if g.id != "g2" else 64} for g in plan.groups}  # 37 rows: flash
    generated_matches(write_problem(src, "relu_att_m"), tmp_path, seeds=(0,), atol=2e-2, rtol=2e-2,
                      configs=cfg, launched=("_egg_k_g0", "_egg_k_g2_split", "_egg_k_g2_merge"))


def test_gqa_fold_keeps_a_tiled_repeat(write_problem):
    """x.repeat(1, g, 1, 1) tiles the heads (head h reads h % H_kv): not grouped-query
    attention's h // g; only repeat_interleave and expand + reshape fold into enable_gqa."""
    src = problem("q, k, v", "        return (F.scaled_dot_product_attention(q, k.repeat(1, 2, 1, 1), v.repeat(1, 2, 1, 1)),\n"
                  "                F.scaled_dot_product_attention(q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, 1)))\n",
                  "[torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)]")
    plan, _applied = plan_of(write_problem, src, "tile")
    ops = [[t.op for t in plan.nops[g.red].operands[:3]] for g in plan.groups]
    assert sorted(ops) == [["placeholder", "call_method", "call_method"], ["placeholder"] * 3]
    assert sum(bool(plan.nops[g.red].p["gqa"]) for g in plan.groups) == 1


# ------------------------------------------------------------------ LM head + cross-entropy
def lm_problem(forward: str, inputs: str, bias: bool = False, dtype: str = "torch.bfloat16") -> str:
    members = f"        self.head = nn.Linear(72, 501, bias={bias}, dtype={dtype})\n"
    return problem("h, t", forward, inputs, members=members)


LM = {
    "mean": ("        return F.cross_entropy(self.head(h).float(), t)\n",
             f"[torch.randn(37, 72, {BF}), torch.randint(0, 501, (37,))]", False, "torch.bfloat16"),
    # bias, ignored targets, a sum; targets shaped [B, S] and logits flattened from [B, S, V]
    "bias_ignore_sum": ("        lg = self.head(h)\n"
                        "        return F.cross_entropy(lg.view(-1, lg.shape[-1]).float(), t.view(-1), "
                        "ignore_index=7, reduction='sum')\n",
                        f"[torch.randn(3, 13, 72, {BF}), torch.randint(0, 501, (3, 13)).clamp(7, 9)]",
                        True, "torch.bfloat16"),
    "none_fp32": ("        return F.cross_entropy(self.head(h), t, reduction='none')\n",
                  "[torch.randn(37, 72), torch.randint(0, 501, (37,))]", False, "torch.float32"),
}


def lm_compiled(src: str, name: str, mode: int, dtype: str, tol: float, write_problem, tmp_path):
    """The LM-head problem compiled with MODE's mapping at small tiles, its kernels run and
    matched against torch on two seeds: one linear_ce group, by rw-linear-cross-entropy."""
    path = write_problem(src, f"lm_{name}_{mode}")
    cfg = {"g0": {"MODE": mode, "CHUNK_N": 128, "BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 32}}
    tol = 5e-3 if mode == 1 and dtype != "torch.float32" else tol
    launched = ("_egg_k_g0_mm",) if mode == 1 else ("_egg_k_g0_lse",)
    comp = generated_matches(path, tmp_path, seeds=(0, 1), atol=tol, rtol=tol, configs=cfg,
                             launched=launched + ("_egg_k_g0_row",))
    assert [g.kind for g in comp.plan.groups] == ["linear_ce"]
    assert "rw-linear-cross-entropy" in comp.rewrites
    return comp


@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("name", sorted(LM))
def test_lm_head_cross_entropy_matches_torch(name, mode, write_problem, tmp_path):
    """MODE 0 (cuBLAS chunks: eager's product and rounding) and MODE 1 (the fused product: in
    the interpreter the fp32 tile is truncated to bf16, not rounded, which moves a loss of ~6 by
    up to ~2e-3)."""
    fwd, inputs, bias, dtype = LM[name]
    lm_compiled(lm_problem(fwd, inputs, bias, dtype), name, mode, dtype, 1e-4, write_problem, tmp_path)


SOFTCAP = {
    # Hugging Face's Gemma-2: the cap in bf16 on the product, then the upcast and the flattening
    "gemma_bf16": ("        lg = self.head(h)\n        lg = lg / 1.5\n        lg = torch.tanh(lg)\n"
                   "        lg = lg * 1.5\n"
                   "        return F.cross_entropy(lg.float().view(-1, lg.size(-1)), t.view(-1), reduction='none')\n",
                   f"[torch.randn(3, 13, 72, {BF}) * 3, torch.randint(0, 501, (3, 13))]", "torch.bfloat16"),
    # after the upcast, the division written as a product, the factors the other way round
    "fp32_mul": ("        return F.cross_entropy(1.5 * torch.tanh(self.head(h).float() * (1 / 1.5)), t,\n"
                 "                               reduction='none')\n",
                 "[torch.randn(37, 72) * 3, torch.randint(0, 501, (37,))]", "torch.float32"),
}


@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("name", sorted(SOFTCAP))
def test_lm_head_cross_entropy_with_gemmas_logit_soft_cap(name, mode, write_problem, tmp_path):
    """Gemma-2's final logit soft cap (cap * tanh(logits / cap)) between the LM head and its loss
    is the fused op's soft cap, each tile capped where it is made, in the dtype eager caps it in
    (bf16 steps for the bf16 product): the logits are still never written."""
    fwd, inputs, dtype = SOFTCAP[name]
    comp = lm_compiled(lm_problem(fwd, inputs, False, dtype), f"cap_{name}", mode, dtype, 2e-4,
                       write_problem, tmp_path)
    op = comp.plan.nops[comp.plan.groups[0].red]
    assert op.p["softcap"] == 1.5 and op.p["softcap_16"] == (dtype == "torch.bfloat16")


def test_lm_head_cross_entropy_gives_nan_for_a_target_outside_the_vocabulary(write_problem, tmp_path):
    """Eager raises on such a target; the kernel must not return a number for it."""
    fwd, inputs, bias, dtype = LM["mean"]
    path = write_problem(lm_problem(fwd, inputs, bias, dtype), "lm_bad")
    comp = generated_matches(path, tmp_path, seeds=(0,), configs={"g0": {"CHUNK_N": 128, "BLOCK_N": 64}})
    cand = tmp_path / "lm_bad_new.py"
    cand.write_text(comp.emitted.source)
    m = load_module(cand, "candidate").ModelNew()
    t = torch.randint(0, 501, (37,))
    t[3] = 501
    with torch.no_grad():
        assert torch.isnan(m(torch.randn(37, 72, dtype=torch.bfloat16), t))


def test_lm_head_cross_entropy_refuses_what_eager_refuses(write_problem, tmp_path):
    """The kernel reads K from the hidden states and walks the weight, the targets and the bias
    with their own strides: operands that do not fit raise as eager does, never a loss."""
    fwd, inputs, bias, dtype = LM["bias_ignore_sum"]
    path = write_problem(lm_problem(fwd, inputs, bias, dtype), "lm_refuse")
    comp = generated_matches(path, tmp_path, seeds=(0,), configs={"g0": {"CHUNK_N": 128, "BLOCK_N": 64}})
    cand = tmp_path / "lm_refuse_new.py"
    cand.write_text(comp.emitted.source)
    mod = load_module(cand, "candidate")
    m = mod.ModelNew()
    w, b = m.head.weight, m.head.bias
    x, t = torch.randn(5, 72, dtype=torch.bfloat16), torch.randint(0, 501, (5,))
    with torch.no_grad():
        assert torch.isfinite(mod._egg_g0(x, w, t, b))
        with pytest.raises(RuntimeError, match=r"\(5x71 and 72x501\)"):
            mod._egg_g0(x[:, :71], w, t, b)
        with pytest.raises(ValueError, match="target batch_size"):
            mod._egg_g0(x, w, t[:4], b)
        with pytest.raises(RuntimeError, match="bias has 500 elements"):
            mod._egg_g0(x, w, t, b[:500])


@pytest.mark.parametrize("why,forward", [
    ("label smoothing", "        return F.cross_entropy(self.head(h).float(), t, label_smoothing=0.1)\n"),
    ("the logits returned too", "        lg = self.head(h)\n        return F.cross_entropy(lg.float(), t), lg\n"),
    ("a 16-bit loss (no upcast)", "        return F.cross_entropy(self.head(h), t)\n"),
    ("a tanh whose two scales differ", "        return F.cross_entropy(torch.tanh(self.head(h).float() / 2.0) * 3.0, t)\n"),
    ("the capped logits returned too", "        lg = torch.tanh(self.head(h) / 2.0) * 2.0\n"
                                       "        return F.cross_entropy(lg.float(), t), lg\n"),
    ("the inner logits used elsewhere", "        lg = self.head(h)\n"
                                        "        return F.cross_entropy((torch.tanh(lg / 2.0) * 2.0).float(), t), lg.sum()\n"),
])
def test_lm_head_rule_leaves_other_losses_alone(why, forward, write_problem):
    _plan, applied = plan_of(write_problem, lm_problem(forward, LM["mean"][1]), "lm_no")
    assert "rw-linear-cross-entropy" not in applied, why


# --------------------------------------------------------------------- interleaved RoPE
def test_interleaved_rope_is_one_kernel_per_tensor(write_problem, tmp_path):
    src = problem("q, k", """        def pairs(x):
            return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)
        return q * self.c + pairs(q) * self.s, (k.float() * self.c + pairs(k) * self.s).to(k.dtype)
""", f"[torch.randn(2, 4, 7, 10, {BF}), torch.randn(2, 2, 7, 10, {BF})]",
                  members="        self.register_buffer('c', torch.randn(7, 10, dtype=torch.bfloat16))\n"
                          "        self.register_buffer('s', torch.randn(7, 10, dtype=torch.bfloat16))\n")
    comp = generated_matches(write_problem(src, "pairs"), tmp_path, seeds=(0, 1), atol=1e-2, rtol=1e-2)
    assert [g.kind for g in comp.plan.groups] == ["pointwise", "pointwise"]
    assert "rw-rotate-half" in comp.rewrites


def test_a_rotation_of_a_value_made_in_the_kernel_reads_it_from_memory(write_problem, tmp_path):
    """The rotated operand is computed by another kernel (a rolled load needs memory)."""
    src = problem("q", "        y = q * 2.0 + 1.0\n"
                  "        return y + torch.stack((-y[..., 1::2], y[..., ::2]), dim=-1).flatten(-2)\n",
                  "[torch.randn(3, 5, 12)]")
    comp = generated_matches(write_problem(src, "pairs_mem"), tmp_path, seeds=(0,))
    assert [g.kind for g in comp.plan.groups] == ["pointwise", "pointwise"]


def test_a_forward_with_math_of_a_shape_loads(write_problem, tmp_path):
    """fx wraps math.sqrt(x.shape[-1]) and writes a wrap() call into the forward's code; the
    emitted ModelNew must import (fx.wrap refuses to run below a module's top level)."""
    src = problem("x", "        return torch.tanh(x / math.sqrt(x.shape[-1])) * 2.0\n", "[torch.randn(6, 49)]")
    comp = generated_matches(write_problem(src, "wrapped"), tmp_path, seeds=(0,))
    assert "symbolic_trace.wrap" not in comp.emitted.source


def test_the_pair_rotation_needs_the_odd_columns_negated(write_problem):
    src = problem("q", "        return q * 2.0 + torch.stack((q[..., 1::2], -q[..., ::2]), dim=-1).flatten(-2)\n",
                  "[torch.randn(2, 7, 10)]")
    _plan, applied = plan_of(write_problem, src, "pairs_no")
    assert "rw-rotate-half" not in applied


COMPLEX_ROPE = HEAD + '''
def precompute_freqs_cis(dim, end, theta=10000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    return torch.polar(torch.ones(end, dim // 2), torch.outer(t, freqs).float())


def reshape_for_broadcast(freqs_cis, x):
    shape = [d if i == 1 or i == x.ndim - 1 else 1 for i, d in enumerate(x.shape)]
    return freqs_cis.view(*shape)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("freqs_cis", precompute_freqs_cis(8, 32), persistent=False)

    def forward(self, xq, xk):
        xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
        xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
        freqs_cis = reshape_for_broadcast(self.freqs_cis[: xq.shape[1]], xq_)
        xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
        xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
        return xq_out.type_as(xq), xk_out.type_as(xk){extra}


def get_inputs():
    return [torch.randn(2, 12, 4, 8, dtype={dtype}), torch.randn(2, 12, 2, 8, dtype={dtype})]


def get_init_inputs():
    return []
'''


@pytest.mark.parametrize("dtype", ["torch.float32", "torch.bfloat16"])
def test_rope_by_complex_numbers_is_one_kernel_per_tensor(dtype, write_problem):
    """Meta's Llama RoPE (view_as_complex of the pairs, times freqs_cis, view_as_real,
    flatten): one pointwise kernel per tensor (x * cos + rotate_pairs(x) * sin, the tables the
    buffer's real and imaginary parts, folded), no complex op left; a drop-in, including the
    layouts where view_as_complex raises (a transposed input: ModelNew raises too) and a call of
    another rank (Model's own code)."""
    from codegen.pipeline import compile_problem
    from tests.dropin import check_dropin

    src = COMPLEX_ROPE.replace("{extra}", "").replace("{dtype}", dtype)
    comp = compile_problem(load_problem(write_problem(src, "rope_complex")))
    assert [g.kind for g in comp.plan.groups] == ["pointwise", "pointwise"]
    targets = {getattr(n.target, "__name__", str(n.target)) for n in comp.plan.gm.graph.nodes}
    assert not targets & {"view_as_complex", "view_as_real"}
    tol = 1e-4 if dtype == "torch.float32" else 1e-2
    report = check_dropin(src, comp.emitted.source, calls=1, atol=tol, rtol=tol)
    assert report.fast("own") and {"transposed", "rank"} <= report.names()


def test_complex_products_read_elsewhere_stay_complex(write_problem):
    src = (COMPLEX_ROPE.replace("{dtype}", "torch.float32")
           .replace("{extra}", ", (xq_ * freqs_cis).abs()"))
    plan, _applied = plan_of(write_problem, src, "rope_complex_kept")
    assert any(n.op == "call_function" and n.target is torch.view_as_complex for n in plan.gm.graph.nodes)


# ---------------------------------------------------------------------- canonical forms
def canonical_ops(write_problem, src: str, name: str) -> list[str]:
    cap = capture(load_problem(write_problem(src, name)))
    assert cap.gm is not None, cap.error
    RW.canonicalize(cap.gm, cap.inputs)
    return [getattr(n.target, "__name__", str(n.target)) for n in cap.gm.graph.nodes
            if n.op in ("call_function", "call_method")]


@pytest.mark.parametrize("body,want,not_want", [
    ("        return x.sum(-1) / x.shape[-1]\n", "mean", "sum"),
    ("        return x.sum(1, keepdim=True) * 0.125\n", "mean", "sum"),
    ("        return x.sum(-1) / 7.0\n", "sum", "mean"),  # 8 values summed, not 7
    ("        return x.mean(-1).unsqueeze(-1) + x\n", "mean", "unsqueeze"),
    ("        return x.amax(1)[:, None, :] - x\n", "amax", "getitem"),
    ("        return x.mean(1).unsqueeze(0)\n", "unsqueeze", None),  # not where the dim was
    ("        return x / torch.sqrt(x.abs() + 1.0), 1.0 / torch.sqrt(x.abs() + 1.0)\n", "rsqrt", None),
    ("        return torch.sqrt(x.abs() + 1.0).reciprocal() + (x.abs() + 2.0) ** -0.5\n", "rsqrt", "sqrt"),
    ("        return 2.0 / torch.sqrt(x.abs() + 1.0)\n", "sqrt", "rsqrt"),
])
def test_canonical_forms_of_reductions_and_rsqrt(body, want, not_want, write_problem):
    ops = canonical_ops(write_problem, problem("x", body, "[torch.randn(3, 8, 8)]"), "canon")
    assert want in ops, ops
    if not_want:
        assert not_want not in ops, ops


@pytest.mark.parametrize("body,dropped", [
    ("        return h * w.float()\n", True),
    ("        return (w.float() + h) * 0.5\n", True),
    ("        return w.float() * 2.0\n", False),  # the result would be bf16 without the cast
    ("        return h[0, 0] * w.float()\n", False),  # a 0-dim fp32 operand: bf16 result
    ("        return w.float()\n", False),  # the cast is the output
])
def test_redundant_upcasts(body, dropped, write_problem):
    src = problem("h, w", body, f"[torch.randn(4, 16), torch.randn(16, {BF})]")
    ops = canonical_ops(write_problem, src, "upcast")
    assert ("float" not in ops) is dropped, ops


@pytest.mark.parametrize("body,kind", [
    # Hugging Face's eager attention and MoE routers: softmax in fp32 by dtype=
    ("        return torch.nn.functional.softmax(s, dim=-1, dtype=torch.float32).to(s.dtype)\n", "softmax"),
    ("        return torch.softmax(s, -1, torch.float32)\n", "softmax"),  # dtype by position
    ("        return s.softmax(-1, dtype=torch.float32)\n", "softmax"),
    ("        return torch.log_softmax(s, dim=1, dtype=torch.float32)\n", "softmax"),
    ("        return s.sum(-1, dtype=torch.float32)\n", "reduction"),
    ("        return torch.mean(s, (1,), keepdim=True, dtype=torch.float32) + 1.0\n", "reduction"),
])
def test_reductions_with_dtype_cast_first(body, kind, write_problem, tmp_path):
    """``op(x, ..., dtype=D)`` casts x to D before the op (PyTorch's semantics): the canonical
    form writes the cast out and the op gets its template (it was left to torch); the result
    has D's dtype and eager's values."""
    src = problem("s", body, f"[torch.randn(6, 40, {BF}) * 4]")
    plan, _applied = plan_of(write_problem, src, "dtype_first")
    assert kind in [g.kind for g in plan.groups], plan.groups
    comp = generated_matches(write_problem(src, "dtype_first"), tmp_path, atol=1e-5, rtol=1e-5)
    assert comp.emitted.kernels


def test_hf_eager_attention_with_softmax_dtype_is_attention(write_problem):
    """Hugging Face's eager_attention_forward without a mask: matmul * scaling, softmax(dim=-1,
    dtype=torch.float32).to(q.dtype), matmul: one attention kernel."""
    body = ("        w = torch.matmul(q, k.transpose(2, 3)) * 0.25\n"
            "        w = nn.functional.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)\n"
            "        return torch.matmul(w, v).transpose(1, 2).contiguous()\n")
    src = problem("q, k, v", body, f"[torch.randn(2, 4, 8, 16, {BF}) for _ in range(3)]")
    plan, applied = plan_of(write_problem, src, "hf_eager")
    assert [g.kind for g in plan.groups if g.kind != "library"][:1] == ["attention"], plan.groups
    assert "rw-attention" in applied


NANOGPT_LN = (HEAD + "import torch.nn.functional as F\n"
              "class LayerNorm(nn.Module):\n"
              "    def __init__(self, ndim, bias):\n"
              "        super().__init__()\n"
              "        self.weight = nn.Parameter(torch.ones(ndim))\n"
              "        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None\n"
              "    def forward(self, input):\n"
              "        return F.layer_norm(input, {shape}, self.weight, self.bias, 1e-5)\n"
              "class Model(nn.Module):\n"
              "    def __init__(self):\n"
              "        super().__init__()\n"
              "        self.ln = LayerNorm(48, bias={bias})\n"
              "    def forward(self, x):\n"
              "        return self.ln(x) * 2.0 + 1.0\n"
              "def get_inputs():\n    return [torch.randn(2, 5, 48)]\n"
              "def get_init_inputs():\n    return []\n")


@pytest.mark.parametrize("bias", [False, True])
def test_nanogpt_layer_norm_by_the_weights_shape(bias, write_problem, tmp_path):
    """nanoGPT's LayerNorm passes ``self.weight.shape`` as normalized_shape (a shape read in
    forward: the planner failed on it and the whole program kept the reference): a parameter's
    shape is a constant, so it is one norm kernel; a drop-in."""
    from codegen.pipeline import compile_problem
    from tests.dropin import check_dropin

    src = NANOGPT_LN.format(shape="self.weight.shape", bias=bias)
    plan, _applied = plan_of(write_problem, src, "nanogpt_ln")
    assert [g.kind for g in plan.groups] == ["norm"]
    generated_matches(write_problem(src, "nanogpt_ln"), tmp_path)
    comp = compile_problem(load_problem(write_problem(src, "nanogpt_ln")))
    assert check_dropin(src, comp.emitted.source, calls=1).fast("own")


def test_layer_norm_by_an_inputs_shape(write_problem, tmp_path):
    """``F.layer_norm(x, x.shape[-1:], ...)``: the input's last dim, whatever its size; the file
    holds the traced size, and the drop-in guard fixes that dim (another width takes Model's
    ops, where torch raises on the weight's size as Model does). One norm kernel; a drop-in."""
    src = NANOGPT_LN.format(shape="input.shape[-1:]", bias=True)
    plan, _applied = plan_of(write_problem, src, "input_ln")
    assert "norm" in [g.kind for g in plan.groups]
    generated_matches(write_problem(src, "input_ln"), tmp_path)
    comp = compile_problem(load_problem(write_problem(src, "input_ln")))
    assert check_dropin(src, comp.emitted.source, calls=1).fast("own")


# ------------------------------------------------------------------------------ decode GEMV
def test_decode_gemv_is_a_split_k_kernel_and_matches_torch(write_problem, tmp_path):
    """A few decoding rows against a large bf16 weight (alg-decode-gemv): the template's 16-row
    split-K tiles, the partials summed by its second kernel."""
    src = problem("x", "        return self.fc(x)\n", f"[torch.randn(3, 4096, {BF})]",
                  members="        self.fc = nn.Linear(4096, 1100, bias=False, dtype=torch.bfloat16)\n")
    cfg = {"g0": {"BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 128, "SPLIT_K": 4}}
    comp = generated_matches(write_problem(src, "gemv"), tmp_path, seeds=(0,), atol=1e-2, rtol=1e-2,
                             configs=cfg, launched=("_egg_k_g0", "_egg_k_g0_sum"))
    assert [g.kind for g in comp.plan.groups] == ["matmul"]


@pytest.mark.parametrize("rows,width", [(17, 4096), (3, 512)])
def test_other_sixteen_bit_products_alone_stay_cublas(rows, width, write_problem):
    src = problem("x", "        return self.fc(x)\n", f"[torch.randn({rows}, {width}, {BF})]",
                  members=f"        self.fc = nn.Linear({width}, 1100, bias=False, dtype=torch.bfloat16)\n")
    plan, _applied = plan_of(write_problem, src, "not_gemv")
    assert not plan.groups
