"""Capture a problem's ``Model`` as one fx op graph with shapes and dtypes (meta tensors).

Two tracers, tried in order (docs/capture.md says why these and not torch.export or dynamo):

1. ``fx.symbolic_trace``: the whole forward as one graph, shapes symbolic. Most problems of
   KernelBench levels 1-3 capture this way in well under a second.
2. When that fails, a tracer that survives whole models (``method="fx-breaks"``):
   - tensors kept as plain attributes of a module (RoPE tables, a recurrent net's hidden state)
     are registered as non-persistent buffers first, and every buffer is traced as a graph value,
     so slicing one to a traced length (``self.bias[:, :, :T, :T]``) is a graph op;
   - a statement fx cannot trace (control flow on a traced value, a traced value iterated or used
     as a Python int, a tensor constant too large to embed) is a **graph break**: the statement
     moves into a function of its own that the graph calls as one opaque node and that runs as
     plain PyTorch (its source is written into the generated file). The statement is found from
     the traceback of the failed trace, in the innermost module ``forward`` being traced; one that
     cannot move (it returns, breaks or continues out of a block) takes its enclosing block, or
     the rest of the function. Tracing is retried until it succeeds (at most MAX_BREAKS breaks).
   The graph breaks cut the graph into **regions** (the nodes between two breaks); fusion keeps
   every kernel inside one region (codegen.fusion), so nothing moves across a statement that may
   have effects.

Shapes are propagated on meta tensors; a graph break whose statement needs real values (a branch
on data) runs once on random CPU tensors of the same shapes to learn its outputs' shapes, when its
inputs and its module are small enough (REAL_RUN_MAX_ELEMENTS).
"""
from __future__ import annotations

import ast
import builtins
import copy
import inspect
import textwrap
import time
import types
from dataclasses import dataclass, field

import torch
from torch import fx
from torch.fx.node import has_side_effect, map_aggregate
from torch.fx.passes.shape_prop import _extract_tensor_metadata

from harness.metarun import FastMeta
from harness.problem import LoadedProblem, meta_inputs, meta_model, one_line

#: graph breaks one capture may insert before it gives up
MAX_BREAKS = 48
#: a graph break whose statement does not run on meta tensors runs on random CPU tensors when
#: its tensor inputs and its module hold at most this many elements together
REAL_RUN_MAX_ELEMENTS = 1 << 25
#: tensor constants up to this many elements are embedded in the generated file
#: (codegen.emit.MAX_EMBEDDED_CONSTANT); a statement that creates a larger one is a graph break
MAX_CONSTANT = 4096
#: the get_attr target that stands for the traced root module itself (a graph break in the
#: root's forward receives the module as its ``self``)
ROOT_REF = "_egg_self"


class RootRef:
    """The value of the stand-in attribute ROOT_REF (propagation reads the module itself)."""

    def __repr__(self) -> str:
        return "RootRef()"


ROOT_VALUE = RootRef()
#: a state name that is also an attribute of fx's GraphModule (a buffer named ``code``, as
#: bitsandbytes-style NF4 modules name their table; ``graph``, ``meta``) is read under this
#: prefix in the traced graphs (fx cannot hold it: the GraphModule's own attribute is found
#: first); codegen.emit writes it back (``self._egg_attr_code`` -> ``self.code``)
ATTR_ALIAS = "_egg_attr_"
_GM_NAMES: set[str] = set()


def gm_reserved(name: str) -> bool:
    """Whether a GraphModule cannot hold an attribute of this name."""
    if not _GM_NAMES:
        _GM_NAMES.update(dir(fx.GraphModule(torch.nn.Module(), fx.Graph())))
    return name in _GM_NAMES


def alias_reserved(model: torch.nn.Module, graph: fx.Graph) -> None:
    """Targets whose first name a GraphModule reserves are read under ATTR_ALIAS (the model
    gets the alias as a plain attribute, which fx.GraphModule copies from)."""
    for n in graph.nodes:
        if n.op not in ("get_attr", "call_module") or n.target == ROOT_REF:
            continue
        head, dot, rest = str(n.target).partition(".")
        if gm_reserved(head):
            if not hasattr(model, ATTR_ALIAS + head):
                object.__setattr__(model, ATTR_ALIAS + head, getattr(model, head))
            n.target = ATTR_ALIAS + head + dot + rest


def unalias(name: str) -> str:
    """The model's own name of a (qualified) state name read under ATTR_ALIAS."""
    return name[len(ATTR_ALIAS):] if name.startswith(ATTR_ALIAS) else name
#: gm.meta key: the trace took a tensor's rank as a number (``*x.shape[:-1]``, ``x.ndim``), so
#: the traced graph, the reference too, holds only at the traced ranks (codegen.emit routes a
#: call of another rank to a copy of Model.forward)
RANK_FIXED = "egg_rank_fixed"
#: gm.meta key: the trace branched on dtypes (``if self.weight.dtype in [torch.float16, ...]``,
#: ``if x.dtype == torch.float16``: T5's norm and feed-forward), taken as their traced values
#: instead of a graph break: {("arg", i) or ("attr", "path.to.tensor"): traced dtype}. The graph
#: holds only while those tensors have those dtypes (codegen.emit routes any other call to a copy
#: of Model.forward)
DTYPE_FIXED = "egg_dtype_fixed"
#: the module name of every function a capture creates (codegen.emit defines them in the file)
GENERATED_MODULE = "egg_breaks"


@dataclass
class Break:
    """One graph break: the statement that runs as PyTorch, where and why."""

    name: str  # the function the statement became, e.g. _egg_break_0
    where: str  # the function it came from, e.g. CausalSelfAttention.forward
    line: int  # its first line in that function's file
    stmt: str  # its first line of code
    reason: str  # why fx could not trace it
    module: str = ""  # the module (path) whose forward holds it; "" for the root

    def describe(self) -> str:
        return f"{self.where} line {self.line} ({self.stmt.strip()[:60]}): {self.reason[:120]}"


@dataclass
class Captured:
    gm: fx.GraphModule | None
    inputs: list
    error: str | None = None
    #: how the graph was captured: fx (one graph, symbolic) | fx-breaks (buffers traced,
    #: graph breaks) | none
    method: str = "fx"
    breaks: list[Break] = field(default_factory=list)
    #: source of the function of every graph break, as the generated file defines it
    break_sources: dict[str, str] = field(default_factory=dict)
    #: plain tensor attributes registered as non-persistent buffers ("attn.cos_cached")
    attr_buffers: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: the (meta) module the graph was traced from: which buffers are persistent
    root: torch.nn.Module | None = None

    @property
    def regions(self) -> int:
        """Graph regions: the segments between graph breaks (0 when nothing was captured)."""
        return 0 if self.gm is None else 1 + len(self.breaks)


def capture(prob: LoadedProblem, inputs: list | None = None, training: bool = True) -> Captured:
    """The problem's op graph on meta tensors. ``inputs``: meta inputs to trace with (default:
    the problem's own); ``training``: the mode the model is traced in (fx bakes
    ``self.training`` into the graph): True traces it as built (submodules a constructor froze
    in eval() stay so) unless it was built in eval(), False traces it in eval()."""
    init = prob.init_inputs()
    inputs = meta_inputs(prob) if inputs is None else inputs

    def make():
        m = meta_model(prob, init)
        if not training or not m.training:
            m.train(training)
        return m

    return capture_model(make, inputs)


def capture_model(make, inputs: list) -> Captured:
    """Capture the module ``make()`` builds (called again for a fresh copy when the first trace
    fails: a failed trace may leave traced values in its attributes) on ``inputs`` (meta or
    real tensors)."""
    t0 = time.time()
    model = make()
    # plain tensor attributes (a 0-d scale, RoPE tables) as buffers, as the graph-break tracer
    # does: the graph reads them as module state, and ModelNew registers them the same way (else
    # its kernels would find no parameter or buffer of that name and never run)
    attrs = tensor_attrs_to_buffers(model)
    first = None
    concrete = unsupplied_defaults(model, inputs)
    try:
        tracer = _PlainTracer()
        tracer.meta_inputs = list(inputs)
        with _FactorySizes():
            graph = tracer.trace(model, concrete_args=concrete or None)
        alias_reserved(tracer.root, graph)
        gm = fx.GraphModule(tracer.root, graph, type(model).__name__)
        if tracer.rank_fixed:
            gm.meta[RANK_FIXED] = True
        if tracer.dtype_reads:
            gm.meta[DTYPE_FIXED] = dict(tracer.dtype_reads)
        assigned = _proxy_attrs(model)
        if assigned:  # fx would drop the update of module state the forward makes
            first = f"forward assigns {', '.join(assigned[:3])}: a trace would drop the update"
        baked = _state_constants(gm)
        if baked and first is None:  # fx computed them from a buffer at trace time
            first = (f"forward computes {baked[0]} from module state at trace time (a "
                     "load_state_dict would not reach it): buffers are traced as graph values")
    except Exception as e:  # noqa: BLE001
        first = f"fx could not trace Model: {one_line(e)}"
    if first is None:
        try:
            propagate(gm, inputs)
        except Exception as e:  # noqa: BLE001
            return Captured(None, inputs, f"shape propagation failed: {one_line(e)}", "none",
                            seconds=time.time() - t0)
        return Captured(gm, inputs, seconds=time.time() - t0, root=model, attr_buffers=attrs)
    cap = capture_with_breaks(make(), inputs, concrete)
    cap.seconds = time.time() - t0
    if cap.gm is None:
        cap.error = f"{first}; with graph breaks: {cap.error}"
    return cap


def _state_constants(gm: fx.GraphModule) -> list[str]:
    """Tensor constants of a plain fx trace on the meta model: fx reads a buffer as a tensor, so
    ``self.mask == 0`` becomes a meta ``_tensor_constantN`` computed at trace time (a literal
    ``torch.tensor(v)`` of forward is a real tensor and stays a constant)."""
    out = []
    for n in gm.graph.nodes:
        if n.op == "get_attr" and str(n.target).startswith("_tensor_constant"):
            t = getattr(gm, str(n.target), None)
            if isinstance(t, torch.Tensor) and t.device.type == "meta":
                out.append(str(n.target))
    return out


def unsupplied_defaults(model: torch.nn.Module, inputs: list) -> dict:
    """forward's parameters that the problem's inputs leave out, at their defaults (traced as
    constants: ``forward(self, x, h0=None)`` called with x alone takes its ``h0 is None`` way)."""
    try:
        params = list(inspect.signature(type(model).forward).parameters.values())[1:]
    except (TypeError, ValueError):
        return {}
    out = {}
    for p in params[len(inputs):]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.default is inspect.Parameter.empty:
            return {}
        out[p.name] = p.default
    return out


# ------------------------------------------------------------------------------------------------
# shape propagation (meta tensors; graph breaks fall back to a real run)


def propagate(gm: fx.GraphModule, inputs: list) -> None:
    """Record ``tensor_meta`` (shape, dtype, ...) on every node, as fx's ShapeProp does."""
    with torch.no_grad(), FastMeta():
        _Prop(gm).run(*inputs)


class _Prop(fx.Interpreter):
    #: hooks (harness.roofline.node_costs): before(node), after(node, args, result)
    before = after = None

    def run_node(self, n: fx.Node):
        if self.before is not None:
            self.before(n)
        self._node = n
        result = super().run_node(n)
        if self.after is not None:
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            self.after(n, (args, kwargs), result)
        found = []

        def meta(obj):
            if isinstance(obj, torch.Tensor):
                found.append(obj)
                return _extract_tensor_metadata(obj)
            return obj

        m = map_aggregate(result, meta)
        if found:
            n.meta["tensor_meta"] = m
        elif _plain(result):  # a size, dtype or device: codegen.constants keys tables on them
            n.meta["value"] = result
        n.meta["type"] = type(result)
        return result

    def current_meta(self):
        """An empty meta tensor of the node being run's recorded shape and dtype, if any."""
        tm = getattr(self, "_node", None) is not None and self._node.meta.get("tensor_meta")
        if not tm or not hasattr(tm, "shape"):
            return None
        return torch.empty(tuple(tm.shape), dtype=tm.dtype, device="meta")

    def get_attr(self, target, args, kwargs):
        if target == ROOT_REF:
            return getattr(self.module, "_egg_root", self.module)
        return super().get_attr(target, args, kwargs)

    def call_function(self, target, args, kwargs):
        if getattr(target, "__module__", None) == "egg_generated":  # a table (codegen.constants)
            tm = self.current_meta()
            if tm is not None:
                return tm
        if getattr(target, "__module__", None) != GENERATED_MODULE:
            return super().call_function(target, args, kwargs)
        args, kwargs = _mutable(args), _mutable(kwargs)  # a break may append to a list it gets
        try:
            return target(*args, **kwargs)
        except Exception as meta_error:  # noqa: BLE001 - e.g. a branch on a meta tensor's value
            return _run_real(target, args, kwargs, meta_error)


def propagation_interpreter(gm: fx.GraphModule, before=None, after=None) -> fx.Interpreter:
    """The interpreter ``propagate`` runs (graph breaks, the root module reference, tables
    standing in by their recorded shapes), with hooks around every node."""
    p = _Prop(gm)
    p.before, p.after = before, after
    return p


def _plain(v) -> bool:
    if isinstance(v, (bool, int, float, torch.dtype, torch.device)):
        return True
    return isinstance(v, (tuple, list, torch.Size)) and all(_plain(x) for x in v)


def _mutable(obj):
    """fx's immutable lists and dicts in a node's arguments as plain (mutable) ones."""
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_mutable(o) for o in obj)
    if isinstance(obj, list):
        return [_mutable(o) for o in obj]
    if isinstance(obj, dict):
        return {k: _mutable(v) for k, v in obj.items()}
    return obj


def _elements(obj) -> int:
    n = 0
    for x in _flat(obj):
        if isinstance(x, torch.Tensor):
            n += x.numel()
        elif isinstance(x, torch.nn.Module):
            n += sum(t.numel() for t in list(x.parameters()) + list(x.buffers()))
    return n


def _flat(obj):
    if isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _flat(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _flat(o)
    else:
        yield obj


def _random_like(t: torch.Tensor) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    if t.dtype.is_floating_point or t.dtype.is_complex:
        return torch.randn(t.shape, dtype=t.dtype, generator=g)
    if t.dtype == torch.bool:
        return torch.rand(t.shape, generator=g) > 0.5
    return torch.zeros(t.shape, dtype=t.dtype)


def _real_module(m: torch.nn.Module) -> torch.nn.Module:
    r = copy.deepcopy(m).to_empty(device="cpu")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for t in list(r.parameters()) + list(r.buffers()):
            if t.dtype.is_floating_point:
                t.copy_(torch.randn(t.shape, dtype=t.dtype, generator=g) * 0.1)
            else:
                t.zero_()
    return r


def _run_real(fn, args, kwargs, meta_error):
    """Run a graph break's function on random CPU values of the meta arguments' shapes, to learn
    its outputs' shapes (a branch on data takes either way with the same shapes)."""
    size = _elements(args) + _elements(kwargs)
    if size > REAL_RUN_MAX_ELEMENTS:
        raise RuntimeError(f"{fn.__name__} does not run on meta tensors ({one_line(meta_error)}) "
                           f"and is too large ({size} elements) to run on the CPU") from meta_error
    cache: dict[int, object] = {}

    def real(x):
        if id(x) in cache:  # (x, its real value): x is held so its id is not reused
            return cache[id(x)][1]
        if isinstance(x, torch.Tensor) and x.device.type == "meta":
            r = _random_like(x)
        elif isinstance(x, torch.nn.Module):
            r = _real_module(x)
        elif isinstance(x, (list, tuple)):
            r = type(x)(real(o) for o in x) if not hasattr(x, "_fields") else type(x)(*(real(o) for o in x))
        elif isinstance(x, dict):
            r = {k: real(v) for k, v in x.items()}
        else:
            r = x
        cache[id(x)] = (x, r)
        return r

    out = fn(*real(list(args)), **real(dict(kwargs)))
    return map_aggregate(out, lambda o: o.to("meta") if isinstance(o, torch.Tensor) else o)


# ------------------------------------------------------------------------------------------------
# the tracer with graph breaks


class CaptureFailed(Exception):
    """Raised inside a trace when a value must not enter the graph (a large tensor constant)."""


def tensor_attrs_to_buffers(model: torch.nn.Module) -> list[str]:
    """Register every plain tensor attribute of every module as a non-persistent buffer (state
    dict keys unchanged; ``.to()`` moves it). Returns their qualified names."""
    out = []
    for path, m in model.named_modules():
        for k, v in list(vars(m).items()):
            if isinstance(v, torch.Tensor) and not isinstance(v, torch.nn.Parameter) \
                    and not k.startswith("__"):
                delattr(m, k)
                m.register_buffer(k, v, persistent=False)
                out.append(f"{path}.{k}" if path else k)
    return out


def _has_proxy(value) -> bool:
    return any(isinstance(v, fx.Proxy) for v in _flat(value))


def _proxy_attrs(model: torch.nn.Module) -> list[str]:
    """Module attributes (plain or buffers) that hold a traced value after a trace: the forward
    assigned them (``self.hidden = ...``)."""
    out = []
    for path, m in model.named_modules():
        for k, v in list(vars(m).items()) + list(m._buffers.items()):
            if _has_proxy(v):
                out.append(f"{path}.{k}" if path else k)
    return out


class _Assigns:
    """While a trace runs: a forward that assigns a traced value to a module attribute raises
    (the statement becomes a graph break that runs as PyTorch and updates the module)."""

    def __enter__(self):
        self.orig = orig = torch.nn.Module.__setattr__

        def guarded(mod, name, value):
            if _has_proxy(value):
                raise CaptureFailed(f"forward assigns {type(mod).__name__}.{name} (module state)")
            orig(mod, name, value)

        torch.nn.Module.__setattr__ = guarded
        return self

    def __exit__(self, *exc):
        torch.nn.Module.__setattr__ = self.orig
        return False


#: factories that take a size as varargs (``torch.ones(T, T)``)
SIZE_FACTORIES = ("ones", "zeros", "empty", "rand", "randn")
#: dtype information (``torch.finfo(x.dtype).min``: a mask's fill) recorded when the dtype is traced
TYPE_INFO = ("finfo", "iinfo")
#: Python types given as a dtype, and the torch dtype they mean
_PY_DTYPES = {bool: torch.bool, int: torch.int64, float: torch.float32}


class _FactoriesOff:
    """torch's own factories and dtype information while a _FactorySizes trace evaluates a
    value on meta tensors (no traced values reach them there)."""

    def __enter__(self):
        self.saved = {n: getattr(torch, n) for n in SIZE_FACTORIES + TYPE_INFO}
        for n, f in self.saved.items():
            setattr(torch, n, getattr(f, "__wrapped__", f))
        return self

    def __exit__(self, *exc):
        for n, f in self.saved.items():
            setattr(torch, n, f)
        return False


class _FactorySizes:
    """While a trace runs: ``torch.ones(T, T, dtype=bool)`` with a traced size T (a causal mask
    built in forward, Mamba-2's segment sum) is recorded as ``torch.ones((T, T), dtype=torch.bool)``.
    fx records a factory called with traced values in one size argument, but the varargs form
    reaches PyTorch's argument parser, which refuses it ("ones() takes 1 positional argument
    but 2 were given"), and a Python type as the dtype is not an fx argument. Calls without
    traced values go to PyTorch unchanged."""

    def __enter__(self):
        self.saved = {n: getattr(torch, n) for n in SIZE_FACTORIES + TYPE_INFO}
        for n, f in self.saved.items():
            setattr(torch, n, self._info(f) if n in TYPE_INFO else self._sized(f))
        self.amp = (torch.autocast, torch.amp.autocast)
        torch.autocast = torch.amp.autocast = self._autocast(torch.autocast)
        return self

    @staticmethod
    def _autocast(cls):
        """``torch.autocast(device_type=x.device.type, enabled=False)`` of a traced x (Hugging
        Face's rotary embedding without its isinstance guard): the block is traced through, as
        fx does with a string device type. Turning autocast off changes nothing where it is not
        on, and a call under autocast takes Model's own code (codegen.emit): only there does the
        block matter. fx refused the traced device type ("Expected `device_type` of type `str`"),
        and the whole block, the tables' products and their cos / sin, was a graph break."""
        import contextlib

        def call(*args, **kwargs):
            if not _has_proxy((args, kwargs)):
                return cls(*args, **kwargs)
            enabled = kwargs.get("enabled", args[2] if len(args) > 2 else True)
            if enabled is False:
                return contextlib.nullcontext()
            return cls(*args, **kwargs)  # turning it on: fx's error, a graph break
        call.__name__ = "autocast"
        call.__wrapped__ = cls
        return call

    @staticmethod
    def _info(cls):
        """``torch.finfo(x.dtype)`` of a traced x: recorded as a call (fx cannot pass a traced
        dtype to the constructor: "finfo() requires a floating point input type"); the
        canonical forms answer it from the dtype the trace knows (codegen.rewrites.metadata)."""
        def call(*args, **kwargs):
            if not _has_proxy((args, kwargs)):
                return cls(*args, **kwargs)
            proxy = next(a for a in (*args, *kwargs.values()) if isinstance(a, fx.Proxy))
            return proxy.tracer.create_proxy("call_function", cls, args, kwargs)
        call.__name__ = cls.__name__
        call.__wrapped__ = cls
        return call

    @staticmethod
    def _sized(f):
        def call(*args, **kwargs):
            if not _has_proxy((args, kwargs)):
                return f(*args, **kwargs)
            if args and (len(args) > 1 or not isinstance(args[0], (tuple, list, torch.Size, fx.Proxy))):
                args = (tuple(args),)  # (a size given as keyword: unchanged)
            # one traced value (``x.shape[-2:]``, or one traced int) is passed as it is: a size
            # or an int at run time, either of which the factory takes
            if kwargs.get("dtype") in _PY_DTYPES:
                kwargs = {**kwargs, "dtype": _PY_DTYPES[kwargs["dtype"]]}
            return f(*args, **kwargs)
        call.__name__ = getattr(f, "__name__", "factory")
        call.__wrapped__ = f
        return call

    def __exit__(self, *exc):
        for n, f in self.saved.items():
            setattr(torch, n, f)
        torch.autocast, torch.amp.autocast = self.amp
        return False


class _ShapeIter:
    """A tracer mixin: a traced shape iterated (``x.view(*x.shape[:-1], h, d)``,
    ``for d in x.shape``) is as long as the traced tensor's rank, which the meta inputs give: the
    iteration yields ``shape[i]`` for each i (graph values: the sizes stay symbolic), where fx
    raised "Proxy object cannot be iterated" (a graph break, or no capture at all). The graph
    traced so far is evaluated on the meta inputs (memoized per node); only a tuple of ints (a
    shape, a slice of one) is iterated so, never a tensor (its length is data the trace fixes).
    A traced tensor's ``ndim`` / ``dim()`` is its traced rank (fixed in any graph)."""

    meta_inputs: list | None = None

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return _SizedProxy(node, self)

    #: whether the trace took a rank as a number (the graph holds only at the traced ranks)
    rank_fixed = False
    #: the dtypes a branch of the trace read (DTYPE_FIXED), None while there is none
    dtype_reads: dict | None = None

    def to_bool(self, obj):
        """A condition on dtypes alone (``x.dtype == torch.float16``, ``w.dtype in (...)``, of
        the forward's inputs or the model's parameters and buffers) is its traced value: the
        graph then holds only at those dtypes (DTYPE_FIXED). Any other condition is fx's error
        (a graph break)."""
        got = self._dtype_condition(obj.node)
        if got is None:
            return super().to_bool(obj)
        value, reads = got
        self.dtype_reads = {**(self.dtype_reads or {}), **reads}
        return value

    def _dtype_condition(self, node: fx.Node):
        import operator

        ops = {operator.eq, operator.ne, operator.is_, operator.is_not, operator.contains,
               operator.not_, operator.and_, operator.or_, operator.truth}
        reads: dict = {}
        placeholders = [n for n in node.graph.nodes if n.op == "placeholder"]
        todo, seen = [node], set()
        while todo:
            m = todo.pop()
            if m in seen:
                continue
            seen.add(m)
            if m.op == "call_function" and m.target is getattr and m.args[1:] == ("dtype",):
                src = m.args[0]
                if not isinstance(src, fx.Node) or src.op not in ("placeholder", "get_attr") \
                        or (src.op == "get_attr" and not all(p.isidentifier() for p in src.target.split("."))):
                    return None  # the dtype of a value computed in forward: not followed
                value = self._traced_value(src)
                if not isinstance(value, torch.Tensor):
                    return None
                key = ("arg", placeholders.index(src)) if src.op == "placeholder" else ("attr", src.target)
                reads[key] = value.dtype
                continue
            if m.op == "call_function" and m.target is getattr and m.args[1:] in (
                    ("is_floating_point",), ("is_complex",), ("itemsize",)):
                todo.extend(m.all_input_nodes)  # of a dtype
                continue
            if m.op != "call_function" or m.target not in ops:
                return None
            todo.extend(m.all_input_nodes)
        if not reads:
            return None
        value = self._traced_value(node)
        return (bool(value), reads) if isinstance(value, (bool, torch.dtype, int)) else None

    def iter(self, obj):
        length = self._traced_length(obj.node)
        if length is None:
            return super().iter(obj)
        self.rank_fixed = True
        return iter([obj[i] for i in range(length)])

    def _traced_length(self, node: fx.Node) -> int | None:
        value = self._traced_value(node)
        if isinstance(value, (tuple, list, torch.Size)) and all(
                isinstance(v, int) and not isinstance(v, bool) for v in value):
            return len(value)
        return None

    def _traced_rank(self, node: fx.Node) -> int | None:
        value = self._traced_value(node)
        return value.dim() if isinstance(value, torch.Tensor) else None

    def _traced_value(self, node: fx.Node):
        if self.meta_inputs is None:
            return None
        memo = self.__dict__.setdefault("_meta_values", {})
        placeholders = [n for n in node.graph.nodes if n.op == "placeholder"]
        from torch.fx._symbolic_trace import _maybe_revert_all_patches

        try:  # (fx's patches of Module.__call__ and wrapped functions off while it runs)
            with _maybe_revert_all_patches(), _FactoriesOff(), torch.no_grad(), FastMeta():
                return self._meta_value(node, memo, placeholders)
        except Exception:  # noqa: BLE001 - not evaluable on meta tensors
            return None

    def _meta_value(self, node: fx.Node, memo: dict, placeholders: list):
        todo, order = [node], []
        while todo:  # the nodes node depends on that have no value yet, then node
            m = todo.pop()
            if m in memo or m in order:
                continue
            order.append(m)
            todo.extend(m.all_input_nodes)
        pos = {m: i for i, m in enumerate(node.graph.nodes)}
        for m in sorted(order, key=pos.__getitem__):
            if m.op == "placeholder":
                i = placeholders.index(m)
                if i >= len(self.meta_inputs):
                    raise LookupError(m.name)
                memo[m] = self.meta_inputs[i]
                continue
            args = fx.node.map_arg(m.args, memo.__getitem__)
            kwargs = fx.node.map_arg(m.kwargs, memo.__getitem__)
            if m.op == "get_attr":
                memo[m] = ROOT_VALUE if m.target == ROOT_REF else _attr_path(self.root, m.target)
            elif m.op == "call_module":
                memo[m] = self.root.get_submodule(m.target)(*args, **kwargs)
            elif m.op == "call_method":
                memo[m] = getattr(args[0], m.target)(*args[1:], **kwargs)
            elif getattr(m.target, "__module__", None) == GENERATED_MODULE:
                raise LookupError(m.name)  # a graph break's statement: not run here
            else:
                memo[m] = m.target(*args, **kwargs)
        return memo[node]


class _SizedProxy(fx.Proxy):
    """``len()`` of a traced shape is the traced rank (_ShapeIter); Python asks for it when a
    shape is unpacked into a call (``reshape(*x.shape[:-1], -1, 2)``)."""

    def __len__(self) -> int:
        length = self.tracer._traced_length(self.node)
        if length is None:
            return super().__len__()
        self.tracer.rank_fixed = True
        return length

    def __getattr__(self, name: str):
        # a tensor's rank is fixed in a graph (ops on it have their shapes' arity): ``x.ndim``
        # and ``x.dim()`` as numbers let ``[d if i == x.ndim - 1 else 1 for ...]`` run
        if name in ("ndim", "dim"):
            rank = self.tracer._traced_rank(self.node)
            if rank is not None:
                self.tracer.rank_fixed = True
                return rank if name == "ndim" else (lambda: rank)
        return super().__getattr__(name)


def _attr_path(root: torch.nn.Module, target: str):
    obj = root
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


class _PlainTracer(_ShapeIter, fx.Tracer):
    """fx's symbolic tracer, with traced shapes iterable (_ShapeIter)."""


class _BreakTracer(_ShapeIter, fx.Tracer):
    proxy_buffer_attributes = True

    def __init__(self, rewrites: dict, owner: dict):
        super().__init__()
        self.rewrites = rewrites  # original function -> _Rewritable
        self.owner = owner  # original function's code -> (qualname, module path)
        self.breaks_made = 0  # graph-break nodes created so far in this trace
        self._buffer_proxies: dict[int, dict] = {}

    def getattr(self, attr, attr_val, parameter_proxy_cache):
        """A buffer read after a graph break is a new graph read (the break may have replaced
        it: ``self.h = ...``); fx would reuse the read from before."""
        if isinstance(attr_val, torch.Tensor) and not isinstance(attr_val, torch.nn.Parameter):
            return super().getattr(attr, attr_val, self._buffer_proxies.setdefault(self.breaks_made, {}))
        return super().getattr(attr, attr_val, parameter_proxy_cache)

    def call_module(self, m, forward, args, kwargs):
        try:
            path = self.path_of_module(m)
        except NameError:
            # a module that is not one of the model's submodules: a function made a module at
            # import (transformers >= 5.25 with the `kernels` package wraps apply_rotary_pos_emb
            # so), called like a function: its ops are traced inline, as the function's were
            return forward(*args, **kwargs)
        fn = _unwrapped_forward(m)
        rw = self.rewrites.get(fn)
        if rw is not None and rw.breaks and not self.is_leaf_module(m, path):
            built = rw.build(self)
            forward = types.MethodType(built, m)
        return super().call_module(m, forward, args, kwargs)

    def create_arg(self, a):
        if isinstance(a, torch.nn.Module) and a is self.root:
            return self.create_node("get_attr", ROOT_REF, (), {})
        if isinstance(a, torch.Tensor) and not isinstance(a, torch.nn.Parameter) \
                and a.numel() > MAX_CONSTANT and not any(a is b for b in self.root.buffers()):
            raise CaptureFailed(f"forward creates a tensor constant of {a.numel()} elements")
        return super().create_arg(a)


def _unwrapped_forward(m: torch.nn.Module):
    return inspect.unwrap(type(m).forward)


def _qualname(fn) -> str:
    return getattr(fn, "__qualname__", getattr(fn, "__name__", "forward"))


def capture_with_breaks(model: torch.nn.Module, inputs: list, concrete: dict | None = None) -> Captured:
    """Trace ``model`` (on meta tensors) with buffers as graph values and graph breaks."""
    attrs = tensor_attrs_to_buffers(model)
    rewrites: dict = {}
    owner: dict = {}
    for path, m in model.named_modules():
        fn = _unwrapped_forward(m)
        if not isinstance(fn, types.FunctionType) or fn.__module__.startswith("torch."):
            continue
        owner.setdefault(fn.__code__, (fn, path))
    breaks: list[Break] = []
    sources: dict[str, str] = {}
    counter = [0]
    last = ""
    for _attempt in range(MAX_BREAKS + 1):
        tracer = _BreakTracer(rewrites, owner)
        tracer.meta_inputs = list(inputs)
        root_fn = _unwrapped_forward(model)
        rw = rewrites.get(root_fn)
        try:
            if rw is not None and rw.breaks:
                built = rw.build(tracer)
                shim = type(type(model).__name__, (type(model),), {"_egg_traced_forward": built})
                orig_cls = model.__class__
                model.__class__ = shim
                tracer.traced_func_name = "_egg_traced_forward"
                try:
                    with _Assigns(), _FactorySizes():
                        graph = tracer.trace(model, concrete_args=concrete or None)
                finally:
                    model.__class__ = orig_cls
            else:
                with _Assigns(), _FactorySizes():
                    graph = tracer.trace(model, concrete_args=concrete or None)
            object.__setattr__(model, ROOT_REF, ROOT_VALUE)  # the stand-in get_attr target
            alias_reserved(model, graph)
            gm = fx.GraphModule(model, graph, type(model).__name__)
            if tracer.rank_fixed:
                gm.meta[RANK_FIXED] = True
            if tracer.dtype_reads:
                gm.meta[DTYPE_FIXED] = dict(tracer.dtype_reads)
            object.__setattr__(gm, "_egg_root", model)
            propagate(gm, inputs)
        except Exception as e:  # noqa: BLE001 - a statement to break at, or the end of the road
            if isinstance(e, _OpaqueArg):  # the statement that assigned the value a break needs
                rw, reason, path = e.rw, str(e), e.b.module
                lineno = rw.assigned_before(e.name, e.b.line)
                if lineno is None:
                    return Captured(None, inputs, f"{e}, and it is not assigned in {_qualname(rw.fn)} "
                                    "before the break", "none", breaks, sources, attrs)
            else:
                reason = one_line(e)
                site = _break_site(e, owner)
                if site is None:
                    return Captured(None, inputs, f"no statement to break at: {reason}", "none",
                                    breaks, sources, attrs)
                fn, path, lineno = site
                rw = rewrites.get(fn)
                if rw is None:
                    try:
                        rw = rewrites[fn] = _Rewritable(fn)
                    except (OSError, TypeError, SyntaxError) as err:
                        return Captured(None, inputs, f"{reason} in {_qualname(fn)}, whose source "
                                        f"cannot be read ({one_line(err)})", "none", breaks, sources, attrs)
                key = (fn, lineno)
                if key == last:
                    return Captured(None, inputs, f"{reason} (again after a graph break at "
                                    f"{_qualname(fn)} line {lineno})", "none", breaks, sources, attrs)
                last = key
            try:
                b = rw.add_break(lineno, f"_egg_break_{counter[0]}", reason, path)
            except _NoBreak as err:
                return Captured(None, inputs, f"{reason}; {err}", "none", breaks, sources, attrs)
            counter[0] += 1
            breaks.append(b)
            continue
        for rw in rewrites.values():
            sources.update(rw.sources())
        used = {n.target.__name__ for n in gm.graph.nodes
                if n.op == "call_function" and getattr(n.target, "__module__", None) == GENERATED_MODULE}
        kept = [b for b in breaks if b.name in used]
        return Captured(gm, inputs, None, "fx-breaks", kept,
                        {k: v for k, v in sources.items() if k in used}, attrs, root=model)
    return Captured(None, inputs, f"more than {MAX_BREAKS} graph breaks", "none", breaks, sources, attrs)


def _break_site(e: BaseException, owner: dict):
    """(original function, module path, line) of the innermost frame of a traced forward in the
    traceback of a failed trace; None when no such frame is there."""
    site = None
    tb = e.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        hit = owner.get(code) or _Rewritable.built_codes.get(code)
        if hit is not None:
            fn, path = hit
            site = (fn, path, tb.tb_lineno)
        tb = tb.tb_next
    return site


# ------------------------------------------------------------------------------------------------
# rewriting a forward's source: statements that become graph breaks


class _NoBreak(Exception):
    pass


class _OpaqueArg(Exception):
    """A graph break needs a local value the graph cannot carry (a function chosen at run time,
    say transformers' ``attention_interface``): the statement that assigns it becomes a graph
    break too, so the value passes between two opaque nodes."""

    def __init__(self, rw, b, name: str, value):
        super().__init__(f"graph break {b.name} needs {name}, a {type(value).__name__} the graph cannot carry")
        self.rw, self.b, self.name = rw, b, name


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ListComp,
           ast.SetComp, ast.DictComp, ast.GeneratorExp)
_JUMPS = (ast.Return, ast.Break, ast.Continue, ast.Yield, ast.YieldFrom, ast.Await, ast.Global,
          ast.Nonlocal)


def _walk_scope(node):
    """Nodes of ``node`` without descending into nested scopes."""
    todo = list(ast.iter_child_nodes(node))
    while todo:
        n = todo.pop()
        yield n
        if not isinstance(n, _SCOPES):
            todo.extend(ast.iter_child_nodes(n))


def _stores(node) -> set[str]:
    out = set()
    nodes = [node] + list(_walk_scope(node))
    for n in nodes:
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            out.add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n is not node:
            out.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in n.names)
        elif isinstance(n, ast.ExceptHandler) and n.name:
            out.add(n.name)
    return out


def _loads(node) -> list[str]:
    seen: list[str] = []
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in seen:
            seen.append(n.id)
    return seen


def _jumps_out(stmt) -> bool:
    """Does the statement return, break or continue out of itself (so it cannot move into a
    function of its own)? Loops inside it may break and continue."""
    def visit(n, in_loop):
        for c in ast.iter_child_nodes(n):
            if isinstance(c, _SCOPES):
                continue
            if isinstance(c, (ast.Return, ast.Yield, ast.YieldFrom, ast.Await, ast.Global, ast.Nonlocal)):
                return True
            if isinstance(c, (ast.Break, ast.Continue)) and not in_loop:
                return True
            if visit(c, in_loop or isinstance(c, (ast.For, ast.While, ast.AsyncFor))):
                return True
        return False
    if isinstance(stmt, _JUMPS):
        return True
    return visit(stmt, isinstance(stmt, (ast.For, ast.While, ast.AsyncFor)))


class _Rewritable:
    """A forward whose statements can become graph breaks; ``build`` compiles the rewritten
    function for one tracer."""

    built_codes: dict = {}  # code of a built (rewritten) function -> (original function, path)

    def __init__(self, fn: types.FunctionType):
        self.fn = fn
        lines, start = inspect.getsourcelines(fn)
        src = textwrap.dedent("".join(lines))
        tree = ast.parse(src)
        fdef = tree.body[0]
        if not isinstance(fdef, (ast.FunctionDef, ast.AsyncFunctionDef)):
            raise TypeError("not a function definition")
        ast.increment_lineno(tree, start - 1)
        fdef.decorator_list = []
        self.fdef = fdef
        self.filename = fn.__code__.co_filename
        a = fdef.args
        self.params = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
        self.params += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
        self.locals = set(self.params) | _stores(fdef)
        self.breaks: list[tuple[ast.stmt, bool, Break, list]] = []  # (stmt, tail, record, block)
        self.path = ""
        self._source: dict[str, str] = {}

    # -- where to break
    def _find(self, body: list, lineno: int, top: bool):
        """(block, index) of the statement to break at for a failure at ``lineno``."""
        for i, s in enumerate(body):
            if not (s.lineno <= lineno <= (s.end_lineno or s.lineno)):
                continue
            for name in ("body", "orelse", "finalbody"):
                sub = getattr(s, name, None)
                if isinstance(sub, list) and sub and not isinstance(s, _SCOPES) and \
                        sub[0].lineno <= lineno and not self._header(s, lineno):
                    found = self._find(sub, lineno, False)
                    if found is not None:
                        return found
            for h in getattr(s, "handlers", []) or []:
                if h.body and h.body[0].lineno <= lineno <= (h.end_lineno or h.lineno):
                    found = self._find(h.body, lineno, False)
                    if found is not None:
                        return found
            return body, i, top
        return None

    @staticmethod
    def _header(s, lineno) -> bool:
        """Is ``lineno`` in the header of compound statement s (its test, iterable, items)?"""
        first = min((b[0].lineno for b in (getattr(s, n, None) for n in ("body",)) if b), default=None)
        return first is not None and lineno < first

    def assigned_before(self, name: str, lineno: int) -> int | None:
        """The line of the last statement of this function (outside nested scopes) that assigns
        ``name`` before ``lineno``; None when there is none (a parameter)."""
        best = None
        for n in _walk_scope(self.fdef):
            if isinstance(n, ast.stmt) and n.lineno < lineno and name in _stores(n):
                best = n.lineno if best is None else max(best, n.lineno)
        return best

    def add_break(self, lineno: int, name: str, reason: str, path: str) -> Break:
        found = self._find(self.fdef.body, lineno, True)
        if found is None:
            raise _NoBreak(f"line {lineno} is not a statement of {_qualname(self.fn)}")
        block, i, top = found
        stmt = block[i]
        tail = False
        # a statement that jumps out of itself takes its enclosing statement; at the top level,
        # the rest of the function (which then returns through the break's function)
        while _jumps_out(stmt):
            if top:
                tail = True
                break
            parent = self._parent_of(stmt)
            if parent is None:
                raise _NoBreak(f"cannot move the statement at line {stmt.lineno} out of "
                               f"{_qualname(self.fn)}")
            block, i, top = parent
            stmt = block[i]
        if any(s is stmt or (t and s in block[:i]) for s, t, _b, _bl in self.breaks):
            raise _NoBreak(f"line {stmt.lineno} of {_qualname(self.fn)} is a graph break already")
        # one that contains earlier breaks replaces them (a tail covers the statements after it)
        self.breaks = [(s, t, b, bl) for s, t, b, bl in self.breaks
                       if not self._inside(s, stmt) and not (tail and bl is block and s in block[i:])]
        line = ast.unparse(stmt).splitlines()[0]
        b = Break(name, _qualname(self.fn), stmt.lineno, line, reason, path)
        self.breaks.append((stmt, tail, b, block))
        self.path = path
        return b

    @staticmethod
    def _inside(inner, outer) -> bool:
        return any(n is inner for n in ast.walk(outer))

    def _parent_of(self, target):
        def visit(body, top):
            for i, s in enumerate(body):
                for name in ("body", "orelse", "finalbody"):
                    sub = getattr(s, name, None)
                    if isinstance(sub, list) and not isinstance(s, _SCOPES):
                        if any(x is target for x in sub):
                            return body, i, top
                        r = visit(sub, False)
                        if r is not None:
                            return r
                for h in getattr(s, "handlers", []) or []:
                    if any(x is target for x in h.body):
                        return body, i, top
                    r = visit(h.body, False)
                    if r is not None:
                        return r
            return None
        return visit(self.fdef.body, True)

    # -- building
    def _break_parts(self, stmt, tail: bool, block: list):
        """(moved statements, parameters, outputs) of a break at ``stmt``."""
        if tail:
            i = next(k for k, s in enumerate(block) if s is stmt)
            moved = block[i:]
        else:
            moved = [stmt]
        box = ast.Module(body=moved, type_ignores=[])
        loads = _loads(box)
        stores = set()
        for s in moved:
            stores |= _stores(s)
        first, last = moved[0].lineno, max(s.end_lineno or s.lineno for s in moved)
        lo = first  # loads after the statement, or anywhere in a loop around it, read its outputs
        p = self._parent_of(stmt)
        while p is not None:
            pstmt = p[0][p[1]]
            if isinstance(pstmt, (ast.For, ast.While, ast.AsyncFor)):
                lo = min(lo, pstmt.lineno)
            p = self._parent_of(pstmt)
        later = set()
        for n in ast.walk(self.fdef):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and \
                    (n.lineno > last or lo <= n.lineno < first):
                later.add(n.id)
        # outputs: what the statement binds and the code after it reads, and what it reads that
        # the code after it reads too (a list it appends to is that list, as the break left it)
        outs = [] if tail else sorted(((stores | set(loads)) & later & self.locals)
                                      - set(self.params[:1]))
        before = set(self.params)
        for n in ast.walk(self.fdef):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.lineno < first:
                before.add(n.id)
        order = loads + [o for o in outs if o not in loads]
        params = [v for v in order if v in self.locals and v in before]
        if self.params and self.params[0] in params:  # self first
            params.remove(self.params[0])
            params.insert(0, self.params[0])
        return moved, params, outs

    def _rewrite(self, mapping: dict):
        """A copy of the function with each break's statement(s) replaced by a call of its
        function (``mapping``: id of an original statement -> its break's plan)."""
        fcopy = copy.deepcopy(self.fdef)
        corr = {id(c): mapping[id(o)] for o, c in zip(ast.walk(self.fdef), ast.walk(fcopy))
                if id(o) in mapping}

        def fix(body: list) -> list:
            out = []
            for s in body:
                hit = corr.get(id(s))
                if hit is not None:
                    name, params, outs, tail = hit
                    call = ast.Call(func=ast.Name(name, ast.Load()),
                                    args=[ast.Name(p, ast.Load()) for p in params], keywords=[])
                    if tail:
                        new = ast.Return(value=call)
                    elif not outs:
                        new = ast.Expr(value=call)
                    elif len(outs) == 1:
                        new = ast.Assign(targets=[ast.Name(outs[0], ast.Store())], value=call)
                    else:
                        new = ast.Assign(targets=[ast.Tuple([ast.Name(o, ast.Store()) for o in outs],
                                                            ast.Store())], value=call)
                    out.append(ast.copy_location(new, s))
                    if tail:
                        break  # the rest of the block moved into the break's function
                    continue
                for name in ("body", "orelse", "finalbody"):
                    sub = getattr(s, name, None)
                    if isinstance(sub, list) and sub and not isinstance(s, _SCOPES):
                        setattr(s, name, fix(sub) or [ast.Pass()])
                for h in getattr(s, "handlers", []) or []:
                    h.body = fix(h.body) or [ast.Pass()]
                out.append(s)
            return out

        fcopy.body = fix(fcopy.body)
        return fcopy

    def _plan(self):
        """Per break: (record, moved statements, params, outputs, tail), and the id mapping."""
        plans, mapping = [], {}
        for stmt, tail, b, block in self.breaks:
            moved, params, outs = self._break_parts(stmt, tail, block)
            plans.append((b, moved, params, outs, tail))
            mapping[id(stmt)] = (b.name, params, outs, tail)
        return plans, mapping

    def break_module(self, b: Break, moved, params, outs, tail, qualify=None) -> ast.Module:
        """The function a break's statement(s) become, as a module of one definition."""
        body = [copy.deepcopy(s) for s in moved]
        if qualify is not None:
            body = [qualify.visit(s) for s in body]
        if not tail:
            if len(outs) == 1:
                body.append(ast.Return(ast.Name(outs[0], ast.Load())))
            elif outs:
                body.append(ast.Return(ast.Tuple([ast.Name(o, ast.Load()) for o in outs], ast.Load())))
        fn = ast.FunctionDef(name=b.name, args=ast.arguments(
            posonlyargs=[], args=[ast.arg(p) for p in params], vararg=None, kwonlyargs=[],
            kw_defaults=[], kwarg=None, defaults=[]), body=body, decorator_list=[], returns=None,
            type_params=[])
        ast.copy_location(fn, moved[0])
        return ast.fix_missing_locations(ast.Module(body=[fn], type_ignores=[]))

    def build(self, tracer: fx.Tracer):
        """The rewritten function, with each break's function wrapped to be one graph node."""
        plans, mapping = self._plan()
        g = dict(self.fn.__globals__)
        for b, moved, params, outs, tail in plans:
            ns: dict = {}
            exec(compile(self.break_module(b, moved, params, outs, tail), self.filename, "exec"), g, ns)
            real = ns[b.name]
            real.__module__ = GENERATED_MODULE
            has_side_effect(real)

            def node(*args, _real=real, _b=b, _params=params):
                try:
                    out = tracer.create_proxy("call_function", _real, args, {}, name=f"{_real.__name__}_out")
                except NotImplementedError:  # an argument the graph cannot carry: which one (the
                    for name, a in zip(_params, args):  # trace is abandoned, its nodes do not matter)
                        try:
                            tracer.create_arg(a)
                        except NotImplementedError:
                            raise _OpaqueArg(self, _b, name, a) from None
                    raise
                tracer.breaks_made += 1
                return out

            node.__name__ = b.name
            g[b.name] = node
            self._source[b.name] = self._emitted_source(b, moved, params, outs, tail)
        fdef = self._rewrite(mapping)
        fdef.name = "_egg_traced"
        mod = ast.fix_missing_locations(ast.Module(body=[fdef], type_ignores=[]))
        ns = {}
        exec(compile(mod, self.filename, "exec"), g, ns)
        built = ns["_egg_traced"]
        _Rewritable.built_codes[built.__code__] = (self.fn, self.path)
        return built

    def _emitted_source(self, b, moved, params, outs, tail) -> str:
        """The break's function as the generated file defines it: the problem file's own
        functions use its globals; another module's (a library's model code) read theirs
        through an import of that module."""
        mod = self.fn.__module__
        if _from_problem(self.fn):
            return ast.unparse(self.break_module(b, moved, params, outs, tail))
        alias = "_egg_mod_" + mod.replace(".", "_")
        q = _Qualify(self.fn.__globals__, self.locals | set(params), alias)
        body = ast.unparse(self.break_module(b, moved, params, outs, tail, qualify=q))
        return f"import {mod} as {alias}\n\n\n{body}"

    def sources(self) -> dict[str, str]:
        return dict(self._source)


def _from_problem(fn) -> bool:
    """Is the function defined in the problem file itself (whose source the generated file holds)?"""
    return str(getattr(fn, "__module__", "")).startswith("egg_problem_")


class _Qualify(ast.NodeTransformer):
    """Global names of a library's function read through an import of its module."""

    def __init__(self, globs: dict, local: set, alias: str):
        self.globs, self.local, self.alias = globs, local, alias

    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Load) and node.id not in self.local and node.id in self.globs \
                and not (hasattr(builtins, node.id) and self.globs[node.id] is getattr(builtins, node.id)):
            return ast.copy_location(ast.Attribute(ast.Name(self.alias, ast.Load()), node.id, ast.Load()), node)
        return node
