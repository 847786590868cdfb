"""Attention written over other layouts than [B, H, L, D] keys: a key cache kept transposed
(``q @ k_t``, k_t [B, H, D, T]: read through ``k_t.transpose(-2, -1)``, a view), and 5-d
products over two head dims, grouped-query attention written as ``q.view(B, KV, G, L, D)``
against each group's one cache (by einsums that broadcast the group letter, or by matmuls
against ``k.unsqueeze(2)``): 4-d attention over KV * G heads with enable_gqa (head h reads
key/value head h // G), its result unflattened back. Each is one attention kernel reading the
caches where they are (no copy per head), with eager's values, and a drop-in; what is not that
form (the other grouping, ``q.view(B, G, KV, ...)``, whose head h reads cache h % KV; a mask of
the 5-d scores; a key group dim that is neither 1 nor G) keeps its products."""
import pathlib

import pytest
import torch

from codegen.pipeline import analyze, compile_problem
from harness.problem import load_problem
from tests.test_attention_mask import FLASH, SPLIT, runs_and_is_a_drop_in

HEAD = "import math\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"

#: decode (or causal prefill) against a key cache stored transposed, [B, H, D, T]
KT_CACHE = HEAD + '''
class Model(nn.Module):
    def forward(self, q, k_t, v):
        s = (q @ k_t) / math.sqrt(q.shape[-1])
        {mask}
        p = torch.softmax(s.float(), dim=-1).to(q.dtype)
        return p @ v
def get_inputs():
    return [torch.randn(2, 4, {L}, 16, dtype=torch.{dtype}), torch.randn(2, 4, 16, {T}, dtype=torch.{dtype}),
            torch.randn(2, 4, {T}, 16, dtype=torch.{dtype})]
def get_init_inputs():
    return []
'''

CAUSAL = ("s = s.masked_fill(torch.ones(s.size(-2), s.size(-1), dtype=torch.bool, device=s.device).triu(1), "
          "float('-inf'))")
#: the mask's size as one traced value (a torch.Size slice): the factory gets it as it is
CAUSAL_SHAPE = "s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float('-inf'))"

#: grouped-query attention over a 5-d view of the query heads, by einsums
GQA5_EINSUM = HEAD + '''
class Model(nn.Module):
    def __init__(self, n_kv=2):
        super().__init__()
        self.n_kv = n_kv
    def forward(self, q, k, v):
        B, H, L, D = q.shape
        q5 = q.view(B, self.n_kv, H // self.n_kv, L, D)
        s = torch.einsum("bkgld,bktd->bkglt", q5, k) / math.sqrt(D)
        p = torch.softmax(s.float(), dim=-1).to(q.dtype)
        o = torch.einsum("bkglt,bktd->bkgld", p, v)
        return o.reshape(B, H, L, D)
def get_inputs():
    return [torch.randn(2, 8, {L}, 16, dtype=torch.{dtype}), torch.randn(2, 2, 40, 16, dtype=torch.{dtype}),
            torch.randn(2, 2, 40, 16, dtype=torch.{dtype})]
def get_init_inputs():
    return [2]
'''

#: the same by 5-d matmuls against each group's cache unsqueezed ({kdim}: where its size-1 dim is)
GQA5_MATMUL = HEAD + '''
class Model(nn.Module):
    def forward(self, q, k, v):
        B, H, L, D = q.shape
        q5 = q.view(B, {qview}, L, D)
        k5, v5 = k.unsqueeze({kdim}), v.unsqueeze({kdim})
        s = torch.matmul(q5, k5.transpose(-1, -2)) * D ** -0.5
        p = s.softmax(dim=-1)
        return torch.matmul(p, v5).view(B, H, L, D)
def get_inputs():
    return [torch.randn(2, 8, 1, 16), torch.randn(2, 2, 40, 16), torch.randn(2, 2, 40, 16)]
def get_init_inputs():
    return []
'''


def _plan(path):
    plan, rw, err = analyze(load_problem(path))
    assert plan is not None, err
    return plan, rw


def _emitted(path, configs) -> str:
    comp = compile_problem(load_problem(path), configs=configs)
    assert comp.emitted is not None, comp.error
    return comp.emitted.source


def _attention_reads_inputs(plan) -> None:
    """One attention kernel whose keys and values are the inputs themselves or views of them
    (no copy per head)."""
    assert [g.kind for g in plan.groups] == ["attention"], [g.kind for g in plan.groups]
    op = plan.nops[plan.groups[0].red]
    for t in op.operands[1:3]:
        while t.op != "placeholder":
            assert t.target in ("transpose", "squeeze", "flatten"), t.target
            t = t.args[0]


@pytest.mark.parametrize("L,T,mask,configs,kernel", [
    (1, 40, "", SPLIT, "_egg_k_g0_split"),      # decode: split-KV (one split: 8 heads)
    (24, 24, CAUSAL, FLASH, "_egg_k_g0"),       # causal prefill: flash
    (24, 24, CAUSAL_SHAPE, FLASH, "_egg_k_g0"),
])
@pytest.mark.parametrize("dtype,tol", [("float32", 1e-4), ("bfloat16", 1e-2)])
def test_a_transposed_key_cache_is_one_attention_kernel(L, T, mask, configs, kernel, dtype, tol, write_problem):
    src = KT_CACHE.format(L=L, T=T, mask=mask, dtype=dtype)
    path = write_problem(src, f"kt_{L}_{len(mask)}_{dtype}")
    plan, rw = _plan(path)
    assert "rw-attention" in rw
    _attention_reads_inputs(plan)
    assert plan.nops[plan.groups[0].red].p["causal"] == bool(mask)
    runs_and_is_a_drop_in(src, _emitted(path, configs), kernel, tol)


@pytest.mark.parametrize("L,configs,kernel", [(1, SPLIT, "_egg_k_g0_merge"), (24, FLASH, "_egg_k_g0")])
@pytest.mark.parametrize("dtype,tol", [("float32", 1e-4), ("bfloat16", 1e-2)])
def test_grouped_query_attention_over_5d_einsums_is_one_kernel(L, configs, kernel, dtype, tol, write_problem):
    src = GQA5_EINSUM.format(L=L, dtype=dtype)
    path = write_problem(src, f"gqa5_{L}_{dtype}")
    plan, rw = _plan(path)
    _attention_reads_inputs(plan)
    assert plan.nops[plan.groups[0].red].p["gqa"]
    runs_and_is_a_drop_in(src, _emitted(path, configs), kernel, tol)


def test_grouped_query_attention_over_5d_matmuls_is_one_kernel(write_problem):
    src = GQA5_MATMUL.format(qview="2, H // 2", kdim=2)
    path = write_problem(src, "gqa5_mm")
    plan, _rw = _plan(path)
    _attention_reads_inputs(plan)
    runs_and_is_a_drop_in(src, _emitted(path, SPLIT), "_egg_k_g0_merge", 1e-4)


def test_a_group_cache_expanded_over_the_group_is_read_once(write_problem):
    """``k.unsqueeze(2).expand(-1, -1, G, -1, -1)`` makes the key dims equal (the "heads" form,
    whose flatten would copy the cache per query head): read as the one head it expands."""
    src = GQA5_MATMUL.format(qview="2, H // 2", kdim=2).replace(
        "k5, v5 = k.unsqueeze(2), v.unsqueeze(2)",
        "k5, v5 = k.unsqueeze(2).expand(-1, -1, H // 2, -1, -1), v.unsqueeze(2).expand(-1, -1, H // 2, -1, -1)")
    path = write_problem(src, "gqa5_expand")
    plan, _rw = _plan(path)
    _attention_reads_inputs(plan)
    assert plan.nops[plan.groups[0].red].p["gqa"]
    runs_and_is_a_drop_in(src, _emitted(path, SPLIT), "_egg_k_g0_merge", 1e-4)


def test_the_other_grouping_keeps_its_products(write_problem):
    """``q.view(B, G, KV, ...)`` against ``k.unsqueeze(1)``: query head h = g * KV + kv reads
    cache kv = h % KV, not enable_gqa's h // G: not taken (taking it would be wrong)."""
    src = GQA5_MATMUL.format(qview="H // 2, 2", kdim=1)
    path = write_problem(src, "gqa5_other")
    assert "attention" not in [g.kind for g in _plan(path)[0].groups]


def test_a_5d_mask_is_not_folded(write_problem):
    src = GQA5_EINSUM.format(L=3, dtype="float32").replace(
        "p = torch.softmax(s.float()", "s = s + mask\n        p = torch.softmax(s.float()").replace(
        "def forward(self, q, k, v):", "def forward(self, q, k, v, mask):").replace(
        "torch.randn(2, 2, 40, 16, dtype=torch.float32)]",
        "torch.randn(2, 2, 40, 16, dtype=torch.float32), torch.randn(2, 2, 4, 3, 40)]")
    path = write_problem(src, "gqa5_mask")
    assert "attention" not in [g.kind for g in _plan(path)[0].groups]


def test_keys_of_another_rank_are_no_stored_cache(write_problem):
    """``q [B, H, L, D] @ w [D, T]`` (a weight, not a cache of q's rank) keeps its product."""
    src = HEAD + '''
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 40))
    def forward(self, q, v):
        return torch.softmax(q @ self.w, dim=-1) @ v
def get_inputs():
    return [torch.randn(2, 4, 3, 16), torch.randn(2, 4, 40, 16)]
def get_init_inputs():
    return []
'''
    path = write_problem(src, "weight_keys")
    assert "attention" not in [g.kind for g in _plan(path)[0].groups]


#: one decode step that writes the new key and value into the caches it is given (in place),
#: then attends to the prefix: the caller's caches hold the write afterwards
KV_UPDATE = HEAD + '''
class Model(nn.Module):
    def forward(self, q, k_new, v_new, k_cache, v_cache):
        pos = 40
        k_cache[:, :, pos] = k_new[:, :, 0]
        v_cache[:, :, pos] = v_new[:, :, 0]
        return F.scaled_dot_product_attention(q, k_cache[:, :, :pos + 1], v_cache[:, :, :pos + 1])
def get_inputs():
    return [torch.randn(2, 4, 1, 16), torch.randn(2, 4, 1, 16), torch.randn(2, 4, 1, 16),
            torch.randn(2, 4, 64, 16), torch.randn(2, 4, 64, 16)]
def get_init_inputs():
    return []
'''


def test_a_cache_written_in_place_is_written_as_model_writes_it(write_problem):
    """The attention kernel reads the caches after the writes, and the caller's caches hold the
    same writes afterwards (the drop-in check compares the inputs with Model's after the call)."""
    path = write_problem(KV_UPDATE, "kv_update")
    plan, _rw = _plan(path)
    assert "attention" in [g.kind for g in plan.groups]
    runs_and_is_a_drop_in(KV_UPDATE, _emitted(path, SPLIT), "_egg_k_g0_split", 1e-4)


def test_the_drop_in_check_rejects_a_file_that_skips_the_cache_write(write_problem):
    """The attack on the check above: a ModelNew that returns the right output from a copy but
    leaves the caller's cache unwritten is not a drop-in."""
    from tests.dropin import check_dropin

    lazy = KV_UPDATE.replace("class Model(", "class ModelNew(").replace(
        "        k_cache[:, :, pos] = k_new[:, :, 0]\n        v_cache[:, :, pos] = v_new[:, :, 0]\n",
        "        k_cache, v_cache = k_cache.clone(), v_cache.clone()\n"
        "        k_cache[:, :, pos] = k_new[:, :, 0]\n        v_cache[:, :, pos] = v_new[:, :, 0]\n")
    lazy = KV_UPDATE + lazy[lazy.index("class ModelNew("):lazy.index("def get_inputs")]
    with pytest.raises(AssertionError, match="other than Model"):
        check_dropin(KV_UPDATE, lazy, calls=1, shapes=False, rank=False, move=False)


def test_query_rows_past_one_tile_are_a_drop_in(write_problem):
    """Falcon's multi-query decode at small sizes: 40 query heads on one cached head, packed in
    row tiles of DECODE_ROWS = 16 (3 tiles per batch) with the keys split: the split-KV kernel runs,
    matches eager, and the file is a drop-in (train and eval, another batch, scaled inputs)."""
    from tests.helpers import load_script

    shapes = load_script("workloads/small_shapes.py")
    wl = pathlib.Path(__file__).resolve().parent.parent / "workloads" / "llm"
    mqa = shapes.small_source(wl / "23_mqa_decode_broadcast.py",
                              "BATCH, Q_HEADS, HEAD_DIM, CACHE_LEN = 2, 40, 16, 77")
    path = write_problem(mqa, "mqa_rows")
    plan, _rw = _plan(path)
    assert [g.kind for g in plan.groups] == ["attention"]
    configs = {g: {"BLOCK_N": 16, "SPLIT_PROGRAMS": 8, "DECODE_ROWS": 16} for g in ("g0", "eg0")}
    runs_and_is_a_drop_in(mqa, _emitted(path, configs), "_egg_k_g0_split", 1e-2)
