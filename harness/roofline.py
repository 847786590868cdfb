"""Roofline floor of a problem: max(compute time at peak rates, compulsory bytes / bandwidth).

One forward call runs on meta tensors (no data, no device) under ``torch.utils.flop_counter``
and an op census of our own:
- FLOPs of the ops flop_counter counts (matmuls, convolutions, attention) are taken from it,
  each charged to the fastest rate that keeps eager's precision: fp32 matmuls at the 3xTF32
  rate (``tf32x3``: a third of TF32, or the fp32 CUDA-core rate where that is higher), since
  PyTorch leaves TF32 off for matmuls, the precision contract forbids plain TF32, and 3xTF32
  keeps fp32's accuracy (principle alg-matmul-epilogue); fp32 *convolutions* at the TF32 rate, since cuDNN uses TF32 by default
  (``torch.backends.cudnn.allow_tf32``), so eager itself runs them there; fp16/bf16/fp64 at
  their own rates.
- FLOPs of every other op are estimated by the rules below (docs/roofline.md) and charged to
  the fp32 CUDA-core rate. They are small next to the bytes such ops move: they rarely decide
  the floor.
Compulsory bytes are the inputs, the parameters and buffers, and the outputs, each once; a
tensor read only through indexed reads (an embedding table, a gather's or index_select's source,
``x[ids]``, and their views) counts the bytes those reads return, when fewer than its own: a
token embedding reads the rows its ids name, not the 128K-row table.

The floor is ``max(sum_k flops_k / peak_k, bytes / bandwidth)``; the percent of roofline of a
timing is ``100 * floor / time``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from harness.metarun import GATES, FastMeta
from harness.problem import LoadedProblem, meta_inputs, meta_model

PEAK_KEY = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64"}

#: ops flop_counter counts that run on cuDNN convolution kernels (TF32 for fp32 by default)
CONV_OPS = {"convolution", "_convolution", "cudnn_convolution", "cudnn_convolution_transpose",
            "convolution_overrideable", "_slow_conv2d_forward", "convolution_backward"}

# ---- estimate rules for ops flop_counter does not count (FLOPs per element) -----------------
#: data movement only: 0 FLOPs (their cost is bytes)
MOVE_OPS = {"clone", "copy", "_to_copy", "contiguous", "cat", "stack", "constant_pad_nd", "pad",
            "repeat", "index", "index_select", "gather", "scatter", "flip", "roll", "embedding",
            "slice_scatter", "select_scatter", "fill", "zero", "zeros_like", "ones_like",
            "empty_like", "full_like", "lift_fresh", "lift_fresh_copy", "detach", "_unsafe_view",
            "alias", "masked_fill", "index_put", "narrow_copy", "tril", "triu", "unfold"}
#: transcendental and special-function unit work: 4 FLOPs per output element
TRANSCENDENTAL_OPS = {"exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "tanh", "sigmoid",
                      "erf", "erfc", "erfinv", "gelu", "silu", "mish", "softplus", "elu", "selu",
                      "celu", "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh",
                      "pow", "sqrt", "rsqrt", "logit", "log_sigmoid_forward", "softshrink",
                      "_log_softmax_backward_data"}
#: reductions: FLOPs per element of the (largest) input
REDUCTION_OPS = {"sum": 1, "mean": 1, "amax": 1, "amin": 1, "max": 1, "min": 1, "argmax": 1,
                 "argmin": 1, "prod": 1, "any": 1, "all": 1, "cumsum": 1, "cumprod": 1,
                 "nansum": 1, "count_nonzero": 1, "sort": 1, "topk": 1, "median": 1,
                 "linalg_vector_norm": 2, "norm": 2, "var": 3, "std": 3, "var_mean": 3,
                 "std_mean": 3, "logsumexp": 4, "logcumsumexp": 4, "mse_loss": 3,
                 "l1_loss": 2, "smooth_l1_loss": 4, "huber_loss": 4, "nll_loss_forward": 1,
                 "kl_div": 4, "binary_cross_entropy": 6, "_cdist_forward": 3}
#: normalizations: FLOPs per input element (mean and variance: 3, normalize: 2, affine: 2, ...)
NORM_OPS = {"native_layer_norm": 8, "native_group_norm": 8, "native_batch_norm": 8,
            "_native_batch_norm_legit": 8, "_native_batch_norm_legit_no_training": 5,
            "_native_batch_norm_legit_functional": 8, "_fused_rms_norm": 5, "rms_norm": 5}
#: softmax family: max, subtract, exp (4), sum, divide: 8 per element
SOFTMAX_OPS = {"_softmax": 8, "_log_softmax": 8, "_safe_softmax": 8, "softmax": 8,
               "log_softmax": 8}
#: pooling: one FLOP per window element per output element
POOL_OPS = {"max_pool1d", "max_pool2d", "max_pool3d", "max_pool2d_with_indices",
            "max_pool3d_with_indices", "avg_pool1d", "avg_pool2d", "avg_pool3d",
            "max_pool1d_with_indices"}
#: indexed reads: the first argument is the source, read only where the indices say
GATHER_OPS = {"embedding", "gather", "index_select", "index"}
ADAPTIVE_POOL_OPS = {"_adaptive_avg_pool2d", "_adaptive_avg_pool3d", "adaptive_max_pool2d",
                     "adaptive_max_pool3d", "adaptive_avg_pool1d", "adaptive_max_pool1d"}
#: anything else that produces tensors (add, mul, relu, where, clamp, ...): 1 per output element


@dataclass
class Count:
    """FLOPs and compulsory bytes of one forward call (iterates as (flops, bytes, dtype))."""

    flops: float = 0.0
    nbytes: float = 0.0
    dtype: str = "float32"
    flops_by_peak: dict[str, float] = field(default_factory=dict)
    counted_flops: float = 0.0  # by torch.utils.flop_counter
    estimated_flops: float = 0.0  # by the rules above
    exact: bool = True  # False when the forward could not run on meta tensors
    note: str = ""
    ops: dict[str, float] = field(default_factory=dict)  # FLOPs per op name, for reports
    #: per tensor id: bytes returned by indexed reads of it (GATHER_OPS), and the ids some other
    #: op reads (whole): the byte count of a tensor read only by indexed reads is the former
    gathered: dict[int, int] = field(default_factory=dict)
    read_whole: set[int] = field(default_factory=set)

    def __iter__(self):  # backward compatible: flops, nbytes, dtype = count(...)
        return iter((self.flops, self.nbytes, self.dtype))


@dataclass
class Floor:
    ms: float | None
    bound: str  # memory | compute | unknown
    compute_ms: float | None = None
    memory_ms: float | None = None


def _numel(t) -> int:
    return t.numel() if isinstance(t, torch.Tensor) else 0


def _tensors(tree) -> list[torch.Tensor]:
    flat, _ = torch.utils._pytree.tree_flatten(tree)
    return [x for x in flat if isinstance(x, torch.Tensor)]


def _window(arg, dims: int) -> int:
    if isinstance(arg, int):
        return arg ** dims
    if isinstance(arg, (list, tuple)) and arg:
        vals = list(arg) + [arg[-1]] * max(0, dims - len(arg))
        return math.prod(int(v) for v in vals[:dims])
    return 1


def estimate_flops(name: str, args: tuple, out) -> float:
    """FLOPs of an op flop_counter does not count (the rules of docs/roofline.md)."""
    base = name[:-1] if name.endswith("_") and not name.endswith("__") else name  # relu_ -> relu
    ins = _tensors(args)
    outs = _tensors(out)
    n_in = max((t.numel() for t in ins), default=0)
    n_out = sum(t.numel() for t in outs[:1])  # the first output (indices etc. are extra)
    if base in MOVE_OPS or not outs:
        return 0.0
    if base in REDUCTION_OPS:
        return float(REDUCTION_OPS[base] * n_in)
    if base in NORM_OPS:
        return float(NORM_OPS[base] * n_in)
    if base in SOFTMAX_OPS:
        return float(SOFTMAX_OPS[base] * n_in)
    if base in POOL_OPS:
        dims = 3 if "3d" in base else (1 if "1d" in base else 2)
        return float(n_out * _window(args[1] if len(args) > 1 else 1, dims))
    if base in ADAPTIVE_POOL_OPS:
        return float(max(n_in, n_out))
    if base in TRANSCENDENTAL_OPS:
        return float(4 * n_out)
    return float(n_out)


def _peak_key(name: str, args: tuple) -> str:
    dts = [t.dtype for t in _tensors(args) if t.dtype.is_floating_point]
    dt = str(dts[0]).replace("torch.", "") if dts else "float32"
    key = PEAK_KEY.get(dt, "fp32")
    if key == "fp32":
        if (name in CONV_OPS or name in GATES) and torch.backends.cudnn.allow_tf32:
            return "tf32"
        if name not in CONV_OPS and name not in GATES:
            return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "tf32x3"
    return key


def peak_of(peak_tflops: dict, key: str) -> float | None:
    """Peak TFLOP/s of a key; ``tf32x3`` (three TF32 products per fp32 product) is derived."""
    if key == "tf32x3" and key not in peak_tflops:
        rate = max(peak_tflops.get("fp32") or 0.0, (peak_tflops.get("tf32") or 0.0) / 3)
        return rate or None
    return peak_tflops.get(key) or peak_tflops.get("fp32")


class _Census(TorchDispatchMode):
    """Entered inside FlopCounterMode: sees every op first, and attributes flop_counter's delta
    to it (charged by dtype), or estimates the op's FLOPs when flop_counter counted none."""

    def __init__(self, fc: FlopCounterMode, cnt: Count):
        super().__init__()
        self.fc, self.cnt = fc, cnt
        self.muted = False  # inside an op counted whole (attention): its decomposition is not
        self.views: dict[int, tuple[int, torch.Tensor]] = {}  # view id -> (its base's id, view)

    def _root(self, t) -> int:
        return self.views[id(t)][0] if id(t) in self.views else id(t)

    def reads(self, name: str, args: tuple, out) -> None:
        """Book which tensors the op reads whole, or only at indices (GATHER_OPS)."""
        ts = [a for a in args if isinstance(a, torch.Tensor)]
        ts += [t for a in args if isinstance(a, (list, tuple)) for t in a if isinstance(t, torch.Tensor)]
        if name in GATHER_OPS and ts and isinstance(out, torch.Tensor):
            src = self._root(ts[0])
            self.cnt.gathered[src] = self.cnt.gathered.get(src, 0) + _nbytes(out)
            ts = ts[1:]
        self.cnt.read_whole.update(self._root(t) for t in ts)

    def charge(self, key: str, flops: float, name: str) -> None:
        """Book FLOPs of op ``name`` at peak ``key`` (the totals, per peak and per op)."""
        self.cnt.flops_by_peak[key] = self.cnt.flops_by_peak.get(key, 0.0) + flops
        self.cnt.ops[name] = self.cnt.ops.get(name, 0.0) + flops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.muted:
            out = func(*args, **kwargs)
            self.reads("", args, out)
            return out
        before = self.fc.get_total_flops()
        out = func(*args, **kwargs)
        delta = float(self.fc.get_total_flops() - before)
        name = func.overloadpacket.__name__
        rets = func._schema.returns
        is_view = bool(rets) and rets[0].alias_info is not None and not rets[0].alias_info.is_write
        if is_view and args and isinstance(args[0], torch.Tensor) and isinstance(out, torch.Tensor):
            self.views[id(out)] = (self._root(args[0]), out)  # (kept alive: ids stay unique)
        elif not is_view:
            self.reads(name, args, out)
        if delta > 0:
            key = _peak_key(name, args)
            self.cnt.counted_flops += delta
        elif is_view or not _tensors(args):
            return out  # views and factories: no work
        else:
            delta = estimate_flops(name, args, out)
            key = "fp32"
            self.cnt.estimated_flops += delta
        if delta:
            self.charge(key, delta, name)
        return out


def attention_flops(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> float:
    """FLOPs of softmax(q k^T) v as a fused attention kernel does them: two matmuls over the
    query-key pairs it visits (with is_causal, the lower triangle torch's mask keeps)."""
    lq, lk, d, dv = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    heads = math.prod(q.shape[:-2])
    pairs = sum(min(i + 1, lk) for i in range(lq)) if causal else lq * lk
    return float(2 * heads * pairs * (d + dv))


class _Attention(TorchFunctionMode):
    """Counts F.scaled_dot_product_attention as a GPU runs it (a flash/efficient kernel in the
    inputs' dtype, skipping masked-out blocks under is_causal), not as the math decomposition
    the meta/CPU dispatch runs, which upcasts bf16 to fp32 and masks instead of skipping."""

    def __init__(self, census: _Census):
        super().__init__()
        self.census = census

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention or len(args) < 3:
            return func(*args, **kwargs)
        q, k, v = args[:3]
        causal = bool(kwargs.get("is_causal", args[5] if len(args) > 5 else False))
        dt = str(q.dtype).replace("torch.", "")
        flops = attention_flops(q, k, v, causal)
        self.census.cnt.counted_flops += flops
        key = PEAK_KEY.get(dt, "fp32")  # fp32: at the 3xTF32 rate, as fp32 matmuls
        self.census.charge("tf32x3" if key == "fp32" else key, flops, "scaled_dot_product_attention")
        self.census.muted = True
        try:
            return func(*args, **kwargs)
        finally:
            self.census.muted = False


def _run_counted(model, inputs, cnt: Count):
    with FlopCounterMode(display=False) as fc, torch.no_grad():
        census = _Census(fc, cnt)

        def recurrent(name, flops, args):  # harness.metarun: a recurrent layer by its shapes
            cnt.counted_flops += flops
            census.charge(_peak_key(name, args), flops, name)

        with census, _Attention(census), FastMeta(recurrent):
            out = model(*inputs)
    return out


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


#: real CPU tensors are used when meta tensors fail, up to this many input bytes
CPU_FALLBACK_BYTES = 64 * 1024 * 1024


def count(prob: LoadedProblem, gm=None) -> Count:
    """FLOPs and compulsory bytes of one forward call of the problem's Model."""
    init = prob.init_inputs()
    inputs = meta_inputs(prob)
    model = meta_model(prob, init)
    cnt = Count()
    outs: list = []
    try:
        outs = _tensors(_run_counted(model, inputs, cnt))
    except Exception as e:  # noqa: BLE001 - an op without a meta kernel
        why = f"meta run failed ({type(e).__name__})"
        cnt = Count(exact=False, note=why)
        in_bytes = sum(_nbytes(x) for x in inputs if isinstance(x, torch.Tensor))
        if in_bytes <= CPU_FALLBACK_BYTES:  # small enough to run for real on the CPU
            try:
                torch.manual_seed(0)
                real = Count(note=f"{why}: counted on CPU tensors")
                outs = [o.to("meta") for o in
                        _tensors(_run_counted(prob.Model(*init), prob.inputs(), real))]
                cnt = real
            except Exception:  # noqa: BLE001
                outs = []
        if not cnt.exact and gm is not None:  # fx graph: 1 FLOP per output element per op
            for n in gm.graph.nodes:
                tm = n.meta.get("tensor_meta")
                if n.op in ("call_function", "call_method", "call_module") and hasattr(tm, "shape"):
                    cnt.estimated_flops += float(math.prod(tm.shape))
            cnt.flops_by_peak = {"fp32": cnt.estimated_flops} if cnt.estimated_flops else {}
    cnt.flops = cnt.counted_flops + cnt.estimated_flops
    seen: set[int] = set()
    tensors = []
    for t in [x for x in inputs if isinstance(x, torch.Tensor)] + list(model.parameters()) \
            + list(model.buffers()) + outs:
        if id(t) not in seen:
            seen.add(id(t))
            tensors.append(t)
    cnt.nbytes = float(sum(
        min(_nbytes(t), cnt.gathered[id(t)]) if id(t) in cnt.gathered and id(t) not in cnt.read_whole
        else _nbytes(t) for t in tensors))
    dtypes = [t.dtype for t in tensors if t.dtype.is_floating_point]
    dt = max(set(dtypes), key=dtypes.count) if dtypes else torch.float32
    cnt.dtype = str(dt).replace("torch.", "")
    return cnt


def floor(cnt: Count, peak_tflops: dict, bw_gbs: float) -> Floor:
    """Roofline floor of a count on a machine (peak TFLOP/s per key, bandwidth GB/s)."""
    if not bw_gbs or not peak_tflops:
        return Floor(None, "unknown")
    t_mem = cnt.nbytes / (bw_gbs * 1e9) * 1e3
    t_cmp = 0.0
    for key, f in cnt.flops_by_peak.items():
        peak = peak_of(peak_tflops, key)
        if not peak:
            return Floor(None, "unknown", None, t_mem)
        t_cmp += f / (peak * 1e12) * 1e3
    return Floor(max(t_mem, t_cmp), "memory" if t_mem >= t_cmp else "compute", t_cmp, t_mem)


def floor_ms(flops: float, nbytes: float, dtype: str, peak_tflops: dict, bw_gbs: float) -> tuple[float | None, str]:
    """Roofline floor in ms and the bound, with every FLOP at the dtype's rate (older API)."""
    cnt = Count(flops=flops, nbytes=nbytes, dtype=dtype,
                flops_by_peak={PEAK_KEY.get(dtype, "fp32"): flops} if flops else {})
    f = floor(cnt, peak_tflops, bw_gbs)
    return f.ms, f.bound


def percent(floor_ms_: float | None, ms: float | None) -> float | None:
    """Percent of roofline of a timing: 100 * floor / time."""
    if not floor_ms_ or not ms:
        return None
    return 100.0 * floor_ms_ / ms


# ---- where the time goes: per node of a captured graph (the planner's regions and groups) -----
@dataclass
class NodeCost:
    """FLOPs (per peak key) and bytes one node of a captured graph costs when eager runs it as
    an op of its own: the inputs it reads and the output it writes (views cost nothing)."""

    flops_by_peak: dict[str, float] = field(default_factory=dict)
    nbytes: float = 0.0

    def ms(self, peak_tflops: dict, bw_gbs: float) -> float | None:
        """max(compute at the peaks, bytes at the bandwidth): the op's own roofline time."""
        if not bw_gbs or not peak_tflops:
            return None
        t = 0.0
        for key, f in self.flops_by_peak.items():
            peak = peak_of(peak_tflops, key)
            if not peak:
                return None
            t += f / (peak * 1e12) * 1e3
        return max(t, self.nbytes / (bw_gbs * 1e9) * 1e3)


def _is_view(out, ins) -> bool:
    base = getattr(out, "_base", None)
    return base is not None and any(base is t or base is getattr(t, "_base", None) for t in ins)


def node_costs(gm, inputs: list) -> dict:
    """NodeCost of every computing node of ``gm`` (fx node -> NodeCost), from one run on the
    meta inputs under the same counters as ``count`` (graph breaks run as capture runs them;
    functions the generated file defines stand in by their outputs' shapes)."""
    from harness.capture import propagation_interpreter

    costs: dict = {}
    cnt = Count()
    with FlopCounterMode(display=False) as fc, torch.no_grad():
        census = _Census(fc, cnt)

        def recurrent(name, flops, args):
            census.charge(_peak_key(name, args), flops, name)

        def on_node(n, args, result):
            if n.op not in ("call_function", "call_method", "call_module"):
                return
            before = on_node.before
            delta = {k: v - before.get(k, 0.0) for k, v in cnt.flops_by_peak.items()
                     if v - before.get(k, 0.0) > 0}
            ins = [t for t in _tensors(args)]
            if n.op == "call_module":  # a library module reads its weights too
                ins += list(gm.get_submodule(n.target).parameters())
            in_ids = {id(t) for t in ins}
            new = [t for t in _tensors(result) if id(t) not in in_ids and not _is_view(t, ins)]
            seen, nbytes = set(), 0
            for t in (ins + new) if new else []:  # a view or a query moves nothing
                if id(t) not in seen:
                    seen.add(id(t))
                    nbytes += _nbytes(t)
            costs[n] = NodeCost(delta, float(nbytes))

        def before_node(n):
            on_node.before = dict(cnt.flops_by_peak)

        on_node.before = {}
        with census, _Attention(census), FastMeta(recurrent):
            propagation_interpreter(gm, before_node, on_node).run(*inputs)
    return costs
