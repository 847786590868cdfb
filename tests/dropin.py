"""check_dropin: is a ModelNew a drop-in for its Model, in the calls a user makes?

In one process (CPU, Triton's interpreter for the kernels): build Model and ModelNew, load the
same random state dict into both (a seeded init of ones and zeros would hide a dropped weight;
running variances positive), then call both on the same inputs and compare the outputs and the
updated buffers after every call, over:
- train() and eval(), several calls in each (running statistics drift if counted wrong);
- the problem's inputs, scaled x3, x0.01, x100 and negated, with a few elements changed, and in
  two other memory layouts (rows padded at an offset, the last two dims transposed);
- another size of the batch dim and of every other dim (dims of one size change together),
  and one more leading dim: where the reference raises, ModelNew must raise too;
- grad mode on (outputs compared detached) as well as off;
- moved with .to(torch.float64) (and back), every tensor attribute a parameter or buffer, the
  state_dict keys equal to the reference's.
Outputs match within atol/rtol, or their error against a float64 run of the reference is no
larger than the reference's own (the verifier's float64 door); NaN/Inf where the reference has
them, nowhere else. Inputs are left as Model leaves them: untouched where Model does not write
into them, written with Model's values (within atol/rtol) where it does (a KV cache updated in
place). Returns a report of the trials, with whether each call launched a kernel.
"""
from __future__ import annotations

import copy
import pathlib
import tempfile
from dataclasses import dataclass, field

import torch

from harness.problem import load_module
from harness.trials import LAYOUTS, copy_layout, relayout


@dataclass
class Trial:
    mode: str
    name: str
    fast: bool  # a Triton kernel ran in ModelNew's call
    raised: bool = False  # both raised (an input the reference refuses)


@dataclass
class Report:
    trials: list[Trial] = field(default_factory=list)

    def fast(self, name: str, mode: str = "train") -> bool:
        got = [t.fast for t in self.trials if t.name == name and t.mode == mode]
        assert got, f"no trial {name!r} in {mode}"
        return all(got)

    def names(self) -> set[str]:
        return {t.name for t in self.trials}


class _Count:
    """Stands in for a generated kernel (``kernel[grid](...)``) and counts its launches."""

    def __init__(self, kernel, box: list):
        self.kernel, self.box = kernel, box

    def __getitem__(self, grid):
        self.box[0] += 1
        return self.kernel[grid]


def load_sources(problem_source: str, modelnew_source: str):
    """(problem module, candidate module), each written to a file of its own and imported."""
    d = pathlib.Path(tempfile.mkdtemp(prefix="egg_dropin_"))
    (d / "problem.py").write_text(problem_source)
    (d / "candidate.py").write_text(modelnew_source)
    return load_module(d / "problem.py", "problem"), load_module(d / "candidate.py", "candidate")


def own_call_launches(pmod, cmod, kernel: str = "_egg_k_g0", atol: float = 2e-2,
                      rtol: float = 2e-2) -> list[list[torch.Tensor]]:
    """Call Model and ModelNew (one state) on the problem's inputs, compare the outputs, and
    return the tensor arguments of each launch of the generated module's ``kernel``."""
    box: list[list[torch.Tensor]] = []
    jit = getattr(cmod, kernel)

    class Spy:
        def __getitem__(self, grid):
            def launch(*a, **k):
                box.append([t for t in a if isinstance(t, torch.Tensor)])
                return jit[grid](*a, **k)
            return launch

    setattr(cmod, kernel, Spy())
    try:
        torch.manual_seed(0)
        ref, new = pmod.Model(*pmod.get_init_inputs()), cmod.ModelNew(*pmod.get_init_inputs())
        new.load_state_dict(ref.state_dict())
        xs = pmod.get_inputs()
        with torch.no_grad():
            torch.testing.assert_close(new(*xs), ref(*xs), atol=atol, rtol=rtol)
    finally:
        setattr(cmod, kernel, jit)
    return box


def random_state(model: torch.nn.Module, seed: int) -> dict:
    """Random values for every floating parameter and buffer (running variances positive, a
    few batches tracked), the rest kept; a buffer of 0s and 1s (an attention mask) is structure
    and kept, as the verifier keeps it (harness.worker._is_mask)."""
    from harness.worker import _is_mask

    gen = torch.Generator().manual_seed(seed)
    params = {k for k, _ in model.named_parameters()}
    out = {}
    for k, v in model.state_dict().items():
        if v.is_floating_point() and (k in params or not _is_mask(v)):
            r = torch.randn(v.shape, generator=gen, dtype=torch.float64) * 0.7
            if k.endswith("running_var"):
                r = r.abs() + 0.5
            out[k] = r.to(v.dtype)
        elif k.endswith("num_batches_tracked"):
            out[k] = torch.full_like(v, 3)
        else:
            out[k] = v.clone()
    return out


def stray_tensors(model: torch.nn.Module) -> list[str]:
    """Tensor attributes that are neither parameters nor buffers (.to() would not move them)."""
    bad = []
    for name, m in model.named_modules():
        for k, v in vars(m).items():
            if k in ("_parameters", "_buffers", "_modules"):
                continue
            vals = list(v.values()) if isinstance(v, dict) else list(v) if isinstance(v, (list, tuple)) else [v]
            if any(isinstance(x, torch.Tensor) for x in vals):
                bad.append(f"{name}.{k}" if name else k)
    return bad


def _resample(x: torch.Tensor, shape, gen) -> torch.Tensor:
    """A tensor of another shape whose values are drawn from x's (same distribution, valid
    class indices stay valid)."""
    flat = x.reshape(-1)
    idx = torch.randint(0, max(1, flat.numel()), tuple(shape), generator=gen)
    return flat[idx].clone() if flat.numel() else torch.zeros(shape, dtype=x.dtype)


def _map_floats(inputs, fn):
    return [fn(x) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]


def input_variants(inputs: list, seed: int, shapes: bool = True, rank: bool = True):
    """(name, inputs) of every trial input set."""
    gen = torch.Generator().manual_seed(seed)
    out = [("own", inputs), ("x3", _map_floats(inputs, lambda x: x * 3.0)),
           ("x0.01", _map_floats(inputs, lambda x: x * 0.01)),
           ("neg", _map_floats(inputs, lambda x: -x)), ("x100", _map_floats(inputs, lambda x: x * 100.0))]

    def few_changed(x):
        y = x.clone()
        f = y.view(-1)
        k = min(3, f.numel())
        f[:k] = f[torch.randint(0, f.numel(), (k,), generator=gen)] * 1.5 + 0.25
        return y

    out.append(("changed", _map_floats(inputs, few_changed)))
    # the same values in other layouts: rows padded at an offset (what split / chunk / a slice
    # give) and, from two dims, the last two dims transposed in memory (what .t() gives)
    if any(isinstance(x, torch.Tensor) and x.dim() for x in inputs):
        out += [(how, [relayout(x, how) for x in inputs]) for how in LAYOUTS]
    tensors = [(i, x) for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)]
    if shapes and tensors:
        # the batch: dim 0 of every input of the first one's batch size; then every other
        # size (dims of one size change together: a square matrix, an image's H and W)
        first = tensors[0][1]
        batch = int(first.shape[0]) if first.dim() and first.shape[0] >= 2 else None
        groups: list[tuple[str, int, list]] = []
        if batch is not None:
            groups.append(("batch", batch + 3, [(i, 0) for i, x in tensors
                                               if x.dim() and x.shape[0] == batch]))
        classes: dict[int, list] = {}
        for i, x in tensors:
            for d, s in enumerate(x.shape):
                if s >= 2 and not (groups and (i, d) in groups[0][2]):
                    classes.setdefault(int(s), []).append((i, d))
        groups += [(f"dim{s}", s + 1, m) for s, m in sorted(classes.items())]
        for name, new, members in groups:
            xs = list(inputs)
            for i, x in tensors:
                shape = [new if (i, d) in members else n for d, n in enumerate(x.shape)]
                if shape != list(x.shape):
                    xs[i] = _resample(x, shape, gen)
            out.append((name, xs))
    if rank and tensors:
        top = max(x.dim() for _, x in tensors)
        xs = [(_resample(x, [2] + list(x.shape), gen) if isinstance(x, torch.Tensor) and x.dim() == top
               else x) for x in inputs]
        out.append(("rank", xs))
    return out


def _flat(out):
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _clone(inputs):
    """Copies in the same layout (clone() makes a padded tensor contiguous)."""
    return [copy_layout(x) if isinstance(x, torch.Tensor) else x for x in inputs]


def _run(model, inputs, grad: bool, seed: int):
    torch.manual_seed(seed)  # dropout in train(): the same draws for both models
    try:
        with torch.set_grad_enabled(grad):
            return _flat(model(*inputs)), None
    except Exception as e:  # noqa: BLE001 - compared: both raise, or neither
        return None, e


def _close(r: torch.Tensor, c: torch.Tensor, atol: float, rtol: float) -> bool:
    r, c = r.detach(), c.detach()
    if not r.dtype.is_floating_point:
        return bool(torch.equal(r, c))
    if not torch.equal(torch.isfinite(r), torch.isfinite(c)):
        return False
    fin = torch.isfinite(r)
    if not torch.equal(r[~fin].nan_to_num(), c[~fin].nan_to_num()):
        return False
    return bool(torch.allclose(r[fin].double(), c[fin].double(), atol=atol, rtol=rtol))


def _fp64_ok(snap, inputs, grad, seed, i, r, c) -> tuple[bool, str]:
    """The float64 door: the candidate's error against a float64 run of the reference (from its
    state before the call) no larger than the reference's own."""
    ref64 = copy.deepcopy(snap).to(torch.float64)
    out64, err = _run(ref64, _map_floats(_clone(inputs), lambda x: x.double()), grad, seed)
    if err is not None:
        return False, f"float64 reference raised {err!r}"
    t = out64[i].detach().double()
    fin = torch.isfinite(t)
    e_ref = float((r.detach().double() - t).abs()[fin].max()) if fin.any() else 0.0
    e_cand = float((c.detach().double() - t).abs()[fin].max()) if fin.any() else 0.0
    return e_cand <= e_ref, f"error vs float64 {e_cand:.3g}, the reference's {e_ref:.3g}"


def _compare(where, ref_out, cand_out, snap, inputs, grad, seed, atol, rtol):
    assert len(ref_out) == len(cand_out), f"{where}: {len(cand_out)} outputs, reference {len(ref_out)}"
    for i, (r, c) in enumerate(zip(ref_out, cand_out)):
        if not isinstance(r, torch.Tensor):
            assert r == c, f"{where}: output {i} is {c!r}, reference {r!r}"
            continue
        assert isinstance(c, torch.Tensor), f"{where}: output {i} is {type(c).__name__}"
        assert c.shape == r.shape, f"{where}: output {i} shape {tuple(c.shape)}, reference {tuple(r.shape)}"
        assert c.dtype == r.dtype, f"{where}: output {i} dtype {c.dtype}, reference {r.dtype}"
        if _close(r, c, atol, rtol):
            continue
        ok, why = (_fp64_ok(snap, inputs, grad, seed, i, r, c) if r.dtype.is_floating_point
                   and torch.equal(torch.isfinite(r), torch.isfinite(c)) else (False, "values differ"))
        diff = (r.detach().double() - c.detach().double()).abs().nan_to_num(nan=float("inf")).max()
        assert ok, f"{where}: output {i} differs (max abs {float(diff):.3g}; {why})"


def _compare_state(where, ref, cand, atol, rtol):
    rs, cs = ref.state_dict(), cand.state_dict()
    for k, v in rs.items():
        w = cs[k]
        assert w.dtype == v.dtype and w.shape == v.shape, f"{where}: {k} is {w.dtype} {tuple(w.shape)}"
        assert _close(v, w, atol, rtol), (
            f"{where}: state {k} differs from the reference's (max abs "
            f"{float((v.double() - w.double()).abs().max()):.3g})")


def check_dropin(problem_source: str, modelnew_source: str, *, seed: int = 0, atol: float = 1e-4,
                 rtol: float = 1e-4, modes=("train", "eval"), calls: int = 2, shapes: bool = True,
                 rank: bool = True, grad: bool = True, move: bool = True,
                 variants: tuple[str, ...] | None = None,
                 eval_variants: tuple[str, ...] | None = None, device: str = "cpu",
                 skip: tuple[str, ...] = (), amp: bool = True) -> Report:
    """Raise AssertionError, naming the trial, where ModelNew is not a drop-in for Model; return
    the report of the trials (which calls launched a kernel). ``variants``: the input sets to
    try (names of input_variants, "grad"; None: all); ``eval_variants``: those of eval() when
    not the same (a file whose kernels serve both modes needs fewer there); ``calls``: calls
    per input set where state carries over (own, batch, grad) when the model has buffers.
    ``device``: both models are built on the CPU, loaded, then moved there with ``.to()``.
    ``skip``: input sets not to try (a 16-bit kernel that rounds once where eager rounds each
    step differs by an ulp of a cancelling sum at x100). ``amp``: one eval() call under
    ``torch.autocast`` (bf16), where Model's products compute in bf16 and return it: ModelNew
    must give Model's dtypes and values, its kernels not running."""
    pmod, cmod = load_sources(problem_source, modelnew_source)
    box = [0]
    for name, v in list(vars(cmod).items()):
        if type(v).__name__ in ("JITFunction", "InterpretedFunction", "_egg_Launcher") and (
                name.startswith("_egg_k_") or name == "_egg_transpose_kernel"):
            setattr(cmod, name, _Count(v, box))  # kernels, not the @triton.jit helpers they call
    init = pmod.get_init_inputs()
    torch.manual_seed(seed)
    ref = pmod.Model(*init)
    torch.manual_seed(seed)
    cand = cmod.ModelNew(*init)
    assert set(cand.state_dict()) == set(ref.state_dict()), (
        f"state_dict keys differ: {sorted(set(cand.state_dict()) ^ set(ref.state_dict()))}")
    stray = stray_tensors(cand)
    assert not stray, f"tensor attributes outside parameters and buffers: {stray}"
    state = random_state(ref, seed + 1)
    ref.load_state_dict(state)
    cand.load_state_dict(state)
    ref.to(device)
    cand.to(device)
    assert not stray_tensors(cand), "tensor attributes outside parameters and buffers after .to()"
    torch.manual_seed(seed + 2)
    cpu_inputs = pmod.get_inputs()

    def on(xs):
        return [x.to(device) if isinstance(x, torch.Tensor) else x for x in xs]

    inputs = on(cpu_inputs)
    report = Report()
    every = [(n, on(xs)) for n, xs in input_variants(cpu_inputs, seed + 3, shapes, rank)]
    every += [("grad", inputs)] if grad else []
    stateful = any(True for _ in ref.buffers())
    for mode in modes:
        ref.train(mode == "train")
        cand.train(mode == "train")
        want = eval_variants if mode == "eval" and eval_variants is not None else variants
        for name, xs in [(n, xs) for n, xs in every if (want is None or n in want) and n not in skip]:
            repeat = calls if name == "own" or (stateful and name in ("batch", "grad")) else 1
            for k in range(repeat):
                where = f"{mode}(), inputs {name}" + (f", call {k + 1}" if k else "")
                snap = copy.deepcopy(ref)
                before = _clone(xs)
                g = name == "grad"
                rin = _clone(xs)
                ref_out, ref_err = _run(ref, rin, g, seed + k)
                box[0] = 0
                cin = _clone(xs)
                cand_out, cand_err = _run(cand, cin, g, seed + k)
                fast = box[0] > 0
                for i, (a, r, b) in enumerate(zip(cin, rin, before)):
                    if not isinstance(a, torch.Tensor):
                        continue
                    if torch.equal(r, b):  # Model leaves it as it was: so must ModelNew
                        assert torch.equal(a, b), f"{where}: ModelNew changed its input {i}"
                    else:  # Model writes into it (a KV cache updated in place): the same values
                        assert _close(r, a, atol, rtol), f"{where}: ModelNew wrote input {i} other than Model"
                if ref_err is not None:
                    assert cand_err is not None, (f"{where}: the reference raises "
                                                  f"({type(ref_err).__name__}: {ref_err}), ModelNew returns")
                    report.trials.append(Trial(mode, name, fast, raised=True))
                    break
                assert cand_err is None, f"{where}: ModelNew raises {type(cand_err).__name__}: {cand_err}"
                _compare(where, ref_out, cand_out, snap, xs, g, seed + k, atol, rtol)
                _compare_state(where, ref, cand, atol, rtol)
                report.trials.append(Trial(mode, name, fast))
    if amp:
        ref.eval()
        cand.eval()
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            ro, re_ = _run(ref, _clone(inputs), False, seed)
            box[0] = 0
            co, ce = _run(cand, _clone(inputs), False, seed)
        assert (re_ is None) == (ce is None), f"eval() under autocast: raises {ce!r} / reference {re_!r}"
        if re_ is None:
            for i, (r, c) in enumerate(zip(ro, co)):
                if isinstance(r, torch.Tensor):
                    assert isinstance(c, torch.Tensor) and c.dtype == r.dtype and _close(r, c, atol, rtol), (
                        f"eval() under autocast: output {i} is not Model's ({getattr(c, 'dtype', c)} "
                        f"against {r.dtype})")
            _compare_state("eval() under autocast", ref, cand, atol, rtol)
        assert box[0] == 0, "eval() under autocast: ModelNew ran its kernels (built for the traced dtypes)"
    if move:
        for mode in modes[:1] if not stateful else modes:
            r64 = copy.deepcopy(ref).to(torch.float64).train(mode == "train")
            c64 = copy.deepcopy(cand).to(torch.float64).train(mode == "train")
            c64.load_state_dict(r64.state_dict())  # the float32 calls left rounding differences
            assert not stray_tensors(c64)
            xs = _map_floats(_clone(inputs), lambda x: x.double())
            ro, re_ = _run(r64, _clone(xs), False, seed)
            co, ce = _run(c64, _clone(xs), False, seed)
            assert (re_ is None) == (ce is None), f"{mode}(), moved to float64: raises {ce!r} / reference {re_!r}"
            if re_ is None:
                _compare(f"{mode}(), moved to float64", ro, co, r64, xs, False, seed, 1e-9, 1e-9)
                _compare_state(f"{mode}(), moved to float64", r64, c64, 1e-9, 1e-9)
            back = c64.to(torch.float32)
            box[0] = 0
            bo, be = _run(back, _clone(inputs), False, seed)
            # Model moved the same way (a 16-bit parameter is float32 now: loading the state
            # into Model as built would keep its dtype), with the moved copy's state
            r32 = copy.deepcopy(ref).to(torch.float64).to(torch.float32).train(mode == "train")
            r32.load_state_dict(back.state_dict())
            ro, re_ = _run(r32, _clone(inputs), False, seed)
            assert (re_ is None) == (be is None), f"{mode}(), moved back to float32: {be!r} / {re_!r}"
            if re_ is None:
                _compare(f"{mode}(), moved back to float32", ro, bo, r32, inputs, False, seed, atol, rtol)
            report.trials.append(Trial(mode, "moved back", box[0] > 0))
    return report
