"""Running a forward on meta tensors fast: recurrent layers by their shapes.

On meta tensors, ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` have no kernel of their own: PyTorch
decomposes them into one small op per time step, layer and gate, each dispatched in Python
(measured on the CPU: a 6-layer LSTM over 512 steps took 180 s for one meta forward, and a
planner ran three of them). ``FastMeta`` answers their calls on meta tensors with outputs of the
right shapes (no values: meta tensors have none) and counts their FLOPs the way cuDNN does the
work (one gate GEMM per step for the input and one for the hidden state).
"""
from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

#: gate matrices per cell
GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}


def _is_meta(x) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "meta"


def recurrent_call(name: str, args: tuple):
    """(outputs, FLOPs) of a ``torch.lstm``/``gru``/``rnn_*`` call on meta tensors, or None
    when it is not the dense (unpacked) form this knows."""
    if len(args) != 9 or not _is_meta(args[0]) or not isinstance(args[2], (list, tuple)):
        return None
    x, hx, weights, _bias, _layers, _dropout, _train, bidir, batch_first = args
    hs = list(hx) if isinstance(hx, (list, tuple)) else [hx]
    if not all(_is_meta(h) for h in hs) or x.dim() not in (2, 3):
        return None
    dirs = 2 if bidir else 1
    h_out = hs[0].shape[-1]
    if x.dim() == 3:
        t, b = (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])
        shape = (b, t, dirs * h_out) if batch_first else (t, b, dirs * h_out)
    else:
        t, b = x.shape[0], 1
        shape = (t, dirs * h_out)
    out = torch.empty(shape, dtype=x.dtype, device="meta")
    rest = tuple(torch.empty(h.shape, dtype=h.dtype, device="meta") for h in hs)
    # FLOPs: per step, every weight matrix of every layer and direction multiplies a row of
    # the batch (x @ W_ih^T, h @ W_hh^T, and a projection's h @ W_hr^T)
    flops = sum(2.0 * t * b * w.shape[0] * w.shape[1] for w in weights
                if isinstance(w, torch.Tensor) and w.dim() == 2)
    return (out, *rest), flops


class FastMeta(TorchFunctionMode):
    """Answer recurrent layers on meta tensors by their shapes; ``on_flops(name, flops, args)``
    is told what each call costs."""

    def __init__(self, on_flops=None):
        super().__init__()
        self.on_flops = on_flops

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in GATES and not kwargs:
            res = recurrent_call(name, tuple(args))
            if res is not None:
                outs, flops = res
                if self.on_flops is not None:
                    self.on_flops(name, flops, args)
                return outs
        return func(*args, **kwargs)
