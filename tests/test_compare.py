"""The precision contract on its own (harness.compare, no processes): integer outputs compared
exactly, the tolerance and non-finite rules, and the boundaries of the float64 door, the
lower-precision guard, the deep-net regime and the precision / mismatch label: each case builds
eager's and the candidate's outputs around a float64 truth with errors of known size. The
verifier suite covers the same contract end to end."""
import pytest
import torch

from harness import compare as CMP
from harness.compare import Tolerance, compare_output, fp64_door, structure_error

N = 4096


def _truth(seed=0, n=N):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g, dtype=torch.float64)


def _noise(n, scale, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g, dtype=torch.float64) * scale


def _judge(ref64, eager64, cand64, tol=None):
    tol = tol or Tolerance()
    eager, cand = eager64.float(), cand64.float()
    chk = compare_output(0, eager, cand, tol)
    return fp64_door(chk, ref64, eager, cand, tol)


def _err(t, frac, seed):
    """An error of exactly ``frac`` of the fp32 tolerance at each element, random signs."""
    g = torch.Generator().manual_seed(seed)
    sign = torch.randint(0, 2, t.shape, generator=g, dtype=torch.float64) * 2 - 1
    return frac * (1e-4 + 1e-4 * t.abs()) * sign


def test_door_boundary_more_accurate_passes_less_accurate_fails():
    """Eager within the tolerance of the float64 truth (0.7 of it), the candidate outside the
    tolerance of eager: 0.9x eager's error vs float64 passes by the door, 1.2x and 3x fail (a door
    widened to 100x eager's error would pass them)."""
    t = _truth()
    eager = t + _err(t, 0.7, 1)
    for k, ok in ((0.9, True), (1.2, False), (3.0, False)):
        chk = _judge(t, eager, t + _err(t, 0.7 * k, 2))
        assert not chk.within_tol
        assert chk.ok is ok, (k, chk.reason)
        assert chk.passed_by == ("fp64" if ok else "none")
        assert not chk.extra.get("deep_regime")
        if not ok:
            assert "error vs fp64" in chk.reason


def test_guard_boundary_inside_tolerance():
    """Inside the tolerance, an RMS error vs float64 16x eager's is lower precision; 8x is not
    (a guard factor widened to 1e12 would pass the 40x candidate)."""
    t = _truth()
    e = _noise(N, 1e-7, 2)
    eager = t + e
    for k, ok in ((8.0, True), (40.0, False)):
        cand = t + _noise(N, 1e-7 * k, 3)
        chk = _judge(t, eager, cand)
        assert chk.within_tol
        assert chk.ok is ok, (k, chk.reason)
        if not ok:
            assert chk.category == "precision" and "lower precision than eager" in chk.reason


def test_guard_catches_a_small_relative_bias_inside_tolerance():
    """A 2e-5 relative bias (inside rtol=1e-4) is ~100x eager's fp32 error: rejected."""
    t = _truth()
    eager = t.float().double()
    chk = _judge(t, eager, t * (1 + 2e-5))
    assert chk.within_tol and not chk.ok and chk.category == "precision"


def test_guard_floor_exact_eager():
    """Eager exact (a copy, relu): the candidate's rounding of ~1 ulp is not lower precision."""
    t = _truth().float().double()  # exactly representable: eager's error is 0
    cand = (t.float() * 3.0 / 3.0).double()
    chk = _judge(t, t, cand)
    assert chk.ok, chk.reason


def test_guard_floor_is_in_ulps_of_each_element():
    """Eager nearly exact on small outputs of mixed magnitude (a 12-channel mean dominated by an
    exact bias): an honest sum's 3-4 ulps per element is rounding, not lower precision (a floor
    of 2^-22 of the output's RMS rejected it: CI, test_layout); 40 ulps per element is not."""
    g = torch.Generator().manual_seed(3)
    t = (torch.rand(12, generator=g, dtype=torch.float64) * 0.12).float().double()
    ulp = (torch.nextafter(t.float(), torch.tensor(1.0)) - t.float()).double()
    eager = t + 0.05 * ulp * torch.randn(12, generator=g, dtype=torch.float64)
    sign = torch.randint(0, 2, (12,), generator=g, dtype=torch.float64) * 2 - 1
    honest = _judge(t, eager, t + 3.5 * ulp * sign)
    assert honest.ok, honest.reason
    cheat = _judge(t, eager, t + 40 * ulp * sign)
    assert cheat.within_tol and not cheat.ok and cheat.category == "precision", cheat.reason


def test_deep_regime_admits_a_like_error_and_rejects_a_larger_one():
    """Eager itself outside the tolerance of float64 (TF32 convolutions deep in a net): a
    candidate of the same class (1.5x eager's max error) passes; 2.5x does not."""
    t = _truth()
    eager = t + _err(t, 2.0, 4)
    ok_c = _judge(t, eager, t + _err(t, 3.0, 5))
    assert ok_c.ok and ok_c.passed_by == "fp64" and ok_c.extra.get("deep_regime"), ok_c.reason
    bad = _judge(t, eager, t + _err(t, 5.0, 6))
    assert not bad.ok and f"{CMP.DEEP_DOOR_FACTOR:g}x eager's" in bad.reason


def _bf16_rounded(t, step, k, seed, offset=0.0):
    """bf16 outputs over values of magnitude 1-2 that carry the rounding of an intermediate of
    step ``step`` (a residual stream of magnitude 4-8 in bf16: 0.031), scaled by ``k``."""
    g = torch.Generator().manual_seed(seed)
    e = (torch.rand(t.shape, generator=g, dtype=torch.float64) - 0.5) * step * k
    return (t + e + offset).to(torch.bfloat16)


def _judge16(t, eager, cand):
    chk = compare_output(0, eager, cand, Tolerance())
    return fp64_door(chk, t, eager, cand, Tolerance())


def test_rounding_regime_of_bf16_outputs():
    """The Llama-3 layer on the H200: eager within the tolerance of float64, an honest candidate
    (its intermediates rounded at other points: the same error distribution, drawn anew) is
    outside the tolerance of eager where the output is small and its max error vs float64 is a
    few percent above eager's: it passes (the strict door rejected it). One element 2.5x eager's
    max error (beyond the 2x door), rounding 1.8x coarser (inside the door, RMS 1.8x eager's) and
    a small systematic offset (inside the door and the RMS bound, but a bias) are rejected."""
    g = torch.Generator().manual_seed(11)
    t = 1 + torch.rand(N, generator=g, dtype=torch.float64)
    eager = _bf16_rounded(t, 0.031, 1.0, 1)
    e_max = float((eager.double() - t).abs().max())
    seeds = [s for s in range(2, 40)
             if float((_bf16_rounded(t, 0.031, 1.0, s).double() - t).abs().max()) > e_max]
    honest = _judge16(t, eager, _bf16_rounded(t, 0.031, 1.0, seeds[0]))
    assert not honest.within_tol and honest.cand_err_fp64 > honest.eager_err_fp64
    assert honest.ok and honest.passed_by == "fp64" and honest.extra.get("rounding_regime"), honest.reason
    outlier = _bf16_rounded(t, 0.031, 1.0, seeds[0]).double()
    outlier[17] = t[17] + 2.5 * e_max  # like rounding elsewhere, one element beyond the 2x door
    wide = _judge16(t, eager, outlier.to(torch.bfloat16))
    assert not wide.ok and f"{CMP.DEEP_DOOR_FACTOR:g}x eager's" in wide.reason, wide.reason
    assert not _judge16(t, eager, _bf16_rounded(t, 0.031, 2.5, 3)).ok
    coarse = _judge16(t, eager, _bf16_rounded(t, 0.031, 1.8, 3))
    assert coarse.cand_err_fp64 <= CMP.DEEP_DOOR_FACTOR * coarse.eager_err_fp64
    assert not coarse.ok and "RMS" in coarse.reason, coarse.reason
    biased = _judge16(t, eager, _bf16_rounded(t, 0.031, 1.0, 3, offset=0.006))
    assert biased.cand_err_fp64 <= CMP.DEEP_DOOR_FACTOR * biased.eager_err_fp64
    assert biased.extra["cand_rms_fp64"] <= CMP.LOWP_RMS_FACTOR * biased.extra["eager_rms_fp64"]
    assert not biased.ok, biased.reason


def test_close_noise_is_precision_but_a_systematic_error_is_a_mismatch():
    """Both outside the tolerance and close to the truth: rounding-like noise (TF32 for fp32
    work) is 'precision'; a wrong eps (error proportional to the values) or a constant offset
    is a 'mismatch'."""
    t = _truth()
    eager = t + _noise(N, 1e-8, 5)
    noisy = _judge(t, eager, t + _noise(N, 1e-3, 6))
    assert not noisy.ok and noisy.category == "precision"
    scaled = _judge(t, eager, t * (1 - 2e-3))  # 1 / sqrt(var + eps') with eps' too large
    assert not scaled.ok and scaled.category == "mismatch"
    shifted = _judge(t, eager, t + 2e-3)
    assert not shifted.ok and shifted.category == "mismatch"


def test_nan_where_eager_is_finite_fails_before_any_door():
    t = _truth()
    cand = t.clone()
    cand[7] = float("nan")
    chk = _judge(t, t, cand)
    assert not chk.ok and "NaN" in chk.reason and chk.passed_by == "none"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_problems_have_no_guard(dtype):
    """For fp16/bf16 problems eager is itself low precision: only tolerance and door apply."""
    t = _truth()
    eager = t.to(dtype)
    cand = (t + _noise(N, 1e-4, 7)).to(dtype)
    chk = fp64_door(compare_output(0, eager, cand, Tolerance()), t, eager, cand, Tolerance())
    assert chk.ok, chk.reason


def test_integer_outputs_must_be_equal():
    """argmax-style outputs: one index off fails (no tolerance applies to integers)."""
    ref = torch.tensor([3, 0, 7, 1])
    assert compare_output(0, ref, ref.clone(), Tolerance()).ok
    off = ref.clone()
    off[2] = 6
    chk = compare_output(0, ref, off, Tolerance())
    assert not chk.ok and chk.max_abs == 1.0 and "integer values differ" in chk.reason


def test_float_tolerance_and_non_finite_values():
    ref = torch.tensor([1.0, -2.0, 1000.0])
    tol = Tolerance()
    assert compare_output(0, ref, ref + 5e-5, tol).ok  # inside atol + rtol * |ref|
    chk = compare_output(0, ref, ref + torch.tensor([0.0, 0.0, 0.2]), tol)
    assert not chk.ok and chk.max_abs > 0.1  # 0.2 > 1e-4 + 1e-4 * 1000
    nan = ref.clone()
    nan[0] = float("nan")
    assert not compare_output(0, ref, nan, tol).ok
    assert "NaN/Inf" in compare_output(0, ref, nan, tol).reason


def test_structure_shape_and_dtype():
    ref = [torch.zeros(2, 3)]
    assert structure_error(ref, [torch.zeros(2, 3)]) is None
    assert "shape" in structure_error(ref, [torch.zeros(3, 2)])
    assert "dtype" in structure_error(ref, [torch.zeros(2, 3, dtype=torch.float64)])


class _UpcastSoftmax(torch.nn.Module):
    """An LLM-style head: bf16 logits upcast with ``.float()``, softmax in fp32."""

    def forward(self, x):
        return torch.softmax(x.float() / 0.7, dim=-1)


def test_fp64_reference_keeps_float64_through_the_models_own_casts():
    """The float64 reference of a model that upcasts with ``.float()`` (and casts with ``.to`` or a
    ``dtype=`` argument) is computed in float64, not in fp32 bit for bit eager's; integer casts
    stay integer."""
    from harness.worker import _fp64_model, _fp64_outputs

    class Casts(torch.nn.Module):
        def forward(self, x):
            y = x.to(torch.float32) + torch.zeros(x.shape, dtype=torch.bfloat16)
            return torch.log_softmax(y, -1, dtype=torch.float32), x.float().argmax(-1).long()

    x = (torch.randn(8, 300, generator=torch.Generator().manual_seed(0)) * 3).bfloat16()
    for model in (_UpcastSoftmax(), Casts()):
        ref = _fp64_outputs(_fp64_model(model), model, {}, [x], "train")
        assert ref[0].dtype == torch.float64
        eager = model(x)
        eager = eager[0] if isinstance(eager, tuple) else eager
        assert not torch.equal(ref[0], eager.double())  # not fp32 in disguise
        assert torch.allclose(ref[0], eager.double(), rtol=1e-5, atol=1e-7)
    assert ref[1].dtype == torch.int64


def test_honest_rounding_of_an_upcasting_softmax_is_not_lower_precision():
    """Peaked softmaxes (bf16 logits x3 / 0.7, upcast with ``.float()``): a kernel computing exp as
    exp2(x * log2 e), as Triton does, rounds a few ulps off eager and must pass the guard on every
    draw. With the float64 reference computed in fp32 (the model's own ``.float()``), eager's error
    was 0 and one draw in ~25 failed."""
    from harness.worker import _fp64_model, judge_outputs

    model = _UpcastSoftmax()
    m64 = _fp64_model(model)
    for seed in range(40):
        g = torch.Generator().manual_seed(seed)
        x = (torch.randn(4, 500, generator=g) * 3).bfloat16()
        eager = model(x)
        z = x.float() / 0.7
        e = torch.exp2((z - z.amax(-1, keepdim=True)) * 1.4426950408889634)
        cand = e / e.sum(-1, keepdim=True)
        (chk,) = judge_outputs([eager], [cand], [x], model, m64, {}, "train",
                               lambda i, r: Tolerance(), "trial")
        assert chk.ok, (seed, chk.reason)
        # the same kernel keeping 15 mantissa bits (inside rtol=1e-4): lower precision, every draw
        low = (cand.view(torch.int32) & ~0xFF).view(torch.float32)
        (chk,) = judge_outputs([eager], [low], [x], model, m64, {}, "train",
                               lambda i, r: Tolerance(), "trial")
        assert chk.within_tol and not chk.ok and chk.category == "precision", (seed, chk.reason)


def _masked(t, idx):
    out = t.clone()
    out[idx] = float("-inf")
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decision_regime_admits_infinities_as_close_to_float64_as_eagers(dtype):
    """Top-p filtering on a bf16 cumulative sum: eager's rounding moves where the -inf begin, so
    its pattern differs from float64's at some elements. A candidate whose infinities differ from
    float64's at no more than DECISION_DOOR_FACTOR x as many passes the pattern; one further off,
    one with a NaN, or one whose kept values are not float64's does not. Where eager's pattern is
    float64's, the pattern must be eager's exactly."""
    ref = _truth(3).to(dtype).double()
    cut = torch.arange(0, N, 2)  # float64 masks every other element ...
    ref64 = _masked(ref, cut)
    eager = _masked(ref, torch.cat([cut, torch.arange(1, 41, 2)])).to(dtype)  # ... eager 20 more
    tol = Tolerance()

    def judge(cand):
        return fp64_door(compare_output(0, eager, cand, tol), ref64, eager, cand, tol)

    honest = _masked(ref, torch.cat([cut, torch.arange(101, 131, 2)])).to(dtype)  # 15 elsewhere
    chk = judge(honest)
    assert chk.ok and chk.passed_by == "fp64" and chk.extra["decision_regime"]
    assert (chk.extra["eager_pattern_fp64"], chk.extra["cand_pattern_fp64"]) == (20, 15)
    assert judge(_masked(ref, torch.cat([cut, torch.arange(101, 181, 2)])).to(dtype)).ok  # 40: 2x
    far = judge(_masked(ref, torch.cat([cut, torch.arange(101, 185, 2)])).to(dtype))  # 42 > 2 x 20
    assert not far.ok and "eager's at 20" in far.reason
    unfiltered = judge(ref.to(dtype))  # no filtering at all
    assert not unfiltered.ok
    nan = honest.clone()
    nan[1] = float("nan")
    assert not judge(nan).ok and "NaN" in judge(nan).reason
    kept_wrong = honest.clone()
    kept_wrong[3] += 0.5  # kept where eager has -inf (float64 keeps it): not float64's value
    assert not judge(kept_wrong).ok
    shifted = honest.clone()
    shifted[201] += 0.5  # a value both keep, off eager's and float64's: the value contract
    assert not judge(shifted).ok and "max abs error" in judge(shifted).reason
    plus = honest.clone()
    plus[cut[:3]] = float("inf")  # the sign of an infinity is part of the pattern
    assert judge(plus).extra["cand_pattern_fp64"] == 18
    # eager's pattern is float64's: strict, one element off fails
    eager_exact = ref64.to(dtype)
    one_off = _masked(ref, torch.cat([cut, torch.tensor([1])])).to(dtype)
    chk = fp64_door(compare_output(0, eager_exact, one_off, tol), ref64, eager_exact, one_off, tol)
    assert not chk.ok and "NaN/Inf" in chk.reason and chk.extra["eager_pattern_fp64"] == 0


def test_decision_regime_keeps_the_unstable_log_softmax_out():
    """Infinities where eager and float64 are finite (exp overflowed): eager's pattern is
    float64's, so none is admitted."""
    ref64 = _truth(4)
    eager = ref64.float()
    cand = eager.clone()
    cand[:10] = float("-inf")
    chk = fp64_door(compare_output(0, eager, cand, Tolerance()), ref64, eager, cand, Tolerance())
    assert not chk.ok and chk.extra["eager_pattern_fp64"] == 0


def test_nested_outputs_flatten_with_their_structure():
    """A dict (Hugging Face's ModelOutput), or a tuple holding a tuple, crosses as its structure
    then its leaves; another structure with the same leaves is a mismatch."""
    from collections import OrderedDict

    from harness.compare import TREE, flatten, structure_error

    a, b, c = torch.ones(2), torch.zeros(3), torch.arange(4)
    assert flatten(a) == [a] and flatten((a, 2)) == [a, 2]  # flat: as before
    out = flatten(OrderedDict(logits=a, past=(b, c)))
    assert out[0] == TREE + "{'logits':*,'past':(*,*)}" and out[1:] == [a, b, c]
    assert flatten((a, (b, c)))[0] == TREE + "(*,(*,*))"
    assert structure_error(out, flatten({"logits": a, "past": (b, c)})) is None
    assert "structure" in structure_error(out, flatten((a, b, c)))
    assert "structure" in structure_error(out, flatten({"logits": a, "cache": (b, c)}))


@pytest.mark.parametrize("dtype", [torch.int8, torch.int64, torch.bool])
def test_integer_decision_regime_admits_values_as_close_to_float64_as_eagers(dtype):
    """Integers and bools decided from rounded floats (_integer_door): where eager's differ from
    float64's at n_e elements, a candidate differing at <= 2 n_e elements, each by no more than
    eager's largest difference, passes by "fp64"; more elements, a larger step, or any
    difference where eager matches float64 exactly, fails with the counts."""
    g = torch.Generator().manual_seed(0)
    ref64 = torch.randint(0, 2, (4000,), generator=g).to(dtype)

    def off(t, idx, by=1):
        t = t.long().clone()
        t[idx] += by
        return (t % 2).to(dtype) if dtype == torch.bool else t.to(dtype)

    eager = off(ref64, torch.arange(0, 100))  # 100 elements one off float64's
    honest = off(ref64, torch.arange(50, 250))  # 200 off float64's, 200 + 100 - 2*50 off eager's

    def door(cand, e=eager):
        chk = compare_output(0, e, cand, Tolerance())
        assert not chk.ok and "integer values differ" in chk.reason
        return fp64_door(chk, ref64, e, cand, Tolerance())

    chk = door(honest)
    assert chk.ok and chk.passed_by == "fp64" and chk.extra["decision_regime"], chk.reason
    chk = door(off(ref64, torch.arange(50, 260)))  # 210 > 2 * 100
    assert not chk.ok and "at 210 elements" in chk.reason and "eager's at 100" in chk.reason
    if dtype != torch.bool:
        chk = door(off(ref64, torch.arange(50, 60), by=2))  # few, but two steps where eager's one
        assert not chk.ok and "by up to 2" in chk.reason
    chk = door(honest, e=ref64.clone())  # eager equals float64: exact equality stays the contract
    assert not chk.ok and "eager's at 0" in chk.reason
