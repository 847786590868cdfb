"""The precision contract (DESIGN.md): compare candidate outputs with eager's.

An output passes when it matches eager within KernelBench's tolerance for its dtype, or when its
error against a float64 reference is no larger than eager's own. NaN or Inf where eager has
none fails; so does a different shape, dtype, or a tensor subclass.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

LOW_PRECISION = {torch.float16, torch.bfloat16}
#: a candidate whose fp64 error exceeds eager's by this factor (and the floor below) computes with
#: lower precision than eager (e.g. TF32 where eager is fp32): rejected even inside tolerance.
#: TF32 GEMMs land ~1000x above fp32 error; honest reorderings of fp32 sums stay within ~4x.
LOWER_PRECISION_FACTOR = 16.0
LOWER_PRECISION_FLOOR = 1e-5  # relative to max|reference|
#: outside tolerance and less accurate than eager, but within this fraction of max|reference| of the
#: float64 truth: the candidate is close but imprecise (bf16 or TF32 for fp32 work), not wrong.
PRECISION_CLOSE = 0.05


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


def flatten(out) -> list:
    if isinstance(out, (list, tuple)):
        return list(out)
    return [out]


def structure_error(ref: list, cand: list) -> str | None:
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
    for r, c in _chunks(ref, cand):
        r, c = r.double(), c.double()
        r_fin, c_fin = torch.isfinite(r), torch.isfinite(c)
        bad_nonfinite += int((~c_fin & r_fin).sum())
        if not torch.equal(r_fin, c_fin) or not torch.equal(r[~r_fin].nan_to_num(), c[~c_fin].nan_to_num()):
            differ_nonfinite = True
        diff = torch.where(r_fin & c_fin, (r - c).abs(), torch.zeros_like(r))
        if diff.numel():
            max_abs = max(max_abs, float(diff.max()))
            # relative to |eager|, floored at atol so that near-zero values do not blow it up
            max_rel = max(max_rel, float((diff / r.abs().nan_to_num().clamp_min(max(atol, 1e-12))).max()))
            within &= bool((diff <= atol + rtol * r.abs().nan_to_num()).all())
    if bad_nonfinite:
        return OutputCheck(i, False, f"output {i}: {bad_nonfinite} NaN/Inf values where eager has finite ones")
    if differ_nonfinite:
        return OutputCheck(i, False, f"output {i}: non-finite values differ from eager's")
    return OutputCheck(i, within, "" if within else
                       f"output {i}: max abs error {max_abs:.3g} exceeds atol={atol:g}, rtol={rtol:g}",
                       max_abs=max_abs, max_rel=max_rel, within_tol=within,
                       passed_by="tolerance" if within else "none")


def _max_err(a: torch.Tensor, ref64: torch.Tensor) -> tuple[float, float]:
    """(max |a - ref| over finite ref, max |ref|) in float64, chunked."""
    err = scale = 0.0
    for x, r in _chunks(a, ref64):
        r = r.double()
        fin = torch.isfinite(r)
        if fin.any():
            err = max(err, float((x.double() - r).abs()[fin].max()))
            scale = max(scale, float(r.abs()[fin].max()))
    return err, scale


def fp64_door(chk: OutputCheck, ref64: torch.Tensor, eager: torch.Tensor, cand: torch.Tensor) -> OutputCheck:
    """Apply the float64 door and the lower-precision guard to a floating output."""
    if not eager.dtype.is_floating_point:
        return chk
    e_err, scale = _max_err(eager, ref64)
    c_err, _ = _max_err(cand, ref64)
    chk.eager_err_fp64, chk.cand_err_fp64 = e_err, c_err
    if chk.within_tol:
        if (eager.dtype not in LOW_PRECISION and c_err > LOWER_PRECISION_FACTOR * e_err
                and c_err > LOWER_PRECISION_FLOOR * max(scale, 1e-30)):
            chk.ok = False
            chk.passed_by = "none"
            chk.category = "precision"
            chk.reason = (f"output {chk.index}: computes with lower precision than eager "
                          f"(error vs fp64 {c_err:.3g}, eager's {e_err:.3g})")
        return chk
    if "NaN" in chk.reason or "non-finite" in chk.reason:
        return chk
    if c_err <= e_err:
        chk.ok, chk.passed_by, chk.reason = True, "fp64", ""
    else:
        chk.reason += f"; error vs fp64 {c_err:.3g} > eager's {e_err:.3g}"
        if c_err <= PRECISION_CLOSE * max(scale, 1e-30):
            chk.category = "precision"
            chk.reason += " (close to the float64 result but less accurate than eager: lower precision)"
    return chk
