"""Tuning tables (knowledge/tuning/*.yaml): validated on load, looked up by template, arch, dtype."""
import pytest

import knowledge
from knowledge.schema import ConfigSpace, dtype_key
from knowledge.templates import all_templates


def test_every_table_loads_with_sources_and_defaults_in_space():
    spaces = knowledge.config_spaces()
    assert len(spaces) >= 10
    for (template, arch, dtype), cs in spaces.items():
        assert cs.source.strip(), (template, arch, dtype)
        for name, v in cs.default.items():
            if name in cs.params:
                assert v in cs.params[name]


def test_every_template_has_a_hopper_space():
    for name in all_templates():
        cs = knowledge.config_space(name, "sm_90", "float32")
        assert cs is not None and cs.arch == "sm_90", name


def test_lookup_prefers_arch_and_dtype_then_falls_back():
    assert knowledge.config_space("pointwise", "sm_90", "bfloat16").dtype == "bf16"
    assert knowledge.config_space("pointwise", "sm_90", "torch.float32").dtype == "fp32"
    bf16, fp32 = (knowledge.config_space("pointwise", "sm_90", d) for d in ("bf16", "fp32"))
    assert max(bf16.params["BLOCK"]) == 2 * max(fp32.params["BLOCK"])  # same bytes per program
    gen = knowledge.config_space("reduction", "sm_75", "fp32")  # no table for sm_75
    assert gen is not None and gen.arch == "any"
    assert knowledge.config_space("no-such-template", "sm_90") is None


def test_schema_rejects_bad_spaces():
    ok = dict(template="t", arch="sm_90", params={"BLOCK": [256, 512]}, default={"BLOCK": 256},
              source="test")
    assert ConfigSpace(**ok).size() == 2
    with pytest.raises(ValueError, match="not in"):
        ConfigSpace(**{**ok, "default": {"BLOCK": 1024}})
    with pytest.raises(ValueError, match="unknown dtype"):
        ConfigSpace(**{**ok, "dtype": "int3"})
    with pytest.raises(ValueError, match="increasing"):
        ConfigSpace(**{**ok, "params": {"BLOCK": [512, 256]}})
    assert dtype_key("torch.bfloat16") == "bf16" and dtype_key(None) == "any"
