"""Test helpers: build a problem's Model and a generated ModelNew with the same seed and compare."""
from __future__ import annotations

import importlib.util
import pathlib

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent


def load_script(relpath: str):
    """A script of the repository (not a package module) imported by path, e.g.
    ``load_script("scripts/merge_runs.py")``."""
    path = ROOT / relpath
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod

from codegen.pipeline import compile_problem
from harness.problem import load_module, load_problem


def fast_forward(source: str) -> str:
    """The kernel path of a generated ModelNew (``_egg_fast`` or ``_egg_fast_train``): the fx
    code calling the wrappers, without the dispatch, the traced reference or the runtime."""
    start = source.index("    def _egg_fast")
    end = source.find("\n    def ", start + 1)
    return source[start:end if end > 0 else None]


def outputs(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


class _Launches:
    """Stands in for a generated kernel (``kernel[grid](...)``) and records that it launched."""

    def __init__(self, kernel, name: str, seen: set):
        self.kernel, self.name, self.seen = kernel, name, seen

    def __getitem__(self, grid):
        self.seen.add(self.name)
        return self.kernel[grid]


def generated_matches(problem_path, tmp_path, seeds=(0, 1), atol=1e-4, rtol=1e-4, configs=None,
                      launched=()):
    """Compile a problem with EGG's codegen, then compare ModelNew with Model in-process.
    ``launched``: kernel names of the generated module that must run (a mapping a config forces).

    Returns the Compiled result (so tests can assert on the groups/kernels it made)."""
    prob = load_problem(problem_path)
    comp = compile_problem(prob, configs=configs)
    assert comp.emitted is not None, comp.error
    path = tmp_path / f"cand_{problem_path.stem}.py"
    path.write_text(comp.emitted.source)
    mod = load_module(path, "candidate")
    seen: set = set()
    for name in launched:
        setattr(mod, name, _Launches(getattr(mod, name), name, seen))
    init = prob.init_inputs()
    for seed in seeds:
        torch.manual_seed(1000 + seed)
        ref_model = prob.Model(*init)
        torch.manual_seed(1000 + seed)
        new_model = mod.ModelNew(*init)
        torch.manual_seed(seed)
        inputs = prob.inputs()
        with torch.no_grad():
            ref = outputs(ref_model(*inputs))
            got = outputs(new_model(*inputs))
        assert len(ref) == len(got)
        for r, g in zip(ref, got):
            assert g.shape == r.shape and g.dtype == r.dtype, (g.shape, r.shape, g.dtype, r.dtype)
            if r.dtype.is_floating_point:
                torch.testing.assert_close(g, r, atol=atol, rtol=rtol, equal_nan=True)  # NaN where eager has it
            else:
                assert torch.equal(g, r)
    assert seen == set(launched), f"kernels that did not run: {set(launched) - seen}"
    return comp
