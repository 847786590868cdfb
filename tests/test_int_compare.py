"""Masks built in forward as pointwise kernels: comparisons of signed integer tensors (positions
against lengths), ``~``, ``&``, ``|``, ``^`` of bool tensors (``torch.logical_*`` of any) and ``masked_fill`` (codegen.ops, codegen.fusion
._int_comparison). The integers are compared as integers: int64 values 2**40 apart by 1, which
fp32 cannot tell apart, decide the result. Against torch in the interpreter, as a user calls
the module (tests/dropin.check_dropin)."""
import pytest

from tests.dropin import check_dropin
from tests.helpers import generated_matches
from tests.test_llm_kernels import problem

CASES = {
    # a padding mask from lengths filled into scores (int64 positions, int32 lengths)
    "lengths": problem(
        "s, pos, n",
        "        keep = pos[None, :] < n[:, None]\n"
        "        return s.masked_fill(~keep, float('-inf')) * 2.0\n",
        "[torch.randn(4, 9), torch.arange(9), torch.tensor([9, 3, 0, 5], dtype=torch.int32)]"),
    # int64 values past fp32's 24-bit mantissa: a converted comparison would call them equal
    "wide": problem(
        "x, a, b",
        "        return torch.where(a >= b, x, -x), (a != b).float() + x\n",
        "[torch.randn(3, 8), torch.randint(2**40, 2**40 + 3, (3, 8)), torch.randint(2**40, 2**40 + 3, (3, 8))]"),
    # a 0-d value tensor of the input's dtype, a bool mask computed from floats
    "tensor_value": problem(
        "x, v",
        "        return torch.relu(x).masked_fill(x > 0.5, v) + 1.0\n",
        "[torch.randn(5, 7), torch.tensor(-3.0)]"),
    # positions from arange(size) of an input: a table at init for the traced size, computed as
    # the forward did at another (its key), the kernel the same for every size
    "arange_positions": problem(
        "s, n",
        "        pos = torch.arange(s.shape[-1], device=s.device)\n"
        "        return s.masked_fill(pos[None, :] >= n[:, None], float('-inf')) * 2.0\n",
        "[torch.randn(4, 9), torch.tensor([9, 3, 0, 5])]"),
    # masks combined: & | ^ of bool tensors, torch.logical_* of floats (their truth)
    "combined": problem(
        "x, y, pos, n",
        "        keep = (x > 0) & (y < 0.5) | (pos[None, :] >= n[:, None])\n"
        "        other = torch.logical_xor(x > 1, y > 0) | ~(x < -1) ^ (y > 1)\n"
        "        return torch.where(keep, x, y), torch.logical_and(x, y.relu()).float() + other\n",
        "[torch.randn(4, 16), torch.randn(4, 16), torch.arange(16), torch.tensor([16, 3, 0, 9])]"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_masks_built_in_forward_are_pointwise_kernels(name, write_problem, tmp_path):
    path = write_problem(CASES[name], f"mask_{name}")
    comp = generated_matches(path, tmp_path, seeds=(0, 1))
    assert [g.kind for g in comp.plan.groups] == ["pointwise"] * len(comp.plan.groups)
    left = [op.name for op in comp.plan.nops.values() if op.kind == "library"]
    assert not [x for x in left if x in ("lt", "ge", "ne", "where", "masked_fill", "logical_not")
                or "and" in x or "or" in x], left
    rep = check_dropin(path.read_text(), comp.emitted.source, calls=1)
    slow = {(t.mode, t.name) for t in rep.trials if not t.fast and not t.raised and t.name != "moved back"}
    assert not slow, slow


LEFT = {
    # bitwise not of integers, a uint8 comparison (Triton would not widen it as torch does), a
    # value tensor of another dtype (masked_fill casts it first)
    "bitwise": ("x, m", "        return x + (~m).float()\n",
                "[torch.randn(4), torch.tensor([1, 2, 3, 4])]", "invert"),
    "int_and": ("x, m", "        return x + (m & 6).float()\n",
                "[torch.randn(4), torch.tensor([1, 2, 3, 7])]", "and_"),
    "uint8": ("x, a", "        return torch.where(a > 3, x, 0.0)\n",
              "[torch.randn(6), torch.arange(6, dtype=torch.uint8)]", "gt"),
    "value_dtype": ("x, v", "        return x.masked_fill(x > 0, v)\n",
                    "[torch.randn(6), torch.tensor(2.0, dtype=torch.float64)]", "masked_fill"),
}


@pytest.mark.parametrize("name", sorted(LEFT))
def test_integer_ops_the_kernels_would_compute_otherwise_stay_torch(name, write_problem, tmp_path):
    args, body, inputs, op = LEFT[name]
    comp = generated_matches(write_problem(problem(args, body, inputs), f"left_{name}"), tmp_path, seeds=(0,))
    assert op in {o.name.split(":")[-1].split(".")[-1] for o in comp.plan.nops.values() if o.kind == "library"}
