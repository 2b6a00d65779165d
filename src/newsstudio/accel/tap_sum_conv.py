"""A Conv2d with very few output channels as one 1x1 conv over its taps plus a shifted tap sum.

Why: Ditto's occlusion head is a 7x7 conv from 2,272 channels to ONE output at 64x64. As an
implicit GEMM its output dimension is 1, which fits no tensor-core tile: on an H200 it ran at
4.9 TFLOP/s, 5.9 ms per batch of 32 (run C, benchmarks/RESULTS.md), more than convs with ten
times its FLOPs. The same sum, reordered: a 1x1 conv (a plain GEMM, N = taps x outputs = 49,
padded to 56) gives every tap's partial sum at every pixel, and output pixel ``p`` adds tap
``k``'s map at ``p + k - padding``. Same multiply-adds plus a 49-term add per output pixel;
equal up to rounding.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .depth_sliced_conv3d import _round_up

__all__ = ["TapSumConv2d"]


class TapSumConv2d(nn.Module):
    """``conv(x)`` for a stride-1, ungrouped, undilated, zero-padded Conv2d, as a 1x1 conv to
    ``kh * kw * out_channels`` tap maps and a sum of shifted tap maps."""

    def __init__(self, conv: nn.Conv2d, align: int = 8) -> None:
        super().__init__()
        if (conv.stride != (1, 1) or conv.dilation != (1, 1) or conv.groups != 1
                or conv.padding_mode != "zeros" or isinstance(conv.padding, str)):
            raise ValueError(f"TapSumConv2d needs a stride-1, ungrouped, undilated, zero-padded Conv2d; got {conv}")
        w = conv.weight.detach()  # [O, I, kh, kw]
        o, i, kh, kw = w.shape
        self.out_channels, self.kernel_size = o, (kh, kw)
        self.padding = (int(conv.padding[0]), int(conv.padding[1]))
        taps = kh * kw * o
        # tap-major rows: row (ky * kw + kx) * O + o holds W[o, :, ky, kx]
        rows = w.permute(2, 3, 0, 1).reshape(taps, i)
        w1 = w.new_zeros(_round_up(taps, align), i, 1, 1)
        w1[:taps, :, 0, 0] = rows
        self.weight = nn.Parameter(w1, requires_grad=False)
        self.bias = nn.Parameter(conv.bias.detach().clone(), requires_grad=False) if conv.bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, h, w = x.shape
        (kh, kw), (ph, pw), o = self.kernel_size, self.padding, self.out_channels
        t = F.conv2d(x, self.weight)[:, : kh * kw * o].float()  # [B, taps*O, H, W], summed in float32
        t = F.pad(t, (pw, pw, ph, ph)).reshape(b, kh * kw, o, h + 2 * ph, w + 2 * pw)
        h_out, w_out = h + 2 * ph - kh + 1, w + 2 * pw - kw + 1
        out = t[:, 0, :, 0:h_out, 0:w_out]
        for k in range(1, kh * kw):
            ky, kx = divmod(k, kw)
            out = out + t[:, k, :, ky : ky + h_out, kx : kx + w_out]
        if self.bias is not None:
            out = out + self.bias.float().view(1, o, 1, 1)
        return out.to(x.dtype).contiguous()
