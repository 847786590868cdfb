"""Attention never reads the key blocks its mask hides from a whole tile (principle
mem-mask-skip-blocks): a decode over a padded batch of caches (lengths given), a prefill with a
bool padding mask, left padding. Checked against torch in the interpreter, and by NaN written
into the hidden blocks of K and V: eager's result is NaN there (0 * NaN); the kernels, which
never read those blocks, match torch on the same inputs with the hidden tails zeroed. A
kernel that reads every block returns NaN and fails."""
import pytest
import torch

from codegen import pipeline
from harness.problem import load_module, load_problem
from tests.dropin import check_dropin
from tests.test_llm_kernels import problem

BN = 16  # BLOCK_N of every case: hidden blocks start at multiples of it

CASES = {
    # one decode step over caches of three lengths (workload 36's spelling): the split-KV
    # kernel, the cache cut in chunks (some wholly past a length)
    "decode_lengths": (problem(
        "q, k, v, lengths",
        "        pos = torch.arange(k.shape[-2], device=q.device)\n"
        "        valid = pos[None, :] < lengths[:, None]\n"
        "        mask = torch.zeros(valid.shape, dtype=q.dtype, device=q.device).masked_fill(~valid, float('-inf'))\n"
        "        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])\n",
        "[torch.randn(3, 4, 1, 16), torch.randn(3, 4, 77, 16), torch.randn(3, 4, 77, 16),"
        " torch.tensor([77, 5, 33])]"),
        {"BLOCK_N": BN, "SPLIT_PROGRAMS": 8}),
    # prefill rows with a bool padding mask (the flash kernel): True where the key is kept
    "prefill_bool": (problem(
        "q, k, v, lengths",
        "        keep = torch.arange(k.shape[-2], device=q.device)[None, :] < lengths[:, None]\n"
        "        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :])\n",
        "[torch.randn(2, 2, 40, 16), torch.randn(2, 2, 70, 16), torch.randn(2, 2, 70, 16),"
        " torch.tensor([70, 20])]"),
        {"BLOCK_M": 16, "BLOCK_N": BN, "DECODE_ROWS": 1}),
}


def _kernel_module(write_problem, tmp_path, name):
    src, cfg = CASES[name]
    prob = load_problem(write_problem(src, f"skip_{name}"))
    # (the mask's comparison and fill are pointwise kernels of their own before it)
    comp = pipeline.compile_problem(prob, configs={f"g{i}": cfg for i in range(4)})
    assert comp.emitted is not None, comp.error
    assert [g.kind for g in comp.plan.groups][-1] == "attention"
    path = tmp_path / f"cand_{name}.py"
    path.write_text(comp.emitted.source)
    return prob, load_module(path, "candidate")


def _hide_tails(k, v, lengths, value):
    """K and V with ``value`` in each sequence's whole key blocks past its length."""
    k, v = k.clone(), v.clone()
    for b, n in enumerate(lengths.tolist()):
        start = -(-n // BN) * BN
        k[b, :, start:] = value
        v[b, :, start:] = value
    return k, v


@pytest.mark.parametrize("name", sorted(CASES))
def test_hidden_key_blocks_are_never_read(name, write_problem, tmp_path):
    prob, mod = _kernel_module(write_problem, tmp_path, name)
    ref, new = prob.Model(), mod.ModelNew()
    q, k, v, lengths = prob.inputs()
    with torch.no_grad():
        torch.testing.assert_close(new(q, k, v, lengths), ref(q, k, v, lengths), atol=1e-4, rtol=1e-4)
        kn, vn = _hide_tails(k, v, lengths, float("nan"))
        kz, vz = _hide_tails(k, v, lengths, 0.0)
        assert torch.isnan(ref(q, kn, vn, lengths)).any()  # eager reads them: 0 * NaN
        got = new(q, kn, vn, lengths)
        torch.testing.assert_close(got, ref(q, kz, vz, lengths), atol=1e-4, rtol=1e-4)
    # as a user calls it: train() and eval(), scaled inputs, another batch, grad mode
    src = (tmp_path / f"cand_{name}.py").read_text()
    rep = check_dropin(CASES[name][0], src, calls=1, atol=1e-4, rtol=1e-4)
    assert rep.fast("own", "train") and rep.fast("own", "eval")


def test_leading_hidden_blocks_and_a_hole_keep_the_result(write_problem, tmp_path):
    """Left padding (the first keys hidden) is skipped from the start of the range; a block
    hidden in the middle of the visible range is still read (no branch per block) and adds
    nothing; a row that sees no key at all gives sdpa's 0."""
    src = problem(
        "q, k, v, start",
        "        pos = torch.arange(k.shape[-2], device=q.device)\n"
        "        keep = (pos[None, :] >= start[:, None]) & ((pos[None, :] < 32) | (pos[None, :] >= 48))\n"
        "        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :])\n",
        "[torch.randn(3, 2, 1, 16), torch.randn(3, 2, 70, 16), torch.randn(3, 2, 70, 16),"
        " torch.tensor([0, 37, 70])]")
    prob = load_problem(write_problem(src, "skip_lead"))
    comp = pipeline.compile_problem(prob, configs={f"g{i}": {"BLOCK_N": BN, "SPLIT_PROGRAMS": 1} for i in range(4)})
    assert [g.kind for g in comp.plan.groups][-1] == "attention"
    path = tmp_path / "cand_lead.py"
    path.write_text(comp.emitted.source)
    mod = load_module(path, "candidate")
    ref, new = prob.Model(), mod.ModelNew()
    q, k, v, start = prob.inputs()
    with torch.no_grad():
        want = ref(q, k, v, start)
        torch.testing.assert_close(new(q, k, v, start), want, atol=1e-4, rtol=1e-4)
        assert (want[2] == 0).all()  # every key hidden: sdpa's safe softmax
        kn, vn = k.clone(), v.clone()
        kn[1, :, :32], vn[1, :, :32] = float("nan"), float("nan")  # blocks wholly before 37
        kz, vz = k.clone(), v.clone()
        kz[1, :, :32], vz[1, :, :32] = 0.0, 0.0
        torch.testing.assert_close(new(q, kn, vn, start)[1], ref(q, kz, vz, start)[1], atol=1e-4, rtol=1e-4)
