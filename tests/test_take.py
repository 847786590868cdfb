"""rw-take: gathers, embeddings, index_select and ``x[ids]`` as one indexed read that a pointwise
kernel loads at the named row (the ops after it in the same pass), against torch in the
interpreter, as a user calls the module (tests/dropin.check_dropin), and the forms left alone."""
import pytest

from codegen.pipeline import compile_problem
from harness.problem import load_problem
from tests.dropin import check_dropin
from tests.helpers import generated_matches
from tests.test_llm_kernels import BF, plan_of, problem

CASES = {
    # Gemma's input embedding: nn.Embedding times a bf16 normalizer buffer; rows of 160 columns
    # take the rows walk (the token id loaded once per row)
    "embedding": problem(
        "ids", "        return self.emb(ids) * self.scale\n", "[torch.randint(0, 50, (2, 7))]",
        members=f"        self.emb = nn.Embedding(50, 160, {BF})\n"
                f"        self.register_buffer('scale', torch.tensor(12.6, {BF}))\n"),
    # a repetition penalty's gathered scores transformed (the index varies along the row: rows of
    # 130 columns, each element its own index)
    "gather": problem(
        "logits, ids", "        s = torch.gather(logits, 1, ids)\n"
        "        return torch.where(s < 0, s * 1.3, s / 1.3)\n",
        "[torch.randn(3, 200), torch.randint(0, 200, (3, 130))]"),
    # a mixture-of-experts combine: the chosen experts' rows (an expanded index) weighted
    "gather_expanded": problem(
        "out, chosen, w", "        idx = chosen.unsqueeze(-1).expand(-1, -1, out.shape[-1])\n"
        "        return out.gather(1, idx) * w.unsqueeze(-1)\n",
        "[torch.randn(5, 4, 24), torch.randint(0, 4, (5, 2)), torch.rand(5, 2)]"),
    "index_select": problem(
        "x, idx", "        return torch.index_select(x, 1, idx) * 2.0 + 1.0\n",
        "[torch.randn(3, 9, 6), torch.randint(0, 9, (5,))]"),
    # a cos table read by int32 position ids, broadcast over heads (HF's older RoPE)
    "table_rows": problem(
        "x, pos", "        return x * self.cos[pos].unsqueeze(1)\n",
        "[torch.randn(2, 3, 5, 8), torch.randint(0, 11, (2, 5), dtype=torch.int32)]",
        members="        self.register_buffer('cos', torch.randn(11, 8))\n"),
    # x[ids] counts a negative index from the end
    "negative_ids": problem(
        "x, ids", "        return torch.relu(x[ids])\n",
        "[torch.randn(10, 6), torch.randint(-10, 10, (4, 3))]"),
}


REDUCED = {
    # a mixture-of-experts combine: the chosen experts' rows weighted and summed over the top-k
    # dim (not innermost: the columns walk), bf16 in, fp32 sum
    "moe_combine": problem(
        "out, chosen, w", "        idx = chosen.unsqueeze(-1).expand(-1, -1, out.shape[-1])\n"
        "        picked = torch.gather(out, 1, idx)\n"
        "        return (picked.float() * w.unsqueeze(-1)).sum(dim=1).to(out.dtype)\n",
        f"[torch.randn(6, 4, 40, {BF}), torch.randint(0, 4, (6, 2)), torch.rand(6, 2)]"),
    # the gathered scores summed along the row (innermost: the rows walk), a negative id wrapped
    "row_sum": problem(
        "x, ids", "        return torch.exp(x[ids]).sum(-1)\n",
        "[torch.randn(30, 70), torch.randint(-30, 30, (5, 3))]"),
}


@pytest.mark.parametrize("name", sorted(REDUCED))
def test_an_indexed_read_is_a_reduction_prologue(name, write_problem, tmp_path):
    """A take feeding a sum is loaded in the reduction's own loop: one kernel, the gathered
    copy never written."""
    path = write_problem(REDUCED[name], f"take_red_{name}")
    comp = generated_matches(path, tmp_path, seeds=(0, 1), atol=1e-2, rtol=1e-2)
    assert "rw-take" in comp.rewrites
    assert [g.kind for g in comp.plan.groups] == ["reduction"]
    rep = check_dropin(path.read_text(), comp.emitted.source, calls=1, atol=1e-2, rtol=1e-2)
    slow = {(t.mode, t.name) for t in rep.trials if not t.fast and not t.raised and t.name != "moved back"}
    assert not slow, slow


@pytest.mark.parametrize("name", sorted(CASES))
def test_indexed_reads_are_loads_in_one_kernel(name, write_problem, tmp_path):
    """No gather stays torch: the indexed read and what follows it are one pointwise kernel;
    the module serves other batches, eval mode and a reload as the reference does."""
    path = write_problem(CASES[name], f"take_{name}")
    comp = generated_matches(path, tmp_path, seeds=(0, 1), atol=1e-2, rtol=1e-2)
    assert "rw-take" in comp.rewrites
    assert [g.kind for g in comp.plan.groups] == ["pointwise"]
    assert not [op for op in comp.plan.nops.values() if op.kind == "library"]
    rep = check_dropin(path.read_text(), comp.emitted.source, calls=1, atol=1e-2, rtol=1e-2)
    slow = {(t.mode, t.name) for t in rep.trials if not t.fast and not t.raised and t.name != "moved back"}
    assert not slow, slow


LEFT = {
    "max_norm": ("an embedding with max_norm renormalises the weight's rows in place", problem(
        "ids", "        return self.emb(ids) * 2.0\n", "[torch.randint(0, 20, (2, 7))]",
        members="        self.emb = nn.Embedding(20, 8, max_norm=1.0)\n")),
    "smaller_index": ("a gather whose index is smaller than its source off the gathered dim", problem(
        "x, idx", "        return torch.gather(x, 1, idx) * 2.0\n",
        "[torch.randn(4, 9), torch.randint(0, 9, (3, 5))]")),
    "two_tensors": ("two index tensors pick elements, not rows", problem(
        "x, i, j", "        return x[i, j] * 2.0\n",
        "[torch.randn(4, 9), torch.randint(0, 4, (5,)), torch.randint(0, 9, (5,))]")),
}


@pytest.mark.parametrize("name", sorted(LEFT))
def test_indexed_reads_left_to_torch(name, write_problem):
    why, src = LEFT[name]
    _plan, applied = plan_of(write_problem, src, f"take_no_{name}")
    assert "rw-take" not in applied, why


def test_a_take_of_a_value_made_in_the_kernel_reads_it_from_memory(write_problem, tmp_path):
    """The gathered source is computed by another kernel: a take loads rows of memory."""
    src = problem("x, idx", "        return torch.gather(x * 2.0 + 1.0, 1, idx) - 3.0\n",
                  "[torch.randn(4, 9), torch.randint(0, 9, (4, 9))]")
    comp = generated_matches(write_problem(src, "take_mem"), tmp_path, seeds=(0, 1))
    assert "rw-take" in comp.rewrites
    assert [g.kind for g in comp.plan.groups] == ["pointwise", "pointwise"]


def test_an_index_out_of_range_is_nan_never_a_number(write_problem, tmp_path):
    """Eager raises on an index past the table (and, but for x[ids], on a negative one); the
    kernel cannot raise: such an element is NaN (never another row, never memory outside the
    table), and in range it matches. x[ids] counts a negative index from the end."""
    import torch

    from harness.problem import load_module

    def fast(name):
        path = write_problem(CASES[name], f"take_range_{name}")
        comp = compile_problem(load_problem(path))
        (tmp_path / f"{name}.py").write_text(comp.emitted.source)
        torch.manual_seed(0)
        return load_module(tmp_path / f"{name}.py", f"cand_{name}").ModelNew()

    new = fast("embedding")
    out = new._egg_fast(torch.tensor([[0, 49, 50, 1000, -1]]))
    assert torch.isnan(out[0, 2:]).all()
    assert torch.equal(out[0, :2], new.emb.weight[[0, 49]] * new.scale)
    new = fast("negative_ids")
    ids = torch.tensor([[-10, -1, 9], [10, -11, 0]])
    x = torch.randn(10, 6)
    out = new._egg_fast(x, ids)
    assert torch.equal(out[0], torch.relu(x[[0, 9, 9]]))
    assert torch.isnan(out[1, :2]).all() and torch.equal(out[1, 2], torch.relu(x[0]))


def test_an_indexed_read_in_a_split_reduction(write_problem, tmp_path):
    """The same prologue in the split kernels (chunks of the reduced dim over programs, then a
    merge): a configuration that splits the 70-long rows into chunks of 16 must run them."""
    path = write_problem(REDUCED["row_sum"], "take_split")
    cfg = {"g0": {"SPLIT_CHUNK": 16, "SPLIT_ROWS": 100000, "BLOCK_R": 16}}
    comp = generated_matches(path, tmp_path, seeds=(0,), atol=1e-2, rtol=1e-2, configs=cfg,
                             launched=["_egg_k_g0_part"])
    assert [g.kind for g in comp.plan.groups] == ["reduction"]


def test_a_source_past_32_bit_offsets_asks_for_64_bit_ones():
    """A few rows gathered from a table of more than 2**31 elements: the output is small, the
    offsets into the table are not (the launch's I64 flag comes from the source too)."""
    import torch

    from knowledge.templates._runtime import _egg_take_view

    ids = torch.zeros(4, 1, dtype=torch.long, device="meta")
    big = torch.empty(2**21, 2**10 + 1, device="meta", dtype=torch.bfloat16)
    view, stride, size, far = _egg_take_view(big, ids, -2)
    assert (tuple(view.shape), stride, size, far) == ((1, 2**10 + 1), 2**10 + 1, 2**21, True)
    assert _egg_take_view(big[:, :5], ids, -2)[3] is True  # strided: the rows still reach far
    assert _egg_take_view(torch.empty(1000, 64, device="meta"), ids, -2)[3] is False


def test_a_take_left_to_torch_when_its_kernel_is_backed_out(write_problem, tmp_path):
    """A group backed out (a failing or slow kernel) leaves its take to PyTorch in the forward,
    as a call of the runtime helper ``_egg_take``: the value it makes must not take the helper's
    name (``_egg_take = _egg_take(...)`` made the name local to forward and every call raised;
    found by level 3's Swin-V2, whose relative position bias is a table read by an index)."""
    from harness.problem import load_problem as load

    path = write_problem(CASES["gather"], "take_backed_out")
    comp = compile_problem(load(path))
    assert [g.kind for g in comp.plan.groups] == ["pointwise"]
    out = compile_problem(load(path), disabled={comp.plan.groups[0].id})
    assert out.emitted is not None and "_egg_take(" in out.emitted.source
    assert not [ln for ln in out.emitted.source.splitlines() if ln.strip().startswith("_egg_take =")]
    check_dropin(path.read_text(), out.emitted.source, calls=1, atol=1e-5, rtol=1e-5)
