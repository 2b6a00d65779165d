"""A Conv3d with few output channels as one Conv2d over depth slices plus a shifted depth sum.

Why: Ditto's dense-motion mask is a 7x7x7 Conv3d from 142 to 22 channels at 16x64x64, 140
GFLOP per frame. As an implicit GEMM it has a huge reduction (142 * 343) and only 22 outputs,
and neither channel count is a multiple of 8: cuDNN picks a slow generic kernel for it (the
largest kernel of Ditto's profile, run D in benchmarks/RESULTS.md). The same sum, reordered:
every depth slice of the input goes through ONE 2-D convolution whose output channels are the
``kd`` depth taps times the outputs (7 x 24 = 168, padded to multiples of 8, zero weights in the
padding), and output slice ``d`` adds tap ``k`` of input slice ``d + k - pd``. Same FLOPs, a
well-shaped 2-D convolution instead of a badly shaped 3-D one; equal up to rounding.

``upsample_hw``: the conv applied to ``x`` upsampled (nearest) by this factor in H and W, depth
kept (the hourglass's UpBlock3d): the 2-D step is then a phase convolution of the slices
(accel/upsample_conv.py), 2.25x fewer FLOPs and no upsampled volume written.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .upsample_conv import PhaseUpsampleConv

__all__ = ["DepthSlicedConv3d"]


def _round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


class DepthSlicedConv3d(nn.Module):
    """``conv(x)`` for a stride-1, ungrouped, undilated Conv3d with zero padding, computed as a
    Conv2d over the depth slices of ``x`` and a shifted sum over the depth taps."""

    def __init__(self, conv: nn.Conv3d, align: int = 8, upsample_hw: int = 1) -> None:
        super().__init__()
        if (conv.stride != (1, 1, 1) or conv.dilation != (1, 1, 1) or conv.groups != 1
                or conv.padding_mode != "zeros" or isinstance(conv.padding, str)):
            raise ValueError(f"DepthSlicedConv3d needs a stride-1, ungrouped, undilated, zero-padded Conv3d; got {conv}")
        if upsample_hw > 1 and (conv.kernel_size[1:] != (3, 3) or tuple(conv.padding[1:]) != (1, 1)):
            raise ValueError(f"upsampling needs a 3x3 kernel with padding 1 in H and W; got {conv}")
        w = conv.weight.detach()  # [O, I, kd, kh, kw]
        o, i, kd, kh, kw = w.shape
        self.out_channels, self.in_channels, self.depth_taps = o, i, kd
        self.padding = tuple(int(p) for p in conv.padding)
        self.o_pad, self.i_pad = _round_up(o, align), _round_up(i, align)
        w2 = w.new_zeros(kd, self.o_pad, self.i_pad, kh, kw)
        w2[:, :o, :i] = w.permute(2, 0, 1, 3, 4)
        w2 = w2.reshape(kd * self.o_pad, self.i_pad, kh, kw)
        self.slice_conv: PhaseUpsampleConv | None = PhaseUpsampleConv(weight=w2, scale=upsample_hw) if upsample_hw > 1 else None
        self.weight = nn.Parameter(w2, requires_grad=False) if self.slice_conv is None else None
        self.bias = nn.Parameter(conv.bias.detach().clone(), requires_grad=False) if conv.bias is not None else None
        # Another implementation of the slices' 2-D convolution (weight above, padding (ph, pw), no bias),
        # e.g. accel/igemm_conv.py's Triton kernel; None: F.conv2d.
        self.conv: nn.Module | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, d, h, w = x.shape
        pd, ph, pw = self.padding
        kd, o, op = self.depth_taps, self.out_channels, self.o_pad
        slices = x.transpose(1, 2).reshape(b * d, c, h, w)
        if self.i_pad != c:
            slices = F.pad(slices, (0, 0, 0, 0, 0, self.i_pad - c))
        if self.slice_conv is not None:
            y = self.slice_conv(slices)  # [B*D, kd*Op, s*H, s*W]
        elif self.conv is not None:
            y = self.conv(slices)
        else:
            y = F.conv2d(slices, self.weight, None, padding=(ph, pw))  # [B*D, kd*Op, H', W']
        h2, w2 = y.shape[-2:]
        y = y.reshape(b, d, kd, op, h2, w2)
        d_out = d + 2 * pd - kd + 1
        y = F.pad(y, (0, 0, 0, 0, 0, 0, 0, 0, pd, pd))  # zero slices beyond the depth borders
        out = y[:, 0:d_out, 0]
        for k in range(1, kd):
            out = out + y[:, k:k + d_out, k]
        out = out[:, :, :o].transpose(1, 2)  # [B, O, D', H', W']
        if self.bias is not None:
            out = out + self.bias.view(1, o, 1, 1, 1)
        return out.contiguous()
