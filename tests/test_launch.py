"""knowledge/templates/_runtime._egg_Launcher: the launch path of a generated file's kernels.

Triton's JITFunction.run binds and specializes every argument on every launch; the launcher
keeps, per argument signature, the CompiledKernel Triton returned and launches it directly. On
the CPU (the interpreter) kernels are not wrapped, so these tests drive the launcher with
stand-ins for a JITFunction and a CompiledKernel that record which path each launch took."""
import inspect

import pytest
import torch

from knowledge.templates import _runtime as R


class _Param:
    def __init__(self, name, default=inspect.Parameter.empty, constexpr=False):
        self.name, self.default, self.is_constexpr = name, default, constexpr
        self.has_default = default is not inspect.Parameter.empty


class _Compiled:
    """A CompiledKernel: compiled[grid] is a runner of all the kernel's parameters."""
    packed_metadata = function = object()

    def __init__(self, log):
        self.log = log

    def __getitem__(self, grid):  # the verifier counts launches here (candidate_proc)
        return lambda *args: self.log.append(("fast", grid, args))


class _JIT:
    """A JITFunction with parameters (P, N, BLOCK: constexpr, EVEN: constexpr = True, W = None)."""

    def __init__(self, returns=True):
        self.log = []
        self.params = [_Param("P"), _Param("N"), _Param("BLOCK", constexpr=True),
                       _Param("EVEN", True, constexpr=True), _Param("W", None)]
        self.returns = returns
        self.__name__ = "_egg_k_g0"
        self.pre_run_hooks = []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.log.append(("slow", grid, args, kwargs))
            return _Compiled(self.log) if self.returns else None
        return run


@pytest.fixture
def device0(monkeypatch):
    """The launcher's key holds the current CUDA device (a compiled kernel is one device's)."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def test_a_signature_seen_before_launches_the_compiled_kernel_directly(device0):
    fn = _JIT()
    k = R._egg_Launcher(fn)
    x = torch.zeros(64, dtype=torch.bfloat16)
    k[(4,)](x, 64, BLOCK=16, num_warps=4)
    k[(4,)](x, 64, BLOCK=16, num_warps=4)
    y = torch.ones(64, dtype=torch.bfloat16)  # other tensor, same dtype and alignment
    k[(4,)](y, 64, BLOCK=16, num_warps=4)
    assert [e[0] for e in fn.log] == ["slow", "fast", "fast"]
    # the runner gets the grid as three dims and every parameter: positional, then the keywords'
    # and the defaults' values in the kernel's order (options such as num_warps are not parameters)
    assert fn.log[1][1] == (4, 1, 1) and fn.log[1][2] == (x, 64, 16, True, None)
    assert fn.log[2][2][0] is y
    k[(4,)](y, 64, BLOCK=16, num_warps=4, EVEN=False)  # a keyword: another signature
    k[(4,)](y, 64, BLOCK=16, num_warps=4, EVEN=False)
    assert [e[0] for e in fn.log[3:]] == ["slow", "fast"] and fn.log[4][2][3] is False


def test_floats_bools_and_tensors_that_are_not_constexprs_are_passed_at_each_launch(device0):
    """Triton never specializes a float or bool argument on its value: a new value launches the
    same compiled kernel, with that value; a tensor (positional or keyword: a workspace made in
    each call) is keyed by dtype and alignment and passed as it is. A constexpr is keyed by its
    value, positional or keyword, float or not."""
    fn = _JIT()
    k = R._egg_Launcher(fn)
    x = torch.zeros(8)
    k[(1,)](x, 0.5, BLOCK=8)
    k[(1,)](x, 0.25, BLOCK=8)
    k[(1,)](x, True, BLOCK=8)
    k[(1,)](x, False, BLOCK=8)
    assert [e[0] for e in fn.log] == ["slow", "fast", "slow", "fast"]
    assert fn.log[1][2][:2] == (x, 0.25) and fn.log[3][2][1] is False
    del fn.log[:]
    w1, w2 = torch.zeros(4), torch.ones(4)
    k[(1,)](x, 1, BLOCK=8, W=w1)
    k[(1,)](x, 1, BLOCK=8, W=w2)
    assert [e[0] for e in fn.log] == ["slow", "fast"] and fn.log[1][2][4] is w2
    del fn.log[:]
    k[(1,)](x, 1, 0.5)  # BLOCK, a constexpr, given positionally
    k[(1,)](x, 1, 0.25)
    k[(1,)](x, 1, BLOCK=0.5)
    k[(1,)](x, 1, BLOCK=0.75)
    assert [e[0] for e in fn.log] == ["slow", "slow", "slow", "slow"]
    k[(1,)](x, 1, BLOCK=0.75)
    assert fn.log[-1][0] == "fast" and fn.log[-1][2][2] == 0.75


@pytest.mark.parametrize("change", ["int", "alignment", "dtype", "keyword", "grid", "device"])
def test_what_triton_specializes_on_takes_its_path_again(change, device0, monkeypatch):
    fn = _JIT()
    k = R._egg_Launcher(fn)
    x = torch.zeros(64, dtype=torch.bfloat16)
    k[(4,)](x, 64, BLOCK=16)
    args, kw, grid = [x, 64], {"BLOCK": 16}, (4,)
    if change == "int":
        args[1] = 65  # 64 is a multiple of 16, 65 is not: another specialization
    elif change == "alignment":
        args[0] = x[1:]  # 2 bytes off a 16-byte boundary
    elif change == "dtype":
        args[0] = x.float()
    elif change == "keyword":
        kw["BLOCK"] = 32
    elif change == "grid":
        grid = (8,)
    else:
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    k[grid](*args, **kw)
    k[grid](*args, **kw)
    assert [e[0] for e in fn.log] == ["slow", "slow", "fast"]


def test_launches_the_key_cannot_hold_always_take_triton_s_path(device0, monkeypatch):
    from triton import knobs

    x = torch.zeros(8)
    cases = {
        "callable grid": (_JIT(), lambda k: k[lambda meta: (1,)](x, 8, BLOCK=8)),
        "an argument of another kind": (_JIT(), lambda k: k[(1,)](x, [8], BLOCK=8)),
        "no CompiledKernel returned (a recorder, the interpreter)":
            (_JIT(returns=False), lambda k: k[(1,)](x, 8, BLOCK=8)),
        "a parameter with neither keyword nor default": (_JIT(), lambda k: k[(1,)](x, 8)),
    }
    for what, (fn, call) in cases.items():
        k = R._egg_Launcher(fn)
        call(k)
        call(k)
        assert [e[0] for e in fn.log] == ["slow", "slow"], what
    fn = _JIT()
    fn.pre_run_hooks = [lambda *a, **k: None]
    k = R._egg_Launcher(fn)
    k[(1,)](x, 8, BLOCK=8)
    k[(1,)](x, 8, BLOCK=8)
    assert [e[0] for e in fn.log] == ["slow", "slow"], "pre-run hooks"
    monkeypatch.setattr(knobs.runtime, "add_stages_inspection_hook", lambda: ("k", "h"))
    fn = _JIT()
    k = R._egg_Launcher(fn)
    k[(1,)](x, 8, BLOCK=8)
    k[(1,)](x, 8, BLOCK=8)
    assert [e[0] for e in fn.log] == ["slow", "slow"], "a stage-inspection hook (part of Triton's key)"


def test_without_cuda_every_launch_takes_triton_s_path():
    """On a machine without CUDA (the compile check's recorder on the CPU) the key fails: no
    launch is remembered."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine")
    fn = _JIT()
    k = R._egg_Launcher(fn)
    for _ in range(2):
        k[(1,)](torch.zeros(8), 8, BLOCK=8)
    assert [e[0] for e in fn.log] == ["slow", "slow"]


def test_the_cache_starts_empty_beyond_its_size(device0, monkeypatch):
    monkeypatch.setattr(R, "_EGG_LAUNCH_KEEP", 3)
    fn = _JIT()
    k = R._egg_Launcher(fn)
    x = torch.zeros(8)
    for n in (1, 2, 3, 4):
        k[(1,)](x, n, BLOCK=8)
    assert len(k.cache) == 1
    k[(1,)](x, 4, BLOCK=8)
    assert fn.log[-1][0] == "fast"


def test_a_generated_file_puts_its_launched_kernels_behind_launchers(write_problem, tmp_path):
    """The emitted file ends by wrapping the kernels its wrappers launch (not the jit helpers
    its kernels call); in Triton's interpreter they stay interpreted functions."""
    from codegen import pipeline
    from codegen.emit import launched_kernels
    from harness.problem import load_module, load_problem

    src = ("import torch, torch.nn as nn\nclass Model(nn.Module):\n    def forward(self, x, c):\n"
           "        h = x.shape[-1] // 2\n        return x * c + torch.cat((-x[..., h:], x[..., :h]), dim=-1)\n"
           "def get_inputs():\n    return [torch.randn(3, 5, 16), torch.randn(5, 16)]\n"
           "def get_init_inputs():\n    return []\n")
    comp = pipeline.compile_problem(load_problem(write_problem(src, "launch")))
    gen = comp.emitted.source
    assert gen.rstrip().endswith("_egg_k_g0 = _egg_launcher(_egg_k_g0)")
    from harness.static_check import check_source

    assert check_source(gen) == []  # the verifier's anti-cheat filter passes the launcher
    assert launched_kernels(["@triton.jit\ndef _egg_k_g0(P):\n    _egg_k_helper(P)\n"],
                            ["    _egg_k_g0[grid](x)\n    _egg_k_helper[grid](x)\n"]) == ["_egg_k_g0"]
    path = tmp_path / "cand_launch.py"
    path.write_text(gen)
    mod = load_module(path, "cand_launch")
    assert not isinstance(mod._egg_k_g0, R._egg_Launcher)  # the interpreter: as it was
    m = mod.ModelNew()
    x, c = torch.randn(3, 5, 16), torch.randn(5, 16)
    with torch.no_grad():
        torch.testing.assert_close(m(x, c), mod.Model()(x, c))


def test_the_verifier_counts_a_compiled_kernel_s_runner_as_a_launch():
    """harness.candidate_proc.count_triton_launches counts JITFunction.run and also
    CompiledKernel.__getitem__ (the launcher's path after a kernel's first launch), so a
    verified call that launched its kernels directly is not taken for one that launched none.
    Run in a child process: the counter patches Triton's classes for the whole process."""
    import subprocess
    import sys

    code = (
        "from harness.candidate_proc import count_triton_launches\n"
        "c = count_triton_launches()\n"
        "from triton.compiler.compiler import CompiledKernel\n"
        "class K:\n"
        "    def _init_handles(self):\n"
        "        pass\n"
        "runner = CompiledKernel.__getitem__(K(), (1, 1, 1))\n"
        "assert callable(runner)\n"
        "print(c['n'])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "1"
