"""Every kernel backed out: what a rewrite left in the graph runs as PyTorch. A group whose kernel
fails or regresses is dropped (codegen.fusion.plan_fusion ``disabled``) and its nodes stay in the
generated forward, where a rewrite's own ops are calls of the runtime helpers (``_egg_take``,
``_egg_rotate_half``, ``_egg_chanstats``...). Those calls must be what a user can run: the module
with no kernel at all is still a drop-in for Model (a value named like the helper it was made by
once made every call raise: ``_egg_take = _egg_take(...)``)."""
import re

import pytest

from codegen.pipeline import compile_problem
from harness.problem import load_problem
from tests.dropin import check_dropin
from tests.test_llm_kernels import BF, problem

CASES = {
    "rotate_half": problem(
        "x, cos, sin", "        h = x.shape[-1] // 2\n"
        "        return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin\n",
        "[torch.randn(2, 3, 5, 8), torch.randn(5, 8), torch.randn(5, 8)]"),
    "batch_norm_train": problem(
        "x", "        return torch.relu(self.bn(x))\n", "[torch.randn(2, 4, 5, 5)]",
        members="        self.bn = nn.BatchNorm2d(4)\n"),
    "reverse_cumsum": problem(
        "x", "        return torch.flip(torch.cumsum(torch.flip(x, [1]), 1), [1]) * 2.0\n",
        "[torch.randn(3, 40)]"),
    # Gemma-2's soft-capped scores: the masked-attention helper with its softcap
    "softcap_attention": problem(
        "q, k, v", "        s = torch.matmul(q, k.transpose(-2, -1)) * 0.25\n"
        "        s = torch.tanh(s / 30.0) * 30.0\n"
        "        return torch.matmul(torch.softmax(s, dim=-1), v)\n",
        "[torch.randn(2, 2, 9, 16), torch.randn(2, 2, 9, 16), torch.randn(2, 2, 9, 16)]"),
    "linear_cross_entropy": problem(
        "h, t", "        return F.cross_entropy(self.head(h).float(), t)\n",
        f"[torch.randn(11, 24, {BF}), torch.randint(0, 70, (11,))]",
        members=f"        self.head = nn.Linear(24, 70, bias=False, {BF})\n"),
    "dequant_linear": problem(
        "x", "        return F.linear(x, self.w.to(x.dtype))\n", f"[torch.randn(5, 32, {BF})]",
        members="        self.register_buffer('w', torch.randint(-128, 128, (24, 32), dtype=torch.int8))\n"),
    "take": problem(
        "logits, ids", "        s = torch.gather(logits, 1, ids)\n"
        "        return torch.where(s < 0, s * 1.3, s / 1.3)\n",
        "[torch.randn(3, 20), torch.randint(0, 20, (3, 13))]"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_module_with_every_kernel_backed_out_is_a_drop_in(name, write_problem):
    path = write_problem(CASES[name], f"backed_out_{name}")
    comp = compile_problem(load_problem(path))
    assert comp.plan is not None and comp.plan.groups, comp.error
    out = compile_problem(load_problem(path), disabled={g.id for g in comp.plan.groups})
    assert out.emitted is not None, out.error
    helpers = set(re.findall(r"= (_egg_[a-z]\w*)\(", _forward(out.emitted.source))) - {"_egg_route", "_egg_graphed"}
    assert helpers, "no rewrite's op left in the forward: the case tests nothing"
    check_dropin(path.read_text(), out.emitted.source, calls=1, atol=2e-2, rtol=2e-2)


def _forward(source: str) -> str:
    """The bodies of the generated module's fast paths (``_egg_fast``, or one per mode: the
    traced forward the kernels serve), their own lines, not the helpers after them."""
    body = []
    for part in source.split("    def _egg_fast")[1:]:  # _egg_fast, or _egg_fast_train / _eval
        for ln in part.splitlines()[1:]:
            if ln.strip() and not ln.startswith("        "):
                break
            body.append(ln)
    return "\n".join(body)
