"""Tables a forward builds from shapes and constants alone become buffers computed once at init.

A RoPE forward builds its cos/sin tables from ``arange(T)`` and a frequency buffer, a decoder
layer its causal mask from ``full((T, T), -inf).triu(1)``: the same values on every call of
the same shapes. ``fold_constants`` finds each such value (a tensor computed only from Python
constants, the sizes, dtypes and devices of the inputs, and non-persistent buffers, through
deterministic ops) that the rest of the forward reads, and replaces it by a call of
``_egg_fold_<k>(self, keys...)``. The generated file computes the table in ``ModelNew.__init__``
for the problem's own shapes and registers it as a non-persistent buffer (``.to()`` moves it; the
state dict keeps Model's keys); at a call the function returns the buffer when the keys (sizes,
dtypes, the device) are those it was built for, the buffer still has its dtype and the buffers it
was built from have not changed in place since (their tensor versions), and otherwise computes
the table as the forward did (another sequence length, a model moved to another dtype).

Tables read from parameters or persistent buffers are not folded: ``load_state_dict`` or a
training step can change those, and the table with them.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import fx

from harness.capture import ROOT_VALUE

#: ops that draw random numbers: never folded
RANDOM_FUNCTIONS = {torch.rand, torch.randn, torch.randint, torch.randperm, torch.normal,
                    torch.bernoulli, torch.rand_like, torch.randn_like, torch.randint_like,
                    torch.multinomial, torch.poisson, F.dropout, torch.dropout}
#: callables whose names end in "_" without writing in place (``a & b`` is operator.and_)
NOT_IN_PLACE = {operator.and_, operator.or_, operator.not_}
#: shape / dtype / device queries: their results are keys of a table
QUERY_ATTRS = {"shape", "dtype", "device", "ndim"}
QUERY_METHODS = {"size", "dim", "numel"}
#: Python arithmetic on keys is a key too
KEY_FUNCTIONS = {operator.add, operator.sub, operator.mul, operator.floordiv, operator.truediv,
                 operator.mod, operator.neg, operator.getitem, int, float, len}
#: view-like methods and functions: a table that is only a view of a buffer is not worth a copy
VIEWS = {"view", "reshape", "unsqueeze", "squeeze", "expand", "transpose", "permute",
         "__getitem__", "contiguous", "narrow", "select", "flatten", "t"}
#: tables above this many elements stay computed per call (a buffer is device memory held
#: for the module's life)
MAX_TABLE_ELEMENTS = 1 << 26


@dataclass
class Fold:
    name: str  # _egg_fold_<k>, the function the forward calls
    buffer: str  # _egg_table_<k>, the buffer ModelNew.__init__ registers
    keys: list  # key values at the problem's shapes (a torch.device: the table's device)
    graph: fx.Graph  # the table's computation: forward(self, k0, ...) -> table
    dtype: torch.dtype
    shape: tuple
    device_of: str | None = None  # the buffer whose device the table follows (no device key)
    nodes: list[str] = field(default_factory=list)  # the folded nodes' names
    sources: list[str] = field(default_factory=list)  # the buffers it reads (their versions guard it)


def _value(n):
    return n.meta.get("value") if isinstance(n, fx.Node) else n


def _is_tensor(n: fx.Node) -> bool:
    tm = n.meta.get("tensor_meta")
    return tm is not None and hasattr(tm, "shape")


def _scalar(v) -> bool:
    if isinstance(v, (bool, int, float, torch.dtype, torch.device, str)) or v is None:
        return True
    return isinstance(v, (tuple, list, torch.Size)) and all(_scalar(x) for x in v)


def _target_name(n: fx.Node) -> str:
    t = n.target
    return t if isinstance(t, str) else getattr(t, "__name__", "")


def non_persistent(model: torch.nn.Module) -> set[str]:
    """Qualified names of the module's non-persistent buffers (not in its state dict)."""
    out = set()
    for path, m in model.named_modules():
        for b in getattr(m, "_non_persistent_buffers_set", ()):
            out.add(f"{path}.{b}" if path else b)
    return out


def classify_nodes(gm: fx.GraphModule, free: set[str]) -> dict[fx.Node, str]:
    """Each node: "key" (a Python value from shapes/dtypes/devices), "const" (computed from keys,
    constants and the buffers named in ``free`` only), or "var"."""
    kind: dict[fx.Node, str] = {}

    def of(a):
        return kind.get(a, "var") if isinstance(a, fx.Node) else "lit"

    for n in gm.graph.nodes:
        ins = [of(a) for a in n.all_input_nodes]
        if n.op == "get_attr":
            val = _attr(gm, n.target)
            kind[n] = "const" if isinstance(val, torch.Tensor) and (
                n.target in free or str(n.target).startswith("_tensor_constant")) else "var"
            continue
        if n.op not in ("call_function", "call_method"):
            kind[n] = "var"
            continue
        name = _target_name(n)
        query = (n.op == "call_function" and n.target is getattr and len(n.args) > 1
                 and n.args[1] in QUERY_ATTRS) or (n.op == "call_method" and name in QUERY_METHODS)
        if query and _scalar(_value(n)):
            kind[n] = "key"
            continue
        if n.op == "call_function" and n.target in KEY_FUNCTIONS and all(k in ("key", "lit") for k in ins) \
                and _scalar(_value(n)) and not _is_tensor(n):
            kind[n] = "key"
            continue
        if (n.target in RANDOM_FUNCTIONS or (name.endswith("_") and n.target not in NOT_IN_PLACE)
                or name.startswith("_egg")
                or getattr(n.target, "__module__", "") in ("egg_breaks", "egg_generated")
                or not all(k in ("key", "lit", "const") for k in ins)):
            kind[n] = "var"
            continue
        kind[n] = "const" if (_is_tensor(n) or n.target is operator.getitem) else "var"
    return kind


def _attr(gm, target: str):
    obj = gm
    for part in str(target).split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def fold_constants(gm: fx.GraphModule, free: set[str], root_ref: str = "_egg_self") -> list[Fold]:
    """Replace every table the forward computes from shapes, constants and the buffers ``free``
    (non-persistent ones) by a call of its fold function (module doc); returns the folds
    (codegen.emit writes their code and buffers)."""
    kind = classify_nodes(gm, free)
    graph = gm.graph
    folds: list[Fold] = []
    for n in list(graph.nodes):
        if kind.get(n) != "const" or not _is_tensor(n) or n.op == "get_attr":
            continue
        if not any(kind.get(u) not in ("const", "key") for u in n.users):
            continue  # read only by other table ops: the table that reads it is folded
        sub = _subgraph(n, kind)
        computed = [m for m in sub if m.op != "get_attr" and kind[m] == "const"]
        if not computed or all(_target_name(m) in VIEWS or m.target is operator.getitem for m in computed):
            continue
        tm = n.meta["tensor_meta"]
        numel = 1
        for s in tm.shape:
            numel *= int(s)
        if numel > MAX_TABLE_ELEMENTS:
            continue
        keys = _table_keys(sub, kind)
        devs = [m for m in keys if isinstance(_value(m), torch.device)]
        attrs = [m for m in sub if m.op == "get_attr"]
        if not devs and not attrs:
            continue  # made on the default device: nothing says where a buffer should live
        k = len(folds)
        fold = Fold(name=f"_egg_fold_{k}", buffer=f"_egg_table_{k}", keys=[_value(m) for m in keys],
                    graph=_table_graph(sub, keys, n), dtype=tm.dtype,
                    shape=tuple(int(s) for s in tm.shape),
                    device_of=None if devs else str(attrs[0].target), nodes=[m.name for m in computed],
                    sources=sorted({str(a.target) for a in attrs}))
        fn = _fold_stub(fold.name)
        if not hasattr(gm, root_ref):
            object.__setattr__(gm, root_ref, ROOT_VALUE)  # the stand-in target of the module itself
        with graph.inserting_before(_first_user(n)):
            root = graph.create_node("get_attr", root_ref, (), {}, name=f"{fold.name}_self")
            call = graph.create_node("call_function", fn, (root, *keys), {}, name=f"{fold.name}_out")
        call.meta = dict(n.meta)
        n.replace_all_uses_with(call, delete_user_cb=lambda u: kind.get(u) not in ("const", "key"))
        folds.append(fold)
    if folds:
        _drop_dead(graph, kind)
        graph.lint()
        gm.recompile()
    return folds


#: constant tensors up to this many elements are evaluated at plan time (fixed_value)
MAX_PLANNED_TABLE = 1 << 20


def fixed_value(n: fx.Node, kind: dict) -> torch.Tensor | None:
    """The values of a tensor the forward computes from Python constants and shapes alone, none
    of them an input's (AWQ's column order: ``torch.arange(w.shape[-1]).view(-1, 8)[:, order]``
    of a stored w), computed on the CPU; else None. ``kind``: classify_nodes(gm, set()). The
    values are the same at every call: a stored tensor's shape cannot change (load_state_dict
    keeps it), and no buffer's values are read."""
    if kind.get(n) != "const" or not _is_tensor(n):
        return None
    sub = _subgraph(n, kind)
    keys = _table_keys(sub, kind)
    if any(m.op == "get_attr" for m in sub) or not all(_input_free(m) for m in keys) \
            or math.prod(int(s) for s in n.meta["tensor_meta"].shape) > MAX_PLANNED_TABLE:
        return None
    values = [torch.device("cpu") if isinstance(_value(m), torch.device) else _value(m) for m in keys]
    try:
        with torch.no_grad():
            out = fx.GraphModule(torch.nn.Module(), _table_graph(sub, keys, n))(*values)
    except Exception:  # noqa: BLE001 - not computable here: not planned on
        return None
    return out if isinstance(out, torch.Tensor) and tuple(out.shape) == tuple(n.meta["tensor_meta"].shape) else None


def _input_free(n: fx.Node) -> bool:
    """No forward argument among n's ancestors (its value cannot depend on a call's inputs)."""
    seen, todo = set(), [n]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        if m.op == "placeholder":
            return False
        todo.extend(m.all_input_nodes)
    return True


def _first_user(n: fx.Node) -> fx.Node:
    order = {m: i for i, m in enumerate(n.graph.nodes)}
    return min(n.users, key=order.__getitem__)


def _subgraph(n: fx.Node, kind: dict) -> list[fx.Node]:
    """The table's nodes (const and key ancestors of n, n included), in program order."""
    seen, todo = set(), [n]
    while todo:
        m = todo.pop()
        if m in seen or kind.get(m) not in ("const", "key"):
            continue
        seen.add(m)
        if kind[m] == "const":
            todo.extend(m.all_input_nodes)
    return [m for m in n.graph.nodes if m in seen]


def _table_keys(sub: list, kind: dict) -> list[fx.Node]:
    """The keys of a table's subgraph: the Python values (sizes, dtypes, devices) its ops read."""
    return [m for m in sub if kind[m] == "key" and any(kind.get(u) == "const" and u in sub for u in m.users)]


def _table_graph(sub: list, keys: list, out: fx.Node) -> fx.Graph:
    g = fx.Graph()
    env = {}
    for i, k in enumerate(keys):
        env[k] = g.placeholder(f"k{i}")
    for m in sub:
        if m in env:
            continue
        env[m] = g.node_copy(m, lambda a: env[a])
    g.output(env[out])
    return g


def _fold_stub(name: str):
    def stub(*args):  # placeholder target; the generated file defines the real function
        raise RuntimeError("stub")

    stub.__name__ = stub.__qualname__ = name
    stub.__module__ = "egg_generated"
    return stub


def _drop_dead(graph: fx.Graph, kind: dict) -> None:
    """Remove the folded nodes nothing reads any more (only table and key ops)."""
    for n in reversed(list(graph.nodes)):
        if not n.users and kind.get(n) in ("const", "key") and n.op != "output":
            graph.erase_node(n)


def source_lines(fold: Fold, forward_source) -> tuple[list[str], str, list[str]]:
    """(imports, module-level code, __init__ lines) of a fold. ``forward_source(graph)``:
    codegen.emit's writer of a graph as a function (imports, source)."""
    imports, src = forward_source(fold.graph)
    compute = src.replace("def forward(self", f"def {fold.name}_compute(self", 1)
    params = [f"k{i}" for i in range(len(fold.keys))]
    # the table and each buffer it depends on read once (a module attribute and get_buffer
    # cost ~0.5 and ~1.5 us each on the host: a call of the kernels checks every fold)
    names = list(dict.fromkeys(list(fold.sources) + ([fold.device_of] if fold.device_of else [])))
    bind = ", ".join(["_egg_t"] + [f"_egg_s{i}" for i in range(len(names))])
    bound = ", ".join([f"self.{fold.buffer}"] + [f"self.get_buffer({b!r})" for b in names])
    checks = [f"_egg_t.dtype == {_lit(fold.dtype)}"]
    init_args = []
    for i, v in enumerate(fold.keys):
        if isinstance(v, torch.device):
            checks.append(f"k{i} == _egg_t.device")
            init_args.append("_egg_dev")
        else:
            checks.append(f"{_cmp(f'k{i}', v)}")
            init_args.append(_lit(v))
    if fold.device_of:
        checks.append(f"_egg_t.device == _egg_s{names.index(fold.device_of)}.device")
    versions = "(" + "".join(f"self.get_buffer({b!r})._version, " for b in fold.sources) + ")"
    if fold.sources:  # a buffer it was built from changed in place: build it again
        checks.append("(" + "".join(f"_egg_s{names.index(b)}._version, " for b in fold.sources)
                      + f") == self.{fold.buffer}_versions")
    sig = ", ".join(["self"] + params)
    code = [compute, "",
            f"def {fold.name}({sig}):",
            f'    """The table {fold.buffer} (built at init for the problem\'s shapes) when the '
            'keys match, else computed as the forward did."""',
            f"    {bind} = {bound}",
            f"    if {' and '.join(checks)}:",
            "        return _egg_t",
            f"    return {fold.name}_compute({sig})"]
    dev = (f"self.get_buffer({fold.device_of!r}).device" if fold.device_of else "torch.empty(0).device")
    init = [f"_egg_dev = {dev}",
            f"self.register_buffer({fold.buffer!r}, {fold.name}_compute(self{''.join(', ' + a for a in init_args)}), "
            "persistent=False)"]
    if fold.sources:
        init.append(f"self.{fold.buffer}_versions = {versions}")
    return imports, "\n".join(code), init


def _lit(v) -> str:
    if isinstance(v, torch.dtype):
        return str(v)
    if isinstance(v, torch.Size):
        return repr(tuple(v))
    return repr(v)


def _cmp(name: str, v) -> str:
    if isinstance(v, (tuple, list, torch.Size)):
        return f"tuple({name}) == {_lit(tuple(v))}"
    return f"{name} == {_lit(v)}"
