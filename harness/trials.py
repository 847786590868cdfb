"""The verification trial plan: how the judge calls ``Model`` and ``ModelNew`` so that "verified"
covers the calls a user makes, not only ``get_inputs()`` in training mode (docs/verifier.md).

Every verification runs the same battery, in this order, on both models (which hold the same
random parameters and buffers, loaded through ``load_state_dict``):

- the problem's own inputs, fresh buffers, then new values in the same buffers (``recall``), then
  a few elements changed in the same buffers (``partial``: a cache keyed on pointers plus a few
  sampled elements returns stale values);
- ``train()`` and ``eval()`` alternating (batch norm, dropout and any ``self.training`` branch),
  grad mode on in some trials (outputs compared detached);
- inputs scaled x3, x0.01, negated, and ``large`` (x100: a log-softmax without the max
  subtraction overflows), floating inputs only;
- the problem's own shapes in other memory layouts (``layout``): rows padded at an odd offset
  (what ``split``, ``chunk`` or a slice give) and the last two dims transposed in memory (what
  ``.t()`` gives): a kernel that assumes contiguous inputs reads the wrong elements;
- another size of the batch dim (the first input's dim 0) and of up to ``MAX_SIZE_VARIANTS - 1``
  other sizes (each size changed everywhere it appears, so that the dims a product contracts stay
  consistent), another rank (a new leading dim of 2 on the inputs that carry the batch), and a
  batch of one (eval(); skipped where the batch is one already);
- then more draws of the problem's own inputs (``trials`` of them in all, counting the first).

A shape variant the reference rejects (it raises) is kept as a trial: the candidate must raise
too, never return a result where the reference raises. The problem's own shapes stay the timed
ones. Everything here is pure tensor code, used by the judge process (harness.worker).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

#: scale factors of the distribution trials (KernelBench-Verified's x3 / x0.01 / negated, plus a
#: large one: a fifth of randn * 100 is past exp's fp32 range of 88, so a formulation without the
#: max subtraction overflows on any row of a few elements)
DISTRIBUTIONS = {"x3": 3.0, "x0.01": 0.01, "negated": -1.0, "large": 100.0}
#: sizes varied in shape trials: the batch and this many - 1 others
MAX_SIZE_VARIANTS = 3
#: elements changed in a ``partial`` trial, per tensor (at most)
PARTIAL_ELEMENTS = 8


@dataclass
class Trial:
    index: int
    mode: str = "train"  # "train" | "eval"
    grad: bool = False
    inputs: str = "own"  # own | recall | partial | x3 | x0.01 | negated | large
    variant: str = ""  # "" (own shapes) | "batch" | "size" | "rank" | "one" (a batch of one)
    layout: str = ""  # "" (contiguous) | one of LAYOUTS (relayout): the inputs' memory layout

    @property
    def same_buffers(self) -> bool:
        """New values written into the previous trial's input buffers (no new buffers)."""
        return self.inputs in ("recall", "partial")


def plan(trials: int) -> list[Trial]:
    """The battery, then own-distribution draws up to ``trials`` of them in all."""
    seq = [
        Trial(0, "train", False, "own"),
        Trial(0, "train", False, "recall"),
        Trial(0, "eval", False, "partial"),
        Trial(0, "eval", False, "own"),
        Trial(0, "train", True, "x3"),
        Trial(0, "eval", True, "x0.01"),
        Trial(0, "train", False, "negated"),
        Trial(0, "eval", False, "large"),
        Trial(0, "train", False, "own", "batch"),
        Trial(0, "eval", True, "own", "batch"),
        Trial(0, "eval", False, "own", "rank"),
        Trial(0, "train", False, "own", layout="padded"),
        Trial(0, "eval", True, "own", layout="transposed"),
    ]
    seq += [Trial(0, "train" if i % 2 else "eval", False, "own", "size")
            for i in range(MAX_SIZE_VARIANTS - 1)]
    # a batch of one (eval(): one request at a time; train()-mode batch norm refuses it): a
    # kernel that squeezes every size-1 dim, or sizes its grid from the batch, fails here
    seq += [Trial(0, "eval", False, "own", "one")]
    # a second partial change (its elements drawn anew): a cache that happened to sample one
    # of the first trial's changed elements does not pass by that chance
    seq += [Trial(0, "train", False, "own"), Trial(0, "train", True, "partial")]
    own = sum(t.inputs in ("own", "recall") and not t.variant and not t.layout for t in seq)
    for i in range(max(0, trials - own)):
        seq.append(Trial(0, "eval" if i % 2 else "train", i % 3 == 2, "recall" if i % 2 else "own"))
    for i, t in enumerate(seq):
        t.index = i
    return seq


# ----------------------------------------------------------------------------- inputs
def _floating(x) -> bool:
    return isinstance(x, torch.Tensor) and (x.dtype.is_floating_point or x.is_complex())


def transform(inputs: list, how: str) -> list:
    """Inputs of a distribution trial: floating tensors scaled (new tensors), others as they are."""
    s = DISTRIBUTIONS.get(how)
    if s is None:
        return inputs
    return [x * s if _floating(x) else x for x in inputs]


def partial_change(buffers: list, gen: torch.Generator) -> None:
    """Change a few elements of each tensor in place, to values drawn from the same tensor (so they
    stay in its distribution: indices stay valid indices)."""
    for b in buffers:
        if not isinstance(b, torch.Tensor) or b.numel() < 2:
            continue
        flat = b.view(-1) if b.is_contiguous() else None
        n = b.numel()
        k = min(PARTIAL_ELEMENTS, max(1, n // 1000))
        dst = torch.randint(0, n, (k,), generator=gen)
        src = (dst + torch.randint(1, n, (k,), generator=gen)) % n  # another element
        if flat is not None:
            flat[dst.to(b.device)] = flat[src.to(b.device)].clone()
        else:
            vals = b.reshape(-1)[src.to(b.device)].clone()
            idx = torch.unravel_index(dst, b.shape)
            b[tuple(i.to(b.device) for i in idx)] = vals


def batch_size(inputs: list) -> int | None:
    """The batch: dim 0 of the first tensor input with at least one dim."""
    t = next((x for x in inputs if isinstance(x, torch.Tensor) and x.dim() >= 1), None)
    return None if t is None else int(t.shape[0])


def other_size(n: int) -> int:
    """Another size for a dim of size n: about half, odd past 4 (not a power of two), 2 for 1."""
    if n <= 1:
        return 2
    if n <= 3:
        return n - 1
    return n // 2 + 1


def varied_sizes(inputs: list) -> list[int]:
    """The sizes a shape trial changes: the batch first, then the first input's other dims'
    distinct sizes (largest first), at most MAX_SIZE_VARIANTS in all."""
    b = batch_size(inputs)
    if b is None:
        return []
    first = next(x for x in inputs if isinstance(x, torch.Tensor) and x.dim() >= 1)
    out = [b]
    for s in sorted({int(s) for s in first.shape[1:]}, reverse=True):
        if s not in out and s > 1:
            out.append(s)
    return out[:MAX_SIZE_VARIANTS]


def resize(xs: list, more: list, size: int, new: int, only_batch: bool = False) -> list:
    """Every dim of size ``size`` of every tensor input changed to ``new`` (the batch dim alone
    of inputs whose dim 0 is ``size`` when ``only_batch``): a narrow when smaller, a concatenation
    with the same tensor of another draw (``more``) when larger, so values stay in distribution."""
    out = []
    for x, y in zip(xs, more):
        if not isinstance(x, torch.Tensor) or x.dim() == 0:
            out.append(x)
            continue
        dims = [0] if only_batch and x.shape[0] == size else (
            [] if only_batch else [d for d in range(x.dim()) if x.shape[d] == size])
        for d in dims:
            if new < size:
                x = x.narrow(d, 0, new)
            else:
                y_ = y
                for d2 in range(y_.dim()):
                    if d2 != d and y_.shape[d2] != x.shape[d2]:
                        y_ = y_.narrow(d2, 0, min(y_.shape[d2], x.shape[d2]))
                x = torch.cat([x, y_.narrow(d, 0, min(y_.shape[d], new - size))], d)
        if not dims and new < size and _indexes_into(x, size):
            out.append(x % new)  # token ids into a vocabulary that shrank: still valid ids
            continue
        out.append(x.contiguous().clone() if dims else x)
    return out


def index_like(x) -> bool:
    """An integer tensor of non-negative values past 1 (ids, positions, lengths): what may index
    a dim, so that changing the dims around it may send it out of range."""
    return isinstance(x, torch.Tensor) and _indexes_into(x, None) and bool(x.max() > 1)


def _indexes_into(x: torch.Tensor, size: int | None) -> bool:
    """An integer tensor whose values could index a dim of ``size`` (all in [0, size]): ids,
    positions, lengths. A shape trial that shrinks that dim maps them into the new range: out of
    range, a gather on the GPU is a device-side assert that aborts the judge's process (on the
    H100, a repetition penalty's `gather(scores, 1, ids)` with the vocabulary halved), where the
    CPU raises."""
    if x.dtype.is_floating_point or x.is_complex() or x.dtype == torch.bool or not x.numel():
        return False
    return bool(x.min() >= 0) and (size is None or bool(x.max() <= size))


def add_rank(xs: list, more: list) -> list:
    """A new leading dim of 2 on the tensor inputs whose dim 0 is the batch: the two halves of the
    batch stacked (one draw each from ``xs`` and ``more`` when the batch is 1)."""
    b = batch_size(xs)
    out = []
    for x, y in zip(xs, more):
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[0] != b:
            out.append(x)
        elif b >= 2:
            h = b // 2
            out.append(torch.stack([x[:h], x[h:2 * h]]).contiguous())
        else:
            out.append(torch.stack([x, y]).contiguous())
    return out


#: elements of padding after each row in a "padded" layout, and before the first (odd: the data
#: pointer is then not 16-byte aligned, as a slice at an odd offset is not)
ROW_PAD = 3
LAYOUTS = ("padded", "transposed")


def relayout(x, how: str, aligned: bool = False):
    """The same values in another memory layout: ``padded``, each row (the last dim) followed by
    ROW_PAD unused elements and the whole at an offset of ROW_PAD (what ``split``, ``chunk`` or
    a slice of a wider tensor give); ``transposed``, the last two dims swapped in memory (what
    ``.t()`` or ``transpose`` give; padded where there are not two dims of size > 1). Others
    (non-tensors) are returned as they are; 0-d and empty tensors cloned. Always a new tensor.

    ``aligned``: the layout the judge's reference run gets where the candidate gets the one
    above: rows padded too (the same strides class: a ``.view()`` that fails on the padded rows
    fails on these), but the offset and the padding chosen so that every row starts 16 bytes
    aligned where its length allows. PyTorch's own kernels can read padded rows with 16-byte
    loads and abort the process (scaled_dot_product_attention's memory-efficient path checks
    strides, not addresses: pytorch/pytorch#183484, "CUDA error: misaligned address" in torch
    2.11), which would kill the judge; the candidate must read odd offsets itself."""
    if not isinstance(x, torch.Tensor):
        return x
    if x.dim() == 0 or x.numel() == 0:
        return x.clone()
    if how == "transposed" and x.dim() >= 2 and x.shape[-1] > 1 and x.shape[-2] > 1:
        return x.transpose(-1, -2).contiguous().transpose(-1, -2)
    n = x.shape[-1]
    if aligned:
        step = max(1, 16 // x.element_size())  # elements in 16 bytes
        pad, lead = (-n) % step or step, step
    else:
        pad, lead = ROW_PAD, ROW_PAD
    base = torch.zeros(lead + x.numel() // n * (n + pad), dtype=x.dtype, device=x.device)
    return base[lead:].view(*x.shape[:-1], n + pad)[..., :n].copy_(x)


def copy_layout(x: torch.Tensor) -> torch.Tensor:
    """A copy of ``x`` in the same layout (``clone()`` makes a padded tensor contiguous): the
    whole span of its storage it uses, viewed with the same sizes, strides and offset."""
    if x.numel() == 0 or any(st == 0 and n > 1 for n, st in zip(x.shape, x.stride())):
        return x.clone()
    span = 1 + sum((n - 1) * st for n, st in zip(x.shape, x.stride()))
    base = torch.empty(x.storage_offset() + span, dtype=x.dtype, device=x.device)
    return base.as_strided(x.shape, x.stride(), x.storage_offset()).copy_(x)


def shapes(xs: list) -> list[list[int]]:
    return [list(x.shape) for x in xs if isinstance(x, torch.Tensor)]
