"""How far eager's top-p mask is from float64's, against emulations of a fused kernel (the
decision regime's evidence, docs/verifier.md). PyTorch's CUDA cumsum of bf16 combines its
partial sums in bf16; a kernel sums in fp32. For each trial (32 x 128256 bf16 logits, scaled
1, 3 or 0.3): the number of elements whose class (finite / -inf) differs from the float64
reference's, for eager and for three emulations.

    python scripts/topp_probe.py [--device cuda] [--trials 12] [--out OUT.json]
"""
from __future__ import annotations

import argparse
import json

import torch

TH = 1 - 0.9


def _cut(s, sl, si, cp, th):
    rm = cp <= th
    rm[..., -1:] = 0
    return s.masked_fill(rm.scatter(1, si, rm), -float("inf"))


def eager(s):
    sl, si = torch.sort(s)
    return _cut(s, sl, si, sl.softmax(dim=-1).cumsum(dim=-1), TH)


def emulated(s, soft32: bool, round_sum: bool):
    """The sum in fp32 of the softmax (in fp32, or eager's bf16), rounded to bf16 before the
    comparison as eager stores it (round_sum) or not."""
    sl, si = torch.sort(s)
    cp = (sl.float().softmax(-1) if soft32 else sl.softmax(-1).float()).cumsum(-1)
    if round_sum:
        return _cut(s, sl, si, cp.to(torch.bfloat16), torch.tensor(TH, dtype=torch.bfloat16, device=s.device))
    return _cut(s, sl, si, cp, TH)


def float64(s):
    d = s.double()
    sl, si = torch.sort(d)
    return _cut(d, sl, si, sl.softmax(-1).cumsum(-1), TH)


def differ(a, b) -> int:
    return int((torch.isfinite(a) != torch.isfinite(b)).sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--out")
    a = ap.parse_args()
    rows = []
    for seed in range(a.trials):
        g = torch.Generator().manual_seed(seed)
        scale = [1.0, 3.0, 0.3][seed % 3]
        s = (torch.randn(a.rows, 128256, generator=g) * scale).to(torch.bfloat16).to(a.device)
        r = float64(s)
        e = eager(s)
        row = {"seed": seed, "scale": scale, "eager": differ(e, r),
               "bf16soft_fp32cs_round": differ(emulated(s, False, True), r),
               "fp32soft_fp32cs_round": differ(emulated(s, True, True), r),
               "fp32soft_fp32cs_noround": differ(emulated(s, True, False), r),
               "eager_vs_round": differ(e, emulated(s, True, True)),
               "masked": int((~torch.isfinite(r)).sum())}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
