"""A weight computed in the product's registers (principle rw-dequant-program): the program of
ops that makes a matrix product's B operand from stored tensors (int4 nibbles unpacked, stacked
and interleaved, group scales broadcast), written as Triton lines that compute the B tile at
the tile's (k, n) indices.

A program (built by codegen.rewrites.quant from the traced graph; run in PyTorch by the
runtime's ``_egg_program``) is a tuple of instructions, value i the result of instruction i,
the last the operand. Each instruction is ``(kind, shape, dtype, *args)``:

- ``("leaf", shape, dt, j)``: the j-th stored tensor;
- ``("bin", shape, dt, op, a, b)``: ``a op b`` with op in BINARY, a and b a value's number or
  ``("c", number)``, read broadcast to shape;
- ``("cast", shape, dt, a)``;
- ``("reshape", shape, dt, a)`` (view, unsqueeze, flatten, None-indexing: row-major order
  kept); ``("permute", shape, dt, a, perm)``; ``("expand", shape, dt, a)``;
- ``("stack", shape, dt, (a, ...), dim)``; ``("cat", shape, dt, (a, ...), dim)``;
- ``("repeat", shape, dt, a, repeats, dim)`` (repeat_interleave);
- ``("take", shape, dt, a, index, dim, wrap)``: ``a`` read along dim at the values of the
  integer value ``index`` (``table[q]``, ``w[:, order]``, index_select: a 4-bit code's lookup
  table), ``wrap`` when an index may be negative (counted from the end). The builder admits
  one only where the index's range, bounded op by op (``q & 15``, ``q >> 4``, casts), lies
  inside the dim: no load leaves its tensor. ``("take", ..., False, R)``: the index is a
  table of fixed values that reorders within blocks of R (``t[n] = (n // R) * R + t[n % R]``:
  AWQ's column order; R = 1: the table is n), read as that (its block from n, a divisible
  index again).

Lowering walks the program backwards from the operand's indices: every view becomes index
arithmetic (a reshape's merged and split dims as // and %, simplified where the bounds allow:
``(k // G) * G + k % G`` is k again), a stack or cat a select between its pieces (each piece
read at a clamped index: no load leaves its tensor), and every value is computed in the dtype
PyTorch computes it in: integer ops in the result's integer dtype, 16-bit float ops in fp32
rounded to the result's dtype after each op, as eager rounds. The same load of a stored tensor
is emitted once (a byte's two nibbles read one load)."""
from __future__ import annotations

from dataclasses import dataclass

#: binary ops a program holds (Python's operators on tensors)
BINARY = {"add": "+", "sub": "-", "mul": "*", "and": "&", "or": "|", "xor": "^",
          "lshift": "<<", "rshift": ">>", "floordiv": "//", "mod": "%"}
FLOAT_DTYPES = ("float16", "bfloat16", "float32")
INT_DTYPES = ("int8", "uint8", "int16", "int32", "int64")


def dtype_range(dt: str) -> tuple[int, int] | None:
    """The values an integer dtype holds (None: a float dtype)."""
    if dt not in INT_DTYPES:
        return None
    bits = int(dt.lstrip("uint") or 8)
    return (0, (1 << bits) - 1) if dt.startswith("u") else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)


def value_range(ins: tuple, ranges: list) -> tuple[int, int] | None:
    """Bounds of an integer instruction's values from its operands' (``ranges[i]`` of value i;
    None for floats), conservative: an op that may wrap gets its dtype's whole range."""
    kind, shape, dt, *a = ins
    full = dtype_range(dt)
    if full is None:
        return None

    def of(t):
        return (t[1], t[1]) if isinstance(t, tuple) else ranges[t]

    got = None
    if kind in ("reshape", "permute", "expand", "repeat", "cast"):
        got = ranges[a[0]]
    elif kind in ("stack", "cat"):
        rs = [ranges[t] for t in a[0]]
        got = None if any(r is None for r in rs) else (min(r[0] for r in rs), max(r[1] for r in rs))
    elif kind == "take":
        got = ranges[a[0]]
    elif kind == "bin":
        op, x, y = a
        rx, ry = of(x), of(y)
        if rx is None or ry is None or isinstance(rx[0], float) or isinstance(ry[0], float):
            return full
        if op == "and" and (rx[0] >= 0 or ry[0] >= 0):
            got = (0, min(r[1] for r in (rx, ry) if r[0] >= 0))
        elif op in ("floordiv", "mod") and ry[0] > 0 and rx[0] >= 0:
            got = (rx[0] // ry[1], rx[1] // ry[0]) if op == "floordiv" else (0, min(rx[1], ry[1] - 1))
        elif op == "rshift" and ry[0] >= 0:
            got = (min(rx[0] >> ry[0], rx[0] >> ry[1]), max(rx[1] >> ry[0], rx[1] >> ry[1]))
        elif op in ("add", "sub", "mul"):
            if op == "add":
                got = (rx[0] + ry[0], rx[1] + ry[1])
            elif op == "sub":
                got = (rx[0] - ry[1], rx[1] - ry[0])
            else:
                c = [p * q for p in rx for q in ry]
                got = (min(c), max(c))
    if got is None or got[0] < full[0] or got[1] > full[1]:
        return full
    return got


# ---- index expressions: non-negative integers below a known bound --------------------------
_INFIX = {"div": "//", "mod": "%", "mul": "*"}


@dataclass(frozen=True)
class Ix:
    """An index expression: ``kind`` var / const / div / mod / add / mul / clamp; ``hi`` an
    exclusive upper bound (every value is >= 0)."""
    kind: str
    args: tuple
    hi: int

    def render(self) -> str:
        k, a = self.kind, self.args
        if k == "var":
            return a[0]
        if k == "const":
            return str(a[0])
        if k in _INFIX:
            return f"({a[0].render()} {_INFIX[k]} {a[1]})"
        if k == "add":
            return "(" + " + ".join(t.render() for t in a) + ")"
        # clamp: min(max(e - off, 0), size - 1)
        e, off, size = a
        inner = f"{e.render()} - {off}" if off else e.render()
        if off:
            inner = f"tl.maximum({inner}, 0)"
        return f"tl.minimum({inner}, {size - 1})"


def var(name: str, hi: int) -> Ix:
    return Ix("var", (name,), hi) if hi > 1 else const(0)


def const(v: int) -> Ix:
    return Ix("const", (int(v),), int(v) + 1)


def mul(e: Ix, c: int) -> Ix:
    if c == 0 or (e.kind == "const" and e.args[0] == 0):
        return const(0)
    if c == 1:
        return e
    if e.kind == "const":
        return const(e.args[0] * c)
    if e.kind == "mul":
        return mul(e.args[0], e.args[1] * c)
    if e.kind == "add":  # distributed, so that (x // c) * c + x % c can meet
        return add(*[mul(t, c) for t in e.args])
    return Ix("mul", (e, c), (e.hi - 1) * c + 1)


def _multiple(t: Ix, c: int) -> bool:
    return (t.kind == "mul" and t.args[1] % c == 0) or (t.kind == "const" and t.args[0] % c == 0)


def _divided(t: Ix, c: int) -> Ix:
    return mul(t.args[0], t.args[1] // c) if t.kind == "mul" else const(t.args[0] // c)


def add(*terms: Ix) -> Ix:
    flat: list[Ix] = []
    for t in terms:
        flat += list(t.args) if t.kind == "add" else [t]
    c = sum(t.args[0] for t in flat if t.kind == "const")
    flat = [t for t in flat if t.kind != "const"]
    # (x // c) * c + x % c is x
    changed = True
    while changed:
        changed = False
        for i, t in enumerate(flat):
            if t.kind == "mul" and t.args[0].kind == "div" and t.args[0].args[1] == t.args[1]:
                x, dv = t.args[0].args
                for j, u in enumerate(flat):
                    if u.kind == "mod" and u.args == (x, dv):
                        flat = [v for q, v in enumerate(flat) if q not in (i, j)] + [x]
                        changed = True
                        break
            if changed:
                break
    if c:
        flat.append(const(c))
    if not flat:
        return const(0)
    if len(flat) == 1:
        return flat[0]
    return Ix("add", tuple(flat), sum(t.hi - 1 for t in flat) + 1)


def div(e: Ix, c: int) -> Ix:
    if c == 1:
        return e
    if e.kind == "const":
        return const(e.args[0] // c)
    if e.hi <= c:
        return const(0)
    if e.kind == "div":
        return div(e.args[0], e.args[1] * c)
    if e.kind == "mul" and e.args[1] % c == 0:
        return mul(e.args[0], e.args[1] // c)
    if e.kind == "add":
        mult = [t for t in e.args if _multiple(t, c)]
        rest = [t for t in e.args if not _multiple(t, c)]
        if mult:  # (c m + r) // c = m + r // c for r >= 0
            return add(*[_divided(t, c) for t in mult], div(add(*rest), c))
    return Ix("div", (e, c), (e.hi - 1) // c + 1)


def mod(e: Ix, c: int) -> Ix:
    if c == 1:
        return const(0)
    if e.kind == "const":
        return const(e.args[0] % c)
    if e.hi <= c:
        return e
    if _multiple(e, c):
        return const(0)
    if e.kind == "add":
        rest = [t for t in e.args if not _multiple(t, c)]
        if len(rest) < len(e.args):
            return mod(add(*rest), c) if rest else const(0)
    return Ix("mod", (e, c), c)


def clamp(e: Ix, off: int, size: int) -> Ix:
    """e - off held inside [0, size): a cat's piece read where another piece is selected."""
    if off == 0 and e.hi <= size:
        return e
    return Ix("clamp", (e, off, size), size)


def _strides(shape) -> list[int]:
    out, s = [], 1
    for d in reversed(shape):
        out.append(s)
        s *= d
    return out[::-1]


def reshape_groups(out_shape, in_shape) -> list[tuple[range, range]]:
    """A reshape's dims in groups whose products meet: (out dims, in dims) per group."""
    out_shape, in_shape = list(out_shape), list(in_shape)
    groups = []
    i = j = 0
    while i < len(out_shape) or j < len(in_shape):
        oi, ij, po, pi = i, j, 1, 1
        if i < len(out_shape):
            po, i = out_shape[i], i + 1
        if j < len(in_shape):
            pi, j = in_shape[j], j + 1
        while po != pi:
            if po < pi:
                po, i = po * out_shape[i], i + 1
            else:
                pi, j = pi * in_shape[j], j + 1
        groups.append((range(oi, i), range(ij, j)))
    return groups


def group_flat(idx: list[Ix], shape, dims: range) -> Ix:
    """The row-major flat index of a reshape group's dims at idx."""
    return add(*[mul(idx[d], s) for d, s in zip(dims, _strides([shape[d] for d in dims]))])


def step_k(kb: Ix, rk: str, bk: int) -> Ix:
    """k in a whole K step: kb * BLOCK_K + rk (rk the step's arange, named so in the kernel)."""
    return add(mul(kb, bk), var(rk, bk))


def reshape_index(idx: list[Ix], out_shape, in_shape) -> list[Ix]:
    """The indices into a tensor of in_shape that its reshape to out_shape reads at idx: each
    group's flat index split by the input's sizes."""
    res: list[Ix] = []
    for outs, ins in reshape_groups(out_shape, in_shape):
        flat = group_flat(idx, out_shape, outs)
        sizes = [in_shape[d] for d in ins]
        res += [mod(div(flat, s), size) for s, size in zip(_strides(sizes), sizes)]
    return res


def subst(e: Ix, names: dict[str, Ix]) -> Ix:
    """e with its variables replaced (by name)."""
    if e.kind == "var":
        return names.get(e.args[0], e)
    if e.kind == "const":
        return e
    if e.kind == "add":
        return add(*[subst(t, names) for t in e.args])
    if e.kind == "clamp":
        return clamp(subst(e.args[0], names), e.args[1], e.args[2])
    return {"div": div, "mod": mod, "mul": mul}[e.kind](subst(e.args[0], names), e.args[1])


def variables(e: Ix) -> set[Ix]:
    """e's variables."""
    if e.kind == "var":
        return {e}
    return set().union(*[variables(t) for t in e.args if isinstance(t, Ix)])


def uses(e: Ix, name: str) -> bool:
    return any(v.args[0] == name for v in variables(e))


#: packing factors (values a stored element holds along K) the tile is split by: 2, 4, 8, 16
MAX_PACK = 16


# ---- lowering ------------------------------------------------------------------------------
class Lowering:
    """Triton lines computing a program's operand at given indices: ``lines`` and, per call of
    ``value``, the name that holds it. Leaf j is read from pointer ``ptr(j)`` with strides
    ``stride(j, d)``."""

    def __init__(self, program: tuple, ptr, stride, prefix: str = "pg",
                 steps: tuple[Ix, Ix, str, int] | None = None):
        self.program, self.ptr, self.stride, self.prefix = program, ptr, stride, prefix
        #: whole K steps: (n's index, the step's kb, k's name in the step, BLOCK_K), k =
        #: kb * BLOCK_K + rk on a [BLOCK_N, BLOCK_K] tile. A reshape that splits that k into
        #: (k // R, k % R), R a packing factor (two nibbles a byte, eight an int32), computes
        #: its source on a [BLOCK_N, BLOCK_K // R, R] tile and reshapes it: each packed value
        #: is loaded once (and contiguously), not R times
        self.steps = steps
        self.split = False  # a reshape was computed on a split tile
        self.lines: list[str] = []
        self.memo: dict[tuple, str] = {}
        self.loads: list[tuple[int, list[Ix]]] = []  # (leaf, its indices) of every load

    def _name(self, key: tuple, expr: str) -> str:
        if key in self.memo:
            return self.memo[key]
        name = f"{self.prefix}{len(self.memo)}"
        self.lines.append(f"{name} = {expr}")
        self.memo[key] = name
        return name

    def value(self, v: int, idx: list[Ix]) -> str:
        kind, shape, dt, *a = self.program[v]
        key = ("v", v, tuple(e.render() for e in idx))
        if key in self.memo:
            return self.memo[key]
        if kind == "leaf":
            j = a[0]
            self.loads.append((j, list(idx)))
            ks = [x for x in set().union(*[variables(e) for e in idx])
                  if "[None, :]" in x.args[0]]  # variables along the tile's K
            r = self._n_pack(idx) if ks else None
            if r:  # a tile read by packs of r columns: loaded once per pack, broadcast over it
                nname = self.steps[0].args[0]
                n8 = var(f"(tl.max(tl.reshape({nname.split('[')[0]} // {r}, (BLOCK_N // {r}, {r})), "
                         f"axis=1))[:, None, None]", self.steps[0].hi // r)
                # on a [BLOCK_N // r, 1, BLOCK_K] tile: n // r is the pack's index (n read only
                # so: n = n8 * r divides back), K's variables indexed [None, None, :]
                to3 = {nname: mul(n8, r),
                       **{x.args[0]: var(x.args[0].replace("[None, :]", "[None, None, :]"), x.hi) for x in ks}}
                idx3 = [subst(e, to3) for e in idx]
                v3 = self._name(("v3", v, tuple(e.render() for e in idx3)),
                                f"tl.load({self.ptr(j)} + {self._offset(j, idx3)})")
                return self._name(key, f"tl.reshape(tl.broadcast_to({v3}, (BLOCK_N // {r}, {r}, BLOCK_K)), "
                                       "(BLOCK_N, BLOCK_K))")
            return self._name(key, f"tl.load({self.ptr(j)} + {self._offset(j, idx)})")
        if kind == "bin":
            op, x, y = a
            ops = [self._operand(t, shape, idx, dt) for t in (x, y)]
            return self._name(key, _binary(op, ops[0], ops[1], dt))
        if kind == "cast":
            return self._name(key, _convert(self.value(a[0], idx), self.program[a[0]][2], dt))
        if kind == "reshape":
            src = a[0]
            inner = self.program[src]
            packed = self._packed(key, src, idx, shape) if self.steps else None
            if packed is not None:
                return packed
            return self.value(src, reshape_index(idx, shape, inner[1]))
        if kind == "permute":
            src, perm = a
            inner = [None] * len(perm)
            for d, p in enumerate(perm):
                inner[p] = idx[d]
            return self.value(src, inner)
        if kind == "expand":
            return self.value(a[0], _broadcast(idx, self.program[a[0]][1], shape))
        if kind == "repeat":
            src, reps, dim = a
            inner = list(idx)
            inner[dim] = div(idx[dim], reps)
            return self.value(src, inner)
        if kind == "take":
            src, index, dim, wrap, *period = a
            size = self.program[src][1][dim]
            m = len(self.program[index][1])
            if period:  # a fixed table reordering within blocks of R: the block read from n
                r, j = period[0], idx[dim]
                if r == 1:  # the table is n itself
                    return self.value(src, idx)
                iv = self.value(index, [mod(j, r)])
                return self.value(src, idx[:dim] + [add(mul(div(j, r), r), var(iv, r))] + idx[dim + 1:])
            iv = self.value(index, idx[dim:dim + m])
            if wrap:  # negative indices count from the end
                iv = self._name(("wrap", iv), f"tl.where({iv} < 0, {iv} + {size}, {iv})")
            return self.value(src, idx[:dim] + [var(iv, size)] + idx[dim + m:])
        if kind == "stack":
            srcs, dim = a
            sel, rest = idx[dim], idx[:dim] + idx[dim + 1:]
            if sel.kind == "const":
                return self.value(srcs[sel.args[0]], rest)
            vals = [self.value(s, rest) for s in srcs]
            expr = vals[-1]
            for k in range(len(vals) - 2, -1, -1):
                expr = f"tl.where({sel.render()} == {k}, {vals[k]}, {expr})"
            return self._name(key, expr)
        if kind == "cat":
            srcs, dim = a
            sizes = [self.program[s][1][dim] for s in srcs]
            offs = [sum(sizes[:k]) for k in range(len(sizes))]
            pos = idx[dim]
            step = self._step_of(pos, sizes)
            vals = []
            for s, off, size in zip(srcs, offs, sizes):
                inner = list(idx)
                inner[dim] = clamp(pos, off, size) if step is None else step(off, size)
                vals.append(self.value(s, inner))
            expr = vals[-1]
            cond = pos.render() if step is None else f"{self.steps[1].render()} * {self.steps[3]}"
            for k in range(len(vals) - 2, -1, -1):
                expr = f"tl.where({cond} < {offs[k] + sizes[k]}, {vals[k]}, {expr})"
            return self._name(key, expr)
        raise ValueError(f"program instruction {kind!r}")

    def _offset(self, j: int, idx: list[Ix]) -> str:
        terms = [f"{e.render()} * {self.stride(j, d)}" for d, e in enumerate(idx)
                 if not (e.kind == "const" and e.args[0] == 0)]
        return " + ".join(terms) or "0"

    def _n_pack(self, idx: list[Ix]) -> int | None:
        """r when a whole step's load reads n only as n // r (a value packed r to a stored
        element along N: AWQ's eight nibbles an int32 along the output columns), r a power of
        two up to MAX_PACK dividing N; else None."""
        if self.steps is None:
            return None
        n = self.steps[0]
        found: set = set()
        for e in idx:
            if not _div_only(e, n.args[0], found):
                return None
        if len(found) != 1:
            return None
        r = found.pop()
        return r if 1 < r <= MAX_PACK and not r & (r - 1) and n.hi % r == 0 else None

    def _step_of(self, pos: Ix, sizes: list[int]):
        """For a cat along a whole step's k whose pieces are all whole steps long: the step lies
        in one piece, so piece k is read at ``(kb * BLOCK_K - offset) mod size + rk`` (inside
        it, contiguous: vector loads) and selected by the step (a scalar); else None."""
        if self.steps is None:
            return None
        _n, kb, rk, bk = self.steps
        if pos.render() != step_k(kb, rk, bk).render() or any(z % bk for z in sizes):
            return None

        def at(off: int, size: int) -> Ix:
            # (a multiple of BLOCK_K: told to Triton, whose analysis loses it through the %)
            base = var(f"tl.multiple_of((({kb.render()} * {bk} + {(-off) % size}) % {size}), {bk})",
                       size - bk + 1)
            return add(base, var(rk, bk))
        return at

    def _packed(self, key: tuple, src: int, idx: list[Ix], shape) -> str | None:
        """The reshape of src at idx on a split tile (``steps``), or None where none applies."""
        n, kb, rk, bk = self.steps
        whole = step_k(kb, rk, bk).render()
        in_shape = self.program[src][1]
        for outs, ins in reshape_groups(shape, in_shape):
            r = in_shape[ins[-1]] if len(ins) else 1
            if group_flat(idx, shape, outs).render() != whole or not 1 < r <= MAX_PACK or r & (r - 1) or bk % r:
                continue
            others = [e for d, e in enumerate(idx) if d not in outs]
            if any(uses(e, rk) for e in others):
                return None
            # the innermost split wins: a group of scales (a view per 16 inputs) above the
            # nibbles' own split would leave the packed bytes loaded per element
            probe = Lowering(self.program, self.ptr, self.stride, "probe", self.steps)
            probe.value(src, reshape_index(idx, shape, in_shape))
            if probe.split:
                return None
            self.split = True
            inner = self.program[src]
            sizes = [in_shape[d] for d in ins]
            at = reshape_index(idx, shape, in_shape)
            if r == 2 and inner[0] == "stack" and inner[4] == ins[-1] and len(inner[3]) == 2:
                # two values stacked along the packed dim: tl.interleave of the two, each read
                # at half the columns of the step (a [BLOCK_N, BLOCK_K // 2] tile)
                flat_h = add(mul(kb, bk // 2), var("tl.arange(0, BLOCK_K // 2)[None, :]", bk // 2))
                for d, s, size in zip(ins[:-1], _strides(sizes), sizes):
                    at[d] = mod(div(flat_h, s // 2), size)
                del at[ins[-1]]
                lo, hi = (self.value(p, at) for p in inner[3])
                return self._name(key, f"tl.interleave({lo}, {hi})")
            # the source on [BLOCK_N, BLOCK_K // r, r]: n along axis 0, k // r and k % r after it
            n3 = var(n.args[0].replace("[:, None]", "[:, None, None]"), n.hi)
            h3 = var(f"tl.arange(0, BLOCK_K // {r})[None, :, None]", bk // r)
            r3 = var(f"tl.arange(0, {r})[None, None, :]", r)
            names = {n.args[0]: n3}
            flat_h = add(mul(kb, bk // r), h3)
            for d, s, size in zip(ins, _strides(sizes), sizes):
                at[d] = r3 if d == ins[-1] else mod(div(flat_h, s // r), size)
            for d in range(len(at)):
                if d not in ins:
                    at[d] = subst(at[d], names)
            v3 = self.value(src, at)
            return self._name(key, f"tl.reshape(tl.broadcast_to({v3}, (BLOCK_N, BLOCK_K // {r}, {r})), "
                                   f"(BLOCK_N, BLOCK_K))")
        return None

    def _operand(self, t, shape, idx: list[Ix], dt: str) -> str:
        """A binary op's operand: a Python scalar as it is (PyTorch computes with it in the
        op's math type), a tensor of another dtype first converted to the result's dtype (as
        PyTorch converts both operands to their common dtype)."""
        if isinstance(t, tuple):  # ("c", number): a Python scalar
            return repr(t[1])
        v = self.value(t, _broadcast(idx, self.program[t][1], shape))
        src = self.program[t][2]
        if src == dt or (dt in FLOAT_DTYPES and src in ("int8", "uint8")):
            return v  # (8-bit integers are exact in every float dtype: converted in _binary)
        return self._name(("as", v, dt), _convert(v, src, dt))


def _div_only(e: Ix, name: str, found: set) -> bool:
    """Does e read the variable name only as name // r? (the divisors r into found)"""
    if e.kind == "div" and e.args[0].kind == "var" and e.args[0].args[0] == name:
        found.add(e.args[1])
        return True
    if e.kind == "var":
        return e.args[0] != name
    return all(_div_only(t, name, found) for t in e.args if isinstance(t, Ix))


def _broadcast(idx: list[Ix], in_shape, out_shape) -> list[Ix]:
    """The indices of a tensor of in_shape read broadcast over out_shape at idx."""
    lead = len(out_shape) - len(in_shape)
    return [const(0) if s == 1 and out_shape[lead + d] != 1 else idx[lead + d]
            for d, s in enumerate(in_shape)]


def _convert(v: str, src: str, dt: str) -> str:
    """v (of dtype src) converted to dt; an integer to a 16-bit float through fp32, as PyTorch
    converts it (and Triton's interpreter converts integers to 16-bit floats wrongly)."""
    if dt in ("float16", "bfloat16") and src in INT_DTYPES:
        return f"{v}.to(tl.float32).to(tl.{dt})"
    return f"{v}.to(tl.{dt})"


def _binary(op: str, x: str, y: str, dt: str) -> str:
    """``x op y`` as PyTorch computes it into dt: integers in dt (wrapped as dt wraps), 16-bit
    floats in fp32 then rounded to dt."""
    sym = BINARY[op]
    if dt in FLOAT_DTYPES:
        return f"({_as(x, 'float32')} {sym} {_as(y, 'float32')}).to(tl.{dt})"
    return f"({_as(x, dt)} {sym} {_as(y, dt)}).to(tl.{dt})"


def _as(x: str, dt: str) -> str:
    try:
        float(x)
        return x  # a scalar: Python's number, weakly typed as in PyTorch
    except ValueError:
        return f"{x}.to(tl.{dt})"


def lower(program: tuple, idx: list[Ix], ptr, stride, prefix: str = "pg",
          steps: tuple[Ix, Ix, str, int] | None = None) -> tuple[list[str], str]:
    """(lines, name): Triton lines computing the program's last value at idx."""
    low = Lowering(program, ptr, stride, prefix, steps)
    name = low.value(len(program) - 1, idx)
    return low.lines, name
