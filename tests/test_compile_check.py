"""harness.compile_check: kernels compiled for sm_90 on this CPU machine, nothing launched."""
import time
import re

import pytest

from codegen import pipeline
from codegen.emit import emit_model
from harness.compile_check import SM90_SMEM, check_file, check_files, target_of
from harness.problem import load_problem
from state.records import HardwareInfo

PROBLEM = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, b):
        y = torch.relu(x + b) * 0.5
        return torch.softmax(y, dim=-1), y.sum(dim=-1)


def get_inputs():
    return [torch.randn(1823, 781), torch.randn(781)]


def get_init_inputs():
    return []
'''

MATMUL = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return a @ b


def get_inputs():
    return [torch.randn(512, 512, dtype=torch.float16), torch.randn(512, 512, dtype=torch.float16)]


def get_init_inputs():
    return []


# ======== EGG generated below this line ========
import triton
import triton.language as tl

TILE, STAGES = {tile}, {stages}


@triton.jit
def _egg_k_g0(A, B, C, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pm = tl.program_id(0)
    pn = tl.program_id(1)
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), tl.float32)
    for k in range(0, K, BK):
        a = tl.load(A + rm[:, None] * K + (k + rk)[None, :])
        b = tl.load(B + (k + rk)[:, None] * N + rn[None, :])
        acc += {dot}
    tl.store(C + rm[:, None] * N + rn[None, :], acc.to(tl.float16))


def _egg_g0(a, b):
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    BM, BN, BK = TILE
    _egg_k_g0[(triton.cdiv(M, BM), triton.cdiv(N, BN))](a, b, c, M, N, K, BM=BM, BN=BN, BK=BK,
                                                       num_warps=8, num_stages=STAGES)
    return c


class ModelNew(Model):
    def forward(self, a, b):
        return _egg_g0(a, b)
'''


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("triton-cache"))


def _matmul(tmp_path, name, tile=(64, 64, 32), stages=3, dot="tl.dot(a, b)"):
    p = tmp_path / f"{name}.py"
    p.write_text(MATMUL.format(tile=tile, stages=stages, dot=dot))
    return p


def test_catches_shared_memory_overuse_and_type_errors_and_passes_normal_kernels(
        write_problem, tmp_path, cache_dir):
    prob = load_problem(write_problem(PROBLEM))
    comp = pipeline.compile_problem(prob)  # a candidate as codegen emits it
    cand = tmp_path / "cand.py"
    cand.write_text(comp.emitted.source)
    ok = _matmul(tmp_path, "ok")
    huge = _matmul(tmp_path, "huge", tile=(256, 256, 128), stages=4)
    bad = _matmul(tmp_path, "bad", dot="tl.dot(a, b) << 2")
    broken = tmp_path / "broken.py"
    broken.write_text(MATMUL.format(tile=(64, 64, 32), stages=3, dot="tl.dot(a, b)")
                      .replace("return _egg_g0(a, b)", "return _egg_g0(a)"))
    files = [cand, ok, huge, bad, broken]
    t0 = time.time()
    res = check_files(files, jobs=2, cache_dir=cache_dir)
    wall = time.time() - t0
    assert [r.path for r in res] == [str(p) for p in files]
    r_cand, r_ok, r_huge, r_bad, r_broken = res

    assert r_cand.ok, r_cand.reason
    assert r_cand.inputs == "meta"
    names = sorted(k.kernel for k in r_cand.kernels)
    assert names == sorted(comp.emitted.kernels) and len(names) >= 2
    for k in r_cand.kernels:
        assert k.shared is not None and k.shared < SM90_SMEM
        assert k.n_regs is not None and 0 < k.n_regs <= 255
        assert k.local_bytes == 0
        assert k.num_warps in (1, 2, 4, 8, 16, 32)
    assert r_ok.ok and r_ok.kernels[0].shared > 0, r_ok.reason
    assert not r_huge.ok and r_huge.category == "shared_memory"
    assert r_huge.kernels[0].shared > SM90_SMEM and "232448" in r_huge.reason
    assert r_huge.kernels[0].shared > 4 * r_ok.kernels[0].shared
    assert not r_bad.ok and r_bad.category == "compile" and "_egg_k_g0" in r_bad.reason
    assert not r_broken.ok and r_broken.category == "run"
    per = {k.kernel + "@" + r.path.rsplit("/", 1)[-1]: round(k.compile_s, 2) for r in res for k in r.kernels}
    print(f"5 files on 2 processes: {wall:.1f} s wall; compile seconds per kernel: {per}")


def test_target_from_hardware():
    hw = HardwareInfo(device="cuda", name="NVIDIA A100", profile_id="a100", interpreter=False,
                      smem_per_block=166912, arch="sm_80")
    assert target_of(hw) == {"arch": 80, "smem_limit": 166912}


def test_a_hanging_candidate_times_out(tmp_path, cache_dir):
    p = tmp_path / "hang.py"
    p.write_text(MATMUL.format(tile=(64, 64, 32), stages=3, dot="tl.dot(a, b)")
                 .replace("class ModelNew(Model):", "import time\ntime.sleep(60)\n\n\nclass ModelNew(Model):"))
    res = check_file(p, timeout_s=1, startup_s=4, cache_dir=cache_dir)
    assert not res.ok and res.category == "timeout"


ROPE = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("c", torch.randn(64, 128, dtype=torch.bfloat16), persistent=False)
        self.register_buffer("s", torch.randn(64, 128, dtype=torch.bfloat16), persistent=False)

    def forward(self, q, k):
        h = q.shape[-1] // 2
        pairs = torch.stack((-k[..., 1::2], k[..., ::2]), dim=-1).flatten(-2)
        return q * self.c + torch.cat((-q[..., h:], q[..., :h]), dim=-1) * self.s, k * self.c + pairs * self.s


def get_inputs():
    return [torch.randn(2, 4, 64, 128, dtype=torch.bfloat16), torch.randn(2, 2, 64, 128, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
'''


def test_rope_rotations_load_whole_vectors(write_problem, tmp_path, cache_dir):
    """bf16 RoPE, rotate-half (q) and interleaved pairs (k): every global load and store of both
    kernels is a 16-byte vector in sm_90 PTX. A rolled operand loaded at the computed column
    ``offs - offs % d + (offs % d + d/2) % d`` (or ``offs ^ 1`` for pairs) compiled to one
    two-byte ``ld.global.b16`` per element."""
    comp = pipeline.compile_problem(load_problem(write_problem(ROPE, "rope_vec")))
    assert [g.kind for g in comp.plan.groups] == ["pointwise", "pointwise"]
    cand = tmp_path / "rope.py"
    cand.write_text(comp.emitted.source)
    res = check_file(cand, cache_dir=cache_dir)
    assert res.ok, res.reason
    assert len(res.kernels) == 2
    for k in res.kernels:
        forms = set(k.global_access)
        assert forms and all(".v4." in f for f in forms), k.global_access


POOL = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.mp = nn.MaxPool2d(2)

    def forward(self, x):
        return self.mp(torch.relu(x)) * 2.0


def get_inputs():
    return [torch.randn(2, 3, 7, 5)]


def get_init_inputs():
    return []
'''


def test_a_pool_whose_division_shift_is_1_compiles(write_problem, tmp_path, cache_dir):
    """The pool template divides by an output size through its magic number (_egg_magic): a
    shift of 1 (an output size of 3 here) is an int argument Triton passes as the constexpr 1,
    which has no ``.to``: the kernel failed to compile on the GPU (found by scripts/gpu_dropin.py
    on an H100) while Triton's interpreter, which specializes nothing, ran it."""
    comp = pipeline.compile_problem(load_problem(write_problem(POOL, "pool_shift1")))
    assert [g.kind for g in comp.plan.groups] == ["pool"]
    assert "_egg_fdiv" in comp.emitted.source
    cand = tmp_path / "pool.py"
    cand.write_text(comp.emitted.source)
    res = check_file(cand, cache_dir=cache_dir)
    assert res.ok, res.reason


def test_packed_int4_weights_are_read_as_vectors(write_problem, tmp_path, cache_dir):
    """rw-dequant-program, two nibbles a byte interleaved along K (workload 37's form), GPTQ's
    eight an int32, and the low and high nibbles as the two halves of K (a cat whose pieces are
    whole K steps long): in sm_90 PTX the packed weight reaches the kernel by vector copies
    (the [BLOCK_N, BLOCK_K / R] tile of packed values, loaded once); none of it by one-byte or
    per-element loads (the element-wise index k // 2 compiled to a ld.global.b8 per weight
    element)."""
    from tests.test_quant_program import _src

    for case in ("interleaved_view_scales", "int32_eight_nibbles", "halves_repeat_bias"):
        # a decode step's shapes (4 rows, a 1024 x 1024 weight): the template's GEMV tiles
        src = _src(case).replace("in_features=64, out_features=48", "in_features=1024, out_features=1024")
        src = src.replace("torch.randn(3, 64,", "torch.randn(4, 1024,")
        comp = pipeline.compile_problem(load_problem(write_problem(src, case)))
        assert [g.kind for g in comp.plan.groups] == ["matmul"]
        cand = tmp_path / f"{case}.py"
        cand.write_text(comp.emitted.source)
        res = check_file(cand, cache_dir=cache_dir)
        assert res.ok, res.reason
        forms = res.kernels[0].global_access
        assert not [f for f in forms if f.startswith("ld.global.b8")], forms
        # every copy of the packed values moves 4 bytes or more
        assert [f for f in forms if f.startswith("cp.async") or ".v" in f], forms


def test_weights_packed_along_the_columns_are_read_once_per_pack(write_problem, tmp_path, cache_dir):
    """AWQ's eight nibbles an int32 along N (tests/test_quant_program.py's awq_columns, its
    column order undone by a fixed index table): each int32 is loaded once for its eight
    columns (a [BLOCK_N / 8, 1, BLOCK_K] tile broadcast over the pack), not once per column. At
    a decode step's shapes the sm_90 PTX had 192 four-byte copies per thread loaded per column,
    24 once per pack."""
    from tests.test_quant_program import _src

    src = _src("awq_columns").replace("in_features=64, out_features=48", "in_features=1024, out_features=1024")
    src = src.replace("torch.randn(3, 64,", "torch.randn(4, 1024,")
    comp = pipeline.compile_problem(load_problem(write_problem(src, "awq")))
    assert [g.kind for g in comp.plan.groups] == ["matmul"]
    assert "tl.broadcast_to" in comp.emitted.source and "(BLOCK_N // 8, 8, BLOCK_K)" in comp.emitted.source
    cand = tmp_path / "awq.py"
    cand.write_text(comp.emitted.source)
    res = check_file(cand, cache_dir=cache_dir)
    assert res.ok, res.reason
    forms = res.kernels[0].global_access
    assert forms.get("cp.async.ca.shared.global.4B", 0) <= 48, forms


def test_an_moe_combine_reads_the_chosen_rows_as_vectors(write_problem, tmp_path, cache_dir):
    """A mixture-of-experts combine (tests/test_take.py's moe_combine at Mixtral's 8 experts,
    top 2, 4096 columns), the stage-1 tiles of knowledge/heuristics.py: the chosen index and the
    routing weight are constant along the inner columns (an expanded index, an unsqueezed
    weight), so the columns walk loads them once per reduced index (Z1, Z2) and the gathered
    rows are 16-byte vectors in sm_90 PTX. Loaded per element, the gather compiled to one
    two-byte ``ld.global.b16`` per element (Triton cannot see a runtime stride of 0)."""
    from policies.expert import group_config
    from tests.test_llm_kernels import BF, problem

    src = problem(
        "out, chosen, w", "        idx = chosen.unsqueeze(-1).expand(-1, -1, out.shape[-1])\n"
        "        picked = torch.gather(out, 1, idx)\n"
        "        return (picked.float() * w.unsqueeze(-1)).sum(dim=1).to(out.dtype)\n",
        f"[torch.randn(512, 8, 4096, {BF}), torch.randint(0, 8, (512, 2)), torch.rand(512, 2)]")
    prob = load_problem(write_problem(src, "moe_vec"))
    plan, _rw, _err = pipeline.analyze(prob)
    assert [g.kind for g in plan.groups] == ["reduction"]
    cfg = {g.id: group_config(plan, g, 132) for g in plan.groups}
    assert cfg[plan.groups[0].id]["BLOCK_I"] >= 512, cfg  # a tile of ~2K elements over top 2
    cand = tmp_path / "moe.py"
    cand.write_text(emit_model(prob.source, plan, cfg, "# moe").source)
    res = check_file(cand, cache_dir=cache_dir)
    assert res.ok, res.reason
    (k,) = res.kernels
    assert k.constexprs.get("Z1") and k.constexprs.get("Z2"), k.constexprs
    assert not [f for f in k.global_access if f.startswith("ld.global.b16")], k.global_access
    assert k.global_access.get("ld.global.v4.b32", 0) >= 1, k.global_access


QUANT = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        s = x.float().abs().amax(-1, keepdim=True).clamp(min=1e-5) / 127.0
        q = torch.round(x.float() / s).clamp(-128, 127).to(torch.int8)
        return q, s, torch.sqrt(s) + 1.0 / (x.float() + 3.0)


def get_inputs():
    return [torch.randn(6, 64, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
'''


def test_divisions_and_square_roots_round_as_eagers(write_problem, tmp_path, cache_dir):
    """A kernel divides and takes square roots as eager does (IEEE, round to nearest): Triton's
    `/` on fp32 is ``div.full.f32`` and ``tl.sqrt`` ``sqrt.approx``, each within 2 ulp, and a
    quotient one ulp off rounds to the next integer (per-token int8 quantization mismatched by 1
    on an H100; Triton's interpreter divides exactly, so only the compiled PTX shows it)."""
    comp = pipeline.compile_problem(load_problem(write_problem(QUANT, "quant_div")))
    assert comp.plan.groups
    cand = tmp_path / "quant.py"
    cand.write_text(comp.emitted.source)
    res = check_file(cand, cache_dir=cache_dir)
    assert res.ok, res.reason
    forms = {}
    for k in res.kernels:
        for f, n in k.float_forms.items():
            forms[f] = forms.get(f, 0) + n
    assert forms.get("div.rn.f32") and forms.get("sqrt.rn.f32"), forms
    assert not [f for f in forms if "approx" in f or "full" in f], forms


DIVS = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y, h):
        return x / 3.0, 2.0 / x, x / y, h / 3.0, torch.floor(x / y + 0.5)


def get_inputs():
    return [torch.randn(4, 32) + 4.0, torch.rand(4, 32) + 0.5, torch.randn(4, 32, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
'''


def test_each_division_is_written_as_eager_computes_it(write_problem):
    """A tensor by a Python number: CUDA's eager multiplies by the number's fp32 reciprocal
    (1.0f / 3.0f), its CPU divides fp32 (``_egg_sdiv`` picks by where the kernel runs) and
    multiplies a 16-bit tensor; a number by a tensor is ``reciprocal(t) * c``
    (Tensor.__rtruediv__); tensor by tensor is IEEE division."""
    import numpy as np

    comp = pipeline.compile_problem(load_problem(write_problem(DIVS, "divs")))
    src = comp.emitted.source
    inv = repr(float(np.float32(1.0) / np.float32(3.0)))
    assert f", 3.0, {inv})" in src and "_egg_sdiv(" in src, src
    assert f" * {inv})" in src  # the bf16 tensor's
    assert re.search(r"\(_egg_div\(1\.0, \w+\) \* 2\.0\)", src)
    assert re.search(r"_egg_div\(x\d, x\d\)", src)
    assert "_EGG_INTERPRETED = " in src
