"""harness.roofline: flop_counter FLOPs charged per peak (fp32 matmul at the fp32 rate, fp32
conv at TF32), the estimate rules for uncounted ops, compulsory bytes and the floor."""
import pytest
import torch

from harness import roofline as R
from harness.problem import load_problem

PEAKS = {"fp32": 50.0, "tf32": 400.0, "bf16": 800.0, "fp16": 800.0, "fp64": 60.0}

LINEAR = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, k, n):
        super().__init__()
        self.fc = nn.Linear(k, n)
    def forward(self, x):
        return torch.relu(self.fc(x))

def get_inputs():
    return [torch.randn(64, 48)]

def get_init_inputs():
    return [48, 32]
"""

CONV = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, bias=False)
    def forward(self, x):
        return self.conv(x)

def get_inputs():
    return [torch.randn(2, 4, 10, 10)]

def get_init_inputs():
    return []
"""

HALF_MM = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, a, b):
        return a @ b

def get_inputs():
    return [torch.randn(64, 32).half(), torch.randn(32, 16).half()]

def get_init_inputs():
    return []
"""

NORMS = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(40)
    def forward(self, x):
        y = self.ln(x)
        s = torch.softmax(y, dim=-1)
        return s.sum(dim=-1), s.view(-1)

def get_inputs():
    return [torch.randn(30, 40)]

def get_init_inputs():
    return []
"""

NO_META = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        k = int(x.abs().sum().item() > -1.0)  # .item() has no meaning on meta tensors
        return x[:, :1] @ x[:1, :] * k

def get_inputs():
    return [torch.randn(16, 16)]

def get_init_inputs():
    return []
"""


def _count(write_problem, src, name="p"):
    return R.count(load_problem(write_problem(src, name)))


def test_linear_counts_and_bytes(write_problem):
    c = _count(write_problem, LINEAR)
    assert c.exact
    assert c.counted_flops == 2 * 64 * 48 * 32
    # fp32 matmul at the 3xTF32 rate (precision kept, tensor cores); relu estimated at fp32
    assert c.flops_by_peak["tf32x3"] == c.counted_flops
    assert c.flops_by_peak["fp32"] == 64 * 32
    assert c.estimated_flops == 64 * 32
    assert "tf32" not in c.flops_by_peak
    assert c.nbytes == 4 * (64 * 48 + 48 * 32 + 32 + 64 * 32)  # input, weight, bias, output once each
    assert c.dtype == "float32"
    flops, nbytes, dt = c  # the older tuple API still unpacks
    assert (flops, nbytes, dt) == (c.flops, c.nbytes, "float32")


PRODUCTS = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(6, 4, 3, stride=2, padding=1, groups=2, bias=False)
    def forward(self, a, b, x):
        return torch.bmm(a, b), self.conv(x)

def get_inputs():
    return [torch.randn(3, 5, 7), torch.randn(3, 7, 9), torch.randn(2, 6, 11, 13)]

def get_init_inputs():
    return []
"""


def test_counted_flops_match_closed_forms(write_problem):
    """Products counted as 2 x multiply-adds, by hand (not by the FlopCounterMode the count
    uses): a batched matmul, and a strided, padded, grouped convolution."""
    c = _count(write_problem, PRODUCTS, "prod")
    bmm = 2 * 3 * 5 * 9 * 7  # batch x M x N, K multiply-adds each
    oh, ow = (11 + 2 - 3) // 2 + 1, (13 + 2 - 3) // 2 + 1
    conv = 2 * (2 * 4 * oh * ow) * ((6 // 2) * 3 * 3)  # outputs x (cin per group x kh x kw)
    assert c.exact and c.counted_flops == bmm + conv
    assert c.ops["bmm"] == bmm and c.ops["convolution"] == conv
    assert c.flops_by_peak == {"tf32x3": bmm, "tf32": conv}  # fp32 bmm at 3xTF32, conv at TF32


def test_fp32_conv_is_charged_at_tf32_like_eager(write_problem, monkeypatch):
    c = _count(write_problem, CONV)
    conv = 2 * (2 * 8 * 8 * 8) * (4 * 3 * 3)  # 2 * outputs * (cin * kh * kw)
    assert c.flops_by_peak == {"tf32": conv}
    f = R.floor(c, PEAKS, 1000.0)
    assert f.compute_ms == pytest.approx(conv / 400e12 * 1e3)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    assert _count(write_problem, CONV, "conv2").flops_by_peak == {"fp32": conv}


def test_half_matmul_uses_the_half_rate(write_problem):
    c = _count(write_problem, HALF_MM)
    assert c.flops_by_peak == {"fp16": 2 * 64 * 32 * 16}
    assert c.dtype == "float16"
    assert c.nbytes == 2 * (64 * 32 + 32 * 16 + 64 * 16)


def test_estimate_rules_for_uncounted_ops(write_problem):
    c = _count(write_problem, NORMS)
    n = 30 * 40
    assert c.counted_flops == 0
    assert c.ops["native_layer_norm"] == R.NORM_OPS["native_layer_norm"] * n
    assert c.ops["_softmax"] == R.SOFTMAX_OPS["_softmax"] * n
    assert c.ops["sum"] == n
    assert "view" not in c.ops  # views cost nothing
    assert c.estimated_flops == sum(c.ops.values())
    # outputs: the (30,) sums and the (1200,) view, plus the input and the LayerNorm parameters
    assert c.nbytes == 4 * (n + 40 + 40 + 30 + n)


def test_estimate_flops_table():
    x = torch.empty(10, 20, device="meta")
    assert R.estimate_flops("relu_", (x,), x) == 200  # in-place spelled like its op
    assert R.estimate_flops("tanh", (x,), x) == 800
    assert R.estimate_flops("clone", (x,), x) == 0
    y = torch.empty(2, 3, 4, 4, device="meta")
    assert R.estimate_flops("max_pool2d_with_indices", (torch.empty(2, 3, 8, 8, device="meta"), [2, 2]),
                            (y, y)) == y.numel() * 4


def test_meta_failure_falls_back_to_cpu_tensors(write_problem):
    c = _count(write_problem, NO_META)
    assert c.counted_flops == 2 * 16 * 1 * 16
    assert "CPU" in c.note


def test_floor_bound_and_percent():
    c = R.Count(flops=4e12, nbytes=1e9, flops_by_peak={"fp32": 4e12})
    f = R.floor(c, PEAKS, 2000.0)  # compute 80 ms vs memory 0.5 ms
    assert f.bound == "compute" and f.ms == pytest.approx(80.0) and f.memory_ms == pytest.approx(0.5)
    c = R.Count(flops=1e6, nbytes=4e9, flops_by_peak={"fp32": 1e6})
    f = R.floor(c, PEAKS, 4000.0)
    assert f.bound == "memory" and f.ms == pytest.approx(1.0)
    assert R.floor(c, {}, 4000.0).bound == "unknown"
    assert R.percent(1.0, 4.0) == 25.0 and R.percent(None, 4.0) is None
    ms, bound = R.floor_ms(2e12, 1e6, "bfloat16", PEAKS, 1000.0)
    assert bound == "compute" and ms == pytest.approx(2e12 / 800e12 * 1e3)


def test_attention_counted_as_a_fused_kernel_in_its_own_dtype(write_problem):
    """SDPA on meta/CPU decomposes into fp32 math with a mask; a GPU runs a bf16 flash kernel
    that skips the masked half. Counting the decomposition put a bf16 prefill at 1838% of
    roofline on the H200."""
    from harness import roofline
    from harness.problem import load_problem

    src = ("import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
           "class Model(nn.Module):\n    def forward(self, q, k, v):\n"
           "        return F.scaled_dot_product_attention(q, k, v, is_causal=CAUSAL)\n"
           "def get_inputs():\n    return [torch.randn(2, 4, 64, 32, dtype=torch.bfloat16) for _ in range(3)]\n"
           "def get_init_inputs():\n    return []\n")
    full = roofline.count(load_problem(write_problem(src.replace("CAUSAL", "False"), "full")))
    causal = roofline.count(load_problem(write_problem(src.replace("CAUSAL", "True"), "causal")))
    assert full.flops == 2 * 2 * 4 * 64 * 64 * (32 + 32)
    assert causal.flops == 2 * 2 * 4 * (64 * 65 // 2) * (32 + 32)
    assert set(full.flops_by_peak) == {"bf16"} and full.estimated_flops == 0


def test_a_table_read_through_indices_counts_the_rows_read(write_problem):
    """An embedding table (and a gather's source, x[ids]) read only at indices counts the bytes
    the reads return, not the whole table; read whole anywhere else, it counts whole."""
    src = """import torch, torch.nn as nn
class Model(nn.Module):
    def __init__(self, whole):
        super().__init__()
        self.emb = nn.Embedding(1000, 64)
        self.whole = whole
    def forward(self, ids, x):
        out = self.emb(ids) + torch.gather(x, 1, ids[:, :2]).sum() + self.emb.weight.t()[0][ids].unsqueeze(-1)
        return out + self.emb.weight.sum() if self.whole else out
def get_inputs():
    return [torch.randint(0, 1000, (4, 8)), torch.randn(4, 100)]
def get_init_inputs():
    return [WHOLE]
"""
    rows = 4 * 8 * 64 * 4 + 4 * 8 * 4  # the embedding's rows, then x[ids] of column 0 (a view)
    ins = 4 * 8 * 8 + 4 * 2 * 4  # the ids; the gather's elements of x
    out = 4 * 8 * 64 * 4
    c = R.count(load_problem(write_problem(src.replace("WHOLE", "False"), "rows")))
    assert c.nbytes == rows + ins + out
    c = R.count(load_problem(write_problem(src.replace("WHOLE", "True"), "rows_whole")))
    assert c.nbytes == 1000 * 64 * 4 + ins + out
