"""A pointwise wrapper's plan (knowledge/templates/_runtime._EGG_PLANS): what the wrapper computes
from its inputs' shapes, strides and device (domain, layout, grid, the kernel's int and constexpr
arguments, a cat's widths and offsets, a take's narrowing) is remembered, and a later call with
the same ones only allocates and launches. Every call here is checked against torch: a plan used
for a call it does not fit (another layout of the same shape, other values, an empty batch)
would read the wrong elements."""
import pytest
import torch

from codegen import pipeline
from harness.problem import load_module, load_problem
from tests.test_llm_kernels import problem


def _compiled(write_problem, tmp_path, src, name):
    prob = load_problem(write_problem(src, name))
    comp = pipeline.compile_problem(prob)
    assert comp.emitted is not None, comp.error
    assert [g.kind for g in comp.plan.groups] == ["pointwise"]
    path = tmp_path / f"cand_{name}.py"
    path.write_text(comp.emitted.source)
    mod = load_module(path, "candidate")
    launches = []
    kernel = mod._egg_k_g0
    first = mod._egg_g0_first

    class Count:  # the launches, and which path each took (planned: not through _first)
        def __getitem__(self, grid):
            return lambda *a, **k: (launches.append(grid), kernel[grid](*a, **k))

    def counted_first(*a):
        launches.append("first")
        return first(*a)

    mod._egg_k_g0 = Count()
    mod._egg_g0_first = counted_first
    torch.manual_seed(0)
    return prob.Model(), mod.ModelNew(), mod, launches


def _plans(mod):
    return {k: v for k, v in mod._EGG_PLANS.items() if k[0] == "_egg_g0"}


def _same(ref, new, *xs):
    with torch.no_grad():
        torch.testing.assert_close(new(*xs), ref(*xs), atol=1e-5, rtol=1e-5)


def test_a_call_like_an_earlier_one_takes_its_plan_and_another_layout_its_own(write_problem, tmp_path):
    src = problem("x, b", "        return torch.sigmoid(x) * 2.0 + b\n",
                  "[torch.randn(4, 6, 40), torch.randn(40)]")
    ref, new, mod, launches = _compiled(write_problem, tmp_path, src, "plan_layouts")
    b = torch.randn(40)
    _same(ref, new, torch.randn(4, 6, 40), b)
    assert launches[0] == "first" and len(_plans(mod)) == 1
    _same(ref, new, torch.randn(4, 6, 40), torch.randn(40))  # other values: the plan
    assert launches[-1] != "first" and len(launches) == 3
    # the same shape laid out otherwise: a plan of its own (the first one would walk it wrong)
    t = torch.randn(40, 6, 4).permute(2, 1, 0)
    _same(ref, new, t, b)
    assert launches[-2] == "first" and len(_plans(mod)) == 2
    _same(ref, new, t.clone().mul_(-1), b)
    assert launches[-1] != "first"
    # a broadcast operand as a stride-0 view of another shape, and one more leading dim
    _same(ref, new, torch.randn(4, 6, 40), torch.randn(1).expand(40))
    _same(ref, new, torch.randn(2, 4, 6, 40), b)
    _same(ref, new, torch.randn(2, 4, 6, 40), b)
    assert len(_plans(mod)) == 4


def test_an_empty_call_is_planned_and_a_call_that_copies_is_not(write_problem, tmp_path):
    src = problem("x, y", "        return x * y - 1.0\n",
                  "[torch.randn(2, 3, 4, 5, 6), torch.randn(2, 3, 4, 5, 6)]")
    ref, new, mod, launches = _compiled(write_problem, tmp_path, src, "plan_copies")
    for _ in range(2):  # the wrapper itself (the module routes an empty batch to torch)
        out = mod._egg_g0(torch.randn(0, 3, 4, 5, 6), torch.randn(0, 3, 4, 5, 6))
        assert out.shape == (0, 3, 4, 5, 6)
    assert launches == ["first"]  # an empty batch launches nothing, the second time too
    # strides that merge to no 4 dims: the wrapper copies, and does so at every call (a plan
    # would launch on the views it never copied)
    del launches[:]
    xs = [torch.randn(6, 5, 4, 3, 2).permute(4, 3, 2, 1, 0) for _ in range(2)]
    y = torch.randn(2, 3, 4, 5, 6)
    for x in xs:
        _same(ref, new, x, y)
    assert launches.count("first") == 2
    assert any(v is False for v in _plans(mod).values())


CASES = {
    # a cat's pieces (each narrowed to its first column in the first call)
    "cat": problem("x, y, z", "        return torch.cat((torch.tanh(x) + y, torch.sigmoid(z) * 2.0), dim=-1)\n",
                   "[torch.randn(3, 5, 6), torch.randn(3, 5, 6), torch.randn(3, 5, 4)]"),
    # a take's source (narrowed to its first row)
    "take": problem("ids, x", "        return self.emb[ids] * 2.0 + x\n",
                    "[torch.randint(0, 9, (3, 5)), torch.randn(3, 5, 4)]",
                    members="        self.emb = nn.Parameter(torch.randn(9, 4))\n"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_plan_launches_the_inputs_not_the_views_the_first_call_narrowed(name, write_problem, tmp_path):
    """A cat's pieces and a take's source are narrowed to their first column / row in the first
    call; the plan launches the inputs themselves (the same address)."""
    ref, new, mod, launches = _compiled(write_problem, tmp_path, CASES[name], f"plan_{name}")
    new.load_state_dict(ref.state_dict())
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        xs = [torch.randint(0, 9, (3, 5), generator=g) if "ids" in name or i == 0 and name == "take"
              else torch.randn(*x.shape, generator=g)
              for i, x in enumerate(load_problem(tmp_path / f"cand_plan_{name}.py").inputs())]
        _same(ref, new, *xs)
    assert launches.count("first") == 1 and len(launches) == 4


def test_the_plans_start_empty_beyond_their_size(write_problem, tmp_path, monkeypatch):
    src = problem("x", "        return x * 3.0\n", "[torch.randn(5)]")
    ref, new, mod, launches = _compiled(write_problem, tmp_path, src, "plan_bound")
    monkeypatch.setattr(mod, "_EGG_PLANS", {})
    for n in range(1, 1030):
        mod._egg_keep_plan(("other", n), False)
    _same(ref, new, torch.randn(7))
    assert len(mod._EGG_PLANS) <= 1026 and _plans(mod)


@pytest.mark.parametrize("change", ["alignment", "dtype", "device", "plan"])
def test_a_planned_launch_is_keyed_by_its_plan_and_the_tensors(change, monkeypatch):
    """_egg_Launcher.planned: the plan fixes the ints and keywords; the tensors' dtypes and
    alignments and the device are keyed at each launch."""
    from knowledge.templates import _runtime as R
    from tests.test_launch import _JIT

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    fn = _JIT()
    k = R._egg_Launcher(fn)
    x = torch.zeros(64, dtype=torch.bfloat16)
    k.planned(("g", 1), (4,), (x,), (64,), {"BLOCK": 16, "num_warps": 4})
    y = torch.ones(64, dtype=torch.bfloat16)
    k.planned(("g", 1), (4,), (y,), (64,), {"BLOCK": 16, "num_warps": 4})
    assert [e[0] for e in fn.log] == ["slow", "fast"]
    # the runner gets every parameter: the tensors, the ints, the keywords' and defaults' values
    assert fn.log[1][1] == (4, 1, 1) and fn.log[1][2] == (y, 64, 16, True, None)
    plan, t = ("g", 1), y
    if change == "alignment":
        t = x[1:]
    elif change == "dtype":
        t = x.float()
    elif change == "device":
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    else:
        plan = ("g", 2)
    k.planned(plan, (4,), (t,), (64,), {"BLOCK": 16, "num_warps": 4})
    k.planned(plan, (4,), (t,), (64,), {"BLOCK": 16, "num_warps": 4})
    # another plan of the same arguments: the launcher's own key finds the kernel
    assert [e[0] for e in fn.log[2:]] == ["fast" if change == "plan" else "slow", "fast"]
    assert len(k.plans) == 2
    # a float or tensor among the ints or keywords (passed by value at each launch) is no plan's
    del fn.log[:]
    for w in (0.5, 0.25):
        k.planned(("g", 3), (4,), (y,), (64,), {"BLOCK": 16, "W": w})
    assert [e[0] for e in fn.log] == ["slow", "fast"] and fn.log[1][2][4] == 0.25
    # the interpreter's kernels are no launchers: launched as kernel[grid](...)
    fn2 = _JIT()
    R._egg_launch_planned(fn2, ("g", 1), (4,), (x,), (64,), {"BLOCK": 16})
    assert fn2.log[0][:3] == ("slow", (4,), (x, 64))
