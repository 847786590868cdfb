"""A cat along the last dim with the pointwise kernels that make its pieces, one kernel over the
result (principle alg-cat-placed): each piece's ops computed at its columns, their loads placed
there (partial RoPE: the rotated and the passed-through columns of each head). Against torch in
the interpreter, as a user calls the module (tests/dropin.check_dropin), and the cats left to
torch."""
import pytest

from harness.problem import load_problem
from tests.dropin import check_dropin
from tests.helpers import generated_matches
from tests.test_llm_kernels import BF, plan_of, problem

ROPE_MEMBERS = ("        inv = 1.0 / (10000.0 ** (torch.arange(0, 8, 2).float() / 8))\n"
                "        emb = torch.outer(torch.arange(12).float(), inv)\n"
                "        emb = torch.cat((emb, emb), dim=-1)\n"
                "        self.register_buffer('cos_t', emb.cos(), persistent=False)\n"
                "        self.register_buffer('sin_t', emb.sin(), persistent=False)\n")

CASES = {
    # GPT-NeoX / Phi partial rotary: the first 8 of 20 columns rotated (a rotate-half within
    # them), the rest passed through; bf16, tables sliced to the sequence
    "partial_rope": problem(
        "x", "        r, s = x[..., :8], x[..., 8:]\n"
        "        h = torch.cat((-r[..., 4:], r[..., :4]), dim=-1)\n"
        "        cos = self.cos_t[: x.shape[-2]].to(x.dtype)\n"
        "        sin = self.sin_t[: x.shape[-2]].to(x.dtype)\n"
        "        return torch.cat((r * cos + h * sin, s), dim=-1)\n",
        f"[torch.randn(2, 3, 12, 20, {BF})]", members=ROPE_MEMBERS),
    # the rotated piece second (DeepSeek's MLA: q = cat(q_nope, rope(q_pe))), fp32
    "rope_second": problem(
        "x", "        s, r = x[..., :6], x[..., 6:]\n"
        "        h = torch.cat((-r[..., 4:], r[..., :4]), dim=-1)\n"
        "        return torch.cat((s, r * self.cos_t[: x.shape[-2]] + h * self.sin_t[: x.shape[-2]]), dim=-1)\n",
        "[torch.randn(2, 12, 14)]", members=ROPE_MEMBERS),
    # three pieces, one read per row (a broadcast scale inside a piece), then ops on the result
    "three_pieces": problem(
        "x, y, s", "        z = torch.cat((x * s, y, torch.exp(-y) + 1.0), dim=-1)\n"
        "        return torch.relu(z) * 2.0 - 1.0\n",
        "[torch.randn(3, 5, 7), torch.randn(3, 5, 9), torch.rand(3, 5, 1)]"),
    # Swin-V2's qkv bias: 1-d pieces, the middle one zeros shaped like a parameter, then used
    "bias_pieces": problem(
        "x", "        b = torch.cat((self.q, torch.zeros_like(self.v), self.v))\n"
        "        return x + b\n", "[torch.randn(3, 15)]",
        members="        self.q = nn.Parameter(torch.randn(5))\n        self.v = nn.Parameter(torch.randn(5))\n"),
    # rows long enough for the rows walk (130 + 70 columns)
    "long_rows": problem(
        "x, y", "        return torch.cat((torch.sigmoid(x), y * 0.5), dim=-1)\n",
        "[torch.randn(6, 130), torch.randn(6, 70)]"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_cat_and_the_kernels_of_its_pieces_are_one_kernel(name, write_problem, tmp_path):
    path = write_problem(CASES[name], f"cat_{name}")
    tol = 4e-2 if BF in CASES[name] else 1e-4
    comp = generated_matches(path, tmp_path, seeds=(0, 1), atol=tol, rtol=tol)
    cats = [m for g in comp.plan.groups for m in g.members if comp.plan.nops[m].name == "cat"]
    assert [g.kind for g in comp.plan.groups] == ["pointwise"] and len(cats) == 1
    assert not [op for op in comp.plan.nops.values() if op.kind == "library" and "cat" in op.name]
    # (bf16 at x100: eager rounds each product before the sum, the kernel the sum once; the
    # one-ulp differences of a cancelling sum pass no tolerance a test can fix)
    rep = check_dropin(path.read_text(), comp.emitted.source, calls=1, atol=tol, rtol=tol,
                       skip=("x100",) if tol > 1e-3 else ())
    slow = {(t.mode, t.name) for t in rep.trials if not t.fast and not t.raised and t.name != "moved back"}
    assert not slow, slow


def test_a_piece_read_elsewhere_stays_a_kernel_output(write_problem, tmp_path):
    """The first piece is also returned: its kernel stays its own (the cat reads it from
    memory); the second piece's kernel moves into the cat's."""
    src = problem("x, y", "        a = torch.tanh(x)\n"
                  "        return torch.cat((a, y * 3.0), dim=-1), a\n",
                  "[torch.randn(4, 6), torch.randn(4, 5)]")
    comp = generated_matches(write_problem(src, "cat_shared"), tmp_path, seeds=(0,))
    assert [g.kind for g in comp.plan.groups] == ["pointwise", "pointwise"]
    cat = next(g for g in comp.plan.groups if any(comp.plan.nops[m].name == "cat" for m in g.members))
    assert {k for _c, k in cat.placed.values()} == {1}


def test_a_cat_before_a_reduction_keeps_its_kernel(write_problem, tmp_path):
    """A reduction does not take a cat's kernel as its prologue (its pieces are computed at the
    cat's columns, which only the pointwise template places): two kernels, the right sums."""
    src = problem("x, y", "        return torch.cat((x * 2.0, torch.exp(y)), dim=-1).sum(-1)\n",
                  "[torch.randn(4, 6), torch.randn(4, 5)]")
    comp = generated_matches(write_problem(src, "cat_reduced"), tmp_path, seeds=(0,))
    assert sorted(g.kind for g in comp.plan.groups) == ["pointwise", "reduction"]


LEFT = {
    "inputs_only": ("a cat of values read from memory is a copy either way", problem(
        "x, y", "        return torch.cat((x, y), dim=-1)\n", "[torch.randn(4, 6), torch.randn(4, 5)]")),
    "middle_dim": ("a cat along another dim than the last", problem(
        "x, y", "        return torch.cat((x * 2.0, y * 3.0), dim=1)\n",
        "[torch.randn(2, 3, 4), torch.randn(2, 5, 4)]")),
    "one_column": ("a piece of one column (a broadcast operand could not be told apart)", problem(
        "x, y", "        return torch.cat((x * 2.0, y * 3.0), dim=-1)\n",
        "[torch.randn(4, 1), torch.randn(4, 5)]")),
}


@pytest.mark.parametrize("name", sorted(LEFT))
def test_cats_left_to_torch(name, write_problem):
    why, src = LEFT[name]
    plan, _applied = plan_of(write_problem, src, f"cat_no_{name}")
    cats = [op for op in plan.nops.values() if op.node.op == "call_function" and "cat" in str(op.node.target)]
    assert cats and all(op.kind == "library" for op in cats), why


def test_the_fallback_of_a_backed_out_cat_is_torch_cat(write_problem):
    """With the cat's kernel backed out the forward calls torch.cat: no runtime helper of its own."""
    from codegen.pipeline import compile_problem

    path = write_problem(CASES["three_pieces"], "cat_backed_out")
    comp = compile_problem(load_problem(path))
    out = compile_problem(load_problem(path), disabled={g.id for g in comp.plan.groups})
    assert "torch.cat(" in out.emitted.source
    check_dropin(path.read_text(), out.emitted.source, calls=1)
