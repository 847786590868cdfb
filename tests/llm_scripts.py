"""A small problem and scripted model replies for the LLM tests (see llm_fake_server)."""

PROBLEM = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return torch.relu(x) * self.scale + 1.0


def get_inputs():
    return [torch.randn(37, 301)]


def get_init_inputs():
    return [2.0]
'''

#: a correct kernel for PROBLEM, as a model would reply (prose, then one python block)
GOOD = '''Fuse relu, the scale and the shift into one pointwise kernel (alg-fuse-pointwise-chain,
alg-fp32-accumulate).

```python
import torch
import triton
import triton.language as tl

EGG_CONFIGS = {"_egg_k_g0": {"BLOCK": 4096, "num_warps": 4}}


@triton.jit
def _egg_k_g0(X, OUT, N, SCALE, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(X + offs, mask=mask, other=0).to(tl.float32)
    y = tl.maximum(x, 0.0) * SCALE + 1.0
    tl.store(OUT + offs, y.to(OUT.dtype.element_ty), mask=mask)


def _egg_g0(x, scale):
    xc = x.contiguous()
    out = torch.empty_like(xc)
    n = xc.numel()
    cfg = EGG_CONFIGS["_egg_k_g0"]
    grid = (triton.cdiv(n, cfg["BLOCK"]),)
    _egg_k_g0[grid](xc, out, n, scale, BLOCK=cfg["BLOCK"], num_warps=cfg["num_warps"])
    return out


class ModelNew(Model):
    def forward(self, x):
        return _egg_g0(x, self.scale)
```
'''

#: the same kernel with a bug (the shift is missing): fails verification with a mismatch
BAD = GOOD.replace("* SCALE + 1.0", "* SCALE")

#: the planner's structured reply for PROBLEM (tool-call arguments)
PLAN = {
    "groups": [{"id": "g0", "kind": "pointwise", "nodes": ["relu", "mul", "add"],
                "reason": "one pass over x", "principle_ids": ["alg-fuse-pointwise-chain"]}],
    "rewrites": [],
    "goals": {"algorithm": "one fused kernel", "tiling": "block size for the GPU",
              "memory": "stream x once"},
    "notes": ["memory-bound"],
}
