"""Weight-only int8 linears (gpt-fast's WeightOnlyInt8Linear, torchao's int8 weight-only):
``F.linear(x, w.to(x.dtype)) * scales`` with an int8 weight is one matmul kernel that loads the
int8 tiles and converts them in registers (rw-dequant-linear), the scales in its epilogue: no
16-bit copy of the weight is written per call. Each file is a drop-in and passes the verifier's
static check; spellings the rule does not cover keep the cast in PyTorch."""
import pytest
import torch

from codegen.pipeline import analyze, compile_problem
from harness.problem import load_problem
from harness.verify import static_findings_src
from tests.dropin import check_dropin, load_sources, own_call_launches

HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"

INT8_LINEAR = '''
class Model(nn.Module):
    def __init__(self, in_features=64, out_features=96):
        super().__init__()
        self.register_buffer("weight", torch.randint({lo}, 127, (out_features, in_features), dtype=torch.{wdt}))
        self.register_buffer("scales", torch.rand(out_features, dtype=torch.bfloat16) * 0.01 + 0.001)
{extra_init}
    def forward(self, input):
        return {expr}
def get_inputs():
    return [torch.randn(2, 3, 64, dtype=torch.bfloat16)]
def get_init_inputs():
    return []
'''

CASES = {
    "gpt_fast": dict(wdt="int8", lo=-128, extra_init="", expr="F.linear(input, self.weight.to(dtype=input.dtype)) * self.scales"),
    "bias": dict(wdt="int8", lo=-128, extra_init="        self.bias = nn.Parameter(torch.randn(96, dtype=torch.bfloat16))",
                 expr="F.linear(input, self.weight.to(input.dtype), self.bias) * self.scales"),
    # the scales on the weight's rows before the product: the integer product, then the scales
    "row_scaled_weight_bias": dict(wdt="int8", lo=-128,
                                   extra_init="        self.bias = nn.Parameter(torch.randn(96, dtype=torch.bfloat16))",
                                   expr="F.linear(input, self.weight.to(input.dtype) * self.scales[:, None], self.bias)"),
    "row_scaled_weight_unsqueeze": dict(wdt="int8", lo=-128, extra_init="",
                                        expr="F.linear(input, self.scales.unsqueeze(-1) * self.weight.to(input.dtype))"),
    "uint8_bf16_method": dict(wdt="uint8", lo=0, extra_init="", expr="F.linear(input, self.weight.bfloat16()) * self.scales"),
}


def _src(case):
    return HEAD + INT8_LINEAR.format(**CASES[case])


@pytest.mark.parametrize("case", sorted(CASES))
def test_int8_weight_linear_is_one_kernel_reading_int8(case, write_problem):
    src = _src(case)
    path = write_problem(src, case)
    plan, applied, err = analyze(load_problem(path))
    assert plan is not None, err
    assert "rw-dequant-linear" in applied
    assert [g.kind for g in plan.groups] == ["matmul"]
    assert not [op for op in plan.nops.values() if op.kind == "library" and op.name == "cast"]
    comp = compile_problem(load_problem(path))
    emitted = comp.emitted.source
    assert static_findings_src(emitted, src) == []
    box = own_call_launches(*load_sources(src, emitted))
    want = torch.uint8 if "uint8" in case else torch.int8
    assert box and want in [t.dtype for t in box[0]]  # the kernel read the integer weight itself
    report = check_dropin(src, emitted, calls=1, atol=2e-2, rtol=2e-2)
    assert report.fast("own") and report.fast("own", "eval")


NEAR = {
    "the 16-bit weight read elsewhere too": ("F.linear(input, w) * self.scales + w.sum()", "w = self.weight.to(input.dtype)"),
    "an fp32 product of an int8 weight": ("F.linear(input.float(), self.weight.float())", ""),
    "scales per input column (not per output channel)": (
        "F.linear(input, self.weight.to(input.dtype) * self.scales[None, :64])", ""),
    "an int32 weight": ("F.linear(input, self.weight.to(torch.int32).to(input.dtype)) * self.scales", ""),
}


@pytest.mark.parametrize("why", sorted(NEAR))
def test_casts_the_rule_does_not_cover_stay_in_pytorch(why, write_problem):
    expr, pre = NEAR[why]
    src = HEAD + INT8_LINEAR.format(wdt="int8", lo=-128, extra_init="", expr=expr)
    if pre:
        src = src.replace("        return ", f"        {pre}\n        return ")
    plan, applied, err = analyze(load_problem(write_problem(src, "near")))
    assert plan is not None, err
    assert "rw-dequant-linear" not in applied, why
