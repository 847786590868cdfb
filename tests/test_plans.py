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
    """_egg_Launcher.planned: the plan fixes the grid, the ints and the constexprs; the tensors'
    dtypes and alignments and the device are keyed at each launch; keywords (a float, a tensor)
    are read at each launch."""
    from knowledge.templates import _runtime as R
    from tests.test_launch import _JIT

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    fn = _JIT()
    k = R._egg_Launcher(fn)
    x = torch.zeros(64, dtype=torch.bfloat16)
    k.planned(("g", 1), (4,), (x, 64), {"BLOCK": 16, "num_warps": 4}, (x,))
    y = torch.ones(64, dtype=torch.bfloat16)
    k.planned(("g", 1), (4,), (y, 64), {"BLOCK": 16, "num_warps": 4}, (y,))
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
    k.planned(plan, (4,), (t, 64), {"BLOCK": 16, "num_warps": 4}, (t,))
    k.planned(plan, (4,), (t, 64), {"BLOCK": 16, "num_warps": 4}, (t,))
    # another plan of the same arguments: the launcher's own key finds the kernel
    assert [e[0] for e in fn.log[2:]] == ["fast" if change == "plan" else "slow", "fast"]
    assert len(k.plans) == 2
    # a keyword tensor is among the tensors keyed (its dtype), and read at each launch, as a float
    del fn.log[:]
    w16, w32 = torch.zeros(8, dtype=torch.bfloat16), torch.zeros(8)
    ws = (w16, w16.clone(), w32, 0.25, 0.5)
    for w in ws:
        tw = (y, w) if isinstance(w, torch.Tensor) else (y,)
        k.planned(("g", 3), (4,), (y, 64), {"BLOCK": 16, "W": w}, tw)
    assert [e[0] for e in fn.log] == ["slow", "fast", "slow", "slow", "fast"]
    assert fn.log[1][2][4] is ws[1] and fn.log[4][2][4] == 0.5
    # the interpreter's kernels are no launchers: launched as kernel[grid](...)
    fn2 = _JIT()
    R._egg_launch_planned(fn2, ("g", 1), (4,), (x, 64), {"BLOCK": 16}, (x,))
    assert fn2.log[0][:3] == ("slow", (4,), (x, 64))


# ---- recorded wrappers (_egg_Rec, _egg_replay): reductions, softmax, scans, norms record their
# first call of a layout (allocations, launches and which tensor each launch took) and replay it

def _recorded(write_problem, tmp_path, src, name, kinds):
    """The candidate's module with each group's first-call path counted (``firsts``: group ids)."""
    prob = load_problem(write_problem(src, name))
    comp = pipeline.compile_problem(prob)
    assert comp.emitted is not None, comp.error
    assert [g.kind for g in comp.plan.groups] == kinds
    path = tmp_path / f"cand_{name}.py"
    path.write_text(comp.emitted.source)
    mod = load_module(path, "candidate")
    firsts = []
    for g in comp.plan.groups:
        first = getattr(mod, f"_egg_{g.id}_first")
        setattr(mod, f"_egg_{g.id}_first", lambda *a, _f=first, _g=g.id: (firsts.append(_g), _f(*a))[1])
    torch.manual_seed(0)
    return prob.Model(), mod.ModelNew(), mod, firsts


def _same_exact(ref, new, *xs):
    with torch.no_grad():
        got, want = new(*xs), ref(*xs)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4, equal_nan=True)


def test_a_split_reduction_replays_its_workspaces_and_a_view_at_the_new_offset(write_problem, tmp_path):
    """Few long rows: the sum and the argmax split over chunks (workspaces of two dtypes); the
    epilogue's per-row operand is a view (expanded, unsqueezed) made again from the new argument
    at its own storage offset: a plan that kept the first call's offset reads another row."""
    src = problem("x, b", "        return x.sum(-1) * b, torch.argmax(x * 2.0, dim=-1)\n",
                  "[torch.randn(3, 70000), torch.randn(3)]")
    ref, new, mod, firsts = _recorded(write_problem, tmp_path, src, "rec_split", ["reduction", "reduction"])
    x, b = torch.randn(3, 70000), torch.randn(3)
    _same_exact(ref, new, x, b)
    assert sorted(firsts) == ["g0", "g1"]
    for k in range(3):  # other values, then b and x read at other offsets of larger buffers
        big = torch.randn(9, 70000)
        bb = torch.randn(9)
        _same_exact(ref, new, big[k + 1:k + 4], bb[2 * k + 1:2 * k + 4])
    assert sorted(firsts) == ["g0", "g1"]  # replayed: the plans fit
    plans = [v for k, v in mod._EGG_PLANS.items() if k[0] in ("_egg_g0", "_egg_g1")]
    assert len(plans) == 2 and all(plans)
    assert sorted(len(p[0]) for p in plans) == [2, 3]  # the outputs and the split's workspaces


def test_a_softmax_whose_input_is_copied_is_never_replayed(write_problem, tmp_path):
    """A permuted input of the same shape is another plan (the key holds strides); one whose
    strides do not collapse is copied by the wrapper, so it is planned never: a replay would
    launch the copy's memory from the first call, or none."""
    src = problem("x", "        return torch.softmax(x * 0.5, dim=-1)\n", "[torch.randn(2, 3, 4, 5, 6)]")
    ref, new, mod, firsts = _recorded(write_problem, tmp_path, src, "rec_copy", ["softmax"])
    _same_exact(ref, new, torch.randn(2, 3, 4, 5, 6))
    _same_exact(ref, new, torch.randn(2, 3, 4, 5, 6))
    assert firsts == ["g0"]
    for _ in range(2):  # the first two dims swapped (the outer dims still three strides): its own plan
        _same_exact(ref, new, torch.randn(3, 2, 4, 5, 6).transpose(0, 1))
    assert firsts == ["g0"] * 2
    for _ in range(2):  # every dim reversed: four outer dims no three strides hold, copied
        _same_exact(ref, new, torch.randn(6, 5, 4, 3, 2).permute(4, 3, 2, 1, 0))
    assert firsts == ["g0"] * 4
    assert False in [v for k, v in mod._EGG_PLANS.items() if k[0] == "_egg_g0"]


def test_an_argument_passed_twice_is_planned_never_and_replays_serve_it(write_problem, tmp_path):
    """The same tensor as both arguments cannot say which argument a launch took: no plan for
    that call's key; a plan recorded with two tensors replays correctly when one is passed twice."""
    src = problem("x, y", "        return (x * y).sum(-1)\n", "[torch.randn(4, 9), torch.randn(4, 9)]")
    ref, new, mod, firsts = _recorded(write_problem, tmp_path, src, "rec_alias", ["reduction"])
    x, y = torch.randn(4, 9), torch.randn(4, 9)
    _same_exact(ref, new, x, x)
    _same_exact(ref, new, x, y)  # no plan for this key: the whole wrapper again, right
    assert firsts == ["g0", "g0"]
    ref2, new2, mod2, firsts2 = _recorded(write_problem, tmp_path, src, "rec_alias2", ["reduction"])
    mod2._EGG_PLANS.clear()
    _same_exact(ref2, new2, x, y)
    _same_exact(ref2, new2, y, y)
    _same_exact(ref2, new2, y, x)
    assert firsts2 == ["g0"]


@pytest.mark.parametrize("body,kinds", [
    ("        return F.rms_norm(x, (x.shape[-1],), self.w, 1e-6)\n", ["norm"]),
    ("        return torch.cumsum(x * 2.0, dim=-1)\n", ["scan"]),
])
def test_norms_and_scans_replay(body, kinds, write_problem, tmp_path):
    src = problem("x", body, "[torch.randn(3, 4, 48)]", members="        self.w = nn.Parameter(torch.randn(48))\n")
    ref, new, mod, firsts = _recorded(write_problem, tmp_path, src, f"rec_{kinds[0]}", kinds)
    new.load_state_dict(ref.state_dict())
    for shape in ((3, 4, 48), (3, 4, 48), (2, 3, 4, 48), (2, 3, 4, 48), (5, 4, 48)):
        _same_exact(ref, new, torch.randn(*shape))
    assert firsts == ["g0"] * 3  # one per layout


def test_an_output_returned_as_a_view_of_its_allocation_is_replayed_as_that_view(write_problem, tmp_path):
    """Attention on 3-d operands: the kernel writes a (B, 1, M, D) allocation and the wrapper
    returns it squeezed; a replay returns the same view of its own allocation."""
    src = problem("q, k, v", "        return F.scaled_dot_product_attention(q, k, v)\n",
                  "[torch.randn(3, 20, 16), torch.randn(3, 24, 16), torch.randn(3, 24, 16)]")
    ref, new, mod, firsts = _recorded(write_problem, tmp_path, src, "rec_view_out", ["attention"])
    for _ in range(3):
        q, k, v = torch.randn(3, 20, 16), torch.randn(3, 24, 16), torch.randn(3, 24, 16)
        _same_exact(ref, new, q, k, v)
        assert new(q, k, v).shape == (3, 20, 16)
    assert firsts == ["g0"]
    (plan,) = [v for k, v in mod._EGG_PLANS.items() if k[0] == "_egg_g0"]
    assert plan and plan[2][0][0] == "m"  # the return: a view of the allocation
