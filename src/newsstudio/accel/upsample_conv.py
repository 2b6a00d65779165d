"""2x nearest upsampling followed by a 3x3 convolution, computed without the upsampling.

Why: every output pixel of ``conv3x3(nearest2x(x))`` sees only a 2x2 neighbourhood of ``x``,
with the nine taps summed into four in a pattern fixed by the pixel's phase (row and column
parity). The pair is therefore four 2x2 convolutions of ``x`` (one per phase, stacked as one
convolution with 4x the output channels) and an interleave: 16 instead of 36 multiply-adds per
channel pair per input pixel (2.25x fewer) and the 4x larger upsampled map is never written.
The result equals the original up to rounding (the summed taps are formed in float32).

Rows (the same holds for columns), scale 2: output row ``2i`` reads upsampled rows ``2i-1, 2i,
2i+1`` = input rows ``i-1, i, i`` (taps ``w0 | w1 + w2``); output row ``2i+1`` reads input rows
``i, i, i+1`` (taps ``w0 + w1 | w2``). A 2x2 convolution with padding 1 gives ``H+1`` rows; phase
0 takes rows ``0..H-1`` of it, phase 1 rows ``1..H``. Zero padding of the upsampled map is zero
padding of the input, so borders are exact too. Larger scales add middle phases that read row
``i`` only (taps ``0 | w0 + w1 + w2``): all alike, so they are computed once (at scale 4, 9 distinct
phases of 16, 1.78x fewer FLOPs again; Ditto's SPADE decoder upsamples its input 4x this way).

The SD VAE decoder of MuseTalk has three such pairs (diffusers ``Upsample2D``): 174 of its
622 GFLOP per frame, 97 GFLOP saved.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .layout import channels_last_dense
from .shared_copy import shared_copy_replacing

__all__ = ["INTERLEAVES", "PhaseUpsampleConv", "with_phase_upsampling"]

# How the phases are interleaved (see PhaseUpsampleConv.forward): "channels_last" channel-minor into
# a channels-last result whenever the input is channels-last (else NCHW order); "nchw" always in NCHW
# order (benchmarks/levers.py times it).
INTERLEAVES = ("channels_last", "nchw")


def phase_classes(scale: int, merge: bool = True) -> list[int]:
    """The distinct row kernel each output phase ``a`` (row modulo ``scale``) uses: 0 for phase 0,
    the last for phase ``scale - 1``, one shared by every middle phase (``merge``; else one each)."""
    if not merge:
        return list(range(scale))
    return [0] + [1] * (scale - 2) + [2 if scale > 2 else 1]


def _tap_sums(scale: int, merge: bool = True) -> tuple[torch.Tensor, list[int]]:
    """Per distinct phase kernel (`phase_classes`): which of the 3x3 taps sum into each of the two
    taps of its 2x2 kernel (``[classes, 2, 3]``), and the offset of its rows in the 2x2
    convolution's ``H+1`` output rows. Phase 0 reads input rows ``i-1, i``; middle phases only row
    ``i``; the last phase rows ``i, i+1``."""
    classes = phase_classes(scale, merge)
    firsts = [classes.index(k) for k in range(len(set(classes)))]
    sums = torch.zeros(len(firsts), 2, 3)
    for k, a in enumerate(firsts):
        offset = 1 if a == scale - 1 else 0
        for dy in (-1, 0, 1):
            row = (scale * 1 + a + dy) // scale - 1  # input row relative to i: -1, 0 or +1
            sums[k, row + 1 - offset, dy + 1] += 1.0
    return sums, [1 if a == scale - 1 else 0 for a in firsts]


def phase_weights(weight: torch.Tensor, scale: int = 2, merge: bool = True) -> torch.Tensor:
    """``[O, I, 3, 3]`` -> ``[n**2 * O, I, 2, 2]`` for the ``n`` distinct row (and column) kernels of
    `phase_classes` (row-major, each ``O`` rows), float32."""
    t = _tap_sums(scale, merge)[0].to(weight.device)
    n = t.shape[0]
    w = torch.einsum("ari,bcj,onij->abonrc", t, t, weight.float())
    return w.reshape(n * n * weight.shape[0], weight.shape[1], 2, 2)


class PhaseUpsampleConv(nn.Module):
    """``conv(F.interpolate(x, scale_factor=scale, mode="nearest"))`` for a 3x3, stride-1,
    padding-1 ``conv`` (given as the conv or as its weight and bias), as one 2x2 convolution of
    ``x`` and an interleave of its ``scale**2`` phases (the alike middle ones computed once): 2.25x
    fewer FLOPs at scale 2, 4x at scale 4."""

    def __init__(self, conv: nn.Conv2d | None = None, scale: int = 2, *, weight: torch.Tensor | None = None,
                 bias: torch.Tensor | None = None, merge_middle_phases: bool = True) -> None:
        super().__init__()
        if conv is not None:
            if not is_plain_3x3(conv):
                raise ValueError(f"PhaseUpsampleConv needs a 3x3 conv with stride 1, padding 1, no dilation or groups; got {conv}")
            weight, bias = conv.weight, conv.bias
        if weight is None or weight.shape[-2:] != (3, 3) or scale < 2:
            raise ValueError("PhaseUpsampleConv needs a 3x3 conv weight and scale >= 2")
        w = weight.detach()  # the new weight is NCHW: engines convert the rewritten copy to channels_last when they want it
        self.scale, self.out_channels = int(scale), int(w.shape[0])
        merge = bool(merge_middle_phases)  # off: every phase its own kernel (benchmarks compare)
        self.offsets = _tap_sums(self.scale, merge)[1]  # per distinct kernel
        self.classes = phase_classes(self.scale, merge)
        n = len(self.offsets)
        self.weight = nn.Parameter(phase_weights(w, self.scale, merge).to(w.dtype), requires_grad=False)
        self.bias = nn.Parameter(bias.detach().repeat(n * n), requires_grad=False) if bias is not None else None
        # Another implementation of the same 2x2 convolution (padding 1), e.g. accel/igemm_conv.py's
        # Triton kernel; None: F.conv2d with the weight above.
        self.conv: nn.Module | None = None
        self.interleave = "channels_last"  # one of INTERLEAVES; a benchmark sets it to time the other

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, h, w = x.shape
        s, o, off, n = self.scale, self.out_channels, self.offsets, len(self.offsets)
        y = self.conv(x) if self.conv is not None else F.conv2d(x, self.weight, self.bias, padding=1)  # [B, n*n*O, H+1, W+1]

        def phase(a: int, c: int) -> tuple[int, int, int]:  # (channel start, row offset, column offset)
            ka, kc = self.classes[a], self.classes[c]
            return (n * ka + kc) * o, off[ka], off[kc]

        if self._channel_minor(x):
            # Interleave channel-minor into a channels-last result, each phase's O channels contiguous.
            # The NCHW interleave below was, under torch.compile, fused into the next GroupNorm's
            # reduction as a gather of one 2-byte value per pixel: 20 ms per batch of 32 behind the
            # Triton conv on an H200, and 45.46 vs 42.46 ms per batch of 32 of the compiled cuDNN
            # decoder (H200, 2026-12-05, benchmarks/RESULTS.md).
            yl = y.permute(0, 2, 3, 1)  # [B, H+1, W+1, n*n*O]
            rows = [torch.stack([yl[:, r:r + h, q:q + w, k:k + o] for k, r, q in (phase(a, c) for c in range(s))], dim=3)
                    for a in range(s)]  # each [B, H, W, s, O]
            return torch.stack(rows, dim=2).reshape(b, s * h, s * w, o).permute(0, 3, 1, 2)  # [B, H, s, W, s, O]
        rows = [torch.stack([y[:, k:k + o, r:r + h, q:q + w] for k, r, q in (phase(a, c) for c in range(s))], dim=-1)
                for a in range(s)]
        return torch.stack(rows, dim=3).reshape(b, o, s * h, s * w)  # [B, O, H, s, W, s] -> interleaved

    def _channel_minor(self, x: torch.Tensor) -> bool:
        if self.interleave not in INTERLEAVES:
            raise ValueError(f"interleave must be one of {INTERLEAVES}, got {self.interleave!r}")
        channels_last = x.shape[1] > 1 and channels_last_dense(x)
        return channels_last and self.interleave == "channels_last"


def is_plain_3x3(conv: nn.Module) -> bool:
    return (isinstance(conv, nn.Conv2d) and conv.kernel_size == (3, 3) and conv.stride == (1, 1)
            and conv.padding == (1, 1) and conv.dilation == (1, 1) and conv.groups == 1
            and conv.padding_mode == "zeros")


class _PhaseUpsample2D(nn.Module):
    """Drop-in for a diffusers ``Upsample2D`` (nearest 2x + 3x3 conv, called without output_size)."""

    def __init__(self, conv: nn.Conv2d) -> None:
        super().__init__()
        self.up_conv = PhaseUpsampleConv(conv, 2)

    def forward(self, hidden_states: torch.Tensor, output_size: int | None = None, *args, **kwargs) -> torch.Tensor:
        if output_size is not None:
            raise ValueError("phase upsampling covers scale-2 upsampling only (output_size given)")
        return self.up_conv(hidden_states)


def _convertible(m: nn.Module) -> bool:
    from diffusers.models.upsampling import Upsample2D

    return (isinstance(m, Upsample2D) and m.interpolate and m.use_conv and not m.use_conv_transpose
            and m.norm is None and m.name == "conv" and is_plain_3x3(m.conv))


def with_phase_upsampling(module: nn.Module) -> tuple[nn.Module, int]:
    """A copy of ``module`` whose diffusers ``Upsample2D`` layers (nearest 2x + 3x3 conv) run as
    :class:`PhaseUpsampleConv`, and how many were replaced. The copy *shares* every other
    parameter and buffer with ``module`` (no second copy of the weights), so ``module`` itself is
    untouched (the reference pipeline of the benchmarks keeps using it)."""
    return shared_copy_replacing(module, lambda child: _PhaseUpsample2D(child.conv) if _convertible(child) else None)
