"""Triton kernel templates with declared tunables.

A template turns a group spec (what to load, the Triton expressions to compute, what to store)
and a launch configuration into the source of one ``@triton.jit`` kernel plus its host wrapper.
Generated sources are standalone: they rely only on torch, triton and the runtime prelude
(``_runtime.py``), whose definitions a generated file calls are copied into it.

Offsets: Triton passes int arguments and computes program ids in 32 bits, so a kernel whose
offsets can pass 2**31 - 1 is launched with ``I64`` (64-bit index math, which costs registers,
only then). What decides it is how far each operand reaches from its first element
(``_egg_span``, ``_egg_far``), not how many elements the launch walks: a column slice of a tall
matrix holds few elements far apart (2**20 rows of a 4096-wide one: 2**20 elements, 2**32 apart).
"""
from __future__ import annotations

import pathlib
from dataclasses import dataclass, field

from knowledge.schema import TemplateInfo

RUNTIME_SOURCE = (pathlib.Path(__file__).with_name("_runtime.py")).read_text()


Stmt = tuple[str, str]  # (variable, Triton expression)


@dataclass
class PointwiseSpec:
    """Elementwise kernel over one domain. Inputs are loaded as x0..x{n-1}."""

    in_dtypes: list[str]
    stmts: list[Stmt]
    outputs: list[tuple[str, str]]  # (variable, torch dtype name)
    compute: str = "fp32"
    #: inputs loaded at the column rolled by half their last dim D (slot -> D): a rotate-half
    rolls: dict[int, int] = field(default_factory=dict)
    #: outputs returned in the standard layout (a channels-last walk converted back)
    std_outputs: list[int] = field(default_factory=list)
    #: inputs loaded at the neighbouring column of their (even, odd) pair: interleaved RoPE
    pairs: list[int] = field(default_factory=list)
    #: inputs read at the rows an integer input names (a take: gather, embedding): source slot
    #: -> (index slot, dim as the op wrote it, whether a negative index counts from the end);
    #: index slots are loaded as integers
    takes: dict[int, tuple[int, int, bool]] = field(default_factory=dict)
    #: inputs placed at a cat's piece (slot -> (cat q, piece k)): loaded at the piece's columns
    #: of the result's last dim (column minus the piece's offset), nothing outside them
    places: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: per cat q of the kernel: for each piece, an input slot of the piece's width (the
    #: wrapper reads the pieces' widths, hence their offsets and the result's, from them)
    cats: list[list[int]] = field(default_factory=list)


@dataclass
class ReductionSpec:
    """Reduction over adjacent dims ``rdims`` of the domain of input 0 (the main input).

    Prologue statements run on each loaded element (full domain, inputs ``pro_inputs``) and
    produce ``red_var``. The reduced value is ``acc`` (and ``acc_idx`` for arg-reductions);
    epilogue statements run on the reduced domain (inputs ``epi_inputs``) before the stores.
    """

    op: str  # sum | mean | amax | amin | argmax | argmin | logsumexp
    in_dtypes: list[str]
    pro_inputs: list[int]
    epi_inputs: list[int]
    pro_stmts: list[Stmt]
    red_var: str
    epi_stmts: list[Stmt]
    outputs: list[tuple[str, str]]
    #: the reduced dims as the reference wrote them (negative: from the end; None: every dim),
    #: resolved against each call's rank, so one kernel serves any number of leading dims
    rdims: list[int] | None
    keepdim: bool
    inner: bool  # True: the reduced dims are innermost (rows variant); False: columns variant
    compute: str = "fp32"
    #: prologue inputs read at the rows an integer input names (PointwiseSpec.takes)
    takes: dict[int, tuple[int, int, bool]] = field(default_factory=dict)


@dataclass
class SoftmaxSpec:
    """softmax / log_softmax over one dim; the result ``sm`` feeds full-domain epilogue stmts.

    Or a reduction (sum | mean | amax | amin over adjacent dims ``rdims``) broadcast back over
    the reduced dims: ``red_stmts`` run on the reduced value ``acc`` (kept with size-1 reduced
    dims), then ``epi_stmts`` on the domain, reading the tile's loads and prologue values.
    """

    op: str  # softmax | log_softmax | sum | mean | amax | amin
    in_dtypes: list[str]
    pro_inputs: list[int]
    epi_inputs: list[int]
    pro_stmts: list[Stmt]
    red_var: str
    epi_stmts: list[Stmt]
    outputs: list[tuple[str, str]]
    dim: int  # as the reference wrote it (negative: from the end)
    inner: bool
    compute: str = "fp32"
    red_stmts: list[Stmt] = field(default_factory=list)
    #: reduced dims as written ([]: [dim]; None: every dim), resolved against each call's rank
    rdims: list[int] | None = field(default_factory=list)


@dataclass
class Rendered:
    kernel: str
    wrapper: str
    kernel_name: str
    wrapper_name: str
    config: dict = field(default_factory=dict)


TL_DTYPE = {"float32": "tl.float32", "float16": "tl.float16", "bfloat16": "tl.bfloat16",
            "float64": "tl.float64", "bool": "tl.int1", "int64": "tl.int64", "int32": "tl.int32",
            "int16": "tl.int16", "int8": "tl.int8", "uint8": "tl.uint8"}


def compute_type(spec) -> str:
    return "tl.float64" if spec.compute == "fp64" else "tl.float32"


def load_expr(ptr: str, idx: str, mask: str, dtype: str, ctype: str, other: str = "0") -> str:
    """A masked load, upcast to the compute type (bool stays int1, an integer stays as it is:
    only comparisons read one, codegen.fusion._int_comparison)."""
    base = f"tl.load({ptr} + {idx}, mask={mask}, other={other})"
    if dtype == "bool" or dtype.startswith("int"):
        return base
    return f"{base}.to({ctype})"


def nan_max(a: str, b: str) -> str:
    """Triton's max of a and b as torch takes maximum, relu, clamp, amax and max pooling: NaN
    wins (tl.maximum alone gives the other operand)."""
    return f"tl.maximum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)"


def nan_min(a: str, b: str) -> str:
    """Triton's min of a and b, NaN winning (nan_max)."""
    return f"tl.minimum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)"


def index_slots(spec) -> list[int]:
    """The input slots a spec's takes read their indices from (loaded as integers, first)."""
    return sorted({j for j, _d, _w in getattr(spec, "takes", {}).values()})


def taken_lines(i: int, j: int, wrap: bool, idx: str, mask: str, dtype: str, ctype: str) -> list[str]:
    """x{i} = the take's source i at the row its index x{j} (an integer tile) names: the offset
    ``idx`` of the source narrowed to row 0 plus index * G{i} (its stride along the dim), with
    ``wrap`` a negative index counted from the end; an index outside [0, GS{i}) reads NaN,
    never a number and never memory outside the source (eager raises there; a kernel cannot)."""
    lines = [f"t{i} = x{j}.to(tl.int64)"]
    if wrap:
        lines.append(f"t{i} = tl.where(t{i} < 0, t{i} + GS{i}, t{i})")
    inb = f"{mask} & (t{i} >= 0) & (t{i} < GS{i})"
    lines.append(f"x{i} = " + load_expr(f"P{i}", f"{idx} + t{i} * G{i}", inb, dtype, ctype, other='float("nan")'))
    return lines


def take_params(spec) -> list[str]:
    """The kernel parameters of a spec's takes: each source's stride and size along its dim."""
    return [f"{p}{i}" for i in sorted(getattr(spec, "takes", {})) for p in ("G", "GS")]


def take_views(spec, args: str = "a") -> list[str]:
    """Wrapper lines: each take's source narrowed to row 0 of its dim (_egg_take_view), ``tk``,
    the stride and size the kernel adds and checks the index with, and ``tk64``: a source too
    large for 32-bit offsets (the launch then asks for 64-bit ones). Nothing without takes."""
    takes = sorted(getattr(spec, "takes", {}).items())
    if not takes:
        return []
    lines = [f"{args}{i}, g{i}, gs{i}, tb{i} = _egg_take_view({args}{i}, {args}{j}, {d})"
             for i, (j, d, _w) in takes]
    return lines + ["tk = [" + ", ".join(f"g{i}, gs{i}" for i, _t in takes) + "]",
                    "tk64 = " + " or ".join(f"tb{i}" for i, _t in takes)]


#: one Welford step per lane: running mean wm, sum of squared deviations w2 and count wn of
#: the values z under mask m (channel statistics; split norm statistics)
WELFORD_STEP = ["wn = wn + m.to(tl.float32)", "d = z - wm",
                "wm = wm + tl.where(m, d / tl.maximum(wn, 1.0), 0.0)",
                "w2 = w2 + tl.where(m, d * (z - wm), 0.0)"]


def recorded_wrapper(gname: str, params: int | list[str], body: list[str]) -> str:
    """A wrapper planned once per inputs' layout (_egg_Rec, _egg_replay): ``{gname}_first(rec,
    ...)`` runs ``body`` (allocating through ``rec.empty``, launching through ``rec.launch(kernel,
    grid)(...)``, returning ``rec.done(...)``), and a later call whose inputs have the shapes,
    strides, dtypes and device of one before replays its allocations and launches. ``params``:
    the wrapper's tensor parameters (an int n: a0 ... a{n-1})."""
    names = [f"a{i}" for i in range(params)] if isinstance(params, int) else list(params)
    args = ", ".join(names)
    key = ", ".join([repr(gname)] + [f"{a}.shape, {a}.stride(), {a}.dtype" for a in names]
                    + [f"{names[0]}.device"])
    fast = [f"plan = ({key})", "got = _EGG_PLANS.get(plan)",
            "if got:",
            f"    return _egg_replay(got, ({args},))",
            "# not seen (None: recorded now) or never planned (False: the whole wrapper each call)",
            f"return {gname}_first(_egg_Rec(plan if got is None else None, ({args},)), {args})"]
    return f"def {gname}_first(rec, {args}):\n{indent(body, 4)}\n\n\ndef {gname}({args}):\n{indent(fast, 4)}\n"


def recorded_return(n_out: int) -> str:
    """What a recorded wrapper returns (its outputs o0, o1, ...: one tensor, or a tuple)."""
    outs = ", ".join(f"o{j}" for j in range(n_out))
    return f"rec.done({outs})" if n_out == 1 else f"rec.done(({outs}))"


def indent(lines: list[str], n: int) -> str:
    pad = " " * n
    return "\n".join(pad + ln if ln else ln for ln in lines)


def stmt_lines(stmts: list[Stmt]) -> list[str]:
    return [f"{v} = {e}" for v, e in stmts]


def all_templates() -> dict[str, TemplateInfo]:
    from knowledge.templates import (attention, chanstats, linear_ce, matmul, norm, pointwise,
                                     pool, reduction, scan, softmax)

    return {m.INFO.name: m.INFO for m in (pointwise, reduction, softmax, norm, pool, scan,
                                          chanstats, matmul, attention, linear_ce)}
