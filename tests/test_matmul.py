"""The matmul template's planning rules (which products become a template kernel, what joins
their epilogue), its launch heuristic, the 3xTF32 roofline key, and the expert's back-out of a
product after a precision failure. The template's numerics are in tests/test_templates.py."""
import pytest
import torch

from codegen.pipeline import analyze
from harness import roofline
from harness.problem import load_problem
from knowledge import heuristics as H
from knowledge.templates.matmul import dot_precision

HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"


def _src(forward: str, inputs: str, members: str = "        pass\n") -> str:
    return (HEAD + "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            + members + f"    def forward(self, {forward}\n"
            + f"def get_inputs():\n    return {inputs}\ndef get_init_inputs():\n    return []\n")


def _plan(write_problem, src, name="p"):
    plan, _rw, err = analyze(load_problem(write_problem(src, name)))
    assert plan is not None, err
    return plan


def _lib_reasons(plan):
    return {n.name: op.why for n, op in plan.nops.items() if op.kind == "library"}


def _is_a_drop_in(path, comp) -> None:
    """The emitted ModelNew is a drop-in for Model (tests/dropin.check_dropin: random state
    loaded, train() and eval(), other batch sizes and ranks, grad mode, .to()), and its kernels
    run for the problem's own inputs in both modes."""
    from tests.dropin import check_dropin

    # torch.testing.assert_close's own fp32 tolerance
    report = check_dropin(path.read_text(), comp.emitted.source, calls=1, atol=1e-5, rtol=1.3e-6)
    assert report.fast("own", "train") and report.fast("own", "eval")


def _planned_state(write_problem, forward: str, inputs: str, members: str, name: str):
    """An H200-like state with the expert's plan of a problem (no GPU needed)."""
    from harness.problem import describe_problem
    from policies.expert import ExpertPolicy
    from state import EggState, HardwareInfo, Settings

    _prob, spec = describe_problem(write_problem(_src(forward, inputs, members), name))
    hw = HardwareInfo(device="cuda", name="NVIDIA H200", profile_id="h200", interpreter=False,
                      sm_count=132, mem_bandwidth_gbs=4800, peak_tflops={"fp32": 67, "tf32": 495})
    st = EggState(problem_path=spec.path, problem=spec, hardware=hw)
    analysis, plan = ExpertPolicy().plan(st, Settings(device="cpu"))
    return st.model_copy(update={"analysis": analysis, "plan": plan})


def test_linear_and_its_epilogue_form_one_group(write_problem):
    plan = _plan(write_problem, _src(
        "x, r):\n        return torch.sigmoid(self.fc(x)) * 2.0 + r\n",
        "[torch.randn(8, 16), torch.randn(8, 1)]", "        self.fc = nn.Linear(16, 12)\n"))
    (g,) = plan.groups
    assert g.kind == "matmul"
    assert [plan.nops[m].name for m in g.members] == ["linear", "sigmoid", "mul", "add"]
    assert plan.nops[g.red].p == {"batched": False, "b_nk": True}


def test_epilogue_input_that_does_not_broadcast_stays_out(write_problem):
    """x @ w is [8, 8]; adding a [2, 8, 8] tensor grows the domain: not an epilogue."""
    plan = _plan(write_problem, _src(
        "x, w, big):\n        return (x @ w) + big\n",
        "[torch.randn(8, 4), torch.randn(4, 8), torch.randn(2, 8, 8)]"))
    kinds = sorted(g.kind for g in plan.groups)
    assert kinds == ["matmul", "pointwise"]


def test_sixteen_bit_product_without_epilogue_stays_cublas(write_problem):
    alone = _plan(write_problem, _src(
        "a, b):\n        return torch.mm(a, b)\n",
        "[torch.randn(8, 4, dtype=torch.bfloat16), torch.randn(4, 8, dtype=torch.bfloat16)]"), "a")
    assert not alone.groups
    assert "no epilogue" in _lib_reasons(alone)["mm"]
    fused = _plan(write_problem, _src(
        "a, b):\n        return torch.relu(torch.mm(a, b))\n",
        "[torch.randn(8, 4, dtype=torch.bfloat16), torch.randn(4, 8, dtype=torch.bfloat16)]"), "b")
    assert [g.kind for g in fused.groups] == ["matmul"]
    fp32 = _plan(write_problem, _src("a, b):\n        return torch.mm(a, b)\n",
                                     "[torch.randn(8, 4), torch.randn(4, 8)]"), "c")
    assert [g.kind for g in fp32.groups] == ["matmul"]  # 3xTF32 beats the CUDA cores alone


@pytest.mark.parametrize("forward,inputs,why", [
    ("a, b):\n        return torch.matmul(a, b)\n", "[torch.randn(2, 3, 4, 5), torch.randn(3, 5, 6)]",
     "broadcast batch"),
    ("a, b):\n        return torch.matmul(a, b)\n", "[torch.randn(4, 5), torch.randn(5)]", "vector"),
    ("a, b):\n        return torch.mm(a, b)\n",
     "[torch.randn(4, 5, dtype=torch.float64), torch.randn(5, 6, dtype=torch.float64)]", "float64"),
])
def test_products_the_template_does_not_take_say_why(forward, inputs, why, write_problem):
    plan = _plan(write_problem, _src(forward, inputs))
    assert not [g for g in plan.groups if g.kind == "matmul"]
    assert any(why in r for r in _lib_reasons(plan).values()), _lib_reasons(plan)


def test_batched_and_transposed_forms(write_problem):
    plan = _plan(write_problem, _src(
        "q, k):\n        return torch.matmul(q, k.transpose(-2, -1)) * 0.125\n",
        "[torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8)]"))
    (g,) = plan.groups
    assert g.kind == "matmul" and plan.nops[g.red].p == {"batched": True, "b_nk": False}
    from codegen.pipeline import group_geometry

    geo = group_geometry(plan, g, 2)
    assert (geo["M"], geo["N"], geo["K"], geo["batch"]) == (5, 7, 8, 6)


def test_matmul_heuristic_fills_the_gpu_and_fits_k():
    big = H.matmul_config(4096, 4096, 4096, 1)
    assert (big["BLOCK_M"], big["BLOCK_N"], big["BLOCK_K"]) == (128, 128, 64)
    small = H.matmul_config(256, 256, 16, 1)  # 4 tiles of 128: shrink to fill 132 SMs
    assert small["BLOCK_M"] == 64 and small["BLOCK_N"] == 64 and small["BLOCK_K"] == 16
    assert H.matmul_config(8192, 2048, 4096, 1)["BLOCK_K"] == 64  # the same tiles for every dtype


def test_fp32_products_use_3xtf32_and_the_roofline_charges_that_rate():
    assert dot_precision("float32") == "tf32x3" and dot_precision("bfloat16") is None
    assert roofline.peak_of({"fp32": 67, "tf32": 495}, "tf32x3") == pytest.approx(165)
    assert roofline.peak_of({"fp32": 67}, "tf32x3") == 67  # no TF32 peak known: CUDA cores
    assert roofline.peak_of({"fp32": 67, "tf32": 495, "tf32x3": 120}, "tf32x3") == 120


def test_precision_failure_backs_out_the_product_first(write_problem):
    """A 'lower precision' verdict names no kernel; only a product changes how products round,
    so the product's group goes before the newest group."""
    from policies.expert import ExpertPolicy
    from state import Candidate, VerificationRecord

    st = _planned_state(write_problem, "x):\n        return torch.softmax(torch.relu(self.fc(x)), dim=-1)\n",
                        "[torch.randn(8, 16)]", "        self.fc = nn.Linear(16, 12)\n", "prec")
    kinds = {g.id: g.kind for g in st.plan.groups if g.kind != "library"}
    assert sorted(kinds.values()) == ["matmul", "softmax"]
    cand = Candidate(id="c1", stage="algorithm", author="algorithm_designer", source="x")
    ver = VerificationRecord(candidate_id="c1", passed=False, category="precision",
                             reason="output 0: computes with lower precision than eager")
    st = st.model_copy(update={"candidates": [cand], "verifications": [ver]})
    disabled, why = ExpertPolicy()._backout(st, "algorithm")
    (victim,) = disabled
    assert kinds[victim] == "matmul" and "precision" in why


def test_regression_backs_out_the_group_expected_to_save_least_time(write_problem):
    """An fp32 product's expected saving counts its FLOPs moved to 3xTF32, not only bytes: after
    a regression the softmax group goes first (on the H200 a Gemm+BatchNorm problem lost its 2x
    product this way when bytes alone decided)."""
    from policies.expert import ExpertPolicy
    from state import Candidate, TimingRecord, VerificationRecord

    st = _planned_state(write_problem, "x):\n        return torch.softmax(self.fc(x), dim=-1) * 2.0 + 1.0\n",
                        "[torch.randn(64, 256)]", "        self.fc = nn.Linear(256, 256)\n", "regr")
    by_kind = {g.kind: g for g in st.plan.groups if g.kind != "library"}
    mm, sm = by_kind["matmul"], by_kind["softmax"]
    assert mm.est_bytes_saved < sm.est_bytes_saved  # bytes alone would pick the product
    assert mm.est_us_saved > sm.est_us_saved
    cand = Candidate(id="c1", stage="algorithm", author="algorithm_designer", source="x")
    tim = TimingRecord(candidate_id="c1", device="cuda", interpreter=False, candidate_ms=2.0,
                       verdict="regressed")
    ver = VerificationRecord(candidate_id="c1", passed=True)
    st = st.model_copy(update={"candidates": [cand], "verifications": [ver], "timings": [tim]})
    disabled, why = ExpertPolicy()._backout(st, "algorithm")
    assert disabled == [sm.id] and "regression" in why


def test_k_major_operands_are_aligned_or_copied_padded():
    from knowledge.templates._runtime import _egg_k_major

    ok = torch.randn(2, 5, 8)
    assert _egg_k_major(ok) is ok  # K contiguous, rows of 32 bytes: read in place
    odd = torch.randn(2, 5, 7)  # rows of 28 bytes: not 16-byte aligned
    got = _egg_k_major(odd)
    assert got.stride() == (5 * 8, 8, 1) and torch.equal(got, odd)
    t = torch.randn(1, 8, 6).transpose(1, 2)  # K strided: transposed copy
    got = _egg_k_major(t)
    assert got.stride(2) == 1 and torch.equal(got, t)
    half = torch.randn(1, 3, 12, dtype=torch.bfloat16)[:, :, :9]  # bf16: 8 elements per 16 bytes
    got = _egg_k_major(half)
    assert got.stride(1) == 16 and torch.equal(got, half)


def test_vector_like_products_stay_cublas_and_long_k_ones_split(write_problem):
    """A GEMV in tensor-core tiles wastes most of the tile (10x slower on the H200); a product
    with few output tiles and a long K loop runs split-K instead."""
    gemv = _plan(write_problem, _src("a, b):\n        return torch.matmul(a, b)\n",
                                     "[torch.randn(256, 4096), torch.randn(4096, 1)]"), "gemv")
    assert not gemv.groups and "matrix-vector" in _lib_reasons(gemv)["matmul"]
    longk = _plan(write_problem, _src("a, b):\n        return torch.matmul(a, b)\n",
                                      "[torch.randn(256, 8192), torch.randn(8192, 256)]"), "lk")
    assert [g.kind for g in longk.groups] == ["matmul"]
    cfg = H.matmul_config(256, 256, 524288, 1)
    assert cfg["SPLIT_K"] == 16  # 16 tiles of 64x64: 16 splits = 256 programs for 132 SMs
    assert H.matmul_config(4096, 4096, 4096, 1)["SPLIT_K"] == 1
    assert H.matmul_config(256, 256, 128, 1)["SPLIT_K"] == 1  # K too short to split


def test_backed_out_product_keeps_its_epilogue_as_a_fused_tail(write_problem, tmp_path):
    """Disabling a product group leaves cuBLAS's product and a pointwise tail (id g0t) with the
    epilogue, which computes the same values; disabling the tail too leaves torch code."""
    from codegen.pipeline import compile_problem

    path = write_problem(_src(
        "x):\n        return torch.sigmoid(self.fc(x)) * 2.0\n",
        "[torch.randn(8, 16)]", "        self.fc = nn.Linear(16, 12)\n"), "tail")
    prob = load_problem(path)
    comp = compile_problem(prob, disabled={"g0"})
    (g,) = comp.plan.groups
    assert g.id == "g0t" and g.kind == "pointwise"
    assert [comp.plan.nops[m].name for m in g.members] == ["sigmoid", "mul"]
    assert "backed out" in _lib_reasons(comp.plan)["linear"]
    _is_a_drop_in(path, comp)
    assert not compile_problem(prob, disabled={"g0", "g0t"}).plan.groups


def test_backout_walks_from_the_product_to_its_tail(write_problem):
    from policies.expert import ExpertPolicy
    from state import Candidate, TimingRecord, VerificationRecord

    st = _planned_state(write_problem, "x):\n        return torch.sigmoid(self.fc(x)) * 2.0\n",
                        "[torch.randn(8, 16)]", "        self.fc = nn.Linear(16, 12)\n", "walk")
    steps = []
    disabled: list[str] = []
    for i in range(3):
        cid = f"c{i + 1}"
        cand = Candidate(id=cid, stage="algorithm", author="algorithm_designer", source="x",
                         disabled_groups=list(disabled))
        st = st.model_copy(update={
            "candidates": st.candidates + [cand],
            "verifications": st.verifications + [VerificationRecord(candidate_id=cid, passed=True)],
            "timings": st.timings + [TimingRecord(candidate_id=cid, device="cuda", interpreter=False,
                                                  candidate_ms=1.0, verdict="regressed")]})
        disabled, why = ExpertPolicy()._backout(st, "algorithm")
        steps.append(disabled)
        if disabled is None:
            break
    assert steps == [["g0"], ["g0", "g0t"], None]


def test_memory_outside_the_candidate_retries_unchanged_once(write_problem):
    """get_inputs() or the reference running out of GPU memory (another process's memory) is
    no kernel's fault: the same groups are tried again once; a second time in a row, the
    newest group goes as before."""
    from policies.expert import ExpertPolicy
    from state import Candidate, VerificationRecord

    st = _planned_state(write_problem, "x):\n        return torch.softmax(torch.relu(self.fc(x)), dim=-1)\n",
                        "[torch.randn(8, 16)]", "        self.fc = nn.Linear(16, 12)\n", "oom")
    oom = "problem p.py: get_inputs() raised OutOfMemoryError: CUDA out of memory. Tried to allocate 7.00 GiB"
    c1 = Candidate(id="c1", stage="algorithm", author="algorithm_designer", source="x")
    v1 = VerificationRecord(candidate_id="c1", passed=False, category="problem", reason=oom)
    one = st.model_copy(update={"candidates": [c1], "verifications": [v1]})
    disabled, why = ExpertPolicy()._backout(one, "algorithm")
    assert disabled == [] and why.startswith("retry unchanged")
    c2 = Candidate(id="c2", stage="algorithm", author="algorithm_designer", source="x")
    v2 = VerificationRecord(candidate_id="c2", passed=False, category="harness",
                            reason="the reference ran out of memory: CUDA out of memory")
    two = st.model_copy(update={"candidates": [c1, c2], "verifications": [v1, v2]})
    disabled, why = ExpertPolicy()._backout(two, "algorithm")
    assert len(disabled) == 1 and "back out" in why
    # the candidate's own forward running out of memory is its own: backed out at once
    v3 = VerificationRecord(candidate_id="c1", passed=False, category="memory",
                            reason="forward ran out of memory (69.90 GiB device limit)")
    own = st.model_copy(update={"candidates": [c1], "verifications": [v3]})
    disabled, why = ExpertPolicy()._backout(own, "algorithm")
    assert len(disabled) == 1 and "back out" in why


def test_a_failure_naming_a_buffer_backs_out_the_group_that_computes_it(write_problem):
    """'buffer bn1.running_var after the call differs' names no kernel, but the buffer: the group
    computing bn1's channel statistics goes, not the newest group (in a deep net the newest is
    far from it: ResNet-101 backed out four unrelated groups this way). A reason naming no
    state, or state no group is near, still backs out the newest."""
    from policies.expert import ExpertPolicy
    from state import Candidate, VerificationRecord

    st = _planned_state(
        write_problem,
        "x):\n        y = torch.relu(self.bn1(self.conv1(x)))\n"
        "        return torch.relu(self.bn2(self.conv2(y)))\n",
        "[torch.randn(2, 4, 6, 6)]",
        "        self.conv1 = nn.Conv2d(4, 4, 3, padding=1)\n        self.bn1 = nn.BatchNorm2d(4)\n"
        "        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)\n        self.bn2 = nn.BatchNorm2d(4)\n",
        "bnback")
    groups = [g for g in st.plan.groups if g.kind != "library"]
    stats = [g.id for g in groups if g.kind == "chanstats"]
    assert len(stats) == 2 and groups[-1].id not in stats[:1]
    cand = Candidate(id="c1", stage="algorithm", author="algorithm_designer", source="x")

    def backout(reason):
        ver = VerificationRecord(candidate_id="c1", passed=False, category="mismatch", reason=reason)
        return ExpertPolicy()._backout(st.model_copy(update={"candidates": [cand], "verifications": [ver]}),
                                       "algorithm")

    for bn, want in (("bn1", stats[0]), ("bn2", stats[1])):
        disabled, why = backout(f"trial 1 (train): buffer {bn}.running_var after the call differs from "
                                "Model's (max abs 0.0002)")
        assert disabled == [want] and f"buffer {bn}.running_var" in why, why
    for reason in ("trial 1 (train): output 0: max abs error 0.5", "buffer nowhere.x differs"):
        disabled, why = backout(reason)
        assert disabled == [groups[-1].id] and "newest" in why


def test_unnamed_failure_among_many_groups_backs_out_half(write_problem):
    """A failure that names no group backs out the half of the live groups expected to save least
    when more than HALVE_ABOVE are live (ResNet-101 on the H200: 26 groups, one backed out per
    60-70 s verification until the budget ran out), then one at a time; a named group still
    goes alone."""
    from policies import expert
    from policies.expert import ExpertPolicy
    from state import Candidate, VerificationRecord

    fwd = "x):\n" + "        x = torch.softmax(x, dim=-1).transpose(0, 1) * 2.0\n" * 7 + "        return x\n"
    st = _planned_state(write_problem, fwd, "[torch.randn(64, 64)]", "        pass\n", "many")
    groups = [g for g in st.plan.groups if g.kind != "library"]
    assert len(groups) == 8 > expert.HALVE_ABOVE
    saving = {g.id: expert._expected_saving(g) for g in groups}

    def fail(disabled, reason, category="mismatch"):
        cand = Candidate(id="c1", stage="algorithm", author="algorithm_designer", source="x",
                         disabled_groups=disabled)
        ver = VerificationRecord(candidate_id="c1", passed=False, category=category, reason=reason)
        return ExpertPolicy()._backout(st.model_copy(update={"candidates": [cand], "verifications": [ver]}),
                                       "algorithm")

    disabled, why = fail([], "trial 3 (eval): output 0: max abs error 0.01 exceeds atol")
    assert len(disabled) == 4 and "half of 8" in why
    kept = [g for g in saving if g not in disabled]
    assert max(saving[g] for g in disabled) <= min(saving[g] for g in kept)  # the least-saving half
    again, why = fail(disabled, "trial 3 (eval): output 0: max abs error 0.01 exceeds atol")
    assert again == disabled + [kept[-1]] and "newest" in why  # 4 live: one at a time
    named, _ = fail([], f"trial 1 (train): output 0 of _egg_k_{groups[2].id} is wrong")
    assert named == [groups[2].id]


def test_products_to_try_on_library_go_back_to_cublas_with_their_epilogues(write_problem):
    """A stage-1 candidate whose Triton products came out within noise of eager, or won while
    GEMM-bound: the next design backs out every product at once (cuBLAS, the epilogue a fused
    tail) and keeps the other groups; a product already backed out, or a win whose products are
    a sliver of its time, asks for nothing more; a cuBLAS try that regressed ends stage 1."""
    from policies.expert import ExpertPolicy
    from state import Candidate, KernelConfig, Settings, TimingRecord, VerificationRecord

    st = _planned_state(write_problem, "x):\n        return torch.softmax(torch.relu(self.fc(x)) + self.fc2(x).sigmoid(), dim=-1)\n",
                        "[torch.randn(64, 256)]",
                        "        self.fc = nn.Linear(256, 256)\n        self.fc2 = nn.Linear(256, 256)\n",
                        "noise")
    kinds = {g.id: g.kind for g in st.plan.groups if g.kind != "library"}
    products = sorted(g for g, k in kinds.items() if k == "matmul")
    assert products and len(kinds) > len(products)
    cfgs = [KernelConfig(group_id=g, template="matmul" if k == "matmul" else k, params={})
            for g, k in kinds.items()]
    cand = Candidate(id="c1", stage="algorithm", author="algorithm_designer", source="x", configs=cfgs)
    ver = VerificationRecord(candidate_id="c1", passed=True)

    def after(verdict, disabled=(), ms=1.0):
        c = cand.model_copy(update={"disabled_groups": list(disabled)})
        tim = TimingRecord(candidate_id="c1", device="cuda", interpreter=False, candidate_ms=ms,
                           verdict=verdict)
        return st.model_copy(update={"candidates": [c], "verifications": [ver], "timings": [tim],
                                     "current_id": "c1", "stage": "algorithm"})

    disabled, why = ExpertPolicy()._backout(after("noise"), "algorithm")
    assert sorted(disabled) == products and "within noise" in why and "cuBLAS" in why
    draft = ExpertPolicy().design(after("noise"), Settings(device="cpu"))
    assert sorted(draft.disabled_groups) == products
    # the epilogues stay kernels: relu(fc(x)) joins the tail that reads it (merge_tails)
    assert f"_egg_k_{products[-1]}t" in draft.source and f"_egg_k_{products[0]}t" not in draft.source
    assert ExpertPolicy()._backout(after("noise", products), "algorithm")[1] == "retry"
    # a win whose products are a sliver of its time stands; one that is GEMM-bound (here: the
    # products' floor above the candidate's whole measured time) tries cuBLAS's products once
    assert ExpertPolicy()._backout(after("improved"), "algorithm")[1] == "retry"
    floor = sum(g.est_ms for g in st.plan.groups if g.id in products)
    # fp32 products stay the template's (3xTF32) however GEMM-bound; 16-bit ones are tried
    assert ExpertPolicy()._backout(after("improved", ms=floor), "algorithm")[1] == "retry"
    half = st.analysis.model_copy(update={"ops": [o.model_copy(update={"dtype": "bfloat16"})
                                                  for o in st.analysis.ops]})
    st = st.model_copy(update={"analysis": half})
    disabled, why = ExpertPolicy()._backout(after("improved", ms=floor), "algorithm")
    assert sorted(disabled) == products and "GEMM-bound" in why and "cuBLAS" in why
    # that try regressed against the Triton products: stage 1 stops, the better candidate stands
    c2 = cand.model_copy(update={"id": "c2", "disabled_groups": products, "rationale": why})
    lost = after("improved", ms=floor).model_copy(update={
        "candidates": [cand, c2], "current_id": "c2",
        "verifications": [ver, ver.model_copy(update={"candidate_id": "c2"})],
        "timings": [TimingRecord(candidate_id="c2", device="cuda", interpreter=False,
                                 candidate_ms=2 * floor, verdict="regressed")]})
    assert ExpertPolicy()._backout(lost, "algorithm")[0] is None
    declined = ExpertPolicy().design(lost, Settings(device="cpu"))
    assert "regressed against the Triton ones" in declined.reason


def test_a_tail_read_only_by_another_tail_joins_it(write_problem, tmp_path):
    """A gated MLP with both products backed out: silu(gate(x)) is read only by the tail of
    up(x), so the two tails are one kernel (silu and mul), which computes what Model does; a
    tail read elsewhere too stays its own."""
    from codegen.pipeline import compile_problem

    members = "        self.gate = nn.Linear(16, 32)\n        self.up = nn.Linear(16, 32)\n"
    path = write_problem(_src("x):\n        return F.silu(self.gate(x)) * self.up(x)\n",
                              "[torch.randn(8, 16)]", members), "gated")
    prob = load_problem(path)
    comp = compile_problem(prob, disabled={"g0", "g1"})
    (g,) = comp.plan.groups
    assert g.kind == "pointwise" and [comp.plan.nops[m].name for m in g.members] == ["silu", "mul"]
    _is_a_drop_in(path, comp)

    both = write_problem(_src("x):\n        s = F.silu(self.gate(x))\n        return s * self.up(x), s\n",
                              "[torch.randn(8, 16)]", members), "gated_out")
    comp2 = compile_problem(load_problem(both), disabled={"g0", "g1"})
    assert len(comp2.plan.groups) == 2


@pytest.mark.parametrize("norm", [
    "F.layer_norm(h, (32,), self.w, None, 1e-5)",
    "self.w * (v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-5)).to(h.dtype)",  # Llama's
])
def test_a_residual_tail_joins_the_norm_after_it(write_problem, tmp_path, norm):
    """The output projection backed out: its residual-add tail becomes the prologue of the norm
    that reads the sum, and the norm kernel also stores the sum the caller gets back; ModelNew
    computes what Model does."""
    from codegen.pipeline import compile_problem

    members = ("        self.o = nn.Linear(32, 32, bias=False)\n"
               "        self.w = nn.Parameter(torch.rand(32) + 0.5)\n")
    path = write_problem(_src(f"x, r):\n        h = r + self.o(x)\n        v = h.to(torch.float32)\n"
                              f"        return {norm}, h\n",
                              "[torch.randn(6, 32), torch.randn(6, 32)]", members), "resid")
    prob = load_problem(path)
    comp = compile_problem(prob, disabled={"g0"})
    kinds = [g.kind for g in comp.plan.groups]
    assert kinds == ["norm"], kinds
    (g,) = comp.plan.groups
    assert comp.plan.nops[g.members[0]].name == "add"
    _is_a_drop_in(path, comp)


@pytest.mark.parametrize("p, one_plan", [(0.0, True), (0.1, False)])
def test_a_zero_dropout_keeps_one_plan_for_both_modes(write_problem, p, one_plan):
    """Hugging Face attention calls ``dropout(w, p=0.0 if not self.training else self.p,
    training=self.training)``: fx bakes ``training`` into each mode's trace, so the train() and
    eval() references differed though a zero-probability dropout is the identity in both. The
    eval() plan then had groups of its own, and a product backed out in train() (cuBLAS + tail)
    stayed a Triton product in eval() (the Llama-3-8B layer's c2 on the H200). Now the two are
    one plan when they differ only there: the back-out holds in both modes and the file is a
    drop-in; a real dropout still gets its own eval() trace."""
    from codegen.pipeline import compile_problem

    members = f"        self.fc = nn.Linear(16, 16)\n        self.p = {p}\n"
    fwd = ("x):\n        h = self.fc(x).relu()\n"
           "        return F.dropout(h, p=0.0 if not self.training else self.p, training=self.training)\n")
    path = write_problem(_src(fwd, "[torch.randn(8, 16)]", members), f"drop{int(p * 10)}")
    plan, _rw, err = analyze(load_problem(path))
    assert plan is not None, err
    assert plan.dropin.same is one_plan
    assert list(plan.dropin.reference) == (["train"] if one_plan else ["train", "eval"])
    if not one_plan:
        return
    (prod,) = [g.id for g in plan.groups if g.kind == "matmul"]
    comp = compile_problem(load_problem(path), disabled={prod})
    assert "_egg_k_eg" not in comp.emitted.source  # eval() takes train()'s kernels: the tail
    assert f"_egg_k_{prod}t" in comp.emitted.source
    _is_a_drop_in(path, comp)


def test_a_model_with_dropout_gets_verified_kernels_in_both_modes(write_problem, tmp_path):
    """GPT-2's MLP: LayerNorm, fc, GELU, proj, dropout 0.1, the residual. In train() the file
    keeps PyTorch's dropout between its kernels; the verifier starts both models' calls from one
    seed, so they draw the same mask. Before, eager's train() differed from itself and every
    candidate was rejected (``reference``): no kernel in either mode, eval() included."""
    from codegen.pipeline import compile_problem
    from harness.verify import verify

    members = ("        self.ln = nn.LayerNorm(32)\n        self.fc = nn.Linear(32, 64)\n"
               "        self.proj = nn.Linear(64, 32)\n        self.drop = nn.Dropout(0.1)\n")
    fwd = "x):\n        return x + self.drop(self.proj(F.gelu(self.fc(self.ln(x)))))\n"
    path = write_problem(_src(fwd, "[torch.randn(4, 6, 32)]", members), "gpt2_mlp")
    comp = compile_problem(load_problem(path))
    assert comp.emitted is not None, comp.error
    assert "self.drop(" in comp.emitted.source.split("def _egg_fast_train", 1)[1].split("def ", 1)[0]
    cand = tmp_path / "cand.py"
    cand.write_text(comp.emitted.source)
    res = verify(str(path), str(cand), device="cpu", trials=2, problem_source=path.read_text())
    assert res["passed"], res["reason"]
    assert "seeded-random:train" in res["checks"] and "fp64-reference" in res["checks"]
    _is_a_drop_in(path, comp)
