"""Weight-only quantized products: rw-dequant-linear."""
from __future__ import annotations

import functools
import operator

from torch import fx

from codegen.constants import classify_nodes, fixed_value
from codegen.fusion import _numel
from codegen.ops import CASTS, classify, node_dtype, node_shape
from codegen.rewrites.common import _annotate, _erase_unused_above, _ops, _replace, _shape_query_kind
from knowledge.templates.program import FLOAT_DTYPES, INT_DTYPES, dtype_range, value_range

#: integer weight dtypes a product's tiles load and convert in registers
QUANT_DTYPES = ("int8", "uint8")


def dequant_linear(gm: fx.GraphModule) -> bool:
    """rw-dequant-linear: ``F.linear(x, w.to(x.dtype)[, bias])`` with an 8-bit integer weight
    (gpt-fast's and torchao's weight-only int8 linears: the per-channel scales multiply the
    result after it) is ``_egg_dequant_linear(x, w, bias)``: the matmul template loads the int8
    tiles and converts them in registers, so each call reads the weight's 1 byte per element
    instead of writing and reading a 16-bit copy of it (3 bytes per element beside the read
    of the int8 weight itself; a decode step is bound by those bytes). The same values: the
    conversion is exact, the product the same fp32-accumulated one.

    A weight scaled per output channel before the product (``w.to(dt) * scales[:, None]``) is
    the product of the integer weight times the scales after it (the bias added after them).

    Left to PyTorch: a cast read elsewhere too, scales of another shape (per group of K), a weight of another dtype, a cast to a dtype
    other than the input's (a mixed-dtype product), an input that is not 16-bit."""
    import torch

    from codegen.ops import dequant_linear as helper

    changed = False
    for n, op in _ops(gm, "matmul", ("linear",)):
        x, w, bias = op.operands[:3]
        if node_dtype(x) not in (torch.float16, torch.bfloat16):
            continue
        w, scales = _row_scaled(gm, w)
        src = _int_cast(gm, w, node_dtype(x))
        if src is None:
            continue
        with gm.graph.inserting_before(n):
            new = gm.graph.create_node("call_function", helper, (x, src, None if scales else bias), {},
                                       name="dequant_linear")
            made = [new]
            if scales is not None:  # x (w s)^T = (x w^T) s per output column, then the bias
                col = gm.graph.call_function(torch.reshape, (scales, (-1,)))
                made += [col, gm.graph.call_function(operator.mul, (new, col))]
                if bias is not None:
                    made.append(gm.graph.call_function(operator.add, (made[-1], bias)))
        if not _annotate(made) or node_dtype(made[-1]) != node_dtype(n):
            for m in reversed(made):
                gm.graph.erase_node(m)
            continue
        _replace(n, made[-1])
        _erase_unused_above([op.operands[1]], stop=None)
        changed = True
    return changed


def _int_cast(gm: fx.GraphModule, w, dtype) -> fx.Node | None:
    """The 8-bit integer 2-d tensor w converts from to ``dtype`` (``w.to(dtype)``, read here
    only), else None."""
    if not isinstance(w, fx.Node) or len(w.users) != 1 or w.op not in ("call_function", "call_method"):
        return None
    cast = classify(w, gm)
    if cast.name not in CASTS or not cast.operands or not isinstance(cast.operands[0], fx.Node):
        return None
    src = cast.operands[0]
    if str(node_dtype(src)).replace("torch.", "") not in QUANT_DTYPES or node_dtype(w) != dtype:
        return None
    return src if node_shape(src) is not None and len(node_shape(src)) == 2 else None


def _row_scaled(gm: fx.GraphModule, w):
    """(the weight, its per-row scales) when w = weight * scales with scales of shape [N, 1] for
    an [N, K] weight (``w.to(dt) * self.scales[:, None]``: each output channel's scale), read
    here only; else (w, None)."""
    import torch

    if not isinstance(w, fx.Node) or len(w.users) != 1 or w.op not in ("call_function", "call_method") \
            or w.target not in (operator.mul, torch.mul, "mul") or len(w.args) != 2 or w.kwargs:
        return w, None
    sw = node_shape(w)
    for a, b in (w.args, w.args[::-1]):
        sb = node_shape(b) if isinstance(b, fx.Node) else None
        if sw is not None and len(sw) == 2 and sb is not None and tuple(sb) == (sw[0], 1) \
                and node_dtype(b) == node_dtype(w) and node_dtype(a) == node_dtype(w):
            return a, b
    return w, None


#: at most this many stored tensors and instructions in a computed weight's program
MAX_LEAVES = 6
MAX_INSTRUCTIONS = 64


def dequant_program(gm: fx.GraphModule) -> bool:
    """rw-dequant-program: a product of a 16-bit input and a weight computed in forward from
    stored integer tensors (int4 nibbles unpacked with ``&`` and ``>>``, stacked or concatenated,
    reshaped, converted, scaled per group of K: GPTQ/AWQ-style storage) is
    ``_egg_program_linear(x, bias, program, b_nk, *stored)``: the matmul template computes each
    weight tile in registers from the stored tensors (knowledge/templates/program.py), so a
    call reads the packed bytes once instead of writing and reading a 16-bit copy of the
    weight. The same values: every op computed in the dtype PyTorch computes it in.

    Applies when the weight (F.linear's, or the B of ``x @ B``) is made only by elementwise
    arithmetic and bitwise ops (with Python numbers), casts, reshapes and views, transposes,
    expands, stack, cat and repeat_interleave over at most MAX_LEAVES tensors, at least one of
    them integer, read by the product alone, and the stored tensors hold fewer bytes than the
    16-bit weight. Anything else keeps PyTorch's ops."""
    import torch

    from codegen.ops import program_linear as helper

    changed = False
    for n, op in list(_ops(gm, "matmul", ("linear", "matmul", "mm"))):
        x, w, bias = op.operands[:3]
        b_nk = op.name == "linear"
        sw = node_shape(w) if isinstance(w, fx.Node) else None
        if node_dtype(x) not in (torch.float16, torch.bfloat16) or sw is None or len(sw) != 2 \
                or node_dtype(w) != node_dtype(x) or (bias is not None and not b_nk) \
                or not isinstance(bias, (fx.Node, type(None))) or set(w.users) != {n}:
            continue
        built = _program(gm, w)
        if built is None:
            continue
        program, leaves = built
        stored = sum(_nbytes(t) for t in leaves)
        if not any(not node_dtype(t).is_floating_point for t in leaves) or stored >= sw[0] * sw[1] * 2:
            continue
        with gm.graph.inserting_before(n):
            new = gm.graph.call_function(helper, (x, bias, program, b_nk, *leaves))
        if not _annotate([new]) or node_dtype(new) != node_dtype(n) or node_shape(new) != node_shape(n):
            gm.graph.erase_node(new)
            continue
        _replace(n, new)
        _erase_unused_above([w], stop=None)
        changed = True
    return changed


def _nbytes(t: fx.Node) -> int:
    import torch

    return _numel(node_shape(t) or ()) * torch.empty((), dtype=node_dtype(t)).element_size()


def _dtname(t: fx.Node) -> str | None:
    dt = str(node_dtype(t)).replace("torch.", "")
    return dt if dt in FLOAT_DTYPES + INT_DTYPES else None


def _program(gm: fx.GraphModule, root: fx.Node) -> tuple[tuple, list[fx.Node]] | None:
    """(program, stored tensors) computing root, or None. A value read outside the program is
    taken as stored (it is computed anyway); every other value is read by the program alone."""
    forced: set[fx.Node] = set()
    kind = classify_nodes(gm, set())
    # a tensor of fixed values (codegen.constants.fixed_value) computed once for every round
    values = functools.cache(lambda n: fixed_value(n, kind))
    for _round in range(MAX_INSTRUCTIONS):
        b = _Builder(gm, forced, values)
        try:
            b.value(root)
        except (_NotProgram, TypeError, ValueError, IndexError, KeyError, AttributeError):
            return None  # a form the builder does not know: PyTorch's ops stay
        inner = [m for m in b.index if m not in b.leaves and m is not root]
        # stored tensors of fixed shapes (parameters, buffers): a shape read of a value the
        # program makes is a constant (GPTQ's unpacking reads ``weight.shape[2]``)
        fixed = all(t.op == "get_attr" or t in b.tables for t in b.leaves)
        # a device query of a value the program makes asks a stored tensor's (AWQ's
        # ``torch.arange(..., device=izeros.device)``): every value lives where they do
        stored = next((t for t in b.leaves if t.op == "get_attr"), None)
        outside = [m for m in inner if any(
            u not in b.index and not (fixed and _constant_query(u, m) is not None)
            and not (stored is not None and _device_query(u, m)) for u in m.users)]
        if not outside:
            if len(b.leaves) > MAX_LEAVES or root in b.leaves:
                return None
            for m in inner:
                for u in [u for u in m.users if u not in b.index]:
                    if _device_query(u, m):
                        u.args = (stored, "device")
                    else:
                        _replace_query(u, _constant_query(u, m))
            return tuple(b.instrs), list(b.leaves)
        forced |= set(outside)
    return None


def _device_query(q: fx.Node, m: fx.Node) -> bool:
    """Is q ``m.device``?"""
    return q.op == "call_function" and q.target is getattr and len(q.args) == 2 \
        and q.args[0] is m and q.args[1] == "device"


def _constant_query(q: fx.Node, m: fx.Node):
    """The value of the shape query q of m (a torch.Size, a size, a rank), or None for a user
    of m that is not a shape query."""
    import torch

    shape = tuple(int(s) for s in node_shape(m))
    kind = _shape_query_kind(q, len(shape)) if q.args and q.args[0] is m else None
    if kind == "shape":
        return torch.Size(shape)
    if kind == "dim":
        return len(shape)
    return shape[kind] if isinstance(kind, int) else None


def _replace_query(q: fx.Node, value) -> None:
    """Every read of the shape query q reads the constant value instead; q is erased."""
    from torch.fx.node import map_arg

    for u in list(q.users):
        u.args = map_arg(u.args, lambda a: value if a is q else a)
        u.kwargs = map_arg(u.kwargs, lambda a: value if a is q else a)
    q.graph.erase_node(q)


class _NotProgram(Exception):
    pass


_BIN_FUNCS = {operator.add: "add", operator.sub: "sub", operator.mul: "mul", operator.and_: "and",
              operator.or_: "or", operator.xor: "xor", operator.lshift: "lshift",
              operator.rshift: "rshift", operator.floordiv: "floordiv", operator.mod: "mod"}
_BIN_METHODS = {"add": "add", "sub": "sub", "mul": "mul", "__and__": "and", "__or__": "or",
                "__xor__": "xor", "__lshift__": "lshift", "__rshift__": "rshift",
                "bitwise_and": "and", "bitwise_or": "or", "bitwise_xor": "xor",
                "bitwise_left_shift": "lshift", "bitwise_right_shift": "rshift",
                "__floordiv__": "floordiv", "floor_divide": "floordiv", "__mod__": "mod",
                "remainder": "mod"}
_RESHAPES = {"reshape", "view", "flatten", "unflatten", "unsqueeze", "squeeze", "view_as",
             "reshape_as", "contiguous"}
_PERMUTES = {"t", "transpose", "permute", "swapaxes", "swapdims"}
#: x.long() and its kind (the result's dtype is the node's)
_CAST_METHODS = {"long", "int", "short", "char", "byte", "float", "half", "bfloat16", "double"}


class _Builder:
    """The program's instructions, built depth first from the root (knowledge/templates/program.py)."""

    def __init__(self, gm: fx.GraphModule, forced: set, values):
        self.gm, self.forced, self.values = gm, forced, values  # values(n): n's fixed values or None
        self.tables: set[fx.Node] = set()  # leaves of values fixed at plan time
        self.instrs: list[tuple] = []
        self.index: dict[fx.Node, int] = {}
        self.leaves: list[fx.Node] = []
        self.ranges: list = []  # bounds of each integer value (knowledge/templates/program.py)

    def _emit(self, n: fx.Node, ins: tuple) -> int:
        if len(self.instrs) >= MAX_INSTRUCTIONS:
            raise _NotProgram
        self.ranges.append(dtype_range(ins[2]) if ins[0] == "leaf" else value_range(ins, self.ranges))
        self.instrs.append(ins)
        self.index[n] = len(self.instrs) - 1
        return self.index[n]

    def _emit_step(self, ins: tuple) -> int:
        """An instruction of no traced node's (a step the builder adds)."""
        if ins in self.instrs:  # the same step for another value (a shift table's cast)
            return self.instrs.index(ins)
        if len(self.instrs) >= MAX_INSTRUCTIONS:
            raise _NotProgram
        self.ranges.append(value_range(ins, self.ranges))
        self.instrs.append(ins)
        return len(self.instrs) - 1

    def _narrow_shift(self, shape: tuple, ops: list) -> tuple | None:
        """``x >> y`` into int64 where x is a narrower integer (int32 nibbles packed by int4
        formats) promoted by a shift table of int64 (``torch.arange(0, 32, 4)``) holding 0-31:
        computed in int32 and widened, the same values (an arithmetic shift of the
        sign-extended x by fewer than 32 bits), without 64-bit shifts in the kernel."""
        x, y = ops
        if isinstance(x, tuple) or self.instrs[x][2] not in ("int8", "int16", "int32"):
            return None
        ry = (y[1], y[1]) if isinstance(y, tuple) else self.ranges[y]
        if ry is None or isinstance(ry[0], float) or ry[0] < 0 or ry[1] > 31:
            return None
        if not isinstance(y, tuple) and self.instrs[y][2] != "int32":
            y = self._emit_step(("cast", self.instrs[y][1], "int32", y))
        return ("cast", shape, "int64", self._emit_step(("bin", shape, "int32", "rshift", x, y)))

    def value(self, n) -> int:
        if not isinstance(n, fx.Node):
            raise _NotProgram
        if n in self.index:
            return self.index[n]
        shape, dt = node_shape(n), _dtname(n)
        if shape is None or dt is None or any(s < 1 for s in shape):
            raise _NotProgram
        shape = tuple(int(s) for s in shape)
        made = None if n in self.forced else self._op(n, shape, dt)
        if made is None:  # a stored tensor
            self.leaves.append(n)
            i = self._emit(n, ("leaf", shape, dt, len(self.leaves) - 1))
            table = self.values(n)  # made from constants and shapes: known values
            if table is not None:
                self.tables.add(n)
                if dt in INT_DTYPES and table.numel():
                    self.ranges[i] = (int(table.min()), int(table.max()))
            return i
        return self._emit(n, made)

    def _operand(self, a):
        if isinstance(a, (int, float)) and not isinstance(a, bool):
            return ("c", a)
        return self.value(a)

    def _op(self, n: fx.Node, shape: tuple, dt: str) -> tuple | None:
        import torch

        if n.op not in ("call_function", "call_method"):
            return None
        name = n.target if n.op == "call_method" else None
        args, kw = n.args, n.kwargs
        # binary arithmetic and bitwise ops with Python numbers
        bop = _BIN_METHODS.get(name) if name else _BIN_FUNCS.get(n.target) or {
            torch.add: "add", torch.sub: "sub", torch.mul: "mul", torch.bitwise_and: "and",
            torch.bitwise_or: "or", torch.bitwise_xor: "xor",
            torch.bitwise_left_shift: "lshift", torch.bitwise_right_shift: "rshift",
            torch.floor_divide: "floordiv", torch.remainder: "mod"}.get(n.target)
        if bop is None and n.target in (torch.div, "div") and len(args) == 2 \
                and kw == {"rounding_mode": "floor"}:
            bop, kw = "floordiv", {}
        if bop is not None:
            if kw or len(args) != 2 or not any(isinstance(a, fx.Node) for a in args):
                return None
            ops = [self._operand(a) for a in args]
            if bop in ("floordiv", "mod"):
                # Python's floor division and modulo: Triton's // and % truncate, so only a
                # non-negative integer by a positive one (where they agree) is taken
                rx, ry = (t[1:] * 2 if isinstance(t, tuple) else self.ranges[t] for t in ops)
                if dt not in INT_DTYPES or rx is None or ry is None \
                        or rx[0] < 0 or ry[0] <= 0:
                    return None
            if bop == "rshift" and dt == "int64":
                narrow = self._narrow_shift(shape, ops)
                if narrow is not None:
                    return narrow
            return ("bin", shape, dt, bop, *ops)
        op = classify(n, self.gm)
        src = op.operands[0] if op.operands else None
        if op.name in CASTS and isinstance(src, fx.Node):
            return ("cast", shape, dt, self.value(src))
        if name in _CAST_METHODS and len(args) == 1 and not kw and isinstance(args[0], fx.Node):
            return ("cast", shape, dt, self.value(args[0]))
        fname = name or getattr(n.target, "__name__", "")
        took = _take(n)
        if took is not None:  # table[q], w[:, order], index_select: read at integer values
            src, index, dim = took
            if node_dtype(index) not in (torch.int32, torch.int64) or node_dtype(src) != node_dtype(n):
                return None
            ss, si_shape = tuple(node_shape(src)), tuple(node_shape(index) or ())
            dim %= len(ss)
            size = ss[dim]
            if shape != ss[:dim] + si_shape + ss[dim + 1:]:
                return None
            si, ii = self.value(src), self.value(index)
            lo, hi = self.ranges[ii]
            if lo < -size or hi >= size:  # an index that may leave the dim: PyTorch raises
                raise _NotProgram
            period = _period(self.values(index)) if len(si_shape) == 1 and lo >= 0 else None
            if period:
                return ("take", shape, dt, si, ii, dim, False, period)
            return ("take", shape, dt, si, ii, dim, lo < 0)
        if fname in _RESHAPES or _none_index(n):
            src = args[0]
            # (``view(dtype)`` reinterprets bits: not a reshape)
            if not isinstance(src, fx.Node) or _numel(node_shape(src) or ()) != _numel(shape) \
                    or node_dtype(src) != node_dtype(n):
                return None
            return ("reshape", shape, dt, self.value(src))
        if fname in _PERMUTES or (n.target is getattr and len(args) == 2 and args[1] in ("T", "mT")):
            src = args[0]
            sh = node_shape(src) if isinstance(src, fx.Node) else None
            perm = _permutation(fname if n.target is not getattr else args[1], args[1:], kw, sh)
            if perm is None:
                return None
            return ("permute", shape, dt, self.value(src), perm)
        if fname in ("expand", "expand_as", "broadcast_to"):
            src = args[0]
            if not isinstance(src, fx.Node) or len(node_shape(src) or ()) > len(shape):
                return None
            return ("expand", shape, dt, self.value(src))
        if fname in ("stack", "cat", "concat", "concatenate") and n.op == "call_function":
            ts = args[0] if args else kw.get("tensors")
            dim = args[1] if len(args) > 1 else kw.get("dim", 0)
            if not isinstance(ts, (list, tuple)) or not isinstance(dim, int) or isinstance(dim, bool) \
                    or len(ts) < 1 or set(kw) - {"tensors", "dim"}:
                return None
            dim %= len(shape)
            srcs = tuple(self.value(t) for t in ts)
            return ("stack" if fname == "stack" else "cat", shape, dt, srcs, dim)
        if fname == "repeat_interleave":
            src = args[0]
            reps = args[1] if len(args) > 1 else kw.get("repeats")
            dim = args[2] if len(args) > 2 else kw.get("dim")
            if not isinstance(src, fx.Node) or not isinstance(reps, int) or isinstance(reps, bool) \
                    or not isinstance(dim, int) or isinstance(dim, bool) or set(kw) - {"repeats", "dim"}:
                return None
            return ("repeat", shape, dt, self.value(src), reps, dim % len(shape))
        return None


#: the longest period of a fixed index table the lowering reads as blocks (_period)
MAX_PERIOD = 64


def _period(t) -> int | None:
    """The least power of two R (1..MAX_PERIOD, below the table's length) for which the fixed
    1-d index table t is ``(n // R) * R + t[n % R]``, each block a reordering inside itself
    (AWQ's column order: [0, 4, 1, 5, 2, 6, 3, 7] in every 8; R = 1: t is n); else None. The
    lowering then reads column ``(n // R) * R + t[n % R]``: the block from n, the table only
    inside it (the least R: a packing of 8 divides the column again)."""
    import torch

    if t is None or t.dim() != 1 or t.dtype.is_floating_point:
        return None
    n = t.numel()
    for r in (1 << e for e in range(MAX_PERIOD.bit_length())):
        if r >= n or n % r:
            continue
        rows = t.reshape(-1, r).long() - torch.arange(0, n, r).unsqueeze(1)
        if bool((rows == rows[0]).all()) and int(rows[0].min()) >= 0 and int(rows[0].max()) < r:
            return r
    return None


def _none_index(n: fx.Node) -> bool:
    """``t[..., None]``, ``t[:, None]``: an index of None, Ellipsis and whole slices (a reshape)."""
    if n.op != "call_function" or n.target is not operator.getitem or len(n.args) != 2:
        return False
    idx = n.args[1] if isinstance(n.args[1], tuple) else (n.args[1],)
    whole = slice(None, None, None)
    return isinstance(n.args[0], fx.Node) and all(i is None or i is Ellipsis or i == whole for i in idx)


def _take(n: fx.Node) -> tuple | None:
    """(source, index tensor, dim) of ``src[idx]``, ``src[:, idx]``, ``src[..., idx]`` (one
    integer tensor among whole slices and an Ellipsis) or ``index_select(src, dim, idx)`` of a
    1-d idx; else None."""
    import torch

    args = n.args
    if n.op == "call_function" and n.target is operator.getitem and len(args) == 2 \
            and isinstance(args[0], fx.Node):
        idx = args[1] if isinstance(args[1], tuple) else (args[1],)
        whole = slice(None, None, None)
        tens = [i for i, e in enumerate(idx) if isinstance(e, fx.Node)]
        if len(tens) != 1 or not all(isinstance(e, fx.Node) or e is Ellipsis or e == whole for e in idx) \
                or sum(e is Ellipsis for e in idx) > 1:
            return None
        t = tens[0]
        src_nd = len(node_shape(args[0]) or ())
        if Ellipsis in idx[:t]:
            dim = src_nd - (len(idx) - t)
        else:
            dim = t
        return args[0], idx[t], dim
    name = n.target if n.op == "call_method" else getattr(n.target, "__name__", "")
    if name == "index_select" and len(args) == 3 and not n.kwargs and isinstance(args[1], int) \
            and isinstance(args[2], fx.Node) and len(node_shape(args[2]) or ()) == 1 \
            and n.target in ("index_select", torch.index_select):
        return args[0], args[2], args[1]
    return None


def _permutation(name: str, rest: tuple, kw: dict, shape) -> tuple | None:
    """The dims' order after t / T / mT / transpose / swapaxes / permute of a tensor of shape."""
    if shape is None:
        return None
    nd = len(shape)
    perm = list(range(nd))
    if name in ("t", "T") and nd == 2 and not rest[1:] and not kw:
        return (1, 0)
    if name == "mT" and nd >= 2:
        perm[-2], perm[-1] = perm[-1], perm[-2]
        return tuple(perm)
    if name in ("transpose", "swapaxes", "swapdims") and len(rest) == 2 and not kw \
            and all(isinstance(d, int) and not isinstance(d, bool) for d in rest):
        a, b = (d % nd for d in rest)
        perm[a], perm[b] = perm[b], perm[a]
        return tuple(perm)
    if name == "permute" and not kw:
        dims = rest[0] if len(rest) == 1 and isinstance(rest[0], (list, tuple)) else rest
        if sorted(d % nd for d in dims if isinstance(d, int)) == perm and len(dims) == nd:
            return tuple(d % nd for d in dims)
    return None
