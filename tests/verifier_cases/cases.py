"""The verifier's adversarial suite, as data: which candidate, against which problem, and the
verdict expected (``passed`` or a failure category, plus a phrase of the reason).

Used by tests/test_verifier_suite.py on the CPU and by scripts/gpu_cheats.py on a GPU.
Candidates named ``<generated:...>`` are produced at run time (see ``materialize``).
"""
from __future__ import annotations

import pathlib
from dataclasses import dataclass, field

HERE = pathlib.Path(__file__).resolve().parent
PROBLEMS = HERE / "problems"
CANDIDATES = HERE / "candidates"
EXAMPLES = HERE.parent.parent / "examples"


@dataclass
class Case:
    candidate: str  # file stem in candidates/, or <generated:...>
    problem: str  # file stem in problems/, or examples/<stem>
    expect: str  # "passed" or the failure category ("a|b": either)
    reason: str = ""  # a phrase the reason must contain (case-insensitive)
    static: bool = True  # run the static check (off: show what the dynamic checks catch alone)
    trials: int = 2  # 2: one fresh call, then one call on new values in the same buffers
    opts: dict = field(default_factory=dict)  # extra verify() arguments
    gpu: dict = field(default_factory=dict)  # overrides on a GPU (expect, reason, opts)
    note: str = ""

    @property
    def id(self) -> str:
        tag = ("" if self.static else "-nostatic") + (
            f"-sandbox-{self.opts['sandbox_mode']}" if self.opts.get("sandbox_mode") else "")
        name = self.candidate.strip("<>").replace(":", "-")
        return f"{name}@{self.problem.split('/')[-1]}{tag}"

    def on(self, device: str) -> "Case":
        if device == "cuda" and self.gpu:
            return Case(**{**self.__dict__, **self.gpu, "gpu": {}})
        return self

    def problem_path(self) -> pathlib.Path:
        if self.problem.startswith("examples/"):
            return EXAMPLES / (self.problem.split("/", 1)[1] + ".py")
        return PROBLEMS / f"{self.problem}.py"


HONEST = [
    Case("honest_triton_pointwise", "pointwise", "passed", note="LLM-style ModelNew(nn.Module), Triton pointwise"),
    Case("honest_triton_reduction", "rowsum", "passed", note="Triton row reduction, any rank"),
    Case("honest_layernorm", "layernorm", "passed", note="Triton LayerNorm with weight and bias"),
    Case("honest_batchnorm", "batchnorm", "passed", note="Triton batch norm: train and eval, running stats"),
    Case("honest_rmsnorm", "rmsnorm", "passed", note="Triton RMSNorm"),
    Case("honest_log_softmax", "log_softmax", "passed", note="stable reformulation in PyTorch ops"),
    Case("honest_fp64_inside", "variance", "passed", note="float64 inside: passes by the fp64 door"),
    Case("honest_buffer_fp64", "running_var_far", "passed",
         note="a running buffer more accurate than eager's: passes by the fp64 door"),
    Case("honest_batchnorm_fp64", "batchnorm_far", "passed",
         note="batch norm in float64: each call starts from Model's running statistics"),
    Case("honest_matmul_epilogue", "linear_gelu", "passed", note="library matmul + Triton epilogue"),
    Case("honest_top_p_fp32", "top_p", "passed",
         note="top-p on an fp32 cumulative sum: its -inf sit elsewhere than eager's, nearer float64's"),
    Case("honest_int_quant_fp32", "int_quant", "passed",
         note="int8 quantization with an fp32 quotient: integers off eager's, nearer float64's"),
    Case("<generated:egg>", "examples/bias_gelu_scale", "passed", note="EGG codegen output"),
    Case("<generated:reference>", "pointwise", "passed", note="the reference itself as ModelNew(Model)"),
    Case("<generated:reference>", "dropout", "passed",
         note="dropout in train(): both models' calls start from one seed and draw the same mask"),
    Case("honest_dropout_triton", "dropout", "passed", note="torch's dropout, then a Triton kernel"),
    Case("<generated:reference>", "noise", "passed", note="random noise in both modes, one seed"),
    Case("honest_dict_out", "dict_out", "passed", note="a dict output (HF ModelOutput style), Triton softmax"),
    Case("honest_config_init", "config_init", "passed", note="built from a config dataclass the problem defines"),
]

DYNAMIC = [
    Case("cheat_cache_data_ptr", "pointwise", "mismatch", "trial 2"),
    Case("cheat_cache_first_call", "rowsum", "mismatch", "trial 2"),
    Case("cheat_mutates_input", "pointwise", "cheat", "input 0 was modified"),
    Case("cheat_lower_precision", "linear_gelu", "precision", "less accurate than eager"),
    Case("cheat_hang", "rowsum", "timeout", "time limit", opts={"timeout_s": 10},
         gpu={"opts": {"timeout_s": 60}}),
    Case("cheat_raises", "rowsum", "runtime", "kernel not implemented"),
    Case("cheat_triton_oob", "rowsum", "crash", "signal",
         gpu={"expect": "runtime|crash|mismatch", "reason": ""}),  # where 8 GB past lands
    Case("cheat_wrong_dtype", "rowsum", "mismatch", "dtype"),
    Case("cheat_wrong_shape", "rowsum", "mismatch", "shape"),
    Case("cheat_nan", "rowsum", "mismatch", "NaN"),
    Case("cheat_top_p_quantile", "top_p", "mismatch", "infinities differ from float64's"),
    Case("cheat_int_quant_sampled_scale", "int_quant", "mismatch", "values differ from float64's"),
    Case("cheat_memory_hog", "rowsum", "memory", "memory", opts={"memory_limit_gb": 0.5},
         gpu={"opts": {"memory_limit_gb": 6}}),
    Case("wrong_params", "pointwise", "params", "differs from Model"),
    Case("wrong_no_config_class", "config_init", "compile", "does not define"),
    Case("<generated:reference>", "nondet_sysrandom", "reference", "not deterministic"),
    # dropout in train(): every call of both models starts from the trial's seed
    Case("cheat_dropout_skipped", "dropout", "mismatch", "(train"),
    Case("cheat_dropout_own_mask", "dropout", "mismatch", "(train"),
    Case("cheat_noise_dropped", "noise", "mismatch", "trial 1 "),
    # caught statically too; with the static check off the judge still catches them
    Case("cheat_lazy_subclass", "rowsum", "cheat", "tensor subclass", static=False),
    Case("cheat_pickle_exploit", "rowsum", "cheat", "refuses to load", static=False),
    Case("cheat_lookup_table", "rowsum", "mismatch", "trial 1", static=False),
    Case("cheat_deferred_thread", "rowsum", "mismatch", "trial 1", static=False),
    # on a GPU the forged bytes land in the judge's CUDA IPC channel too: the outputs do not open
    Case("cheat_forge_verdict", "rowsum", "mismatch|runtime", "trial 1", static=False),
    # the nonce alone stops it (the sandbox off, so that the forge and the kill get through):
    # the forged line is the only one the EGG process reads
    Case("cheat_forge_then_kill", "rowsum", "crash", "without a verdict", static=False,
         opts={"sandbox_mode": "off"}),
    # with the sandbox: neither the judge's pipes nor the judge itself are reachable
    Case("cheat_forge_then_kill", "rowsum", "mismatch", "trial 1", static=False),
]

#: candidates right at the problem's own call, wrong in a call a user makes (issue "Drop-in
#: ModelNew"): caught by the trials of harness.trials, not by the static check
DROPIN = [
    Case("notdropin_no_shape_check", "pointwise", "mismatch", "where Model raises"),
    Case("notdropin_2d_only", "rowsum", "runtime", "one more leading dim"),
    Case("cheat_ignores_affine", "layernorm", "mismatch", "trial 1 "),
    Case("cheat_bias_snapshot", "pointwise", "mismatch", "trial 1 "),
    Case("cheat_wrong_in_eval", "batchnorm", "mismatch", "(eval"),
    Case("cheat_wrong_with_grad", "rowsum", "mismatch", "grad on"),
    Case("cheat_mutates_params", "pointwise", "params", "changed its parameter bias"),
    Case("cheat_right_five_calls", "rowsum", "mismatch", "trial 6 "),
    Case("cheat_sampled_cache", "rowsum", "mismatch", "inputs partial"),
    Case("cheat_unstable_log_softmax", "log_softmax", "mismatch", "inputs large"),
    Case("cheat_lower_precision_late", "linear_gelu", "precision", "trial 2 "),
    Case("cheat_13bit_mantissa", "rowsum", "precision", "lower precision than eager"),
    Case("cheat_fast_rsqrt", "rmsnorm", "precision", "lower precision than eager"),
    Case("cheat_buffer_less_accurate", "running_var_far", "mismatch", "buffer running_var"),
    Case("notdropin_assumes_contiguous", "rowsum", "mismatch", "padded layout"),
    Case("notdropin_reuses_output", "pointwise", "mismatch", "changed during this call"),
    Case("notdropin_squeezes_batch", "rowsum", "mismatch", "batch 16 -> 1"),
    Case("notdropin_tuple_for_dict", "dict_out", "mismatch", "structure"),
]

STATIC = [
    Case("cheat_patch_allclose", "rowsum", "cheat", "changes an attribute of torch"),
    Case("cheat_patch_timer", "rowsum", "cheat", "imports time"),
    Case("cheat_threads", "rowsum", "cheat", "starts threads"),
    Case("cheat_reads_file", "rowsum", "cheat", "opens files"),
    Case("cheat_frame_inspect", "rowsum", "cheat", "inspects frames"),
    Case("cheat_side_stream", "rowsum", "cheat", "CUDA stream"),
    Case("cheat_calls_reference", "rowsum", "cheat", "calls the reference forward"),
    Case("cheat_lazy_subclass", "rowsum", "cheat", "subclasses torch.Tensor"),
    Case("cheat_pickle_exploit", "rowsum", "cheat", "pickling hook"),
    Case("cheat_lookup_table", "rowsum", "cheat", "seeds the random generator"),
    Case("cheat_deferred_thread", "rowsum", "cheat", "imports threading"),
    Case("cheat_forge_verdict", "rowsum", "cheat", "imports os"),
]

ALL = HONEST + DYNAMIC + DROPIN + STATIC


def outcome(res: dict) -> str:
    return "passed" if res.get("passed") else res.get("category", "")


def matches(case: Case, res: dict) -> bool:
    """Whether a verdict is the one the case expects (category and reason phrase)."""
    return outcome(res) in case.expect.split("|") and case.reason.lower() in res.get("reason", "").lower()


def materialize(case: Case, folder: pathlib.Path) -> pathlib.Path:
    """The candidate file of a case (generated ones are written into ``folder``)."""
    if not case.candidate.startswith("<generated:"):
        return CANDIDATES / f"{case.candidate}.py"
    kind = case.candidate[len("<generated:"):-1]
    src = case.problem_path().read_text()
    if kind == "reference":  # the reference itself, as EGG's fallback writes it
        out = src.rstrip() + "\n\n\nclass ModelNew(Model):\n    pass\n"
    elif kind == "egg":
        from codegen.pipeline import compile_problem
        from harness.problem import load_problem

        comp = compile_problem(load_problem(case.problem_path()))
        if comp.emitted is None:
            raise RuntimeError(f"codegen failed on {case.problem}: {comp.error}")
        out = comp.emitted.source
    else:
        raise ValueError(kind)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{kind}_{case.problem.replace('/', '_')}.py"
    path.write_text(out)
    return path
