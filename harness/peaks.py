"""Measured ceilings of this machine's GPU, measured once and cached per GPU model.

``measure()`` times, with the harness's own timer (harness.timing.bench: L2 flushed), a large
device-to-device copy (``copy_gbs``: bytes read + written), a large sum (``read_gbs``: a
read-only stream, which HBM serves faster than a copy's mix of reads and writes) and square
matrix products per dtype (fp32 with TF32 off, tf32, bf16, fp16, fp64) at 4096 and 8192, keeping
the better size. Each rate uses the p20 of the repetitions: a ceiling is what the GPU does on a
good run, and a median-based one is beaten by real problems (dev40's H200 reference timings
have an fp32 matmul at 52.5 TFLOP/s, where the 8192^3 median measured 51). The roofline's
bandwidth is the larger of copy_gbs and read_gbs, so that read-mostly problems (reductions,
losses) stay under 100% of it. ``ensure()`` returns the cached numbers
or measures and caches them: the profiling process calls it once at start-up (GPU only), so a
machine pays the ~10 s once. The roofline (harness.roofline, harness.hardware.detect) uses these
numbers when cached, and the hardware profile's (knowledge/hardware) otherwise.

Cache: ``$EGG_PEAKS_DIR`` or ``~/.cache/egg``, file ``peaks-<gpu name>.json``. Run
``python -m harness.peaks [--force]`` to (re)measure and print them.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import pathlib
import re
import sys

#: matrix sizes of the peak-rate products: large enough to saturate an H100/H200 (8192^3 in
#: bf16 is ~1.4 ms there) and small enough for any GPU of knowledge/hardware (3 x 512 MB in fp64)
MATMUL_SIZES = (4096, 8192)
#: bytes of each copy buffer: far beyond any L2, a couple of ms per copy on HBM3
COPY_BYTES = 2 * 1024 ** 3
#: the keys of a peaks file; matmul keys are the roofline's peak keys (TFLOP/s)
MATMUL_DTYPES = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16",
                 "fp64": "float64"}


def cache_dir() -> pathlib.Path:
    env = os.environ.get("EGG_PEAKS_DIR", "").strip()
    return pathlib.Path(env) if env else pathlib.Path.home() / ".cache" / "egg"


def cache_path(gpu_name: str) -> pathlib.Path:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", gpu_name).strip("-").lower() or "gpu"
    return cache_dir() / f"peaks-{slug}.json"


def load(gpu_name: str) -> dict | None:
    """The cached measured peaks of this GPU model, or None."""
    p = cache_path(gpu_name)
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict) or not data.get("copy_gbs"):
        return None
    return data


def as_profile(measured: dict) -> tuple[dict[str, float], float]:
    """(peak TFLOP/s per key, bandwidth GB/s) of a peaks record (cache file or yaml ``measured``)."""
    peaks = {}
    for k in MATMUL_DTYPES:
        v = measured.get(f"{k}_matmul_tflops")
        if v:
            peaks[k] = float(v)
    bw = max(float(measured.get("copy_gbs") or 0.0), float(measured.get("read_gbs") or 0.0))
    return peaks, bw


def measure(device: int | None = None, sizes: tuple[int, ...] = MATMUL_SIZES,
            copy_bytes: int = COPY_BYTES, rep_ms: float = 100.0) -> dict:
    """Measure bandwidths and matmul rates on the current (or given) CUDA device."""
    import torch

    from harness.timing import bench

    dev = torch.device("cuda", torch.cuda.current_device() if device is None else device)
    props = torch.cuda.get_device_properties(dev)
    out: dict = {"gpu": props.name, "measured_at": _dt.datetime.now().isoformat(timespec="seconds"),
                 "torch": torch.__version__,
                 "method": "harness.timing.bench p20 (L2 flushed); matmul: best of sizes " + str(sizes)}
    src = torch.empty(copy_bytes // 4, dtype=torch.float32, device=dev).fill_(1.0)
    dst = torch.empty_like(src)
    t = bench(lambda: dst.copy_(src), dev, rep_ms)
    out["copy_gbs"] = round(2 * copy_bytes / (t["p20_ms"] * 1e-3) / 1e9, 1)
    t = bench(lambda: src.sum(), dev, rep_ms)
    out["read_gbs"] = round(copy_bytes / (t["p20_ms"] * 1e-3) / 1e9, 1)
    del src, dst
    old = torch.backends.cuda.matmul.allow_tf32
    try:
        for key, dt in MATMUL_DTYPES.items():
            dtype = getattr(torch, dt)
            torch.backends.cuda.matmul.allow_tf32 = key == "tf32"
            best = 0.0
            for n in sizes:
                try:
                    a = torch.randn(n, n, device=dev, dtype=torch.float32).to(dtype)
                    b = torch.randn(n, n, device=dev, dtype=torch.float32).to(dtype)
                    c = torch.empty(n, n, device=dev, dtype=dtype)
                    t = bench(lambda: torch.mm(a, b, out=c), dev, rep_ms)
                    best = max(best, 2 * n ** 3 / (t["p20_ms"] * 1e-3) / 1e12)
                except Exception as e:  # noqa: BLE001 - e.g. a dtype this GPU lacks
                    out[f"{key}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                finally:
                    a = b = c = None
            if best:
                out[f"{key}_matmul_tflops"] = round(best, 1)
        torch.cuda.empty_cache()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    return out


def ensure(force: bool = False) -> dict:
    """The cached peaks of this GPU model, measured now (and cached) when there are none.

    A file lock makes concurrent callers (``egg bench --jobs N``) measure once."""
    import torch

    name = torch.cuda.get_device_properties(torch.cuda.current_device()).name
    if not force and (got := load(name)) is not None:
        return got
    path = cache_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = open(str(path) + ".lock", "w")
    try:
        try:
            import fcntl

            fcntl.flock(lock, fcntl.LOCK_EX)
        except ImportError:  # pragma: no cover
            pass
        if not force and (got := load(name)) is not None:  # another process measured meanwhile
            return got
        data = measure()
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2))
        tmp.replace(path)
        return data
    finally:
        lock.close()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    import torch

    if not torch.cuda.is_available():
        print("harness.peaks: no CUDA GPU visible: nothing to measure", file=sys.stderr)
        return 2
    data = ensure(force="--force" in argv)
    print(json.dumps(data, indent=2))
    print(f"cached in {cache_path(data['gpu'])}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
