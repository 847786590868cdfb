"""64-bit offsets where an operand reaches far, however few elements a launch walks: a column
slice of a tall matrix (2**20 rows of a 4096-wide one: 2**20 elements, 2**32 apart). Triton
passes int arguments and computes program ids in 32 bits; a launch that asked for 64-bit math
only by its element count wrapped those offsets around and read other memory. Checked on meta
tensors (shapes and strides, no storage): each template's launch records the I64 it was given."""
import pytest
import torch

from codegen.pipeline import compile_problem
from harness.problem import load_problem
from knowledge.templates import _runtime as RT
from tests.helpers import load_module
from tests.test_llm_kernels import problem


def _tall(rows: int, cols: int = 1):
    """The first ``cols`` columns of a (rows, 4096) fp32 matrix, as a meta tensor."""
    return torch.empty(rows, 4096, device="meta")[:, :cols]


def test_span_and_far():
    assert RT._egg_span(_tall(2**20)) == (2**20 - 1) * 4096 + 1
    assert RT._egg_span(torch.empty(0, 5, device="meta")) == 0
    assert RT._egg_span(torch.empty(3, 4, device="meta").expand(2**30, 3, 4)) == 12  # stride 0
    assert RT._egg_far([1, 1, 2**20, 1], [[0, 0, 4096, 1]])
    assert not RT._egg_far([1, 1, 2**15, 1], [[0, 0, 4096, 1]])
    # the layouts report it: a column of a tall matrix walked with a dense output
    x = _tall(2**20)
    assert RT._egg_pointwise_layout(tuple(x.shape), [x])[4]
    assert not RT._egg_pointwise_layout((2**20, 1), [torch.empty(2**20, 1, device="meta")])[4]
    lay = RT._egg_reduction_layout([2**20, 1], [1], [x])
    assert lay[4] and not RT._egg_reduction_layout([2**15, 1], [1], [_tall(2**15)])[4]


class _Record:
    """Stands in for a kernel: ``kernel[grid](*args, **kw)`` records kw and runs nothing."""

    def __init__(self, seen: list):
        self.seen = seen

    def __getitem__(self, grid):
        return lambda *a, **kw: self.seen.append(kw)


CASES = {
    # pointwise (flat and rows walks), a row reduction, a column scan, a matrix product
    "pointwise": (problem("x", "        return torch.relu(x) * 2.0\n", "[torch.randn(8, 300)]"), 300),
    "reduction": (problem("x", "        return x.sum(-1)\n", "[torch.randn(8, 300)]"), 300),
    "scan": (problem("x", "        return torch.cumsum(x, dim=-1)\n", "[torch.randn(8, 300)]"), 300),
    "matmul": (problem("x", "        return x @ self.w\n", "[torch.randn(8, 300)]",
                       members="        self.w = nn.Parameter(torch.randn(300, 64))\n"), 300),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_launch_asks_for_64_bits_when_an_operand_reaches_far(name, tmp_path):
    src, cols = CASES[name]
    path = tmp_path / f"{name}.py"
    path.write_text(src)
    comp = compile_problem(load_problem(path))
    assert comp.emitted is not None and comp.emitted.groups, comp.error
    out = tmp_path / f"cand_{name}.py"
    out.write_text(comp.emitted.source)
    mod = load_module(out, f"cand_far_{name}")
    g = comp.emitted.groups[0]
    seen: list = []
    for k in [n for n in vars(mod) if n.startswith(f"_egg_k_{g['id']}")]:
        setattr(mod, k, _Record(seen))
    wrapper = getattr(mod, f"_egg_{g['id']}")
    extra = [torch.empty(cols, 64, device="meta")] if name == "matmul" else []
    for rows, far in ((2**15, False), (2**20, True)):
        seen.clear()
        wrapper(_tall(rows, cols), *extra)
        assert seen and all(bool(kw["I64"]) is far for kw in seen), (rows, seen)
