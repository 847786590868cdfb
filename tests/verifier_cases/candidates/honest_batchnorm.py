"""HONEST (batchnorm problem): batch norm + ReLU as a Triton kernel over NCHW for any batch and
spatial size: in train() the batch's statistics (and the running statistics updated as PyTorch
does: momentum, unbiased variance, num_batches_tracked), in eval() the running statistics.
Expected: passed."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def bn_relu_kernel(x_ptr, scale_ptr, shift_ptr, out_ptr, n, hw, C, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    c = (offs // hw) % C
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    y = x * tl.load(scale_ptr + c, mask=mask, other=1.0) + tl.load(shift_ptr + c, mask=mask, other=0.0)
    tl.store(out_ptr + offs, tl.maximum(y, 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x):
        bn = self.bn
        if x.dim() != 4 or x.shape[1] != bn.num_features:
            return torch.relu(bn(x))  # raises as Model does
        if self.training:
            mean = x.mean(dim=(0, 2, 3))
            var = x.var(dim=(0, 2, 3), unbiased=False)
            n = x.numel() // x.shape[1]
            with torch.no_grad():
                bn.num_batches_tracked.add_(1)
                m = bn.momentum if bn.momentum is not None else 1.0 / float(bn.num_batches_tracked)
                bn.running_mean.mul_(1 - m).add_(mean, alpha=m)
                bn.running_var.mul_(1 - m).add_(var * n / max(n - 1, 1), alpha=m)
        else:
            mean, var = bn.running_mean, bn.running_var
        scale = bn.weight / torch.sqrt(var + bn.eps)
        shift = bn.bias - mean * scale
        x = x.contiguous()
        out = torch.empty_like(x)
        total = x.numel()
        if total:
            bn_relu_kernel[(triton.cdiv(total, 1024),)](x, scale.contiguous(), shift.contiguous(), out,
                                                        total, x.shape[2] * x.shape[3], x.shape[1],
                                                        BLOCK=1024)
        return out
