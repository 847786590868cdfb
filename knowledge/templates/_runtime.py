# EGG runtime helpers. A generated ModelNew file holds the ones it calls (codegen.emit keeps each
# top-level definition here that the file's code reaches), so running one needs no import of EGG.
import math

import torch
import triton
import triton.language as tl


def _egg_cdiv(a, b):
    """``triton.cdiv`` in plain Python for the wrappers' host code: since triton 3.5 it and
    ``triton.next_power_of_2`` are constexpr functions, ~2.5 us a call on the CPU machine, and a
    wrapper makes several per launch."""
    return -(-a // b)


def _egg_pow2(n):
    """``triton.next_power_of_2`` in plain Python (0 for 0, as triton's)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def _egg_bstrides(t, shape):
    """Strides of tensor t broadcast to shape (0 along broadcast dimensions)."""
    nd = len(shape)
    out = [0] * nd
    ts, st = t.shape, t.stride()
    for i in range(1, len(ts) + 1):
        out[nd - i] = 0 if (ts[-i] == 1 and shape[-i] != 1) else st[-i]
    return out


def _egg_collapse(shape, strides_list, ndims):
    """Merge adjacent dimensions that every tensor walks contiguously; drop size-1 dimensions.

    Returns (dims, strides_list) padded on the left to exactly ``ndims`` dimensions, or None
    when more than ``ndims`` dimensions remain.
    """
    dims, sts = [], [[] for _ in strides_list]
    for i, d in enumerate(shape):
        if d == 1:
            continue
        if dims and all(s[-1] == st[i] * d for s, st in zip(sts, strides_list)):
            dims[-1] *= d
            for s, st in zip(sts, strides_list):
                s[-1] = st[i]
            continue
        dims.append(d)
        for s, st in zip(sts, strides_list):
            s.append(st[i])
    if len(dims) > ndims:
        return None
    pad = ndims - len(dims)
    return [1] * pad + dims, [[0] * pad + s for s in sts]


def _egg_contig_strides(dims):
    out, acc = [0] * len(dims), 1
    for i in range(len(dims) - 1, -1, -1):
        out[i] = acc if dims[i] != 1 else 0
        acc *= dims[i]
    return out


def _egg_memory_order(shape, tensors):
    """Dims of a pointwise domain, outermost first, in the order to walk them: the memory order
    of the first full-size input when it is dense (eager's TensorIterator lays its outputs out
    the same way), so that a channels-last input is read, and the outputs written, in its own
    order; the standard order otherwise."""
    order = list(range(len(shape)))
    t = next((t for t in tensors if tuple(t.shape) == tuple(shape)), None)
    if t is None or t.is_contiguous():  # like eager: the first full-size operand decides
        return order
    st = t.stride()
    walk = sorted(order, key=lambda d: (-st[d], d))
    expect = 1
    for d in reversed(walk):  # dense: innermost stride 1, each the product of the inner ones
        if shape[d] != 1 and st[d] != expect:
            return order
        expect *= shape[d]
    return walk


def _egg_empty(shape, order, dtype, device):
    """An uninitialized tensor of this shape whose memory walks dims in ``order`` (the standard
    order, the common case: a plain ``torch.empty``, no permuted view)."""
    if order == sorted(order):
        return torch.empty(shape, dtype=dtype, device=device)
    inv = sorted(range(len(order)), key=lambda i: order[i])
    return torch.empty([shape[d] for d in order], dtype=dtype, device=device).permute(inv)


#: broadcast shapes per operands' shapes (bounded: cleared past 1024 entries)
_EGG_BSHAPES = {}


def _egg_broadcast_shape(ts):
    """``torch.broadcast_shapes`` of the tensors' shapes in plain Python: torch's own goes through
    symbolic-shape checks (27 us a call for two 4-d shapes on the CPU machine, 3.5 us here),
    remembered per the operands' shapes (_EGG_BSHAPES; ~0.5 us a call then). Raises as torch
    does (a shape that raises is never remembered)."""
    key = tuple(t.shape for t in ts)
    got = _EGG_BSHAPES.get(key)
    if got is None:
        got = _egg_broadcast_of(key)
        if len(_EGG_BSHAPES) > 1024:
            _EGG_BSHAPES.clear()
        _EGG_BSHAPES[key] = got
    return got


def _egg_broadcast_of(shapes):
    """The broadcast shape of ``shapes`` (torch.Size), raising as torch does."""
    shapes = [tuple(s) for s in shapes]
    n = max(len(s) for s in shapes)
    out = [1] * n
    for s in shapes:
        off = n - len(s)
        for i, d in enumerate(s):
            o = out[off + i]
            if d != o:
                if o == 1:
                    out[off + i] = d
                elif d != 1:
                    raise RuntimeError(f"The size of tensor a ({o}) must match the size of tensor b "
                                       f"({d}) at non-singleton dimension {off + i}")
    return torch.Size(out)


#: layouts computed per (domain, tensors' shapes and strides, order rule): a call with the
#: shapes and strides of an earlier one takes its layout (bounded: cleared past 1024 entries)
_EGG_LAYOUTS = {}


def _egg_pointwise_layout(shape, tensors, follow_memory=True):
    """Layout of a pointwise iteration domain walked in memory order (``_egg_memory_order``):
    4 collapsed dims, per-tensor strides, whether each tensor is walked exactly like the dense
    domain (then it is indexed by the flat offset), and the walk order (outputs are allocated in
    it, so they are written at the flat offset), and whether an operand reaches offsets past 32
    bits (_egg_far). ``follow_memory=False``: the standard order.
    None when more than 4 dims remain after merging (permuted inputs of many dims). Remembered
    per shapes and strides (_EGG_LAYOUTS): the callers only read it."""
    key = (tuple(shape), *[(t.shape, t.stride()) for t in tensors], follow_memory)
    got = _EGG_LAYOUTS.get(key, 0)
    if got == 0:
        if len(_EGG_LAYOUTS) > 1024:
            _EGG_LAYOUTS.clear()
        got = _EGG_LAYOUTS[key] = _egg_layout_of(shape, tensors, follow_memory)
    return got


#: a pointwise wrapper's launch per (wrapper, its inputs' shapes and strides, the device): what
#: the wrapper computes from them (the domain, the output's order, the grid, the coordinate
#: operands, the kernel's int and constexpr arguments), so that a call like an earlier one
#: allocates and launches (False: a call that copies its inputs, or takes the tiled walk, goes
#: the whole way each time); bounded: cleared past 1024 entries
_EGG_PLANS = {}


def _egg_keep_plan(key, plan):
    """Remember a wrapper's plan (_EGG_PLANS) under ``key``; none when ``key`` is None."""
    if key is not None:
        if len(_EGG_PLANS) > 1024:
            _EGG_PLANS.clear()
        _EGG_PLANS[key] = plan


#: the innermost collapsed dim a pointwise kernel walks row by row (no division per element)
#: must be at least this long: a block then holds >= 128 elements, half or more of them in use
_EGG_ROWS_MIN = 128


def _egg_pointwise_rows(dims, flat, block):
    """(rows mode, block) of a pointwise launch: rows of the innermost dim when an operand is not
    walked flat and that dim is long enough, the block cut to its length (a power of two)."""
    if all(flat) or dims[3] < _EGG_ROWS_MIN:
        return False, block
    return True, min(block, _egg_pow2(dims[3]))


def _egg_layout_of(shape, tensors, follow_memory):
    order = _egg_memory_order(shape, tensors) if follow_memory else list(range(len(shape)))
    strides = [[s[d] for d in order] for s in (_egg_bstrides(t, shape) for t in tensors)]
    res = _egg_collapse([shape[d] for d in order], strides, 4)
    if res is None:
        return None  # more than 4 dims after merging: the caller retries on contiguous copies
    dims, sts = res
    cs = _egg_contig_strides(dims)
    flat = [all(a == b or d == 1 for a, b, d in zip(s, cs, dims)) for s in sts]
    return dims, sts, flat, order, _egg_far(dims, sts)


#: element offsets from this far on need 64-bit index math (Triton passes int arguments and
#: computes program ids and aranges in 32 bits)
_EGG_FAR = 2**31 - 1


def _egg_span(t):
    """How far (in elements) a kernel indexing t reaches from its first element: one past its
    largest element offset, 0 when empty. A column slice of a tall matrix spans far more than
    its element count."""
    if not isinstance(t, torch.Tensor) or t.numel() == 0:
        return 0
    return 1 + sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()))


def _egg_far(dims, sts):
    """Whether an operand of a launch over ``dims`` with per-operand strides ``sts`` (collapsed
    layouts: pointwise, reduction) reaches an element offset of 2**31 - 1 or more: its offsets
    then need 64 bits however few elements the launch walks (a column of a tall matrix: 2**20
    rows of a 4096-wide one are 2**20 elements 2**32 apart; 32-bit offsets wrapped and read
    other memory)."""
    return any(sum((d - 1) * abs(s) for d, s in zip(dims, st) if d) >= _EGG_FAR for st in sts)


def _egg_ncs_layout(shape, tensors, order):
    """A channels-last walk of a 4-d/5-d domain seen as (N, C, S = spatial): per tensor its
    (N, C, S) strides, for a kernel that reads channels-last tiles and writes the standard
    layout. None unless the walk is channels-last and every tensor's spatial dims collapse
    into one stride (then the caller walks as usual and converts afterwards)."""
    nd = len(shape)
    if nd not in (4, 5) or list(order) != [0, *range(2, nd), 1] or shape[0] > 65535:
        return None
    out = []
    for t in tensors:
        b = _egg_bstrides(t, shape)
        sp = _egg_collapse(list(shape[2:]), [b[2:]], 1)
        if sp is None:
            return None
        out.append([b[0], b[1], sp[1][0][0]])
    return shape[0], shape[1], math.prod(shape[2:]), out


def _egg_reduction_layout(shape, rdims, tensors):
    """Layout of a reduction domain split as outer (3 dims) x reduced (1) x inner (1).

    ``tensors`` are given with shapes broadcastable to ``shape`` (reduced-domain tensors with the
    reduced dims kept as size 1). Returns (outer dims, R, INNER, per-tensor strides
    [so0, so1, so2, sr, si]), or None when the strides do not collapse that far (a permuted
    input of many dims).
    """
    nd = len(shape)
    rdims = sorted(d % nd for d in rdims)
    if not rdims or rdims != list(range(rdims[0], rdims[-1] + 1)):
        raise RuntimeError("EGG: reduced dimensions must be adjacent")
    lo, hi = rdims[0], rdims[-1] + 1
    strides = [_egg_bstrides(t, shape) for t in tensors]
    outer = _egg_collapse(shape[:lo], [s[:lo] for s in strides], 3)
    red = _egg_collapse(shape[lo:hi], [s[lo:hi] for s in strides], 1)
    inner = _egg_collapse(shape[hi:], [s[hi:] for s in strides], 1)
    if outer is None or red is None or inner is None:
        return None  # the caller retries on contiguous copies
    per = [o + r + i for o, r, i in zip(outer[1], red[1], inner[1])]
    return outer[0], red[0][0], inner[0][0], per, _egg_far(outer[0] + red[0] + inner[0], per)


def _egg_pool_out(i, k, s, p, d, ceil):
    """Output length of a pooling window along one dim, as torch computes it."""
    num = i + 2 * p - (d * (k - 1) + 1)
    o = (-(-num // s) if ceil else num // s) + 1
    if ceil and (o - 1) * s >= i + p:
        o -= 1
    return o


def _egg_magic(d):
    """(m, s) with n // d == umulhi(n, m) >> s for every 0 <= n < 2**31: Granlund and
    Montgomery's round-up multiplier (N = 31 bits, l = ceil(log2 d), m = ceil(2**(31 + l) / d)
    < 2**32). d == 1 (or 0, never a divisor here): (0, 0), which _egg_fdiv answers with n."""
    if d <= 1:
        return 0, 0
    l = (d - 1).bit_length()
    return -(-(1 << (31 + l)) // d), l - 1


@triton.jit
def _egg_fdiv(n, d, m, s):
    """n // d for int32 0 <= n < 2**31, (m, s) = _egg_magic(d): a multiply-high and a shift
    where a division by a runtime int costs about twenty instructions per element. m and s
    are made tensors first: Triton passes an int argument equal to 1 (a shift of 1: d = 3)
    as the constexpr 1, which has no ``.to``."""
    z = tl.zeros_like(n)
    q = (tl.umulhi(n.to(tl.uint32), (z + m).to(tl.uint32)) >> (z + s).to(tl.uint32)).to(tl.int32)
    return tl.where(d == 1, n, q)


@triton.jit
def _egg_index4(offs, D1, D2, D3, S0, S1, S2, S3):
    """Offset of flat domain index offs in a tensor with strides S over dims (., D1, D2, D3)."""
    i3 = offs % D3
    r = offs // D3
    i2 = r % D2
    r = r // D2
    i1 = r % D1
    i0 = r // D1
    return i0 * S0 + i1 * S1 + i2 * S2 + i3 * S3


@triton.jit
def _egg_swap_pairs(x, ROWS: tl.constexpr, RB: tl.constexpr, BLOCK: tl.constexpr):
    """A pointwise block with each (even, odd) pair of columns swapped, in registers:
    interleaved RoPE's other column of a pair. The block is loaded contiguous (vectorized);
    a load at ``offs ^ 1`` made one two-byte load per element (sm_90 PTX). BLOCK is even and
    a block starts at an even column, so no pair straddles the mask."""
    if ROWS:
        a, b = tl.split(tl.reshape(x, (RB, BLOCK // 2, 2)))
        return tl.reshape(tl.join(b, a), (RB, BLOCK))
    else:
        a, b = tl.split(tl.reshape(x, (BLOCK // 2, 2)))
        return tl.reshape(tl.join(b, a), (BLOCK,))


@triton.jit
def _egg_index3(row, O1, O2, S0, S1, S2):
    """Offset of outer row index row in a tensor with outer strides S over dims (., O1, O2)."""
    i2 = row % O2
    r = row // O2
    i1 = r % O1
    i0 = r // O1
    return i0 * S0 + i1 * S1 + i2 * S2


@triton.jit
def _egg_div(x, y):
    # x / y as eager divides: IEEE round-to-nearest. Triton's `/` on fp32 is PTX div.full.f32
    # (within 2 ulp), and a quotient one ulp off lands on the other side of a rounding step
    # (int8 quantization's round(x / scale) came out 1 apart); fp64 `/` is already div.rn
    q = x / y
    if q.dtype == tl.float32:
        q = tl.math.div_rn(x * 1.0, y * 1.0)  # * 1.0: an integer operand (or literal) as fp32
    return q


#: kernels run by Triton's interpreter (on CPU tensors), where eager's arithmetic is the CPU's
_EGG_INTERPRETED = tl.constexpr(bool(triton.knobs.runtime.interpret))


@triton.jit
def _egg_sdiv(x, c, inv):
    # fp32 x / c for a Python number c: eager on CUDA multiplies by the reciprocal inv
    # (1.0f / c, computed in fp32 on the host), eager on the CPU divides
    if _EGG_INTERPRETED:
        q = _egg_div(x, c)
    else:
        q = x * inv
    return q


@triton.jit
def _egg_sqrt(x):
    # torch.sqrt is IEEE (sqrt.rn); Triton's tl.sqrt on fp32 is sqrt.approx.ftz
    r = tl.sqrt(x)
    if r.dtype == tl.float32:
        r = tl.math.sqrt_rn(x * 1.0)
    return r


@triton.jit
def _egg_rint(x):
    # torch.round: to the nearest integer, ties to even. |x| + 2^23 has a spacing of 1, so the
    # add rounds (round-to-nearest-even, the IEEE default) and the subtraction is exact; from
    # 2^23 on every fp32 value is an integer, and NaN / inf stay themselves
    ax = tl.abs(x)
    r = (ax + 8388608.0) - 8388608.0
    return tl.where(ax < 8388608.0, tl.where(x < 0, -r, r), x)


@triton.jit
def _egg_tanh(x):
    # tanh via exp of a non-positive argument (no overflow); below |x| = 0.3, where 1 - e cancels
    # (relative error ~eps / |x|), its odd Taylor series to x^11 (truncation < 2e-9 relative)
    ax = tl.abs(x)
    e = tl.exp(-2.0 * ax)
    t = (1.0 - e) / (1.0 + e)
    x2 = x * x
    p = x * (1.0 + x2 * (-0.3333333333333333 + x2 * (0.13333333333333333 + x2 * (
        -0.05396825396825397 + x2 * (0.021869488536155203 + x2 * -0.008863235529902197)))))
    return tl.where(ax < 0.3, p, tl.where(x < 0, -t, t))


@triton.jit
def _egg_softplus(x, beta, threshold):
    bx = x * beta
    sp = (tl.maximum(bx, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(bx)))) / beta
    return tl.where(bx > threshold, x, sp)


@triton.jit
def _egg_welford_combine(m1, s1, n1, m2, s2, n2):
    # Chan et al.: merge two (mean, M2, count) partial statistics
    n = n1 + n2
    d = m2 - m1
    f = tl.where(n == 0.0, 0.0, n2 / tl.where(n == 0.0, 1.0, n))
    return m1 + d * f, s1 + s2 + d * d * n1 * f, n


@triton.jit
def _egg_mul(a, b):
    return a * b


@triton.jit
def _egg_max_nan(a, b):
    """max as torch's reductions take it: NaN wins (tl.max gives the other operand)."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _egg_min_nan(a, b):
    """min as torch's reductions take it: NaN wins."""
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


def _egg_reverse_cumsum(x, dim):
    """cumsum from the end along dim (what x.flip(dim).cumsum(dim).flip(dim) computes)."""
    return x.flip(dim).cumsum(dim).flip(dim)


def _egg_reverse_cumprod(x, dim):
    return x.flip(dim).cumprod(dim).flip(dim)


def _egg_exclusive_cumsum(x, dim):
    """Exclusive cumsum along dim: position i holds the sum of the elements before it (0 first),
    what cat((zeros, x.narrow(dim, 0, n - 1).cumsum(dim)), dim) computes."""
    head = torch.zeros_like(x.narrow(dim, 0, 1))
    return torch.cat((head, x.narrow(dim, 0, x.size(dim) - 1).cumsum(dim)), dim)


def _egg_exclusive_cumprod(x, dim):
    head = torch.ones_like(x.narrow(dim, 0, 1))
    return torch.cat((head, x.narrow(dim, 0, x.size(dim) - 1).cumprod(dim)), dim)


def _egg_chanstats(x):
    """Per-channel mean and biased variance over every dim but 1 (batch-norm statistics), and the
    number of values per channel (the running variance's unbiased factor needs it)."""
    dims = [0] + list(range(2, x.dim()))
    count = x.numel() // max(1, x.shape[1])
    return x.mean(dims, keepdim=True), x.var(dims, unbiased=False, keepdim=True), count


def _egg_bn_update(mean, var, count, running_mean, running_var, num_batches_tracked, momentum):
    """nn.BatchNorm's training-mode bookkeeping, exactly as the module does it: refuse a single
    value per channel (as F.batch_norm does), count the batch, update the running statistics
    with the unbiased variance of this call's ``count`` values per channel; returns mean."""
    if count <= 1:
        raise ValueError(f"Expected more than 1 value per channel when training, got {count} "
                         "value per channel")
    with torch.no_grad():
        if num_batches_tracked is not None:
            num_batches_tracked.add_(1)
        m = momentum if momentum is not None else 1.0 / float(num_batches_tracked)
        if running_mean is not None:
            running_mean.mul_(1.0 - m).add_(mean.reshape(-1), alpha=m)
            running_var.mul_(1.0 - m).add_(var.reshape(-1) * (count / (count - 1)), alpha=m)
    return mean


@triton.jit
def _egg_transpose_kernel(X, Y, A, B, NA, BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr):
    """Y[n, b, a] = X[n, a, b] for contiguous X (N, A, B) and Y (N, B, A): a tile is read along b
    and written along a, both coalesced (Triton moves it through shared memory). The tiles of
    one image are numbered along grid axis 0 (no 65535 limit), the images along axis 1."""
    n = tl.program_id(1).to(tl.int64)
    t = tl.program_id(0)
    a = (t % NA) * BLOCK_A + tl.arange(0, BLOCK_A)
    b = (t // NA) * BLOCK_B + tl.arange(0, BLOCK_B)
    m = (a[:, None] < A) & (b[None, :] < B)
    base = n * A * B
    v = tl.load(X + base + a[:, None].to(tl.int64) * B + b[None, :], mask=m)
    tl.store(Y + base + b[None, :].to(tl.int64) * A + a[:, None], v, mask=m)


def _egg_transpose(x, y, a, b):
    n = x.numel() // max(1, a * b)
    if n == 0:
        return y
    na = _egg_cdiv(a, 64)
    grid = (na * _egg_cdiv(b, 64), n)
    _egg_transpose_kernel[grid](x, y, a, b, na, BLOCK_A=64, BLOCK_B=64, num_warps=4)
    return y


_EGG_CL = {4: torch.channels_last, 5: torch.channels_last_3d}


def _egg_relayout(x, to_channels_last):
    """x in channels-last memory order (NHWC, or NDHWC for 5-d) or back in the standard one,
    same values, no copy when it already is. Between the two dense orders: one tiled transpose
    per image (C x spatial <-> spatial x C); anything else: torch's copy."""
    fmt = _EGG_CL.get(x.dim())
    if fmt is None:
        return x if to_channels_last else x.contiguous()
    src, dst = (torch.contiguous_format, fmt) if to_channels_last else (fmt, torch.contiguous_format)
    if x.is_contiguous(memory_format=dst):
        return x
    if not x.is_contiguous(memory_format=src) or x.shape[0] > 65535:
        return x.contiguous(memory_format=dst)
    y = torch.empty_like(x, memory_format=dst)
    c, s = x.shape[1], x[0, 0].numel()
    return _egg_transpose(x, y, c, s) if to_channels_last else _egg_transpose(x, y, s, c)


def _egg_channels_last(x):
    """x in channels-last order; convolutions run in it where the memory optimizer measured it
    faster."""
    return _egg_relayout(x, True)


def _egg_standard_layout(x):
    """x in the standard (contiguous) order eager's results have."""
    return _egg_relayout(x, False)


def _egg_params_channels_last(module, names):
    """Re-lay out the named parameters channels-last once, at construction (values unchanged)."""
    for name in names:
        p = module.get_parameter(name)
        p.data = _egg_channels_last(p.data)


def _egg_standard_params(names):
    """A method running Model's own code (the traced reference, the copy of Model.forward) with
    the parameters _egg_params_channels_last re-laid out given back in the standard layout for
    the call: a convolution on a channels-last weight returns a channels-last result, and
    Model's ``.view(n, -1)`` of it raised where Model's own call does not (a batch of one,
    which the kernels do not take). Costs a copy of those weights on such calls only."""
    def wrap(fn):
        def call(self, *args, **kwargs):
            swapped = []
            for name in names:
                p = self.get_parameter(name)
                if not p.is_contiguous():
                    swapped.append((p, p.data))
                    p.data = p.data.contiguous()
            try:
                return fn(self, *args, **kwargs)
            finally:
                for p, d in swapped:
                    p.data = d
        call.__name__ = fn.__name__
        return call
    return wrap


def _egg_relu_attention(q, k, v, is_causal, scale):
    """ReLU attention written out (rw-relu-attention): relu(q @ k^T * scale (None: 1/sqrt of the
    head dim), the positions above the diagonal dropped when causal) @ v, in PyTorch's ops
    (shapes on meta tensors, and the path of a candidate that keeps no kernel for it); the
    attention template computes it without writing the scores."""
    s = torch.matmul(q, k.transpose(-2, -1)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if is_causal:
        keep = torch.ones((s.shape[-2], s.shape[-1]), dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, 0.0)
    return torch.matmul(torch.relu(s), v)


def _egg_masked_attention(q, k, v, mask, scale, enable_gqa=False, is_causal=False, softcap=None,
                          factor=None, drop=None, fill=None):
    """Attention written out with its scores modified (rw-attention): softmax(S, -1) @ v with
    S = q @ k^T * scale (None: factor (None: 1) / sqrt of the head dim) in fp32, then ``softcap * tanh(S)`` where
    softcap is a number (Gemma's soft capping, its 1/cap folded into scale), then ``+ mask``
    where mask is a tensor (an additive mask or bias: Hugging Face's padding mask, ALiBi), then
    ``fill`` where the bool tensor ``drop`` is True (a padding mask's masked_fill), then
    -inf above the diagonal where is_causal (top-left, as torch's). In PyTorch's ops: shapes on
    meta tensors, and the path of a candidate that keeps no kernel for it. A row whose every
    score is -inf is NaN, as the softmax written out gives (scaled_dot_product_attention gives
    0 there). ``enable_gqa``: k and v hold H / H_kv query heads each (repeated in place)."""
    if enable_gqa:
        g = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(g, dim=-3), v.repeat_interleave(g, dim=-3)
    if scale is None:
        scale = (1.0 if factor is None else factor) * q.shape[-1] ** -0.5
    s = torch.matmul(q, k.transpose(-2, -1)).float() * scale
    if softcap is not None:
        s = torch.tanh(s) * softcap
    if mask is not None:
        s = s + mask
    if drop is not None:
        s = s.masked_fill(drop, fill)
    if is_causal:
        keep = torch.ones((s.shape[-2], s.shape[-1]), dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return torch.matmul(torch.softmax(s, -1).to(v.dtype), v)


def _egg_dequant_linear(x, w, bias=None):
    """A linear layer whose weight is stored as 8-bit integers, converted to the input's dtype
    (rw-dequant-linear): F.linear(x, w.to(x.dtype), bias), in PyTorch's ops (shapes on meta
    tensors, and the path of a candidate that keeps no kernel for it); the matmul template
    loads the integer tiles and converts them in registers."""
    return torch.nn.functional.linear(x, w.to(x.dtype), bias)


def _egg_program(program, leaves):
    """A product's B operand computed by its program (rw-dequant-program; the instructions of
    knowledge/templates/program.py) from the stored tensors, in PyTorch's ops."""
    import operator as _op
    fns = {"add": _op.add, "sub": _op.sub, "mul": _op.mul, "and": _op.and_, "or": _op.or_,
           "xor": _op.xor, "lshift": _op.lshift, "rshift": _op.rshift, "floordiv": _op.floordiv,
           "mod": _op.mod}
    _egg_program_fits(program, leaves)
    vals = []
    for kind, shape, dt, *a in program:
        if kind == "leaf":
            v = leaves[a[0]]
        elif kind == "bin":
            x, y = (vals[t] if isinstance(t, int) else t[1] for t in a[1:])
            v = fns[a[0]](x, y)
        elif kind == "cast":
            v = vals[a[0]].to(getattr(torch, dt))
        elif kind == "reshape":
            v = vals[a[0]].reshape(shape)
        elif kind == "permute":
            v = vals[a[0]].permute(a[1])
        elif kind == "expand":
            v = vals[a[0]].expand(shape)
        elif kind == "stack":
            v = torch.stack([vals[t] for t in a[0]], a[1])
        elif kind == "cat":
            v = torch.cat([vals[t] for t in a[0]], a[1])
        elif kind == "take":
            v = vals[a[0]][(slice(None),) * a[2] + (vals[a[1]],)]
        else:  # repeat
            v = vals[a[0]].repeat_interleave(a[1], a[2])
        vals.append(v)
    return vals[-1]


def _egg_program_fits(program, leaves):
    """Raise when a stored tensor is not of the shape and dtype the program was built for (its
    kernel has the sizes written in)."""
    _egg_leaves_fit(tuple((tuple(shape), getattr(torch, dt)) for kind, shape, dt, *_a in program
                          if kind == "leaf"), leaves)


def _egg_leaves_fit(want, leaves):
    """want: (shape, dtype) of each stored tensor, in order (a generated wrapper's constant)."""
    for (shape, dt), v in zip(want, leaves):
        if v.shape != shape or v.dtype != dt:
            raise ValueError(f"a stored tensor of {tuple(v.shape)} {v.dtype}: the program reads "
                             f"{shape} {dt}")


def _egg_program_linear(x, bias, program, b_nk, *leaves):
    """A product whose weight a program computes from stored tensors (rw-dequant-program:
    int4 nibbles unpacked and scaled per group, say): ``F.linear(x, w, bias)`` (``b_nk``) or
    ``x @ w``, w the program's value, in PyTorch's ops (shapes on meta tensors, and the path
    of a candidate that keeps no kernel for it); the matmul template computes the weight's
    tiles in registers from the stored tensors."""
    w = _egg_program(program, leaves)
    if b_nk:
        return torch.nn.functional.linear(x, w, bias)
    return torch.matmul(x, w)


def _egg_mask_fits(mask, q, k):
    """Raise as masked_fill does when a mask (a buffer's slice: rw-attention read it as causal
    and dropped it) does not broadcast to the scores q @ k^T would have."""
    scores = tuple(q.shape[:-1]) + (k.shape[-2],)
    ms = tuple(mask.shape)
    if len(ms) > len(scores) or any(m not in (1, s) for m, s in zip(ms[::-1], scores[::-1])):
        raise RuntimeError(f"The size of tensor a ({scores[-1]}) must match the size of tensor b "
                           f"({ms[-1]}) at non-singleton dimension {len(scores) - 1}: mask "
                           f"{list(ms)}, scores {list(scores)}")
    return None


#: layouts _egg_complex_fits passed (shape, strides, offset, dtypes, method, view shape): a call
#: with one of them skips the meta-tensor check (~13 us; bounded: cleared past 1024 entries)
_EGG_COMPLEX_OK = set()


def _egg_complex_fits(x, dtype, method, *shape):
    """Raise as ``torch.view_as_complex(x.to(dtype).<method>(*shape))`` would (a last dim of
    stride 1, other strides and the offset even): the complex-rotation rewrite reads x's pairs
    at their columns and never makes that view, so the strides it needed are checked here, on a
    meta tensor of x's layout (no data is read or copied). A layout that passed once passes
    again without the check (_EGG_COMPLEX_OK)."""
    key = (tuple(x.shape), x.stride(), x.storage_offset(), x.dtype, dtype, method, shape)
    if key in _EGG_COMPLEX_OK:
        return None
    need = x.storage_offset() + sum((n - 1) * st for n, st in zip(x.shape, x.stride())) + 1
    m = torch.empty(need, dtype=x.dtype, device="meta").as_strided(x.shape, x.stride(), x.storage_offset())
    if dtype is not None:
        m = m.to(dtype)
    torch.view_as_complex(m.reshape(*shape) if method == "reshape" else m.view(*shape))
    if len(_EGG_COMPLEX_OK) > 1024:
        _EGG_COMPLEX_OK.clear()
    _EGG_COMPLEX_OK.add(key)
    return None


def _egg_mm_check(a, b, bias, b_nk, batched):
    """Raise as torch does when the operands of a matrix product do not fit: the kernel reads K
    from A and walks B and the bias with their strides, so a B or bias of another size would be
    read out of bounds or in part. A ModelNew guard may free a dim that reaches a product only
    through a reshape (a spatial size before a flatten): at a size Model refuses, ModelNew must
    refuse too, not return a result."""
    k = a.shape[-1]
    if batched:
        ok = (a.dim() >= 3 and b.dim() == a.dim() and b.shape[-2] == k
              and tuple(b.shape[:-2]) == tuple(a.shape[:-2]))
    else:
        ok = b.dim() == 2 and b.shape[1 if b_nk else 0] == k
    if not ok:
        m = a.numel() // k if k else 0
        bs = "x".join(str(d) for d in (tuple(b.shape)[::-1] if b_nk and b.dim() == 2 else b.shape))
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({m}x{k} and {bs})")
    if bias is not None:
        n = b.shape[0] if b_nk else b.shape[-1]
        if bias.numel() != n:
            raise RuntimeError(f"the bias has {bias.numel()} elements, the product's rows {n}")


def _egg_mm_operand(t, shape, bt, m, n):
    """An epilogue input of a matrix product as a (BT, M, N) view of its broadcast to the
    output's shape: stride 0 along broadcast dims, a copy only when the folded dims cannot be
    walked with one stride."""
    e = t.expand(shape)
    try:
        return e.view(bt, m, n)
    except RuntimeError:
        return e.reshape(bt, m, n)


def _egg_k_major(x):
    """x (BT, R, K) read K-major: K contiguous and every other stride a multiple of 16 bytes, as
    Hopper's asynchronous copies and TF32 tensor-core reads want; otherwise one copy into a
    buffer whose rows are padded to 16 bytes (the padding is never read)."""
    bt, r, k = x.shape
    al = max(1, 16 // x.element_size())
    if (x.stride(2) == 1 and x.stride(1) % al == 0 and (bt == 1 or x.stride(0) % al == 0)
            and x.data_ptr() % 16 == 0):
        return x
    kp = -(-k // al) * al
    buf = torch.empty((bt, r, kp), dtype=x.dtype, device=x.device)[:, :, :k]
    buf.copy_(x)
    return buf


def _egg_rotate_half(x):
    """RoPE's rotate-half: torch.cat((-x[..., h:], x[..., :h]), dim=-1), h = x.shape[-1] // 2.
    Inside a pointwise kernel it is one load of x at the column rolled by h (rw-rotate-half)."""
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _egg_rotate_pairs(x):
    """Interleaved RoPE's rotation of each (even, odd) pair: torch.stack((-x[..., 1::2],
    x[..., ::2]), dim=-1).flatten(-2). Inside a pointwise kernel it is one load of x at the
    neighbouring column (rw-rotate-half)."""
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def _egg_take(src, idx, dim, wrap=False):
    """src read along ``dim`` at the integer indices idx (rw-take: torch.gather, F.embedding,
    index_select and ``x[ids]`` written one way): src and idx broadcast against each other
    (right-aligned) except along dim, where the result has idx's size; out[c] = src[c with
    c[dim] = idx[c]]. ``dim`` resolves against the larger rank; ``wrap``: a negative index
    counts from the end (``x[ids]``; gather and embedding raise on it). Inside a pointwise kernel
    it is one load of src at the row idx names (no gathered copy written and read back)."""
    nd = max(src.dim(), idx.dim())
    d = dim % nd
    if wrap:
        idx = torch.where(idx < 0, idx + src.shape[d - nd], idx)
    s = [1] * (nd - src.dim()) + list(src.shape)
    i = [1] * (nd - idx.dim()) + list(idx.shape)
    out = list(_egg_broadcast_of([s[:d] + [1] + s[d + 1:], i[:d] + [1] + i[d + 1:]]))
    out[d] = i[d]
    full = src.reshape(s).expand(out[:d] + [s[d]] + out[d + 1:])
    return torch.gather(full, d, idx.reshape(i).expand(out))


def _egg_take_view(src, idx, dim):
    """(src narrowed to index 0 along dim, its stride and size there, whether offsets into src
    pass 2**31): a kernel's operand for a take (its other dims broadcast with the domain as
    usual; the kernel adds index * stride, masked to 0 <= index < size, a negative index counted
    from the end). The last flag asks for 64-bit offsets however small the output is (a few
    rows gathered from a table of more than 2**31 elements)."""
    nd = max(src.dim(), idx.dim())
    d = dim % nd - nd
    if -d > src.dim():
        raise RuntimeError(f"EGG: take along dim {dim} of a {src.dim()}-d tensor")
    return src.narrow(d, 0, 1), src.stride(d), src.size(d), _egg_span(src) >= _EGG_FAR


#: the coordinate operands of cats (_egg_coord_view), per (width, rank, device)
_EGG_COORDS = {}


def _egg_coord_view(total, nd, dev):
    """A (1, ..., 1, total) operand with stride 1 along its last dim that a pointwise kernel never
    reads: its offset there is the result's column, which a cat's kernel places its pieces by
    (principle alg-cat-placed). Remembered per (total, rank, device)."""
    key = (total, nd, dev)
    t = _EGG_COORDS.get(key)
    if t is None:
        if len(_EGG_COORDS) > 256:
            _EGG_COORDS.clear()
        t = _EGG_COORDS[key] = torch.empty(total, dtype=torch.int8, device=dev).view((1,) * (nd - 1) + (total,))
    return t


def _egg_linear_cross_entropy(x, weight, target, bias=None, ignore_index=-100, reduction="mean",
                              softcap=None, softcap_16=False):
    """cross_entropy(linear(x, weight, bias).float(), target): the LM head and its loss, as eager
    computes them (rw-linear-cross-entropy); ``softcap``: Gemma-2's final logit soft cap, the
    logits ``softcap * tanh(logits / softcap)`` first, in the product's 16-bit dtype before the
    upcast where ``softcap_16`` (as Hugging Face's Gemma-2 does), else in fp32. Its kernel never
    writes the logits whole."""
    logits = torch.nn.functional.linear(x, weight, bias)
    if softcap is not None and softcap_16:
        logits = torch.tanh(logits / softcap) * softcap
    logits = logits.float()
    if softcap is not None and not softcap_16:
        logits = torch.tanh(logits / softcap) * softcap
    return torch.nn.functional.cross_entropy(logits, target, ignore_index=ignore_index,
                                             reduction=reduction)


def _egg_nhwc_operand(t, nd):
    """An operand broadcast against an (N, C, *S) tensor, as seen from its (N, *S, C) view: padded
    to nd dims and permuted the same way (a view, no copy)."""
    if not isinstance(t, torch.Tensor) or t.dim() == 0:
        return t
    t = t.reshape((1,) * (nd - t.dim()) + tuple(t.shape))
    return t.permute(0, *range(2, nd), 1)


# ---- drop-in dispatch (codegen.dropin, docs/dropin.md): which calls take the kernels. The file
# defines _EGG_GUARDS (mode -> what the kernels were built for, or None), _EGG_SAME (one set of
# kernels serves both modes) and _EGG_STATE (the parameters and buffers they read, the traced
# constants, with their dtypes). A guard's "tril" names the buffers its kernels take to be
# causal masks (the lower-triangular ones).

#: any device may reach the kernels (set by the compile check, which records launches on meta
#: or CPU tensors instead of running them); otherwise CUDA, or the CPU under TRITON_INTERPRET
_EGG_ANY_DEVICE = False


def _egg_built_with(bind, args, kwargs, init):
    """Was the module constructed with the arguments its kernels were built for? ``bind``:
    Model.__init__'s parameter list as a function returning them by name (the file's
    _egg_init_args); ``init``: the arguments the kernels were built with, defaults applied
    (codegen.dropin.built_with; None: not all literals, not recorded: taken as yes). The trace
    baked them in (a top-p of 0.9, a reshape to the vocabulary size), so a module built with
    others takes Model's own forward."""
    if init is None:
        return True
    try:
        return bool(bind(*args, **kwargs) == init)
    except Exception:  # noqa: BLE001 - another signature; a value == cannot compare (a tensor)
        return False


def _egg_dropin_init(module):
    """At construction and after every .to() / .cuda() / .double(): the traced constants keep
    their dtype (Model makes them anew in each call), and whether the parameters and buffers the
    kernels read still have their traced dtypes on one device; the route cache starts empty."""
    for name, dt in _EGG_STATE["constants"].items():
        b = module.get_buffer(name)
        if b.dtype != dt:
            module.register_buffer(name, b.to(dt), persistent=False)
    ok, devs = True, set()
    for name, dt in _EGG_STATE["params"].items():
        try:
            t = module.get_parameter(name)
        except AttributeError:
            try:
                t = module.get_buffer(name)
            except AttributeError:
                ok = False
                continue
        if t is None or t.dtype != dt:
            ok = False
            continue
        devs.add(t.device)
    module._egg_pstate = (ok and len(devs) <= 1, next(iter(devs)) if len(devs) == 1 else None)
    module._egg_routes = {}
    module._egg_graphs = _egg_GraphCache()  # CUDA graphs (_egg_graphed) read the old tensors: captured anew
    module._egg_graph_seen = set()


class _egg_GraphCache(dict):
    """The CUDA graphs of a module's routes (_egg_graphed). A deep copy of the module
    (``copy.deepcopy``: an EMA or a fine-tuned copy) gets none: a graph cannot be copied (torch
    refuses to pickle one) and it reads the original's tensors; the copy captures its own."""

    def __deepcopy__(self, memo):
        return _egg_GraphCache()


# ---- CUDA graphs (principle alg-cuda-graph): a file whose kernels' launches cost the host more
# than they cost the GPU (deep nets of small layers: ResNet-101's 310 launches take ~30 ms of
# Python, eager's whole call 8.7 ms on the H200) replays its kernel path as one CUDA graph.

#: devices whose calls are replayed from a graph (tests put "cpu" here with a stand-in graph)
_EGG_GRAPH_DEVICES = ("cuda",)
#: graphs kept per module (one per route: mode, shapes, dtypes, devices); the oldest goes first
_EGG_GRAPH_KEEP = 4


def _egg_state_refs(module):
    """What a graph captured from ``module`` reads: each submodule, parameter and buffer as the
    module holds it (its owner's dict, name, object) and where its memory is."""
    refs = []
    for m in module.modules():
        for d in (m._parameters, m._buffers):
            for n, t in d.items():
                if t is not None:
                    refs.append((d, n, t, t.data_ptr()))
        for n, c in m._modules.items():
            refs.append((m._modules, n, c, None))
    return refs


def _egg_state_same(refs):
    """Does the module still hold what the graph reads, where it was? (~0.2 us an entry.)"""
    for d, n, t, p in refs:
        if d.get(n) is not t or (p is not None and t.data_ptr() != p):
            return False
    return True


def _egg_graph_clone(out):
    """Static outputs cloned, the structure kept (a tensor, or a tuple/list of tensors and values)."""
    if isinstance(out, torch.Tensor):
        return out.clone()
    if isinstance(out, (tuple, list)):
        return type(out)(_egg_graph_clone(x) for x in out)
    return out


def _egg_graphed(module, key, fn, args):
    """``fn(*args)`` (a kernel path of the module) replayed from a CUDA graph captured for this
    call's route ``key``: the arguments are copied into the graph's static inputs, the graph is
    replayed, and its static outputs are cloned (an output a caller keeps is never overwritten by
    a later call). The first call of a route runs ``fn`` plainly (Triton's compiles, cuDNN's
    choices, lazy initialization happen outside the capture); the second captures. Buffers the
    capture's call updates (running statistics) are restored, so a call updates them once.
    A graph is captured anew when the module no longer holds what it read, where it read it (a
    replaced submodule or parameter, ``.data`` set; in-place loads keep it) and dropped on
    ``.to()``; a route whose capture fails (an op that cannot be captured) runs plainly from
    then on."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if key is None or not tensors or any(a.device.type not in _EGG_GRAPH_DEVICES for a in tensors):
        return fn(*args)
    graphs = module._egg_graphs
    entry = graphs.get(key)
    if entry is False:
        return fn(*args)
    if entry is None or not _egg_state_same(entry[0]):
        if entry is None and key not in module._egg_graph_seen:
            if len(module._egg_graph_seen) >= 64:  # as the route cache: many shapes, few repeats
                module._egg_graph_seen.clear()
            module._egg_graph_seen.add(key)
            return fn(*args)
        entry = graphs[key] = _egg_capture(module, fn, args)
        while len(graphs) > _EGG_GRAPH_KEEP:
            graphs.pop(next(iter(graphs)))
        if entry is False:
            return fn(*args)
    _, graph, static, out = entry
    with torch.no_grad():
        for s, a in zip(static, args):
            if isinstance(a, torch.Tensor):
                s.copy_(a)
        graph.replay()
        return _egg_graph_clone(out)


def _egg_capture(module, fn, args):
    """(state refs, graph, static inputs, static outputs) of ``fn`` captured on copies of
    ``args``, or False when it cannot be captured. The module's buffers are as before afterwards."""
    saved = [(b, b.clone()) for b in module.buffers()]
    static = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    try:
        graph, out = _egg_record(fn, static)
    except Exception:  # noqa: BLE001 - an op that cannot be captured: plain calls for the route
        return False
    finally:
        with torch.no_grad():
            for b, v in saved:
                b.copy_(v)
    return (_egg_state_refs(module), graph, static, out)


def _egg_record(fn, static):
    """A CUDA graph of ``fn(*static)`` and its (static) outputs."""
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        out = fn(*static)
    return graph, out


def _egg_train_modes(module):
    """The modes of the module and its submodules that train()'s kernels were traced with: as
    built when built in train() (a submodule frozen in eval() stays so), else all train()."""
    built = [m.training for m in module.modules()]
    return built if built[0] else [True] * len(built)


def _egg_admit(module, guard, args):
    """Is this call one the kernels were built for? The parameters as traced, the modules in the
    modes that were traced (any modes when one set of kernels serves a model built in train()
    and the same model in eval()), and each argument: a non-tensor equal to the traced value; a tensor
    of the traced dtype, on a device the kernels can read (the parameters' device), with each
    dim of its traced size, or (a free dim named sK) any size >= 2 that is the same wherever sK
    appears; the arguments in ``lead`` may carry the same extra leading dims, each >= 2."""
    ok, pdev = module._egg_pstate
    if not ok:
        return False
    for name in guard.get("tril", ()):  # a causal mask read from a buffer (rw-attention)
        if not _egg_is_tril_ones(module.get_buffer(name)):
            return False
    built = module._egg_train_modes
    if not (_EGG_SAME and all(built)):  # the modules in the modes that were traced
        modes = [m.training for m in module.modules()]
        if modes != (built if module.training else [False] * len(modes)):
            return False
    want = guard["args"]
    if len(args) != len(want):
        return False
    lead, sizes, extras, dev = guard["lead"], {}, set(), pdev
    launch = "cpu" if triton.knobs.runtime.interpret else "cuda"
    for i, (a, w) in enumerate(zip(args, want)):
        if "value" in w:
            v = w["value"]
            if isinstance(a, torch.Tensor) or type(a) is not type(v) or a != v:
                return False
            continue
        if not isinstance(a, torch.Tensor) or a.dtype != w["dtype"]:
            return False
        if not _EGG_ANY_DEVICE:
            if a.device.type != launch:
                return False
            if launch == "cuda" and a.device.index != torch.cuda.current_device():
                return False  # Triton launches on the current device
        if dev is None:
            dev = a.device
        elif a.device != dev:
            return False
        shape, dims = tuple(a.shape), w["dims"]
        extra = shape[:len(shape) - len(dims)]
        if len(shape) < len(dims) or (extra and (i not in lead or min(extra) < 2)):
            return False
        if i in lead:
            extras.add(extra)
        for s, d in zip(shape[len(extra):], dims):
            if isinstance(d, int):
                if s != d:
                    return False
            elif s < 2 or sizes.setdefault(d, s) != s:
                return False
    return len(extras) <= 1


def _egg_is_tril_ones(b):
    """Is ``b`` the lower-triangular ones on its last two dims (any leading dims)? The kernels
    of a causal mask read from a buffer hold only then (load_state_dict can change it)."""
    if b.dim() < 2:
        return False
    ref = torch.ones(b.shape[-2:], dtype=b.dtype, device=b.device).tril()
    return bool((b == ref).all())


def _egg_route(module, key, args):
    """The route of a call not seen before (its key: mode, shapes, dtypes, devices, values):
    True for the kernels, False for Model's traced ops; remembered per module."""
    guard = _EGG_GUARDS[module.training]
    fast = guard is not None and _egg_admit(module, guard, args)
    if key is not None:
        routes = module._egg_routes
        if len(routes) >= 64:
            routes.clear()
        routes[key] = fast
    return fast


# ---- launches (the host path, docs/dropin.md): Triton's JITFunction.run binds and specializes
# every argument again on each launch (~33 us of host time for a 33-argument kernel on a lent
# H100's host, where the compiled kernel's own launcher takes ~11 us); a generated module's small
# kernels (norms, RoPE, decode attention: 0.03-0.1 ms on the GPU) were host-bound. Each launched
# kernel of a file goes through _egg_Launcher: the first launch of an argument signature takes
# Triton's path (compiling, or finding its cached kernel), later ones the compiled kernel's
# launcher directly.

#: entries a launcher keeps (argument signatures: grid, dtypes, alignments, integer values);
#: beyond it the cache starts empty (many shapes, few repeats)
_EGG_LAUNCH_KEEP = 64


class _egg_Launcher:
    """``kernel[grid](*args, **kwargs)`` as Triton launches it, the specialization remembered.

    The key of a launch is what Triton specializes a kernel on, or finer: the grid, the current
    device, each constexpr's and option's (num_warps, ...) value and, per other argument, a
    tensor's dtype and 16-byte alignment, an int's value (Triton's 1 / multiple-of-16 / 64-bit
    specializations are functions of it), a float's or a bool's type (Triton passes them by
    value) or None. A key seen before launches the CompiledKernel Triton returned for it
    (``compiled[grid](*args)``, its runner), with the arguments Triton's binder would pass
    (positional ones, then the kernel's other parameters from the keywords or their defaults).
    Anything else (a callable grid, an argument the key cannot take, pre-run or stage hooks, a
    recording or interpreted kernel that returns no CompiledKernel) takes Triton's own path
    every time."""

    def __init__(self, fn):
        self.fn = fn
        self.cache = {}
        self.plans = {}  # planned launches (planned): key -> (compiled kernel, grid, the other args)
        params = getattr(fn, "params", None)
        ok = params is not None and all(hasattr(p, "has_default") and hasattr(p, "is_constexpr")
                                        for p in params)
        self.params = [(p.name, p.has_default, p.default) for p in params] if ok else None
        self.const = tuple(p.is_constexpr for p in params) if ok else ()
        self.values = {p.name for p in params if not p.is_constexpr} if ok else set()

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def key(self, grid, args, kwargs):
        """A constexpr (positional or keyword) and an option (num_warps, ...) by value; another
        parameter by what Triton specializes on (_egg_launch_key)."""
        parts = [grid if type(grid) is tuple else None, torch.cuda.current_device()]
        values = self.values
        for name, a in kwargs.items():
            parts.append(name)
            parts.append(_egg_launch_key(a) if name in values else a)
        # an int (most arguments: sizes, strides) is its own key: no call for it
        parts += [a if const or type(a) is int else _egg_launch_key(a)
                  for a, const in zip(args, self.const)]
        return tuple(parts)

    def launch(self, grid, args, kwargs):
        return self.compiled_launch(grid, args, kwargs)[1]

    def compiled_launch(self, grid, args, kwargs):
        """(the CompiledKernel launched, or None where Triton returned none; what the launch
        returned)."""
        try:
            key = self.key(grid, args, kwargs) if self.params is not None and type(grid) is tuple else None
            hit = self.cache.get(key) if key is not None else None
        except Exception:  # noqa: BLE001 - no CUDA (the compile check's recorder), an unhashable value
            key = hit = None
        if hit is not None:
            kernel, grid3, tail = hit  # kernel[grid3]: CompiledKernel's runner (counted by the verifier)
            return kernel, kernel[grid3](*args, *[kwargs[x] if by_name else x for x, by_name in tail])
        kernel = self.fn[grid](*args, **kwargs)
        direct = _egg_launchable(self.fn, kernel)
        if key is not None and direct:
            tail = _egg_launch_tail(self.params[len(args):], kwargs)
            if tail is not None:
                if len(self.cache) >= _EGG_LAUNCH_KEEP:
                    self.cache.clear()
                self.cache[key] = (kernel, tuple(grid) + (1,) * (3 - len(grid)), tail)
        return (kernel if direct else None), kernel

    def planned(self, plan, grid, args, kwargs, tensors):
        """``kernel[grid](*args, **kwargs)`` where ``plan`` (hashable: a wrapper's plan key and the
        launch's place in it) fixes the grid and every argument but the tensors (``tensors``: those
        among ``args`` and ``kwargs``): the key is the plan, the device and each tensor's dtype and
        alignment, a few values where ``key`` takes every argument (~7 us of 26's host time a call
        on the CPU machine for a 60-argument launch; ~1.5 here). The keywords are read at each
        launch (a tensor, a float), as Triton's binder passes them."""
        try:
            key = (plan, torch.cuda.current_device(),
                   *[(t.dtype, t.data_ptr() % 16 == 0) for t in tensors])
            hit = self.plans.get(key)
        except Exception:  # noqa: BLE001 - no CUDA (the compile check's recorder), an unhashable value
            key = hit = None
        if hit is not None:
            kernel, grid3, tail = hit
            return kernel[grid3](*args, *[kwargs[x] if by_name else x for x, by_name in tail])
        kernel, ret = self.compiled_launch(grid, args, kwargs)
        if key is not None and self.params is not None and type(grid) is tuple and kernel is not None:
            tail = _egg_launch_tail(self.params[len(args):], kwargs)
            if tail is not None:
                if len(self.plans) >= _EGG_LAUNCH_KEEP:
                    self.plans.clear()
                self.plans[key] = (kernel, tuple(grid) + (1,) * (3 - len(grid)), tail)
        return ret


def _egg_launch_planned(kernel, plan, grid, args, kwargs, tensors):
    """A launch a wrapper's plan fixes (_EGG_PLANS; ``tensors``: the tensors among ``args`` and
    ``kwargs``): by the plan's key where the kernel is behind an _egg_Launcher (a GPU), else as
    ``kernel[grid](...)`` (the interpreter)."""
    if type(kernel) is _egg_Launcher:
        return kernel.planned(plan, grid, args, kwargs, tensors)
    return kernel[grid](*args, **kwargs)


#: a wrapper's first call of a layout, recorded (_egg_Rec) and replayed (_egg_replay): the
#: templates whose host code is more than a launch (all but pointwise, which plans by hand, and
#: linear_ce: the domain, its layout, splits, workspaces, GQA packing) run it once per inputs'
#: shapes, strides, dtypes and device; a later call like it allocates and launches what the
#: first did
class _egg_NoPlan(Exception):
    """A tensor a recorded launch takes that a replay could not make again."""


class _egg_Rec:
    """The first call of a wrapper with these inputs (``key``; None: record nothing). Allocations
    through ``empty`` and launches through ``launch`` are recorded; each tensor a launch takes
    must be an argument, a view of exactly one argument (expand, unsqueeze, a take's narrowing:
    made again from the new argument, at its own offset), a recorded allocation or a view of one
    (an output squeezed back). Anything else (a contiguous copy of a permuted input, a zeroed
    workspace, a library op's result) makes the call unplanned: ``done`` remembers False, and
    calls with these inputs run the wrapper whole."""

    def __init__(self, key, args):
        self.key, self.args, self.allocs, self.launches = key, args, [], []
        self.ok = key is not None

    def empty(self, shape, dtype, device):
        t = torch.empty(shape, device=device, dtype=dtype)
        if self.ok:
            self.allocs.append((tuple(t.shape), dtype, device, t))
        return t

    def slot(self, t):
        """Where a replay finds tensor ``t``: ('n', j) the j-th allocation, ('m', j, size, stride,
        offset) a view of it (a squeeze of an output), ('a', i) argument i, ('v', i, size,
        stride, offset from the argument's) a view of argument i."""
        ptr = t.untyped_storage().data_ptr()
        for j, al in enumerate(self.allocs):
            if t is al[3]:
                return ("n", j)
            if ptr and al[3].untyped_storage().data_ptr() == ptr and al[3].dtype == t.dtype:
                return ("m", j, tuple(t.shape), tuple(t.stride()), t.storage_offset())
        same = [i for i, a in enumerate(self.args) if t is a]
        if len(same) == 1:
            return ("a", same[0])
        of = [i for i, a in enumerate(self.args)
              if isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() == ptr]
        if same or len(of) != 1 or self.args[of[0]].dtype != t.dtype or not ptr:
            raise _egg_NoPlan  # an argument passed twice, or storage two arguments share
        a = self.args[of[0]]
        if t.shape == a.shape and t.stride() == a.stride() and t.storage_offset() == a.storage_offset():
            return ("a", of[0])  # an alias (a reshape to its own shape): the argument itself
        return ("v", of[0], tuple(t.shape), tuple(t.stride()), t.storage_offset() - a.storage_offset())

    def launch(self, kernel, grid):
        """``kernel[grid]``, the launch recorded."""
        def go(*args, **kwargs):
            if self.ok:
                try:
                    if type(grid) is not tuple:
                        raise _egg_NoPlan
                    pos = [(k, self.slot(a)) for k, a in enumerate(args) if isinstance(a, torch.Tensor)]
                    pos += [(k, self.slot(a)) for k, a in kwargs.items() if isinstance(a, torch.Tensor)]
                    # the tensors left out: a replay puts its own there (the first call's let go)
                    bare = tuple(None if isinstance(a, torch.Tensor) else a for a in args)
                    kbare = {k: None if isinstance(a, torch.Tensor) else a for k, a in kwargs.items()}
                    self.launches.append((kernel, (self.key, len(self.launches)), grid, bare, kbare, pos))
                except _egg_NoPlan:
                    self.ok = False
            return kernel[grid](*args, **kwargs)
        return go

    def done(self, ret):
        """The wrapper's return (a tensor or a tuple of them), its plan remembered."""
        if self.key is None:
            return ret
        try:
            if not self.ok:
                raise _egg_NoPlan
            rets = ret if isinstance(ret, tuple) else (ret,)
            # a count (an int of the shapes) returned as it was; tensors: outputs or views of them
            where = tuple(self.slot(t) if isinstance(t, torch.Tensor) else ("c", t) for t in rets)
            if any(w[0] not in "nmc" or w[0] == "c" and type(w[1]) is not int for w in where):
                raise _egg_NoPlan  # an argument, a view of one, another value: not replayed
            plan = ([a[:3] for a in self.allocs], self.launches, where, isinstance(ret, tuple))
        except _egg_NoPlan:
            plan = False
        _egg_keep_plan(self.key, plan)
        self.allocs = self.launches = self.args = None  # the first call's tensors, let go
        return ret


def _egg_replay(plan, args):
    """A wrapper's call whose inputs match a recorded first call (_egg_Rec): its allocations and
    launches again, the launches' tensors found anew (_egg_Rec.slot)."""
    allocs, launches, where, many = plan
    made = [torch.empty(s, device=dev, dtype=dt) for s, dt, dev in allocs]
    for kernel, key, grid, a, kw, pos in launches:
        a, tensors, kwt = list(a), [], None
        for k, s in pos:
            t = _egg_replayed(s, args, made)
            tensors.append(t)
            if type(k) is int:
                a[k] = t
            else:
                if kwt is None:
                    kwt = dict(kw)
                kwt[k] = t
        _egg_launch_planned(kernel, key, grid, a, kw if kwt is None else kwt, tensors)
    rets = tuple(_egg_replayed(w, args, made) for w in where)
    return rets if many else rets[0]


def _egg_replayed(s, args, made):
    """The tensor a replay passes where the recorded call passed slot ``s`` (_egg_Rec.slot)."""
    if s[0] == "n":
        return made[s[1]]
    if s[0] in "ac":
        return args[s[1]] if s[0] == "a" else s[1]
    if s[0] == "m":
        return made[s[1]].as_strided(s[2], s[3], s[4])
    t = args[s[1]]
    return t.as_strided(s[2], s[3], t.storage_offset() + s[4])


class _egg_NoKey(Exception):
    """An argument the launch key cannot take: Triton's path."""


def _egg_launch_key(a):
    """What Triton specializes a kernel on of one argument, or finer (_egg_Launcher)."""
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() % 16 == 0)
    if type(a) is int or a is None or type(a) is str:
        return a
    if type(a) in (float, bool):  # passed by value, never specialized on it
        return type(a)
    raise _egg_NoKey(type(a).__name__)


def _egg_launch_tail(params, kwargs):
    """How to pass a kernel's parameters after its positional arguments, as Triton's binder
    does: (name, True) for a keyword's value (read at each launch: a tensor or float keyword
    changes), (default, False) for a default; None where a parameter has neither."""
    out = []
    for name, has_default, default in params:
        if name in kwargs:
            out.append((name, True))
        elif not has_default:
            return None
        else:
            out.append((default, False))
    return tuple(out)


def _egg_launchable(fn, kernel):
    """May a launch skip JITFunction.run for ``kernel`` (what it returned)? A CompiledKernel
    (Triton's path returned one: not the interpreter, not a recorder), no pre-run hooks on the
    function and no stage-inspection hook (both act inside JITFunction.run; launch hooks are the
    compiled kernel's runner's own)."""
    from triton import knobs

    return (hasattr(kernel, "packed_metadata") and hasattr(kernel, "function")
            and not getattr(fn, "pre_run_hooks", None)
            and getattr(knobs.runtime, "add_stages_inspection_hook", None) is None)


def _egg_launcher(fn):
    """A generated file's launched Triton kernel behind an _egg_Launcher, on a GPU (Triton's
    interpreter launches interpreted functions: left as they are)."""
    from triton.runtime.jit import JITFunction

    return _egg_Launcher(fn) if type(fn) is JITFunction else fn
