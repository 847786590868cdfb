"""The precision contract (DESIGN.md): compare candidate outputs with eager's.

An output passes when it matches eager within KernelBench's tolerance for its dtype, or when its
error against a float64 reference is no larger than eager's own (up to DEEP_DOOR_FACTOR x in the
deep-net regime and in the rounding regime of 16-bit outputs, under their conditions). NaN or Inf where eager has
none fails; so does a different shape, dtype, or a tensor subclass.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

LOW_PRECISION = {torch.float16, torch.bfloat16}
#: the lower-precision guard, on every trial, for fp32 outputs: a candidate whose RMS error against
#: the float64 reference is more than this factor above eager's computes with lower precision
#: than eager (TF32 where eager is fp32, a 13-bit mantissa, a fast inverse square root) and is
#: rejected even inside the tolerance. Honest reorderings of fp32 sums and Triton's fast exp
#: (ex2.approx after a multiply) stay within ~4x; TF32 GEMMs land ~1000x above fp32 error.
LOWER_PRECISION_FACTOR = 16.0
#: ... unless that RMS error is at most this many fp32 ulps (the spacing of fp32 at each reference
#: element, RMS over the output): where eager is exact or nearly so (a copy, relu, max; a mean
#: dominated by an exact bias) an honest kernel's rounding, a few ulps, would otherwise be "16x
#: worse". Every lower-precision format is far above it (a twice-refined fast inverse square
#: root ~20-40 ulps, a 13-bit mantissa ~1000, TF32 ~8000). Ulps of each element, not a fraction of
#: the output's RMS: outputs of mixed magnitudes have their rounding where their large values are.
LOWER_PRECISION_FLOOR_ULPS = 8.0
#: outside tolerance and less accurate than eager, but within this fraction of max|reference| of the
#: float64 truth, with errors that look like rounding (no bias, uncorrelated with the values):
#: the candidate is close but imprecise (bf16 or TF32 for fp32 work): category "precision".
#: A systematic error (a wrong eps, a dropped bias) is a "mismatch" however small.
PRECISION_CLOSE = 0.05
#: rounding noise: |mean error| / RMS error and |correlation of error with the reference| below this
NOISE_STAT = 0.3
#: fewer finite elements than this: no statistics, a close error is a mismatch
NOISE_MIN_ELEMENTS = 64
#: the deep-net regime: where eager's own error against float64 is beyond the tolerance (deep
#: stacks of fp32 layers; cuDNN convolutions in TF32, PyTorch's default), a candidate of the same
#: precision class differs from eager by more than the tolerance too, and "no larger than
#: eager's error" fails half the time by chance. There the fp64 door admits a max error up to this
#: factor above eager's (honest reorderings: ratios of maxima of two like error distributions,
#: measured 0.5-1.6, docs/verifier.md); a downcast to bf16 is ~8x above TF32's error.
DEEP_DOOR_FACTOR = 2.0
#: the rounding regime of 16-bit outputs: eager rounds its intermediates to bf16 / fp16 (a residual
#: stream of magnitude 4-8 carries bf16 steps of 0.031), and an honest kernel that rounds at
#: other points (a fused add kept in fp32) lands an intermediate step away where the output is
#: small, beyond atol; its max error vs float64 then exceeds eager's as often as not (the Llama-3
#: layer on the H200: 0.0301 vs 0.0291, 0.0312 vs 0.030, four candidates rejected). There the door
#: admits DEEP_DOOR_FACTOR x eager's max error when the error is rounding-like (no bias, no
#: correlation with the values) and its RMS is at most this factor of eager's: two like rounding
#: distributions have RMS ratios near 1, a coarser format (fp8 intermediates, a 16-bit
#: accumulator) several times, a dropped term shows as bias.
LOWP_RMS_FACTOR = 1.5
#: the decision regime: an output whose elements are set to +-inf by a decision on a rounded value
#: (top-p filtering: a bf16 cumulative sum compared with a threshold) has eager's own infinities
#: off from the float64 reference's where eager's rounding moves the decision (PyTorch's CUDA
#: cumsum of bf16 combines its partial sums in bf16). Where it is (eager's pattern of +inf / -inf /
#: finite differs from float64's at some elements), a candidate whose pattern differs from
#: float64's at no more than this factor times as many elements passes the pattern (the deep
#: regime's factor: two like error distributions). Never NaN, never where eager matches float64.
DECISION_DOOR_FACTOR = 2.0


@dataclass
class Tolerance:
    atol_fp32: float = 1e-4
    rtol_fp32: float = 1e-4
    atol_lowp: float = 1e-2
    rtol_lowp: float = 1e-2

    def for_dtype(self, dt: torch.dtype) -> tuple[float, float]:
        if dt in LOW_PRECISION:
            return self.atol_lowp, self.rtol_lowp
        return self.atol_fp32, self.rtol_fp32


@dataclass
class OutputCheck:
    index: int
    ok: bool
    reason: str = ""
    max_abs: float = 0.0
    max_rel: float = 0.0
    within_tol: bool = False
    eager_err_fp64: float | None = None
    cand_err_fp64: float | None = None
    passed_by: str = "none"
    category: str = "mismatch"  # or "precision": close to eager but less accurate than it
    extra: dict = field(default_factory=dict)


#: the first leaf of a nested output: its structure (compared as a plain value, so a candidate
#: must return the same dict keys and nesting as Model)
TREE = "__egg_tree__:"


def flatten(out) -> list:
    """An output's leaves, as the judge compares them: a tensor or a plain value is one; a flat
    tuple or list its items. A nested one (a dict, Hugging Face's ModelOutput, a tuple holding a
    tuple: ``(hidden, (k, v))``) gives its structure first (TREE and the nesting with the dict
    keys), then its leaves in order. Before, such an output crossed as "an object" and every
    candidate, EGG's too, was a mismatch."""
    if isinstance(out, (list, tuple)) and not any(isinstance(o, (list, tuple, dict)) for o in out):
        return list(out)
    if not isinstance(out, (list, tuple, dict)):
        return [out]
    leaves: list = []

    def walk(o) -> str:
        if isinstance(o, dict):
            return "{" + ",".join(f"{k!r}:{walk(v)}" for k, v in o.items()) + "}"
        if isinstance(o, (list, tuple)):
            return "(" + ",".join(walk(v) for v in o) + ")"
        leaves.append(o)
        return "*"

    return [TREE + walk(out)] + leaves


def structure_error(ref: list, cand: list) -> str | None:
    tree = [x[len(TREE):] if isinstance(x, str) and x.startswith(TREE) else None
            for x in (ref[0] if ref else None, cand[0] if cand else None)]
    if tree[0] != tree[1]:
        return (f"the output's structure is {tree[1] or 'flat'}, eager's {tree[0] or 'flat'} "
                "(* a tensor or value; dict keys and nesting must be Model's)")
    if len(ref) != len(cand):
        return f"returned {len(cand)} outputs, eager returns {len(ref)}"
    for i, (r, c) in enumerate(zip(ref, cand)):
        if isinstance(r, torch.Tensor):
            if not isinstance(c, torch.Tensor):
                return f"output {i} is {type(c).__name__}, not a tensor"
            if type(c) is not torch.Tensor and not isinstance(c, torch.nn.Parameter):
                return f"output {i} is a tensor subclass ({type(c).__name__})"
            if tuple(c.shape) != tuple(r.shape):
                return f"output {i} has shape {tuple(c.shape)}, eager {tuple(r.shape)}"
            if c.dtype != r.dtype:
                return f"output {i} has dtype {c.dtype}, eager {r.dtype}"
            if c.device != r.device:
                return f"output {i} is on {c.device}, eager on {r.device}"
    return None


CHUNK = 1 << 24  # elements compared at a time: bounds the float64 temporaries to ~128 MB


def _chunks(*ts: torch.Tensor):
    flat = [t.reshape(-1) for t in ts]
    n = flat[0].numel()
    for i in range(0, n, CHUNK):
        yield [f[i:i + CHUNK] for f in flat]


def compare_output(i: int, ref: torch.Tensor, cand: torch.Tensor, tol: Tolerance) -> OutputCheck:
    if not ref.dtype.is_floating_point and not ref.is_complex():
        same = bool(torch.equal(ref, cand))
        diff = 0.0 if same else float((ref.double() - cand.double()).abs().max())
        return OutputCheck(i, same, "" if same else f"output {i}: integer values differ (max {diff:g})",
                           max_abs=diff, within_tol=same, passed_by="tolerance" if same else "none")
    atol, rtol = tol.for_dtype(ref.dtype)
    max_abs = max_rel = 0.0
    within = True
    bad_nonfinite = 0
    differ_nonfinite = False
    new_nan = 0
    for r, c in _chunks(ref, cand):
        r, c = r.double(), c.double()
        r_fin, c_fin = torch.isfinite(r), torch.isfinite(c)
        bad_nonfinite += int((~c_fin & r_fin).sum())
        if not torch.equal(r_fin, c_fin) or not torch.equal(r[~r_fin].nan_to_num(), c[~c_fin].nan_to_num()):
            differ_nonfinite = True  # (a NaN eager lacks is always such a difference)
            new_nan += int((torch.isnan(c) & ~torch.isnan(r)).sum())
        diff = torch.where(r_fin & c_fin, (r - c).abs(), torch.zeros_like(r))
        if diff.numel():
            max_abs = max(max_abs, float(diff.max()))
            # relative to |eager|, floored at atol so that near-zero values do not blow it up
            max_rel = max(max_rel, float((diff / r.abs().nan_to_num().clamp_min(max(atol, 1e-12))).max()))
            within &= bool((diff <= atol + rtol * r.abs().nan_to_num()).all())
    # a pattern of infinities that differs, with no new NaN, may still pass the decision regime
    extra = {"inf_pattern": True} if differ_nonfinite and not new_nan else {}
    if bad_nonfinite:
        return OutputCheck(i, False, f"output {i}: {bad_nonfinite} NaN/Inf values where eager has finite ones",
                           max_abs=max_abs, max_rel=max_rel, within_tol=within, extra=extra)
    if differ_nonfinite:
        return OutputCheck(i, False, f"output {i}: non-finite values differ from eager's",
                           max_abs=max_abs, max_rel=max_rel, within_tol=within, extra=extra)
    return OutputCheck(i, within, "" if within else
                       f"output {i}: max abs error {max_abs:.3g} exceeds atol={atol:g}, rtol={rtol:g}",
                       max_abs=max_abs, max_rel=max_rel, within_tol=within,
                       passed_by="tolerance" if within else "none")


def _errors(a: torch.Tensor, ref64: torch.Tensor) -> dict:
    """Error statistics of ``a`` against the float64 reference over its finite elements:
    max and RMS error, max and RMS of the reference, RMS of fp32's spacing at the reference's
    values (``ulp_rms``), mean error, covariance with the reference."""
    n = 0
    mx = scale = 0.0
    s_d = s_dd = s_r = s_rr = s_dr = s_uu = 0.0
    for x, r in _chunks(a, ref64):
        r = r.double()
        fin = torch.isfinite(r) & torch.isfinite(x.double())
        if not fin.any():
            continue
        rr = r[fin]
        d = x.double()[fin] - rr
        n += int(fin.sum())
        mx = max(mx, float(d.abs().max()))
        scale = max(scale, float(rr.abs().max()))
        s_d += float(d.sum())
        s_dd += float((d * d).sum())
        s_r += float(rr.sum())
        s_rr += float((rr * rr).sum())
        s_dr += float((d * rr).sum())
        r32 = rr.float().abs()
        ulp = (torch.nextafter(r32, torch.full_like(r32, float("inf"))) - r32).double().nan_to_num(0.0, 0.0, 0.0)
        s_uu += float((ulp * ulp).sum())
    if n == 0:
        return {"n": 0, "max": 0.0, "rms": 0.0, "scale": 0.0, "ref_rms": 0.0, "ulp_rms": 0.0, "bias": 0.0,
                "corr": 0.0}
    rms = (s_dd / n) ** 0.5
    var_d = max(s_dd / n - (s_d / n) ** 2, 0.0)
    var_r = max(s_rr / n - (s_r / n) ** 2, 0.0)
    cov = s_dr / n - (s_d / n) * (s_r / n)
    return {"n": n, "max": mx, "rms": rms, "scale": scale, "ref_rms": (s_rr / n) ** 0.5,
            "ulp_rms": (s_uu / n) ** 0.5,
            "bias": abs(s_d / n) / rms if rms > 0 else 0.0,
            "corr": abs(cov) / (var_d * var_r) ** 0.5 if var_d > 0 and var_r > 0 else 0.0}


def _eager_outside_tolerance(eager: torch.Tensor, ref64: torch.Tensor, tol: "Tolerance") -> bool:
    """Is eager itself beyond the tolerance of the float64 truth (the deep-net regime)?"""
    atol, rtol = tol.for_dtype(eager.dtype)
    for e, r in _chunks(eager, ref64):
        r, e = r.double(), e.double()
        fin = torch.isfinite(r) & torch.isfinite(e)
        if bool(((e - r).abs()[fin] > atol + rtol * r.abs()[fin]).any()):
            return True
    return False


def _classes(t: torch.Tensor) -> torch.Tensor:
    """Each element's class: 0 finite, 1 +inf, 2 -inf, 3 NaN."""
    return torch.where(torch.isnan(t), 3, torch.where(t == float("inf"), 1,
                                                       torch.where(t == float("-inf"), 2, 0)))


def _decision_door(chk: OutputCheck, ref64: torch.Tensor, eager: torch.Tensor, cand: torch.Tensor,
                   tol: "Tolerance | None") -> bool:
    """The decision regime (DECISION_DOOR_FACTOR): the candidate's infinities sit elsewhere than
    eager's, with no NaN eager lacks (compare_output checked). Where eager's own pattern differs
    from the float64 reference's at n_e elements (n_e > 0) and the candidate's at no more than
    the factor times n_e, and each value the candidate keeps finite where eager has an infinity is
    float64's within the tolerance, the pattern passes: ``chk`` goes on to the value contract over
    the elements both keep finite (True). Otherwise ``chk`` gets the counts in its reason (False)."""
    atol, rtol = (tol or Tolerance()).for_dtype(eager.dtype)
    n_e = n_c = far = 0
    for e, c, r in _chunks(eager, cand, ref64):
        r = r.double()
        ce, cc, cr = _classes(e), _classes(c), _classes(r)
        n_e += int((ce != cr).sum())
        n_c += int((cc != cr).sum())
        kept = (cc == 0) & (ce != 0) & (cr == 0)
        if kept.any():
            d = (c.double()[kept] - r[kept]).abs()
            far += int((d > atol + rtol * r[kept].abs()).sum())
    chk.extra.update(eager_pattern_fp64=n_e, cand_pattern_fp64=n_c)
    if n_c > DECISION_DOOR_FACTOR * n_e or far:
        chk.reason += (f"; infinities differ from float64's at {n_c} elements, eager's at {n_e}"
                       + (f", {far} finite values off float64's" if far else ""))
        return False
    chk.extra["decision_regime"] = True
    chk.ok = chk.within_tol
    chk.passed_by = "fp64" if chk.ok else "none"
    chk.reason = "" if chk.ok else (f"output {chk.index}: max abs error {chk.max_abs:.3g} exceeds "
                                    f"atol={atol:g}, rtol={rtol:g}")
    return True


def _integer_door(chk: OutputCheck, ref64: torch.Tensor, eager: torch.Tensor, cand: torch.Tensor) -> None:
    """The decision regime of integer and bool outputs (DECISION_DOOR_FACTOR): values decided
    from rounded floats (``round(x / scale).to(torch.int8)``, a mask ``x > x.mean()``) differ
    from the float64 reference's where eager's rounding moves a decision, and an honest kernel
    that sums or divides in another order moves others. Where eager's values differ from
    float64's at n_e > 0 elements, a candidate whose values differ at no more than the factor
    times n_e, each by no more than eager's largest difference, passes ("fp64"); otherwise the
    counts go into the reason."""
    if (cand.dtype != eager.dtype or cand.shape != eager.shape or ref64.shape != eager.shape
            or ref64.dtype.is_floating_point or ref64.is_complex()):
        return
    n_e = n_c = 0
    d_e = d_c = 0
    for e, c, r in _chunks(eager, cand, ref64):
        e, c, r = e.long(), c.long(), r.long()
        n_e += int((e != r).sum())
        n_c += int((c != r).sum())
        if e.numel():
            d_e = max(d_e, int((e - r).abs().max()))
            d_c = max(d_c, int((c - r).abs().max()))
    chk.extra.update(eager_values_fp64=n_e, cand_values_fp64=n_c)
    if n_e and n_c <= DECISION_DOOR_FACTOR * n_e and d_c <= d_e:
        chk.ok, chk.passed_by, chk.reason = True, "fp64", ""
        chk.extra["decision_regime"] = True
    else:
        chk.reason += (f"; values differ from float64's at {n_c} elements (by up to {d_c}), "
                       f"eager's at {n_e} (by up to {d_e})")


def fp64_door(chk: OutputCheck, ref64: torch.Tensor, eager: torch.Tensor, cand: torch.Tensor,
              tol: "Tolerance | None" = None) -> OutputCheck:
    """Apply the float64 door and the lower-precision guard to a floating output (every trial);
    an integer or bool output that differs from eager's gets the decision regime (_integer_door)."""
    if not eager.dtype.is_floating_point:
        if not chk.ok and not eager.is_complex():
            _integer_door(chk, ref64, eager, cand)
        return chk
    e, c = _errors(eager, ref64), _errors(cand, ref64)
    chk.eager_err_fp64, chk.cand_err_fp64 = e["max"], c["max"]
    chk.extra.update(eager_rms_fp64=e["rms"], cand_rms_fp64=c["rms"])
    if "NaN" in chk.reason or "non-finite" in chk.reason:
        if not chk.extra.pop("inf_pattern", False) or not _decision_door(chk, ref64, eager, cand, tol):
            return chk
    deep = not chk.within_tol and tol is not None and _eager_outside_tolerance(eager, ref64, tol)
    # rounding-like error: no bias, uncorrelated with the values, enough elements to tell
    noise = (c["n"] >= NOISE_MIN_ELEMENTS and c["bias"] < NOISE_STAT and c["corr"] < NOISE_STAT)
    rounding = (not chk.within_tol and not deep and eager.dtype in LOW_PRECISION and noise
                and c["rms"] <= LOWP_RMS_FACTOR * e["rms"])
    factor = DEEP_DOOR_FACTOR if deep or rounding else 1.0
    if chk.within_tol or c["max"] <= factor * e["max"]:
        lower = (eager.dtype not in LOW_PRECISION and eager.dtype != torch.float64
                 and c["rms"] > LOWER_PRECISION_FACTOR * e["rms"]
                 and c["rms"] > LOWER_PRECISION_FLOOR_ULPS * max(c["ulp_rms"], 1e-45))
        if lower:
            chk.ok, chk.passed_by, chk.category = False, "none", "precision"
            chk.reason = (f"output {chk.index}: computes with lower precision than eager (RMS error "
                          f"vs fp64 {c['rms']:.3g}, eager's {e['rms']:.3g}; max {c['max']:.3g} vs "
                          f"{e['max']:.3g})")
        elif not chk.within_tol:
            chk.ok, chk.passed_by, chk.reason = True, "fp64", ""
            if deep:
                chk.extra["deep_regime"] = True
            elif rounding and c["max"] > e["max"]:
                chk.extra["rounding_regime"] = True
        return chk
    chk.reason += (f"; error vs fp64 {c['max']:.3g} > " + (f"{factor:g}x " if deep or rounding else "")
                   + f"eager's {e['max']:.3g}")
    if eager.dtype in LOW_PRECISION and not deep:  # which condition of the rounding regime failed
        chk.reason += f" (RMS {c['rms']:.3g} vs eager's {e['rms']:.3g})"
    if c["max"] <= PRECISION_CLOSE * max(c["scale"], 1e-30) and noise:
        chk.category = "precision"
        chk.reason += " (close to the float64 result but less accurate than eager: lower precision)"
    return chk
