"""Weights computed in forward from packed integers (rw-dequant-program): int4 nibbles unpacked
with ``&`` and ``>>``, interleaved by stack + reshape or put side by side by cat, converted,
scaled per group of K (a view times scales[..., None], or scales.repeat_interleave), with or
without zero points, read by ``F.linear``, ``x @ w.t()`` or ``x @ w``: one matmul kernel that
computes each weight tile in registers from the stored bytes (no 16-bit copy of the weight is
written). Each file is a drop-in (train and eval, other batches, one more leading dim) and
passes the verifier's static check; weights the rule does not cover keep PyTorch's ops. The
index arithmetic of knowledge/templates/program.py is checked against PyTorch's own reshape."""
import itertools
import random

import pytest
import torch

from codegen.pipeline import analyze, compile_problem
from harness.problem import load_problem
from harness.verify import static_findings_src
from knowledge.templates import program as P
from tests.dropin import check_dropin, load_sources, own_call_launches

HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"

INT4 = '''
class Model(nn.Module):
    def __init__(self, in_features=64, out_features=48, group=16):
        super().__init__()
        self.group = group
        self.register_buffer("qweight", torch.randint(0, 256, ({qshape}), dtype=torch.uint8))
        self.register_buffer("scales", torch.rand({sshape}, dtype=torch.bfloat16) * 0.1)
{extra}
    def forward(self, x):
{body}
def get_inputs():
    return [torch.randn(3, 64, dtype=torch.bfloat16)]
def get_init_inputs():
    return []
'''

_UNPACK = '''        n, half = self.qweight.shape
        low = (self.qweight & 0xF).to(torch.int8) - 8
        high = (self.qweight >> 4).to(torch.int8) - 8
'''
CASES = {
    # workload 37's: nibbles interleaved along K, a view per group times the scales
    "interleaved_view_scales": dict(qshape="out_features, in_features // 2", sshape="out_features, in_features // group", extra="", body=_UNPACK + '''        w = torch.stack((low, high), dim=-1).reshape(n, 2 * half).to(x.dtype)
        w = (w.view(n, -1, self.group) * self.scales[..., None]).reshape(n, 2 * half)
        return x @ w.t()
'''),
    # low nibbles in the first half of K, scales repeated per group, a bias
    "halves_repeat_bias": dict(qshape="out_features, in_features // 2", sshape="out_features, in_features // group",
                               extra="        self.bias = nn.Parameter(torch.randn(out_features, dtype=torch.bfloat16))",
                               body=_UNPACK + '''        w = torch.cat([low, high], dim=1).to(torch.bfloat16)
        w = w * self.scales.repeat_interleave(self.group, dim=1)
        return F.linear(x, w, self.bias)
'''),
    # asymmetric uint4 with a zero point per group (AWQ-style), unsigned nibbles
    "zero_points": dict(qshape="out_features, in_features // 2", sshape="out_features, in_features // group",
                        extra="        self.register_buffer('zeros', torch.randint(0, 16, (out_features, in_features // group), dtype=torch.uint8))",
                        body='''        q = torch.stack((self.qweight & 15, self.qweight >> 4), -1).flatten(1)
        g = q.view(q.shape[0], -1, self.group).to(x.dtype) - self.zeros.unsqueeze(-1).to(x.dtype)
        w = (g * self.scales.unsqueeze(-1)).flatten(1)
        return F.linear(x, w)
'''),
    # the weight stored [K, N], packed along K (two rows of K a byte row), read as x @ w
    "k_major": dict(qshape="in_features // 2, out_features", sshape="in_features // group, out_features", extra="",
                    body='''        lo = (self.qweight & 15).to(torch.int8) - 8
        hi = (self.qweight >> 4).to(torch.int8) - 8
        w = torch.stack((lo, hi), dim=1).reshape(-1, self.qweight.shape[1]).to(x.dtype)
        w = w * torch.repeat_interleave(self.scales, self.group, dim=0)
        return x @ w
'''),
    # GPTQ's storage: eight nibbles an int32, unpacked by shifts kept in a buffer
    "int32_eight_nibbles": dict(qshape="out_features, in_features // 8", sshape="out_features, in_features // group",
                                extra="        self.register_buffer('shifts', torch.arange(0, 32, 4, dtype=torch.int32))\n"
                                      "        self.register_buffer('qweight', torch.randint(-2**31, 2**31 - 1, (out_features, in_features // 8), dtype=torch.int32))",
                                body='''        q = (self.qweight.unsqueeze(-1) >> self.shifts) & 15
        w = (q.reshape(q.shape[0], -1) - 8).to(x.dtype)
        w = w * self.scales.repeat_interleave(self.group, dim=-1)
        return F.linear(x, w)
'''),
    # integers past bf16's exact range times bf16 scales: PyTorch converts them to bf16 first
    "widened_past_bf16": dict(qshape="out_features, in_features // 2", sshape="out_features, in_features // group", extra="",
                              body=_UNPACK + '''        w = torch.cat([low, high], dim=1).to(torch.int32) * 37 + 1
        return F.linear(x, w * self.scales.repeat_interleave(self.group, dim=1))
'''),
    # nibbles by arithmetic: q % 16 and q // 16 (floor semantics, exact on non-negative values)
    "mod_and_floordiv": dict(qshape="out_features, in_features // 2", sshape="out_features, in_features // group", extra="",
                             body='''        q = self.qweight.to(torch.int16)
        w = torch.stack((q % 16, torch.div(q, 16, rounding_mode="floor")), -1).flatten(1) - 8
        return F.linear(x, w.to(x.dtype) * self.scales.repeat_interleave(self.group, 1))
'''),
    # NF4 (QLoRA's 4-bit NormalFloat): each nibble indexes a 16-entry fp32 code table, an fp32
    # absmax per block of 16 values, the product in bf16
    "nf4_lookup": dict(qshape="(out_features * in_features // 2,)", sshape="(out_features * in_features // 16,)",
                       extra="        self.register_buffer('nf4', torch.linspace(-1, 1, 16))\n"
                             "        self.register_buffer('absmax', torch.rand(out_features * in_features // 16) + 0.5)",
                       body='''        q = torch.stack((self.qweight >> 4, self.qweight & 15), dim=-1).flatten().long()
        w = (self.nf4[q].view(-1, 16) * self.absmax[:, None]).view(48, 64)
        return F.linear(x, w.to(x.dtype))
'''),
    # AWQ (AutoAWQ's PyTorch path): eight nibbles an int32 along the output columns, in AWQ's
    # order, undone by a column index built with torch.arange; zero points packed the same way
    "awq_columns": dict(qshape="1, 1", sshape="in_features // group, out_features",
                        extra="        self.register_buffer('qw', torch.randint(-2**31, 2**31 - 1, (in_features, out_features // 8), dtype=torch.int32))\n"
                              "        self.register_buffer('qz', torch.randint(-2**31, 2**31 - 1, (in_features // group, out_features // 8), dtype=torch.int32))",
                        body='''        shifts = torch.arange(0, 32, 4, device=self.qz.device)
        iw = torch.bitwise_right_shift(self.qw[:, :, None], shifts[None, None, :]).to(torch.int8)
        iw = iw.view(iw.shape[0], -1)
        iz = torch.bitwise_right_shift(self.qz[:, :, None], shifts[None, None, :]).to(torch.int8)
        iz = iz.view(iz.shape[0], -1)
        order = torch.arange(iw.shape[-1], dtype=torch.int32, device=iz.device).view(-1, 8)
        order = order[:, [0, 4, 1, 5, 2, 6, 3, 7]].view(-1)
        iw = torch.bitwise_and(iw[:, order], 15)
        iz = torch.bitwise_and(iz[:, order], 15)
        w = (iw - iz.repeat_interleave(self.group, dim=0)) * self.scales.repeat_interleave(self.group, dim=0)
        return torch.matmul(x, w)
'''),
    # an int8 weight with group-wise scales (left to PyTorch by rw-dequant-linear)
    "int8_group_scales": dict(qshape="out_features, in_features", sshape="out_features, in_features // group", extra="",
                              body='''        w = self.qweight.to(torch.int16) - 128
        w = (w.to(x.dtype).view(w.shape[0], -1, self.group) * self.scales[:, :, None]).flatten(1)
        return torch.matmul(x, w.transpose(0, 1))
'''),
}


def _src(case):
    if "@" in case:  # another K: 96 ends the K loop with a partial step; at 256 a cat's pieces
        # are whole steps long (each step reads one piece)
        case, k = case.split("@")
        return _src(case).replace("in_features=64", f"in_features={k}").replace("(3, 64,", f"(3, {k},")
    return HEAD + INT4.format(**CASES[case])


@pytest.mark.parametrize("case", sorted(CASES) + ["interleaved_view_scales@96", "halves_repeat_bias@96",
                                                  "halves_repeat_bias@256", "awq_columns@96",
                                                  "awq_columns@256"])
def test_a_packed_weight_is_computed_in_the_products_registers(case, write_problem):
    src = _src(case)
    path = write_problem(src, case)
    plan, applied, err = analyze(load_problem(path))
    assert plan is not None, err
    assert "rw-dequant-program" in applied
    assert [g.kind for g in plan.groups] == ["matmul"]
    comp = compile_problem(load_problem(path))
    emitted = comp.emitted.source
    assert static_findings_src(emitted, src) == []
    box = own_call_launches(*load_sources(src, emitted))
    assert box and any(not t.dtype.is_floating_point for t in box[0])  # the kernel read the packed integers
    report = check_dropin(src, emitted, calls=1, atol=2e-2, rtol=2e-2)
    assert report.fast("own") and report.fast("own", "eval")


def test_the_kernel_reads_no_16_bit_weight(write_problem):
    """The launch's tensors: the input, the packed bytes, the scales, the output; nothing of
    the weight's size in 16 bits."""
    src = _src("interleaved_view_scales")
    comp = compile_problem(load_problem(write_problem(src, "w16")))
    sizes = [(t.dtype, t.numel()) for t in own_call_launches(*load_sources(src, comp.emitted.source))[0]]
    assert (torch.uint8, 48 * 32) in sizes
    assert not [s for s in sizes if s[0] == torch.bfloat16 and s[1] >= 48 * 64]


def test_a_computed_weight_gemv_takes_narrow_split_k_tiles(write_problem):
    """The geometry says the weight is computed (the plan's product has a program), and a
    decode GEMV of a computed weight takes 64-column tiles (measured on an H100 for int4
    4 x 4096 x 14336: 0.039 ms against 0.076 for the 16-bit GEMV's 128 columns); K is split as
    for a 16-bit weight, only where the column tiles leave SMs idle."""
    from codegen import pipeline
    from codegen.fusion import group_inputs
    from knowledge import heuristics as H

    plan, _applied, err = analyze(load_problem(write_problem(_src("interleaved_view_scales"), "geo")))
    (g,) = plan.groups
    geo = pipeline.group_geometry(plan, g, len(group_inputs(plan, g)[0]))
    assert geo["computed_b"] is True
    q = H.matmul_config(4, 14336, 4096, 1, computed_b=True)
    plain = H.matmul_config(4, 14336, 4096, 1)
    assert (plain["BLOCK_N"], plain["SPLIT_K"]) == (128, 1)
    assert (q["BLOCK_M"], q["BLOCK_N"], q["SPLIT_K"]) == (16, 64, 1)  # 224 column tiles
    few = H.matmul_config(4, 4096, 14336, 1, computed_b=True)  # 64 column tiles for 132 SMs
    assert (few["BLOCK_N"], few["SPLIT_K"]) == (64, 2)


NEAR = {
    "a float weight scaled (no integer stored)": "w = self.scales.repeat_interleave(self.group, dim=1) * 2\n        return F.linear(x, w)",
    "the unpacked weight returned too": _UNPACK.strip() + "\n        w = torch.cat([low, high], dim=1).to(x.dtype)\n        return F.linear(x, w), w",
    "an fp32 product": _UNPACK.strip() + "\n        w = torch.cat([low, high], dim=1).float()\n        return F.linear(x.float(), w)",
    # a buffer's values are unknown when the rule runs (a state_dict may change them): an index
    # read from one could leave the dim, so the take is left to PyTorch, which raises
    "columns reordered by an index buffer": _UNPACK.strip() + "\n        w = torch.cat([low, high], dim=1).to(x.dtype)\n        return F.linear(x, w[:, self.order])",
    # nibbles 0..15 index a table of 12 entries: the range proves nothing
    "a lookup past its table": "q = (self.qweight & 15).long()\n        w = self.table[q].repeat_interleave(2, dim=1)\n        return F.linear(x, w.to(x.dtype))",
    # (q - 8) & 15 of a signed nibble: bounded by 15, not by the difference's 7
    "a signed nibble masked, past its table": "q = (((self.qweight & 15).to(torch.int8) - 8) & 15).long()\n        w = self.table[q].repeat_interleave(2, dim=1)\n        return F.linear(x, w.to(x.dtype))",
    "a weight sliced (not a view the program holds)": _UNPACK.strip() + "\n        w = torch.cat([low, high], dim=1).to(x.dtype)\n        return F.linear(x[:, :32], w[:, :32])",
}


@pytest.mark.parametrize("why", sorted(NEAR))
def test_weights_the_rule_does_not_cover_keep_pytorchs_ops(why, write_problem):
    extra = ("        self.register_buffer('order', torch.arange(in_features))\n"
             "        self.register_buffer('table', torch.randn(12))")
    src = HEAD + INT4.format(qshape="out_features, in_features // 2", sshape="out_features, in_features // group",
                             extra=extra, body="        " + NEAR[why] + "\n")
    plan, applied, err = analyze(load_problem(write_problem(src, "near")))
    assert plan is not None, err
    assert "rw-dequant-program" not in applied, why


def _shapes(numel, rng):
    """A random shape of numel elements (size-1 dims included now and then)."""
    dims, left = [], numel
    for p in (2, 3, 5):
        while left % p == 0 and rng.random() < 0.7:
            dims.append(p)
            left //= p
    dims.append(left)
    rng.shuffle(dims)
    merged = []
    for d in dims:
        if merged and rng.random() < 0.4:
            merged[-1] *= d
        else:
            merged.append(d)
    if rng.random() < 0.3:
        merged.insert(rng.randrange(len(merged) + 1), 1)
    return merged


def _known(e: P.Ix, names) -> bool:
    if e.kind == "var":
        return e.args[0] in names
    return all(_known(t, names) for t in e.args if isinstance(t, P.Ix))


def _eval(e: P.Ix, env: dict) -> int:
    code = e.render().replace("tl.minimum", "min").replace("tl.maximum", "max")
    return eval(code, {}, env)  # noqa: S307 - our own index expressions


@pytest.mark.parametrize("seed", range(40))
def test_reshape_indices_read_what_pytorchs_reshape_reads(seed):
    rng = random.Random(seed)
    numel = rng.choice([12, 24, 30, 36, 60, 64, 72, 90, 120])
    src_shape, out_shape = _shapes(numel, rng), _shapes(numel, rng)
    base = torch.arange(numel).reshape(src_shape)
    want = base.reshape(out_shape)
    names = [f"i{d}" for d in range(len(out_shape))]
    idx = [P.var(nm, s) for nm, s in zip(names, out_shape)]
    got = P.reshape_index(idx, out_shape, src_shape)
    assert len(got) == len(src_shape)
    for pos in itertools.product(*(range(s) for s in out_shape)):
        env = dict(zip(names, pos))
        at = tuple(_eval(e, env) for e in got)
        assert base[at] == want[pos], (src_shape, out_shape, pos, [e.render() for e in got])


def test_a_view_and_its_inverse_index_the_element_itself():
    """(k // G) * G + k % G simplifies to k: the group view and the flatten after it cost no
    index arithmetic."""
    k = P.var("k", 4096)
    g, r = P.reshape_index([k], [4096], [32, 128])
    assert (g.render(), r.render()) == ("(k // 128)", "(k % 128)")
    (back,) = P.reshape_index([g, r], [32, 128], [4096])
    assert back.render() == "k"
    j, s = P.reshape_index([back], [4096], [2048, 2])
    assert (j.render(), s.render()) == ("(k // 2)", "(k % 2)")


@pytest.mark.parametrize("case", sorted(CASES) + ["halves_repeat_bias@96"])
def test_no_load_leaves_its_tensor(case, write_problem):
    """Every load of the lowered program, at every (k, n) of the weight, indexes inside its
    stored tensor: a cat's pieces are read at clamped indices where another piece is selected
    (the interpreter would not fault on a stray address; a GPU would)."""
    plan, _applied, err = analyze(load_problem(write_problem(_src(case), case)))
    assert plan is not None, err
    op = plan.nops[plan.groups[0].red]
    prog, b_nk = op.p["program"], op.p["b_nk"]
    shape = prog[-1][1]
    names = ["n", "k"] if b_nk else ["k", "n"]
    low = P.Lowering(prog, lambda j: f"X{j}", lambda j, d: f"S{j}_{d}")
    low.value(len(prog) - 1, [P.var(nm, s) for nm, s in zip(names, shape)])
    leaves = {ins[3]: ins[1] for ins in prog if ins[0] == "leaf"}
    assert low.loads
    for j, idx in low.loads:
        if any(not _known(e, names) for e in idx):
            continue  # read at loaded values (a take): its range is the builder's proof
        for pos in itertools.product(*(range(s) for s in shape)):
            env = dict(zip(names, pos))
            at = [_eval(e, env) for e in idx]
            assert all(0 <= a < s for a, s in zip(at, leaves[j])), (case, j, at, leaves[j])


@pytest.mark.parametrize("case", sorted(CASES) + ["halves_repeat_bias@256", "awq_columns@96", "awq_columns@256"])
def test_the_computed_weight_is_eagers_to_the_bit(case, write_problem):
    """Times the identity, each output is one weight element: the kernel's weight must equal
    eager's bit for bit (every op in PyTorch's dtype, integers converted to bf16 before a
    product with bf16 scales as PyTorch converts them)."""
    src = _src(case)
    comp = compile_problem(load_problem(write_problem(src, case)))
    pm, cm = load_sources(src, comp.emitted.source)
    torch.manual_seed(0)
    ref = pm.Model()
    new = cm.ModelNew()
    new.load_state_dict(ref.state_dict())
    eye = torch.eye(int(case.partition("@")[2] or 64), dtype=torch.bfloat16)
    with torch.no_grad():
        want, got = ref(eye), new(eye)
    assert torch.equal(got, want), (got.float() - want.float()).abs().max()


def test_floor_division_of_signed_values_stays_in_pytorch(write_problem):
    """Python's % and // floor, Triton's truncate: they agree on non-negative values only, so a
    program computes ``q % 16`` of an unsigned byte but takes ``low % 5`` of a signed nibble as
    a stored value (computed by PyTorch), never as its own op."""
    body = _UNPACK + """        w = torch.cat([low % 5, high // 3], dim=1).to(x.dtype)
        return F.linear(x, w * self.scales.repeat_interleave(self.group, dim=1))
"""
    src = HEAD + INT4.format(qshape="out_features, in_features // 2",
                             sshape="out_features, in_features // group", extra="", body=body)
    plan, applied, err = analyze(load_problem(write_problem(src, "signed_mod")))
    assert plan is not None, err
    assert "rw-dequant-program" in applied
    prog = plan.nops[plan.groups[0].red].p["program"]
    assert not [ins for ins in prog if ins[0] == "bin" and ins[3] in ("mod", "floordiv")], prog
    assert sum(ins[0] == "leaf" for ins in prog) == 4  # qweight, low % 5, high // 3, the scales


def test_the_wrapper_refuses_stored_tensors_and_inputs_it_was_not_built_for(write_problem):
    """The kernel has the stored tensors' sizes written in: a packed weight of another shape or
    dtype, or an input of another K, raises (as PyTorch's product does) instead of reading past
    the tensors; the tensors it was built for pass."""
    src = _src("interleaved_view_scales")
    comp = compile_problem(load_problem(write_problem(src, "refuse")))
    pm, cm = load_sources(src, comp.emitted.source)
    m = cm.ModelNew()
    x = pm.get_inputs()[0]
    with torch.no_grad():
        assert cm._egg_g0(x, m.qweight, m.scales).shape == (3, 48)
        with pytest.raises(ValueError, match="stored tensor"):
            cm._egg_g0(x, m.qweight[:24], m.scales)
        with pytest.raises(ValueError, match="stored tensor"):
            cm._egg_g0(x, m.qweight.to(torch.int16), m.scales)
        with pytest.raises(RuntimeError, match="cannot be multiplied"):
            cm._egg_g0(torch.randn(3, 32, dtype=torch.bfloat16), m.qweight, m.scales)


def test_the_period_of_a_fixed_index_table():
    """A fixed column order is read as blocks (codegen.rewrites.quant._period): the least R with
    t[n] = (n // R) * R + t[n % R], each block a reordering inside itself."""
    from codegen.rewrites.quant import _period

    awq = torch.arange(64).view(-1, 8)[:, [0, 4, 1, 5, 2, 6, 3, 7]].reshape(-1)
    assert _period(awq) == 8
    assert _period(awq.int()) == 8
    assert _period(torch.arange(48)) == 1  # the table is n: the take is dropped
    assert _period(torch.tensor([1, 0, 3, 2, 5, 4, 7, 6])) == 2
    assert _period(torch.arange(64).flip(0)) is None  # one block: nothing to read from n
    assert _period(torch.randperm(64, generator=torch.Generator().manual_seed(1))) is None
    assert _period(torch.tensor([0, 0, 2, 2])) == 2  # repeats inside a block are fine
    assert _period(torch.tensor([1, 1, 3, 3])) == 2
    assert _period(torch.tensor([2, 3, 0, 1])) is None  # blocks of 2 swapped: leaves its block
    assert _period(torch.arange(8.0)) is None


@pytest.mark.parametrize("step", [4, 8])
def test_int32_nibbles_shifted_by_an_int64_table_are_shifted_in_int32(step, write_problem):
    """AutoAWQ shifts int32 packs by ``torch.arange(0, 32, 4)`` (int64: PyTorch promotes the
    shift to 64 bits); shifts of 0-31 give the same values in int32 (the arithmetic shift of
    the sign-extended pack), so the program shifts in int32 and widens after. A table reaching
    32 or more (int64 packs of 8-bit codes, here int32 ones shifted to their sign) stays in
    int64: a 32-bit shift by 32 or more is not PyTorch's result. Both are eager's to the bit."""
    body = CASES["awq_columns"]["body"]
    case = dict(CASES["awq_columns"])
    if step == 8:  # bytes of a shift table 0..56: int32 packs shifted past their width
        case["body"] = (body.replace("torch.arange(0, 32, 4,", "torch.arange(0, 64, 8,")
                        .replace(".view(-1, 8)", ".view(-1, 8)"))
    src = HEAD + INT4.format(**case)
    path = write_problem(src, f"shift{step}")
    plan, _applied, err = analyze(load_problem(path))
    assert plan is not None, err
    prog = plan.nops[plan.groups[0].red].p["program"]
    shifts = [ins for ins in prog if ins[0] == "bin" and ins[3] == "rshift"]
    assert shifts and {ins[2] for ins in shifts} == ({"int32"} if step == 4 else {"int64"}), shifts
    comp = compile_problem(load_problem(path))
    pm, cm = load_sources(src, comp.emitted.source)
    torch.manual_seed(0)
    ref, new = pm.Model(), cm.ModelNew()
    new.load_state_dict(ref.state_dict())
    eye = torch.eye(64, dtype=torch.bfloat16)
    with torch.no_grad():
        want, got = ref(eye), new(eye)
    assert torch.equal(got, want), (got.float() - want.float()).abs().max()
