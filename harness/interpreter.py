"""Triton's CPU interpreter (``TRITON_INTERPRET=1``), made to behave as the GPU does where EGG's
verdicts depend on it. Installed in the candidate process before the candidate is imported
(harness.sandbox.candidate_process), and in the test process (tests/conftest.py).

- ``@triton.autotune`` runs (the interpreter has no benchmarker): ``install_autotune_shim``.
- fp32 -> bf16 rounds to nearest even, as the GPU's ``cvt.rn.bf16.f32`` and PyTorch do: the
  interpreter truncates implicit casts (a ``tl.store`` of fp32 values into a bf16 tensor, a
  ``.to(tl.bfloat16)``), one bf16 ulp off eager for half the values (0.031 at magnitudes 4-8,
  three times bf16's tolerance of 1e-2), so every honest bf16 kernel failed verification on the
  CPU: ``install_bf16_rounding``.
"""
from __future__ import annotations

import numpy as np


def install_shims() -> list[str]:
    """Install every shim; returns the names of those installed."""
    return [name for name, fn in (("autotune", install_autotune_shim), ("bf16-rounding", install_bf16_rounding))
            if fn()]


def round_to_bf16(data) -> np.ndarray:
    """bf16 bit patterns (uint16) of float values, rounded to nearest even; NaN stays NaN."""
    x = np.ascontiguousarray(np.asarray(data), dtype=np.float32)
    b = x.view(np.uint32)
    r = ((b.astype(np.uint64) + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (b & 0x7FFFFFFF) > 0x7F800000
    if nan.any():
        r = np.where(nan, ((b >> 16) | 0x0040).astype(np.uint16), r)
    return r.reshape(x.shape)


def install_bf16_rounding() -> bool:
    """Round float -> bf16 casts to nearest even in the interpreter (explicit round-toward-zero
    requests keep truncating). Returns whether it is installed."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter as I
    except Exception:  # noqa: BLE001
        return False
    B = getattr(I, "InterpreterBuilder", None)
    if B is None or not hasattr(B, "cast_impl") or not hasattr(I, "TensorHandle"):
        return False
    if hasattr(B, "_egg_bf16_original"):  # installed already (the originals are kept there)
        return True
    floats = (tl.float16, tl.float32, tl.float64)
    cast_impl, fp_to_fp = B.cast_impl, getattr(B, "create_fp_to_fp", None)

    def _rounded(src, dst_type):
        if dst_type.scalar == tl.bfloat16 and src.dtype.scalar in floats:
            return I.TensorHandle(round_to_bf16(src.data), dst_type.scalar)
        return None

    def cast(self, src, dst_type):
        out = _rounded(src, dst_type)
        return out if out is not None else cast_impl(self, src, dst_type)

    B._egg_bf16_original = {"cast_impl": cast_impl, **({"create_fp_to_fp": fp_to_fp} if fp_to_fp else {})}
    B.cast_impl = cast
    if fp_to_fp is not None:
        rtz = getattr(getattr(I, "_ir", None), "ROUNDING_MODE", None)
        rtz = getattr(rtz, "RTZ", object())

        def to_fp(self, src, dst_type, rounding_mode):
            out = None if rounding_mode == rtz else _rounded(src, dst_type)
            return out if out is not None else fp_to_fp(self, src, dst_type, rounding_mode)

        B.create_fp_to_fp = to_fp
    return True


def install_autotune_shim() -> bool:
    """Make ``@triton.autotune`` kernels run under Triton's interpreter (it has no benchmarker:
    ``do_bench`` needs a GPU). Instead of timing each config, the autotuner picks the config that
    launches the fewest programs (the fastest one in the interpreter, which runs programs one by
    one; the first of those on a tie); ``cache_results`` is ignored. Call it in the candidate
    process before the candidate is imported; returns whether it was installed."""
    try:
        from triton.runtime.autotuner import Autotuner
    except Exception:  # noqa: BLE001
        return False
    if getattr(Autotuner, "_egg_interpreter_shim", False):
        return True

    def _bench(self, *args, config, **meta):
        grid = meta.get("grid")
        current = dict(meta, **config.all_kwargs())
        full = {**(self.nargs or {}), **current}
        try:
            g = grid(full) if callable(grid) else grid
            g = tuple(g) if isinstance(g, (tuple, list)) else (g,)
            n = 1
            for d in g:
                n *= max(1, int(d))
        except Exception:  # noqa: BLE001 - a grid we cannot evaluate: keep the config order
            n = float("inf")
        index = self.configs.index(config) if config in self.configs else 0
        return [float(n), float(index), 0.0]

    def check_disk_cache(self, tuning_key, configs, bench_fn):
        bench_fn()
        return False

    Autotuner._bench = _bench
    Autotuner.check_disk_cache = check_disk_cache
    Autotuner._egg_interpreter_shim = True
    return True
