"""Two-operand einsums that are matrix products become matmul (codegen/rewrites/einsums.py), the
values and the output's layout unchanged; the others stay einsum. Attention written with einsum
is one attention kernel (tests/test_attention.py WRITTEN_OUT)."""
import pytest
import torch

from codegen import pipeline
from codegen.emit import emit_model
from harness.problem import load_module, load_problem

HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"


def _src(eq: str, a: str, b: str) -> str:
    return (HEAD + "class Model(nn.Module):\n    def forward(self, a, b):\n"
            f"        return torch.einsum({eq!r}, a, b)\n\n"
            f"def get_inputs():\n    return [{a}, {b}]\n\ndef get_init_inputs():\n    return []\n")


def _einsums(plan) -> int:
    return sum(1 for n in plan.gm.graph.nodes if n.op == "call_function" and n.target is torch.einsum)


R = "torch.randn"


@pytest.mark.parametrize("eq, a, b", [
    ("bhid,bhjd->bhij", f"{R}(2, 3, 5, 4)", f"{R}(2, 3, 6, 4)"),  # attention scores
    ("bhij,bhjd->bhid", f"{R}(2, 3, 5, 6)", f"{R}(2, 3, 6, 4)"),  # probabilities @ values
    ("bnd,de->bne", f"{R}(2, 5, 4)", f"{R}(4, 7)"),  # a projection: leading rows
    ("bnd,ed->bne", f"{R}(2, 5, 4)", f"{R}(7, 4)"),  # ... by a weight stored [out, in]
    ("bhd,bhsd->bhs", f"{R}(2, 3, 4)", f"{R}(2, 3, 6, 4)"),  # decode: no row dim
    ("bhs,bhsd->bhd", f"{R}(2, 3, 6)", f"{R}(2, 3, 6, 4)"),
    ("bhid,bhjd->bhji", f"{R}(2, 3, 5, 4)", f"{R}(2, 3, 6, 4)"),  # operands swapped
    ("bhid,bhjd->hbij", f"{R}(2, 3, 5, 4)", f"{R}(2, 3, 6, 4)"),  # output permuted
    ("ij,jk->ki", f"{R}(5, 4)", f"{R}(4, 6)"),
    ("bi,bi->b", f"{R}(5, 4)", f"{R}(5, 4)"),  # batched dot: neither row nor column
])
def test_einsum_products_are_matmul(eq, a, b, write_problem):
    path = write_problem(_src(eq, a, b), "eins")
    prob = load_problem(path)
    plan, _applied, err = pipeline.analyze(prob)
    assert err is None and _einsums(plan) == 0
    cand = path.with_name("eins_new.py")
    cand.write_text(emit_model(prob.source, plan, {}, "# test").source)
    mod = load_module(cand, "candidate")
    for seed in range(2):
        torch.manual_seed(seed)
        xs = mod.get_inputs()
        ref, new = mod.Model()(*xs), mod.ModelNew()(*xs)
        torch.testing.assert_close(new, ref, atol=1e-5, rtol=1e-5)
        assert new.shape == ref.shape and new.stride() == ref.stride()


@pytest.mark.parametrize("eq, a, b", [
    ("bij,bjk->bik", f"{R}(1, 5, 4)", f"{R}(3, 4, 6)"),  # size-1 broadcast of a letter
    ("bijk,bjkl->bil", f"{R}(2, 5, 4, 3)", f"{R}(2, 4, 3, 6)"),  # two contracted letters
    ("bij,bjk->bk", f"{R}(2, 5, 4)", f"{R}(2, 4, 6)"),  # i summed in one operand alone
    ("bnd,hdk->bnhk", f"{R}(2, 5, 4)", f"{R}(3, 4, 6)"),  # two column letters
    ("ij,jk->ik", "torch.randint(0, 5, (5, 4))", "torch.randint(0, 5, (4, 6))"),  # integers
])
def test_other_einsums_stay_einsum(eq, a, b, write_problem):
    plan, _applied, err = pipeline.analyze(load_problem(write_problem(_src(eq, a, b), "other")))
    assert err is None and _einsums(plan) == 1


def test_an_outer_product_einsum_is_a_multiply(write_problem):
    """Nothing contracted: no product to call (tests/test_spellings.py checks its values)."""
    plan, _applied, err = pipeline.analyze(load_problem(write_problem(_src("bi,bj->bij", f"{R}(5, 4)",
                                                                          f"{R}(5, 3)"), "outer")))
    assert err is None and _einsums(plan) == 0 and [g.kind for g in plan.groups] == ["pointwise"]


def test_three_operand_einsum_stays(write_problem):
    src = (HEAD + "class Model(nn.Module):\n    def forward(self, a, b):\n"
           "        return torch.einsum('ij,jk,kl->il', a, b, b.transpose(0, 1))\n\n"
           f"def get_inputs():\n    return [{R}(5, 4), {R}(4, 4)]\n\ndef get_init_inputs():\n    return []\n")
    plan, _applied, err = pipeline.analyze(load_problem(write_problem(src, "three")))
    assert err is None and _einsums(plan) == 1


DECODE = (HEAD + "import math\nclass Model(nn.Module):\n    def forward(self, q, k, v):\n"
          "        s = torch.einsum('bhd,bhsd->bhs', q, k) / math.sqrt(q.shape[-1])\n"
          "{mid}"
          "        return torch.einsum('bhs,bhsd->bhd', p, v)\n\n"
          "def get_inputs():\n    return [torch.randn(2, 4, 8), torch.randn(2, 4, 40, 8), torch.randn(2, 4, 40, 8)]\n\n"
          "def get_init_inputs():\n    return []\n")


@pytest.mark.parametrize("mid", [
    "        p = torch.softmax(s.float(), -1).to(q.dtype)\n",
    # the last dim named by its index: renamed -1 when the row dim comes back
    "        p = torch.softmax(s.float(), 2).to(q.dtype)\n",
    "        p = s.float().softmax(dim=2).to(q.dtype)\n",
    # dtype by position: a cast first (reduction_dtypes), then the softmax over dim 2
    "        p = torch.softmax(s, 2, torch.float32)\n",
    # written out: torch.softmax again only through rw-softmax (a rule, after the canonical
    # forms), which names the dim by its index; the canonical pass runs again, then the rules
    "        e = torch.exp(s - s.amax(-1, keepdim=True))\n        p = e / e.sum(-1, keepdim=True)\n",
])
def test_decode_attention_by_einsum_is_one_attention_kernel(mid, write_problem):
    """A 3-d query (one token per head): the einsums are products of a one-row query
    (unsqueeze / squeeze), the squeeze undone through the scaling and the softmax, so
    rw-attention sees softmax(q @ k^T * c) @ v; the file is a drop-in."""
    from codegen.pipeline import compile_problem
    from tests.dropin import check_dropin

    src = DECODE.replace("{mid}", mid)
    path = write_problem(src, "decode")
    plan, applied, err = pipeline.analyze(load_problem(path))
    assert err is None and [g.kind for g in plan.groups] == ["attention"] and "rw-attention" in applied
    comp = compile_problem(load_problem(path))
    assert check_dropin(src, comp.emitted.source, calls=1).fast("own")


@pytest.mark.parametrize("mid", [
    "        p = torch.softmax(s, 0)\n",  # over the batch: the row dim would move the softmax
    "        p = torch.softmax(s, 1)\n",  # over the heads (dim 1 of 3): not the last
    "        p = torch.softmax(s, -1) + s.sum(-1, keepdim=True) * 0.0\n",  # s read twice
])
def test_squeezes_kept_where_the_row_dim_matters(mid, write_problem):
    path = write_problem(DECODE.replace("{mid}", mid), "decode_no")
    plan, applied, err = pipeline.analyze(load_problem(path))
    assert err is None and "rw-attention" not in applied
    cand = path.with_name("decode_no_new.py")
    prob = load_problem(path)
    cand.write_text(emit_model(prob.source, plan, {}, "# test").source)
    mod = load_module(cand, "candidate")
    torch.manual_seed(0)
    xs = mod.get_inputs()
    torch.testing.assert_close(mod.ModelNew()(*xs), mod.Model()(*xs), atol=1e-5, rtol=1e-5)
