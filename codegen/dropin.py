"""What a generated ModelNew guards, so that it is a drop-in for Model (docs/dropin.md).

The kernels of a plan are built from one trace of Model: one mode (fx bakes ``self.training``
into the graph), the problem's input shapes, dtypes and values. Each call of ModelNew takes the
kernels only when it matches what they were built for, and Model's own torch ops (the traced
reference, kept in the file) otherwise. What "matches" means is found here, at compile time, by
asking the compiler itself: a dim of the inputs may take another size when the file EGG writes
for the inputs with that dim changed is the same file (the generated code reads every size from
the call's tensors, so nothing of that size is baked in), and likewise for one more leading dim.

- Dims of the same size are one class (as torch's duck shaping does): they change together and
  must stay equal at the call. A class whose joint change gives another file is split (one dim
  at a time left out, then single dims); what stays is fixed to its traced size.
- A free dim takes any size >= 2 (a size-1 dim broadcasts, and plans read "size 1" as a
  property: size-1 dims are always fixed). One final probe changes every free class at once.
- Non-tensor arguments must equal the traced value; tensors must have the traced dtype and be on
  a device the kernels can read; parameters and buffers the kernels read must have the traced
  dtype and sit on the inputs' device (re-checked after every ``.to()``).
- The mode: the model is traced in train() and in eval(); when the two traces give the same file
  one set of kernels serves both, else each mode has its own plan (batch norm: batch statistics
  and running-statistics updates in train(), running statistics in eval()).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

#: probes per mode at most (each is one capture, plan and emit of the problem: tens of ms)
MAX_PROBES = 24
#: sizes a free dim of traced size s is probed with, in order (the first that gives the same
#: file decides): s + 2 keeps the parity (rotate-half's even width), 2 s every divisor
PROBE_SIZES = (lambda s: s + 2, lambda s: 2 * s)
#: size of the leading dim added to probe another rank
LEAD_PROBE = 3


@dataclass
class Guard:
    """What one mode's kernels were built for. ``args``: per forward argument, a tensor's
    ``dtype`` and ``dims`` (an int: exactly that size; a name "sK": any size >= 2, the same for
    every dim named sK) or a non-tensor's ``value``. ``lead``: the tensor arguments that may
    take extra leading dims (the same ones on each, each >= 2)."""

    args: list[dict[str, Any]]
    lead: list[int] = field(default_factory=list)
    probes: int = 0  # compiles it took to find (for the report)

    def describe(self, names: list[str]) -> str:
        parts = []
        for name, a in zip(names, self.args):
            if "value" in a:
                parts.append(f"{name} = {a['value']!r}")
            else:
                dims = ", ".join(str(d) for d in a["dims"])
                lead = "*, " if self.args.index(a) in self.lead else ""
                parts.append(f"{name}: {str(a['dtype']).replace('torch.', '')} [{lead}{dims}]")
        return "; ".join(parts)


@dataclass
class Dropin:
    """The drop-in facts of a plan, for the emitter (codegen.emit)."""

    train: Guard
    eval: Guard | None  # None: eval() always takes the reference (its trace has no kernels)
    same: bool  # one set of kernels (and one reference) serves both modes
    eval_plan: Any = None  # FusionPlan of the eval() trace when not ``same``
    reference: dict[str, Any] = field(default_factory=dict)  # mode -> traced GraphModule
    params: dict[str, torch.dtype] = field(default_factory=dict)  # read by the kernels
    mode_modules: list[str] = field(default_factory=list)  # submodules whose mode was read
    arg_names: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: buffers the kernels assume hold the lower-triangular ones (a causal mask read from a
    #: buffer: codegen.rewrites.attention): the kernels run only while they do
    tril_buffers: list[str] = field(default_factory=list)
    #: Model's constructor arguments the kernels were built with, bound to its signature (None:
    #: not all literals, not checked): the trace baked them in (a top-p of 0.9, a reshape to
    #: (-1, 500)), so a module built with others takes Model's own forward
    init: dict | None = None
    #: Model's public attributes holding literals after construction (``self.top_p``): baked
    #: in too; a call after one changed takes Model's own forward
    attrs: dict = field(default_factory=dict)


def is_literal(v) -> bool:
    """A value a generated file can write as Python source and compare with ``==``: None, a
    bool, int, str, finite float, dtype, or a tuple / list of them (a dict of them by name:
    a ``**kwargs``)."""
    if v is None or type(v) in (bool, int, str) or isinstance(v, torch.dtype):
        return True
    if type(v) is float:
        return v == v and v not in (float("inf"), float("-inf"))
    if type(v) in (tuple, list):
        return all(is_literal(x) for x in v)
    if type(v) is dict:
        return all(type(k) is str and is_literal(x) for k, x in v.items())
    return False


def built_with(model_cls: type, init: list) -> dict | None:
    """Model's constructor arguments (``Model(*init)``) by parameter name, defaults applied,
    when every one is a literal (is_literal); None otherwise (a tensor, a module, a function:
    the file cannot compare them, and does not)."""
    import inspect

    try:
        bound = inspect.signature(model_cls.__init__).bind(None, *init)
    except (TypeError, ValueError):
        return None
    bound.apply_defaults()
    args = dict(list(bound.arguments.items())[1:])
    return args if is_literal(args) else None


#: a literal attribute longer than this as source is not compared on each call (a table of
#: sizes kept on the module): the call would pay for it every time
MAX_ATTR_REPR = 200


def literal_attrs(root: torch.nn.Module | None) -> dict:
    """The module's own public attributes that hold literals (is_literal; not ``training``),
    as constructed: what a trace reads of ``self`` as a number and bakes in."""
    if root is None:
        return {}
    import keyword

    return {k: v for k, v in vars(root).items()
            if not k.startswith("_") and k != "training" and k.isidentifier() and not keyword.iskeyword(k)
            and is_literal(v) and len(repr(v)) <= MAX_ATTR_REPR}


def exact_guard(inputs: list) -> Guard:
    """Every dim fixed to its traced size (what is left when probing cannot run)."""
    args = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            args.append({"dtype": x.dtype, "dims": [int(s) for s in x.shape]})
        else:
            args.append({"value": x})
    return Guard(args)


def _with_sizes(inputs: list, sizes: dict[tuple[int, int], int], lead: list[int],
                extra: int | None) -> list:
    out = []
    for i, x in enumerate(inputs):
        if not isinstance(x, torch.Tensor):
            out.append(x)
            continue
        shape = [sizes.get((i, d), s) for d, s in enumerate(x.shape)]
        if extra is not None and i in lead:
            shape = [extra] + shape
        out.append(torch.empty(shape, dtype=x.dtype, device="meta"))
    return out


Dims = list[tuple[int, int]]  # (argument, dim) pairs


def _classes(inputs: list) -> dict[int, Dims]:
    """Dims of size >= 2 by traced size (duck shaping: one size, one class)."""
    out: dict[int, Dims] = {}
    for i, x in enumerate(inputs):
        if isinstance(x, torch.Tensor):
            for d, s in enumerate(x.shape):
                if s >= 2:
                    out.setdefault(int(s), []).append((i, d))
    return out


def _search(classes: dict[int, Dims], ok: Callable[[dict], bool]) -> list[tuple[Dims, int]]:
    """The free classes, as (dims, the size they were probed at), by ``ok`` (sizes -> same)."""
    free: list[tuple[Dims, int]] = []
    for s, members in sorted(classes.items()):
        got = None
        for size in PROBE_SIZES:
            if ok({m: size(s) for m in members}):
                got = [(members, size(s))]
                break
        if got is not None:
            # dims of one size at different positions (an image's H and W, attention's length
            # and head dim) are often independent: one class per position when each is free
            parts = [[m for m in members if m[1] == d] for d in sorted({m[1] for m in members})]
            if len(parts) > 1 and all(ok({m: got[0][1] for m in part}) for part in parts):
                got = [(part, got[0][1]) for part in parts]
        if got is None and len(members) > 1:
            for m in members:  # one dim tied to something else (a weight): the rest may move
                rest = [o for o in members if o != m]
                if ok({o: s + 2 for o in rest}):
                    got = [(rest, s + 2)]
                    break
        if got is None and len(members) > 1:
            got = [([m], s + 2) for m in members if ok({m: s + 2})]
        free += got or []
    return free


def _joint(free: list[tuple[Dims, int]]) -> dict:
    return {m: size for cls, size in free for m in cls}


def _accumulate(inputs: list, free: list[tuple[Dims, int]], lead: list[int],
                same: Callable[..., bool]) -> tuple[list[tuple[Dims, int]], list[int]]:
    """The free classes that hold together, when each holds alone but not all at once: each is
    added to those kept if the file stays the same with all of them changed, at its probed size
    or else at twice its traced size. Sizes that are only valid together (grouped-query
    attention's query heads a multiple of its key/value heads: 4 -> 6 against 2 -> 4 raises)
    then keep both free, where dropping every class fixed attention to its traced sequence
    length (a prefill of any other length, a decode step past the traced cache, took Model's ops)."""
    kept: list[tuple[Dims, int]] = []
    for cls, size in free:
        twice = 2 * int(inputs[cls[0][0]].shape[cls[0][1]])
        for z in dict.fromkeys((size, twice)):
            if same(_joint(kept + [(cls, z)])):
                kept.append((cls, z))
                break
    if lead and not same(_joint(kept), lead):
        lead = []
    return kept, lead


def derive_guard(inputs: list, probe: Callable[[list], str | None], base: str | None,
                 shapes_ok: Callable[[list], bool] | None = None) -> Guard:
    """The guard of one mode: which dims of ``inputs`` (meta tensors as traced) may change, found
    by ``probe`` (inputs -> the file's kernel part, None when it cannot be made) giving ``base``
    again. Sound by construction where probing says so; conservative (a fixed dim) elsewhere.

    ``shapes_ok`` (inputs -> does the model accept them: a capture, no plan) finds the
    candidates cheaply; then one probe changes them all at once, which shows any size the file
    bakes in; only when it does is each candidate probed on its own."""
    guard = exact_guard(inputs)
    if base is None:
        return guard
    count = [0]

    def changed(sizes: dict, lead: list[int] | None) -> list:
        return _with_sizes(inputs, sizes, lead or [], LEAD_PROBE if lead else None)

    def same(sizes: dict, lead: list[int] | None = None) -> bool:
        if count[0] >= MAX_PROBES:
            return False
        count[0] += 1
        try:
            return probe(changed(sizes, lead)) == base
        except Exception:  # noqa: BLE001 - a size the model or the compiler refuses is not free
            return False

    def accepted(sizes: dict, lead: list[int] | None = None) -> bool:
        try:
            return bool(shapes_ok(changed(sizes, lead)))
        except Exception:  # noqa: BLE001
            return False

    tensors = [(i, x) for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)]
    top = max((x.dim() for _, x in tensors), default=0)
    lead0 = [i for i, x in tensors if x.dim() == top] if top >= 1 else []
    quick = shapes_ok is not None
    test = accepted if quick else same
    free = _search(_classes(inputs), test)
    lead = lead0 if lead0 and test({}, lead0) else []
    if (free or lead) and (quick or len(free) + bool(lead) > 1):
        # every candidate at once: a size the file bakes in changes the file
        if not same({m: size for cls, size in free for m in cls}, lead):
            if quick:  # each candidate on its own, then all of them again
                free = [(cls, size) for cls, size in free if same({m: size for m in cls})]
                lead = lead if lead and same({}, lead) else []
                if len(free) + bool(lead) > 1 and not same(_joint(free), lead):
                    free, lead = _accumulate(inputs, free, lead, same)
            else:
                free, lead = [], []
    for k, (cls, _size) in enumerate(free):
        for i, d in cls:
            guard.args[i]["dims"][d] = f"s{k}"
    guard.lead = lead
    guard.probes = count[0]
    return guard


def confirm_guard(inputs: list, probe: Callable[[list], str | None], base: str | None,
                  guard: Guard) -> Guard | None:
    """``guard`` (found for another mode's kernels) for these kernels too, if one probe with
    every free class and the extra leading dim changed at once gives ``base`` again (a dim
    whose size the file bakes in would change it: the final probe of derive_guard)."""
    if base is None:
        return None
    sizes, lead = {}, list(guard.lead)
    for i, a in enumerate(guard.args):
        for d, w in enumerate(a.get("dims", [])):
            if isinstance(w, str):
                sizes[(i, d)] = int(inputs[i].shape[d]) + 2
    if not sizes and not lead:
        return guard
    ok = False
    for grow in (lambda n: n + 2, lambda n: 2 * n):  # 2x keeps ratios between sizes (GQA heads)
        try:
            changed = {m: grow(int(inputs[m[0]].shape[m[1]])) for m in sizes}
            ok = probe(_with_sizes(inputs, changed, lead, LEAD_PROBE if lead else None)) == base
        except Exception:  # noqa: BLE001
            ok = False
        if ok:
            break
    if not ok:
        return None
    return Guard([dict(a, dims=list(a["dims"])) if "dims" in a else dict(a) for a in guard.args],
                 lead, probes=1)


def mode_modules(gm) -> list[str]:
    """Submodules called by the trace whose mode the compile reads (batch norm, dropout): the
    dispatch checks their ``training`` flag on every call."""
    import torch.nn as nn

    out = []
    for n in gm.graph.nodes:
        if n.op == "call_module":
            mod = gm.get_submodule(n.target)
            if isinstance(mod, (nn.modules.batchnorm._NormBase, nn.modules.dropout._DropoutNd)):
                if n.target not in out:
                    out.append(str(n.target))
    return out


def read_state(gm) -> dict[str, torch.dtype]:
    """Parameters and buffers a traced graph reads (by qualified name), with their dtypes; the
    traced constants (_tensor_constantN) are ModelNew's own buffers and excluded."""
    from harness.capture import unalias

    out = {}
    for name, t in list(gm.named_parameters()) + list(gm.named_buffers()):
        if not name.split(".")[-1].startswith("_tensor_constant"):
            out[unalias(name)] = t.dtype
    return out


def with_defaults(guard: Guard | None, gm) -> Guard | None:
    """The guard with the traced default of every forward argument ``get_inputs()`` does not
    give (``forward(self, X, initial_states=None)``): the kernels were built for that value, and
    ``_egg_admit`` compares the call's arguments one for one (without it such a file never took
    its kernels: Mamba-2's). An argument without a default stays out (no call matches)."""
    if guard is None:
        return None
    extra = [n for n in gm.graph.nodes if n.op == "placeholder"][len(guard.args):]
    if not extra or any(not n.args for n in extra):
        return guard
    return Guard(guard.args + [{"value": n.args[0]} for n in extra], list(guard.lead), guard.probes)


def arg_names(gm) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op == "placeholder"]
