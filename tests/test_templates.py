"""Every kernel template against torch on irregular shapes, several seeds, in the interpreter.

Each case is a small problem whose generated ModelNew must use the template under test; the
configurations are forced where a template has several mappings (rows/cols, one-pass/split)."""
import pytest
import torch
import triton
import triton.language as tl

from knowledge.templates._runtime import _egg_fdiv, _egg_magic, _egg_tanh
from tests.helpers import generated_matches

HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"


def problem(forward: str, inputs: str, init: str = "[]", members: str = "") -> str:
    return (HEAD + "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            + (members or "        pass\n") + f"    def forward(self, {forward}\n"
            + f"def get_inputs():\n    return {inputs}\n" + f"def get_init_inputs():\n    return {init}\n")


CASES = {
    # template, problem source, forced configs (by group id) or None
    "pointwise_1823x781": ("pointwise", problem(
        "x, b):\n        return F.gelu(x * 0.7 + b) - torch.sigmoid(x).clamp(0.2, 0.8)\n",
        "[torch.randn(1823, 781), torch.randn(781)]"), None),
    "reduction_rows": ("reduction", problem(
        "x):\n        return torch.sum(x * x, dim=1) * 0.5, torch.argmax(x, dim=-1)\n",
        "[torch.randn(523, 781)]"), None),
    "reduction_cols": ("reduction", problem(
        "x):\n        return torch.mean(x, dim=0), torch.amin(x, dim=0), torch.argmin(x, dim=0)\n",
        "[torch.randn(1823, 781)]"), None),
    "reduction_prod": ("reduction", problem(
        "x):\n        return torch.prod(x * 0.2 + 0.9, dim=1), torch.prod(x + 0.5, 0, keepdim=True)\n",
        "[torch.rand(183, 57)]"), None),
    "reduction_split": ("reduction", problem(
        "x, y):\n        return torch.mean((x - y) ** 2)\n",
        "[torch.rand(1823, 781), torch.rand(1823, 781)]"), {"g0": {"SPLIT_CHUNK": 65536, "BLOCK_R": 1024}}),
    "reduction_cols_split": ("reduction", problem(
        "x):\n        return torch.sum(torch.tanh(x) + 1.0, dim=1) * 0.5, torch.amax(x, dim=(1, 2), keepdim=True)\n",
        "[torch.randn(3, 517, 45, 3)]"),
        {"g0": {"SPLIT_CHUNK": 128, "BLOCK_R": 32, "BLOCK_I": 16}, "g1": {"SPLIT_CHUNK": 2048, "BLOCK_R": 64, "BLOCK_I": 4}}),
    # a weight per reduced index (inner stride 0: loaded once per index, Z1) next to an input
    # that varies along the inner dims (Z0 false), with and without the split mapping
    "reduction_cols_row_weights": ("reduction", problem(
        "x, w):\n        return torch.sum(x * w - x, dim=1)\n",
        "[torch.randn(3, 37, 45, 2), torch.randn(3, 37, 1, 1)]"), {"g0": {"BLOCK_R": 8, "BLOCK_I": 32}}),
    "reduction_cols_row_weights_split": ("reduction", problem(
        "x, w):\n        return torch.sum(x * w - x, dim=1)\n",
        "[torch.randn(3, 37, 45, 2), torch.randn(3, 37, 1, 1)]"),
        {"g0": {"SPLIT_CHUNK": 16, "BLOCK_R": 8, "BLOCK_I": 32}}),
    "softmax_one_pass": ("softmax", problem(
        "x):\n        return torch.softmax(x, dim=-1), torch.log_softmax(x, dim=1)\n",
        "[torch.randn(223, 781)]"), None),
    "softmax_two_pass": ("softmax", problem(
        "x):\n        return torch.softmax(x * 3.0, dim=-1)\n", "[torch.randn(37, 9001)]"),
        {"g0": {"ONE_PASS_MAX": 1024, "BLOCK_R": 1024}}),
    # few long rows cut into chunks (tile-split-rows): partials, then the rows combined; a row
    # whose first chunks are all -inf (their partial max is -inf, their sum 0)
    "softmax_split_rows": ("softmax", problem(
        "x, y):\n        return (torch.softmax(x.float() / 0.7, dim=-1), torch.log_softmax(x * 2.0, dim=1),\n"
        "                torch.softmax(y, dim=-1))\n",
        "[torch.randn(3, 9001), torch.cat([torch.full((2, 5000), float('-inf')), torch.randn(2, 3001)], 1)]"),
        {g: {"ONE_PASS_MAX": 1024, "BLOCK_R": 512, "SPLIT_CHUNK": 2048} for g in ("g0", "g1", "g2")}),
    # reductions read back over their reduced dims (alg-reduce-broadcast): columns (a mean of
    # squares over channels), rows over two dims, and both mappings in two passes
    "broadcast_reduction": ("softmax", problem(
        "x, y):\n        return (x / torch.sqrt(torch.mean(x ** 2, dim=1, keepdim=True) + 1e-5),\n"
        "                torch.exp(y - torch.amax(y, dim=(2, 3), keepdim=True)) * 0.5)\n",
        "[torch.rand(2, 7, 40, 30) + 0.1, torch.randn(33, 37, 5, 7)]"), None),
    "broadcast_reduction_two_pass": ("softmax", problem(
        "x, w, y):\n        return F.normalize(x, dim=-1) * w, y / y.abs().sum(1, keepdim=True)\n",
        "[torch.randn(1100, 781), torch.randn(781), torch.randn(3, 300, 347)]"),
        {"g0": {"ONE_PASS_MAX": 256, "BLOCK_R": 128, "BLOCK_O": 2},
         "g1": {"ONE_PASS_MAX": 64, "BLOCK_R": 64, "BLOCK_I": 16}}),
    "layer_norm_one": ("norm", problem(
        "x):\n        return F.relu(self.ln(x))\n", "[torch.randn(223, 781) * 2 + 1]",
        members="        self.ln = nn.LayerNorm(781)\n"), None),
    "layer_norm_split": ("norm", problem(
        "x):\n        return self.ln(x) * 2.0\n", "[torch.rand(2, 1823, 3) * 5 + 2]",
        members="        self.ln = nn.LayerNorm((1823, 3))\n"), {"g0": {"ONE_MAX": 1024, "SPLIT_CHUNK": 4096}}),
    "layer_norm_row_inputs": ("norm", problem(
        "x, b, s):\n        return F.gelu(self.ln(x + b)) * s\n",
        "[torch.randn(4, 6, 5, 37), torch.randn(6, 1, 1), torch.randn(4, 6, 1, 1)]",
        members="        self.ln = nn.LayerNorm(37)\n"), None),
    "layer_norm_row_inputs_split": ("norm", problem(
        "x, b):\n        return self.ln(x - b) * 3.0\n",
        "[torch.randn(4, 6, 5, 37), torch.randn(4, 1, 5, 1)]",
        members="        self.ln = nn.LayerNorm(37)\n"), {"g0": {"ONE_MAX": 16, "BLOCK": 16, "SPLIT_CHUNK": 16}}),
    "group_norm": ("norm", problem(
        "x):\n        return self.gn(torch.tanh(x))\n", "[torch.randn(3, 12, 29, 31)]",
        members="        self.gn = nn.GroupNorm(4, 12)\n"), None),
    "instance_norm_rms": ("norm", problem(
        "x):\n        return self.inorm(x) - 1.0, self.rms(x)\n", "[torch.randn(2, 5, 23, 37)]",
        members="        self.inorm = nn.InstanceNorm2d(5, affine=True)\n        self.rms = nn.RMSNorm(37)\n"), None),
    "pool_max_1d": ("pool", problem(
        "x):\n        return self.p(x) * 2.0\n", "[torch.randn(4, 7, 1823)]",
        members="        self.p = nn.MaxPool1d(8, stride=1, padding=4, dilation=3)\n"), None),
    "pool_avg_2d_3d": ("pool", problem(
        "x, y):\n        return F.avg_pool2d(x, 3, 2, 1), self.p(y)\n",
        "[torch.randn(2, 3, 37, 29), torch.randn(2, 3, 9, 10, 11)]",
        members="        self.p = nn.AvgPool3d(2, ceil_mode=True, count_include_pad=False)\n"), None),
    # output rows of 7 (a prologue and a broadcast epilogue), 33 and 1000 split across blocks of
    # 256: the output index divided by its magic numbers (_egg_fdiv)
    "pool_tiles": ("pool", problem(
        "x, y, z):\n        return (torch.relu(F.max_pool2d(x * 0.5 - 1.0, 3, 2) + self.b),\n"
        "                F.avg_pool1d(y, 3, 2), F.max_pool1d(z, 4, 2, 1))\n",
        "[torch.randn(2, 5, 15, 16), torch.randn(2, 3, 67), torch.randn(1, 3, 2000)]",
        members="        self.b = nn.Parameter(torch.randn(5, 1, 7))\n"),
        {g: {"BLOCK": 256} for g in ("g0", "g1", "g2")}),
    # fp32 products run as 3xTF32 on tensor cores: the interpreter computes them exactly
    "matmul_linear_epilogue": ("matmul", problem(
        "x, r):\n        return F.gelu(self.fc(x)) * 0.5 + r\n",
        "[torch.randn(183, 71), torch.randn(1, 97)]",
        members="        self.fc = nn.Linear(71, 97)\n"), {"g0": {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 16}}),
    "matmul_batched_transposed": ("matmul", problem(
        "a, b):\n        return torch.relu(torch.matmul(a, b.transpose(-2, -1))), torch.bmm(a[0], b[0].transpose(1, 2)) * 2.0\n",
        "[torch.randn(2, 3, 45, 37), torch.randn(2, 3, 29, 37)]"), {"g0": {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16}}),
    "matmul_split_k": ("matmul", problem(
        "x, r):\n        return torch.relu(self.fc(x)) + r\n",
        "[torch.randn(37, 301), torch.randn(37, 45)]",
        members="        self.fc = nn.Linear(301, 45)\n"),
        {"g0": {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16, "SPLIT_K": 4}}),
    "matmul_folded_rows": ("matmul", problem(
        "x, w):\n        return torch.tanh(x @ w), (x @ w.t()[:37]).sum(), torch.mm(w.t(), w)\n",
        "[torch.randn(3, 41, 37), torch.randn(37, 53)]"), None),
    # batch norm in training mode: per-channel statistics, then the fused normalization
    "chanstats_spatial": ("chanstats", problem(
        "x):\n        return torch.relu(self.bn(x))\n", "[torch.randn(5, 7, 13, 11) * 3 + 1]",
        members="        self.bn = nn.BatchNorm2d(7)\n"), {"g0": {"SPLITS": 2}}),
    "chanstats_rows": ("chanstats", problem(
        "x):\n        return self.bn(x) * 2.0\n", "[torch.randn(183, 97) * 3 + 1]",
        members="        self.bn = nn.BatchNorm1d(97)\n"), {"g0": {"SPLITS": 4, "BLOCK": 512}}),
    # the chain before the statistics recomputed inside them (2 full-size reads, a per-channel
    # bias, a scalar) and again in the normalization: no write of the chain's value
    "chanstats_recomputed_chain": ("chanstats", problem(
        "x, y, b):\n        return self.bn(F.softplus(x + b) * 0.5 - y)\n",
        "[torch.randn(5, 7, 13, 11) * 3 + 1, torch.randn(5, 7, 13, 11), torch.randn(7, 1, 1)]",
        members="        self.bn = nn.BatchNorm2d(7)\n"), {"g1": {"SPLITS": 2}}),
    "chanstats_rows_recomputed_chain": ("chanstats", problem(
        "x):\n        return self.bn(torch.tanh(x) * self.s)\n", "[torch.randn(183, 97) * 3 + 1]",
        members="        self.bn = nn.BatchNorm1d(97)\n        self.s = nn.Parameter(torch.tensor(1.7))\n"),
        {"g1": {"SPLITS": 4, "BLOCK": 512}}),
    # fp32 flash attention (the flash mapping forced: DECODE_ROWS 16): irregular sequence
    # lengths (blocks cut at both edges), causal with more queries than keys, grouped-query
    # heads, 3-d operands and a head dim of 40
    "attention": ("attention", problem(
        "q, k, v, q3, k3):\n        return (F.scaled_dot_product_attention(q, k, v),\n"
        "                F.scaled_dot_product_attention(q, k[:, :, :29], v[:, :, :29], is_causal=True, scale=0.3),\n"
        "                F.scaled_dot_product_attention(q, k[:, :2], v[:, :2], enable_gqa=True),\n"
        "                F.scaled_dot_product_attention(q3, k3, k3))\n",
        "[torch.randn(2, 4, 37, 40), torch.randn(2, 4, 45, 40), torch.randn(2, 4, 45, 40), "
        "torch.randn(3, 19, 16), torch.randn(3, 23, 16)]"),
        {g: {"BLOCK_M": 16, "BLOCK_N": 16, "DECODE_ROWS": 16} for g in ("g0", "g1", "g2", "g3")}),
    # LM head + cross-entropy, the fused product (the chunked cuBLAS mapping is stage 1's)
    "linear_ce": ("linear_ce", problem(
        "h, t):\n        return F.cross_entropy(self.fc(h).float(), t, ignore_index=3)\n",
        "[torch.randn(45, 37), torch.randint(0, 301, (45,))]",
        members="        self.fc = nn.Linear(37, 301)\n"),
        {"g0": {"MODE": 1, "BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 16}}),
    "scan": ("scan", problem(
        "x):\n        return torch.cumsum(x.flip(1), 1).flip(1), torch.cumsum(x, dim=-1)\n",
        "[torch.rand(183, 781)]"), None),
    "scan_exclusive": ("scan", problem(
        "x):\n        c = torch.cumsum((x * 2.0).narrow(1, 0, x.size(1) - 1), dim=1)\n"
        "        p = (x * 0.1 + 0.95)[:, :-1].cumprod(1)\n"
        "        return (torch.cat((torch.zeros_like(x[:, :1]), c), 1),\n"
        "                torch.cat((torch.ones_like(x[:, :1]), p), 1) - 1.0)\n",
        "[torch.rand(37, 781)]"), {"g0": {"BLOCK_R": 64}, "g1": {"BLOCK_R": 128, "BLOCK_O": 2}}),
}


#: kernels a case's forced configuration must run (the split mappings)
LAUNCHED = {"reduction_split": ("_egg_k_g0_part", "_egg_k_g0_fin"),
            "reduction_cols_row_weights_split": ("_egg_k_g0_part", "_egg_k_g0_fin"),
            "reduction_cols_split": ("_egg_k_g0_part", "_egg_k_g0_fin", "_egg_k_g1_part", "_egg_k_g1_fin"),
            "layer_norm_split": ("_egg_k_g0_stats", "_egg_k_g0_apply"),
            "layer_norm_row_inputs_split": ("_egg_k_g0_stats", "_egg_k_g0_apply")}
#: cases planned as one kernel: every pointwise op is the norm's prologue or epilogue
ONE_GROUP = {"layer_norm_row_inputs", "layer_norm_row_inputs_split"}
#: cases planned as exactly these kernels (kind, number of prologue ops)
KERNELS = {"chanstats_recomputed_chain": [("chanstats", 4), ("pointwise", 0)],
           "chanstats_rows_recomputed_chain": [("chanstats", 2), ("pointwise", 0)],
           # the cat((identity, scan of the leading slice)) forms: two scans, no cat, no copy
           "scan_exclusive": [("scan", 1), ("scan", 2)],
           # one kernel per reduction and everything after it: the reduced value is not written
           "broadcast_reduction": [("softmax", 0), ("softmax", 1)],
           "broadcast_reduction_two_pass": [("softmax", 1), ("softmax", 1)]}


@pytest.mark.parametrize("name", sorted(CASES))
def test_template_matches_torch(name, write_problem, tmp_path):
    template, src, configs = CASES[name]
    comp = generated_matches(write_problem(src, name), tmp_path, seeds=(0, 1), configs=configs,
                             launched=LAUNCHED.get(name, ()))
    assert template in {g.kind for g in comp.plan.groups}
    if name in ONE_GROUP:
        assert len(comp.plan.groups) == 1, [g.kind for g in comp.plan.groups]
    if name in KERNELS:
        assert sorted((g.kind, len(g.prologue())) for g in comp.plan.groups) == KERNELS[name]


def test_softmax_of_few_long_rows_splits_them_into_chunks(write_problem, tmp_path):
    """Rows longer than SPLIT_CHUNK: two launches of the kernel (partials, then the rows
    combined), one program per (row, chunk) each; shorter rows or the default config: one launch
    of one program per row. The heuristic splits 64 rows of a 128k vocabulary, not 4096 rows."""
    from harness.problem import load_module
    from knowledge.heuristics import softmax_config

    _t, src, configs = CASES["softmax_split_rows"]
    generated_matches(write_problem(src, "split"), tmp_path, seeds=(0,), configs=configs)
    mod = load_module(tmp_path / "cand_split.py", "candidate_split")
    launches = []
    for g in ("g0", "g1", "g2"):
        kernel = getattr(mod, f"_egg_k_{g}")
        setattr(mod, f"_egg_k_{g}", type("L", (), {"__getitem__": lambda self, grid, n=g, k=kernel: (
            lambda *a, **kw: (launches.append((n, grid[0], kw["PHASE"], kw["SPLITS"])), k[grid](*a, **kw)))})())
    with torch.no_grad():
        mod.ModelNew()(torch.randn(3, 9001), torch.randn(2, 2000))
    # 9001 -> chunks of 2048: 5 per row; 2000 fits one chunk: one launch, a program per row
    assert launches == [("g0", 15, 1, 5), ("g0", 15, 2, 5), ("g1", 15, 1, 5), ("g1", 15, 2, 5),
                        ("g2", 2, 0, 1)]
    few, many = softmax_config(64, 128256, 1, True, 132), softmax_config(4096, 128256, 1, True, 132)
    assert 128256 > few["SPLIT_CHUNK"] >= 4 * few["BLOCK_R"] and many["SPLIT_CHUNK"] > 128256


def test_gpu_templates_script_casts_a_case_and_verifies_it(tmp_path):
    """scripts/gpu_templates.py (bf16 on the GPU for issue 5) on one case, in the interpreter."""
    from tests.helpers import load_script

    mod = load_script("scripts/gpu_templates.py")
    r = mod.run_case("group_norm", "bfloat16", "cpu", 1, tmp_path)
    assert r["ok"], r["why"]
    r = mod.run_case("attention", "bfloat16", "cpu", 1, tmp_path)  # tensor cores in 16-bit too
    assert r["ok"] and r["dtype"] == "bfloat16", r["why"]
    assert "torch.bfloat16" in (tmp_path / "group_norm.py").read_text()


def test_batch_norm_bookkeeping_matches_the_module_with_a_recomputed_chain(write_problem, tmp_path):
    """Training-mode batch norm after a chain the statistics recompute: the running statistics
    and the batch count after two calls equal nn.BatchNorm2d's (the bookkeeping gets the count
    per channel, not the chain's value)."""
    import torch

    from harness.problem import load_module, load_problem

    _t, src, configs = CASES["chanstats_recomputed_chain"]
    path = write_problem(src, "bn_book")
    comp = generated_matches(path, tmp_path, seeds=(0,), configs=configs)
    cand = tmp_path / "bn_book_new.py"
    cand.write_text(comp.emitted.source)
    prob, mod = load_problem(path), load_module(cand, "candidate")
    torch.manual_seed(0)
    ref, new = prob.Model(), mod.ModelNew()
    for _ in range(2):
        ins = prob.inputs()
        with torch.no_grad():
            ref(*ins), new(*ins)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(new.bn, name), getattr(ref.bn, name), atol=1e-5, rtol=1e-5)


#: rows that are all negative or all positive, of lengths that are not powers of two: a masked
#: lane filled with 0 instead of the op's identity (-inf for max, +inf for min) changes the
#: answer only on such rows (randn rows nearly always hold both signs)
NEG_POS = "[-torch.rand({s}) - 0.5, torch.rand({s}) + 0.5]"
EXTREMES = {
    # rows mapping: 781 = one full 512-wide tile and a masked one; 13 rows = a masked row block
    "reduction_rows": (problem(
        "x, y):\n        return (torch.amax(x, dim=1), torch.amin(y, dim=1), torch.argmax(x, dim=1),\n"
        "                torch.argmin(y, dim=1), x.max(dim=-1)[0], y.min(dim=-1).values)\n",
        NEG_POS.format(s="13, 781")), None, ()),
    # columns mapping (the reduced dim is not innermost): 45 inner columns, a masked column block
    "reduction_cols": (problem(
        "x, y):\n        return (torch.amax(x, dim=1), torch.amin(y, dim=1), torch.argmax(x, dim=1),\n"
        "                torch.argmin(y, dim=1))\n",
        NEG_POS.format(s="3, 301, 45")), None, ()),
    # the split mapping (partials, then a merge that loads the partials with the identity too)
    "reduction_split": (problem(
        "x, y):\n        return torch.amax(x), torch.amin(y)\n", NEG_POS.format(s="7, 301")),
        {"g0": {"SPLIT_CHUNK": 512, "BLOCK_R": 256}, "g1": {"SPLIT_CHUNK": 512, "BLOCK_R": 256}},
        ("_egg_k_g0_part", "_egg_k_g0_fin", "_egg_k_g1_part", "_egg_k_g1_fin")),
    # arg-reductions split (a greedy token over a vocabulary: few long rows): partial extremes
    # and their indices per chunk, merged to the first index holding the extreme; rows (x) and
    # columns (y) mappings, one sign per row
    "arg_split": (problem(
        "x, y):\n        return torch.argmax(x, dim=1), torch.argmin(y, dim=1)\n",
        "[-torch.rand(7, 301) - 0.5, torch.rand(5, 301, 9) + 0.5]"),
        {"g0": {"SPLIT_CHUNK": 64, "BLOCK_R": 32}, "g1": {"SPLIT_CHUNK": 64, "BLOCK_R": 32, "BLOCK_I": 8}},
        ("_egg_k_g0_part", "_egg_k_g0_fin", "_egg_k_g1_part", "_egg_k_g1_fin")),
    # ... with ties across chunks (three values: the first index wins, not the first chunk's
    # own lowest nor the last) and NaNs, which torch takes as the extreme (the first NaN)
    "arg_split_ties_nan": (problem(
        "x, y):\n        return torch.argmax(x, dim=1), torch.argmin(y, dim=1), x.max(dim=1)[0]\n",
        "[torch.randint(0, 3, (9, 301)).float().masked_fill(torch.rand(9, 301) < 0.004, float('nan')), "
        "torch.randint(0, 3, (5, 301, 9)).float()]"),
        {"g0": {"SPLIT_CHUNK": 64, "BLOCK_R": 32}, "g1": {"SPLIT_CHUNK": 64, "BLOCK_R": 32, "BLOCK_I": 8}},
        ("_egg_k_g0_part", "_egg_k_g0_fin", "_egg_k_g1_part", "_egg_k_g1_fin")),
    # reductions broadcast back over their rows (softmax template; 1024 rows so that the plan
    # fuses them): one pass with masked lanes (37 of 64), then two passes (tiles of 16: the
    # running value starts at the identity)
    "broadcast_one_pass": (problem(
        "x, y):\n        return x - torch.amax(x, dim=-1, keepdim=True), y - torch.amin(y, dim=-1, keepdim=True)\n",
        NEG_POS.format(s="1024, 37")), {"g0": {"BLOCK_O": 64}, "g1": {"BLOCK_O": 64}}, ()),
    "broadcast_two_pass": (problem(
        "x, y):\n        return x / torch.amax(x, dim=-1, keepdim=True), y / torch.amin(y, dim=-1, keepdim=True)\n",
        NEG_POS.format(s="1024, 37")),
        {g: {"ONE_PASS_MAX": 256, "BLOCK_R": 16, "BLOCK_O": 64} for g in ("g0", "g1")}, ()),
    # logsumexp's running max starts at -inf too (a masked lane must add exp(-inf) = 0)
    "logsumexp_rows": (problem(
        "x, y):\n        return torch.logsumexp(x, dim=1), torch.logsumexp(y * 3.0, dim=-1)\n",
        NEG_POS.format(s="13, 781")), None, ()),
    # max pooling whose windows reach into the padding (-inf there, not 0)
    "pool_max_padded": (problem(
        "x):\n        return self.p(x)\n", "[-torch.rand(2, 3, 37) - 0.5]",
        members="        self.p = nn.MaxPool1d(5, stride=2, padding=2)\n"), None, ()),
}
EXTREME_KINDS = {"reduction_rows": "reduction", "reduction_cols": "reduction", "reduction_split": "reduction",
                 "arg_split": "reduction", "arg_split_ties_nan": "reduction",
                 "logsumexp_rows": "reduction", "broadcast_one_pass": "softmax",
                 "broadcast_two_pass": "softmax", "pool_max_padded": "pool"}
#: max/min are exact; a logsumexp sums exponentials in another order than torch
EXTREME_TOL = {"logsumexp_rows": 1e-5}


@pytest.mark.parametrize("name", sorted(EXTREMES))
def test_max_min_of_all_negative_and_all_positive_rows(name, write_problem, tmp_path):
    """max/min and arg-max/min (their broadcast and pooled forms, and logsumexp's running max)
    on rows of one sign at non-power-of-two lengths: exact, in every mapping."""
    src, configs, launched = EXTREMES[name]
    tol = EXTREME_TOL.get(name, 0.0)
    comp = generated_matches(write_problem(src, f"ext_{name}"), tmp_path, seeds=(0,), configs=configs,
                             launched=launched, atol=tol, rtol=tol)
    assert {g.kind for g in comp.plan.groups} == {EXTREME_KINDS[name]}


@triton.jit
def _tanh_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    tl.store(y_ptr + o, _egg_tanh(tl.load(x_ptr + o, mask=m)), mask=m)


def test_runtime_tanh_keeps_relative_precision_near_zero():
    """_egg_tanh (the generated kernels' tanh, GELU-tanh and Mish) holds a few ulps of relative
    error from 1e-8 to 20 and for both signs: the exp form alone cancels below |x| ~ 0.3 (1e-4:
    3e-4 relative), which the lower-precision guard catches on small inputs."""
    mag = torch.logspace(-8, 1.3, 2000, dtype=torch.float64)
    x = torch.cat([mag, -mag, torch.tensor([0.0, 0.2999, 0.3, 0.3001], dtype=torch.float64)]).float()
    y = torch.empty_like(x)
    _tanh_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    ref = torch.tanh(x.double())
    rel = ((y.double() - ref).abs() / ref.abs().clamp_min(1e-30))
    assert y[x == 0].eq(0).all()
    assert rel[x != 0].max().item() < 4 * torch.finfo(torch.float32).eps, rel.max().item()


def test_wrappers_compute_launch_sizes_in_plain_python():
    """The host code the templates write sizes grids with _egg_cdiv / _egg_pow2, not triton.cdiv /
    triton.next_power_of_2: since triton 3.5 those are constexpr functions, ~2.5 us a call on
    the CPU machine, several per launch (a bf16 softmax's kernel path: 46 -> 17 us a call with
    its kernel stubbed). The helpers give triton's values."""
    import ast
    import pathlib

    from knowledge.templates._runtime import _egg_cdiv, _egg_pow2

    folder = pathlib.Path(__file__).resolve().parent.parent / "knowledge" / "templates"
    for f in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert "triton.cdiv(" not in node.value and "triton.next_power_of_2(" not in node.value, f.name
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "triton":
                assert node.attr not in ("cdiv", "next_power_of_2"), (f.name, node.lineno)
    for n in list(range(0, 2100)) + [2**31 - 1, 2**31, 2**40 + 3]:
        assert _egg_pow2(n) == triton.next_power_of_2(n), n
        for d in (1, 3, 64, 1024):
            assert _egg_cdiv(n, d) == triton.cdiv(n, d), (n, d)




@triton.jit
def _fdiv_kernel(X, Y, d, m, s, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + o, _egg_fdiv(tl.load(X + o), d, m, s))


def test_magic_division_matches_floor_division():
    """_egg_fdiv(n, d, *_egg_magic(d)) == n // d for int32 0 <= n < 2**31: divisors 1 (the
    special case), powers of two, their neighbours, primes and the largest int32, numerators at
    0, multiples of d and their neighbours, and the top of the range."""
    g = torch.Generator().manual_seed(0)
    for d in (1, 2, 3, 7, 56, 64, 65, 4095, 65523, 2**20 + 7, 12345678, 2**30, 2**31 - 1):
        edge = [0, 1, d - 1, d, d + 1, 2 * d - 1, 2 * d, 2**31 - 1, 2**31 - 2, 2**31 - d]
        xs = torch.cat([torch.tensor([v for v in edge if 0 <= v < 2**31]),
                        torch.randint(0, 2**31 - 1, (500,), generator=g)]).to(torch.int32)
        xs = torch.cat([xs, xs[: -xs.numel() % 64]]) if xs.numel() % 64 else xs
        y = torch.empty_like(xs)
        _fdiv_kernel[(xs.numel() // 64,)](xs, y, d, *_egg_magic(d), BLOCK=64)
        assert torch.equal(y.long(), xs.long() // d), d


def test_a_weight_per_reduced_index_serves_calls_as_the_module_does(write_problem, tmp_path):
    """The columns walk's weight per reduced index (reduction_cols_row_weights_split) as a user
    calls the module (tests/dropin.check_dropin: other batches, eval mode, a permuted input, one
    more leading dim...). With one more leading dim the weight (B, R, C, 1, 1) is broadcast along
    some inner dims and not others: its strides do not collapse, and the wrapper raised 'reduction
    layout ... not supported' where Model answers; it is now read from a copy at the domain's
    shape."""
    from codegen.pipeline import compile_problem
    from harness.problem import load_problem
    from tests.dropin import check_dropin

    _t, src, configs = CASES["reduction_cols_row_weights_split"]
    comp = compile_problem(load_problem(write_problem(src, "row_w_dropin")), configs=configs)
    rep = check_dropin(src, comp.emitted.source, calls=1, atol=1e-4, rtol=1e-4)
    assert any(t.name == "rank" and t.fast for t in rep.trials), rep.trials


def test_a_split_argmax_serves_calls_as_the_module_does(write_problem, tmp_path):
    """The split arg-reductions (arg_split_ties_nan: ties across chunks, NaNs, rows and columns
    walks) as a user calls the module (tests/dropin.check_dropin: other batches and lengths,
    eval mode, a permuted input, one more leading dim...): the kernels answer each call, the
    indices exactly eager's."""
    from codegen.pipeline import compile_problem
    from harness.problem import load_problem
    from tests.dropin import check_dropin

    src, configs, _launched = EXTREMES["arg_split_ties_nan"]
    comp = compile_problem(load_problem(write_problem(src, "arg_dropin")), configs=configs)
    rep = check_dropin(src, comp.emitted.source, calls=1, atol=0, rtol=0)
    assert {t.name for t in rep.trials if t.fast} >= {"batch", "rank", "transposed"}, rep.trials
