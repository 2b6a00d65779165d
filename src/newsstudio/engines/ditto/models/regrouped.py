"""Ditto's warp network and SPADE decoder with the same weights, regrouped for the GPU.

Every rewrite here is exact up to rounding (tests/test_ditto_regrouped.py compares with the
plain modules); the plain modules stay what the checkpoints load into and what the golden
tests check. Copies share every weight they do not regroup.

Warp network (DenseMotionNetwork's 3-D hourglass):
* the 7x7x7 mask conv (142 -> 22 channels, 140 GFLOP/frame), the hourglass's last conv
  (142 -> 142) and first conv (110 -> 64): channel counts that are not multiples of 8 put cuDNN
  on slow generic 3-D kernels; they run as :class:`DepthSlicedConv3d` (a 2-D conv over depth
  slices with aligned channels and a shifted depth sum);
* each UpBlock3d (nearest 2x in H, W, then a 3x3x3 conv): a phase convolution of the slices,
  2.25x fewer FLOPs, no upsampled volume;
* the occlusion head (7x7 conv, 2,272 channels -> 1): one output channel fits no tensor-core
  tile, so it runs as :class:`TapSumConv2d` (a 1x1 conv to the 49 tap maps, then their shifted sum).

SPADE decoder (18 SPADE norms, each ``relu(conv3x3(nearest(seg)))`` then gamma and beta convs):
* the shared convs of all norms that see the same resolution read the same ``seg``: one conv
  with their output channels stacked (12 norms of the middle blocks at 64x64; 3 + 3 norms of
  the up blocks as phase convolutions of the 64x64 ``seg`` for 128x128 and 256x256, 2.25x and 4x
  fewer FLOPs: 102 of the decoder's 892 GFLOP/frame saved);
* each norm's gamma and beta convs (same input) as one conv with both outputs;
* the learned shortcut of the up blocks (SPADE norm, no activation, then a 1x1 conv to fewer
  channels): the 1x1 conv is linear, so it takes beta through itself at load, ``conv_s(n * (1 +
  gamma) + beta) = conv_s(n * (1 + gamma)) + conv3x3(actv; W_s . B)``: beta's conv makes 64 or 256
  channels instead of 256 or 512 (39 GFLOP/frame more saved: 751 left, flop counter, batch 1).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ....accel.depth_sliced_conv3d import DepthSlicedConv3d
from ....accel.group_norm_nhwc import instance_norm_scale_shift, spade_modulate, spade_norm_nhwc
from ....accel.shared_copy import shared_copy
from ....accel.tap_sum_conv import TapSumConv2d
from ....accel.upsample_conv import PhaseUpsampleConv
from .blocks import SPADE, SPADEResnetBlock, UpBlock3d
from .spade_decoder import SPADEDecoder
from .warping_network import WarpingNetwork

__all__ = ["RegroupedSPADEDecoder", "regrouped_warp", "use_nhwc_spade_norms_"]

LEAKY_SLOPE = 0.2  # SPADEResnetBlock's activation after its norms


class PhaseUpBlock3d(nn.Module):
    """UpBlock3d (nearest 2x in H and W, 3x3x3 conv, BatchNorm, ReLU) without the upsampled volume."""

    def __init__(self, block: UpBlock3d) -> None:
        super().__init__()
        self.conv = DepthSlicedConv3d(block.conv, upsample_hw=2)
        self.norm = block.norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.norm(self.conv(x)))


def _misaligned(conv: nn.Conv3d, align: int = 8) -> bool:
    return conv.in_channels % align != 0 or conv.out_channels % align != 0


def regrouped_warp(warp: WarpingNetwork) -> WarpingNetwork:
    """A copy of ``warp`` (weights shared) with the hourglass rewrites above."""
    out = shared_copy(warp)
    dense = out.dense_motion_network
    hourglass = dense.hourglass
    if _misaligned(dense.mask):
        dense.mask = DepthSlicedConv3d(dense.mask)
    if _misaligned(hourglass.decoder.conv):
        hourglass.decoder.conv = DepthSlicedConv3d(hourglass.decoder.conv)
    first = hourglass.encoder.down_blocks[0]
    if _misaligned(first.conv) and first.conv.groups == 1:
        first.conv = DepthSlicedConv3d(first.conv)
    hourglass.decoder.up_blocks = nn.ModuleList(
        PhaseUpBlock3d(b) if b.conv.groups == 1 and b.conv.kernel_size == (3, 3, 3) else b for b in hourglass.decoder.up_blocks)
    if isinstance(dense.occlusion, nn.Conv2d) and dense.occlusion.out_channels < 8 and dense.occlusion.kernel_size != (1, 1):
        dense.occlusion = TapSumConv2d(dense.occlusion)
    return out


def _stacked(convs: list[nn.Conv2d]) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights and biases of same-input convs stacked along the outputs."""
    return (torch.cat([c.weight.detach() for c in convs]),
            torch.cat([c.bias.detach() if c.bias is not None else c.weight.new_zeros(c.out_channels) for c in convs]))


def _conv_from(weight: torch.Tensor, bias: torch.Tensor) -> nn.Conv2d:
    """A 3x3, padding-1 Conv2d holding these (stacked) weights (NCHW: engines convert the copy)."""
    conv = nn.Conv2d(weight.shape[1], weight.shape[0], 3, padding=1, device="meta")
    conv.weight = nn.Parameter(weight.contiguous(), requires_grad=False)
    conv.bias = nn.Parameter(bias, requires_grad=False)
    return conv


class _StackedConv(nn.Module):
    """Same-input 3x3 convs as one conv (on ``seg`` upsampled by ``scale``: a phase convolution),
    ReLU, split back into each conv's outputs."""

    def __init__(self, convs: list[nn.Conv2d], scale: int, merge_middle_phases: bool = True) -> None:
        super().__init__()
        weight, bias = _stacked(convs)
        self.sizes = [c.out_channels for c in convs]
        self.conv: nn.Module
        if scale > 1:
            self.conv = PhaseUpsampleConv(weight=weight, bias=bias, scale=scale, merge_middle_phases=merge_middle_phases)
        else:
            self.conv = _conv_from(weight, bias)

    def forward(self, seg: torch.Tensor) -> list[torch.Tensor]:
        return list(torch.split(F.relu(self.conv(seg)), self.sizes, dim=1))


class _RegroupedSPADE(nn.Module):
    """A SPADE norm whose shared activation comes from outside; gamma and beta in one conv; the
    LeakyReLU that follows it (``slope``) applied here, so that the NHWC kernels (``nhwc``, see
    `use_nhwc_spade_norms_`) can do norm, modulation and activation in one pass."""

    def __init__(self, norm: SPADE) -> None:
        super().__init__()
        self.param_free_norm = norm.param_free_norm
        gamma, beta = norm.mlp_gamma, norm.mlp_beta
        self.gamma_beta = _conv_from(*_stacked([gamma, beta]))
        self.nhwc = False
        self.statistics: str | None = None  # the NHWC statistics kernel (None: its module's default)

    def scale_shift(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The instance norm of ``x`` as a per-channel affine map (None: not on the NHWC kernels)."""
        return instance_norm_scale_shift(x, self.param_free_norm.eps, self.statistics) if self.nhwc else None

    def forward(self, x: torch.Tensor, actv: torch.Tensor, slope: float | None = None,
                scale_shift: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        if self.nhwc:
            return spade_norm_nhwc(x, self.gamma_beta(actv), self.param_free_norm.eps, slope, scale_shift, self.statistics)
        return spade_modulate(self.param_free_norm(x), self.gamma_beta(actv), slope)


class _FoldedShortcut(nn.Module):
    """``conv_s(norm_s(x, actv))`` of a learned shortcut with beta taken through the 1x1 ``conv_s``
    at load: one conv of ``actv`` gives gamma (the norm's channels) and ``conv_s``'s share of beta
    (its output channels)."""

    def __init__(self, norm: SPADE, conv_s: nn.Conv2d) -> None:
        super().__init__()
        if conv_s.kernel_size != (1, 1) or conv_s.bias is not None:
            raise ValueError("the shortcut fold needs a 1x1 conv without bias")
        self.param_free_norm = norm.param_free_norm
        self.conv_s = conv_s
        w_s = conv_s.weight.detach().double()[:, :, 0, 0]  # [out, C]
        beta = norm.mlp_beta
        folded_w = torch.einsum("oc,ckij->okij", w_s, beta.weight.detach().double())
        folded_b = w_s @ beta.bias.detach().double() if beta.bias is not None else w_s.new_zeros(w_s.shape[0])
        dtype = beta.weight.dtype
        weight = torch.cat([norm.mlp_gamma.weight.detach(), folded_w.to(dtype)])
        bias = torch.cat([norm.mlp_gamma.bias.detach(), folded_b.to(dtype)])
        self.gamma_beta = _conv_from(weight, bias)
        self.sizes = [norm.mlp_gamma.out_channels, conv_s.out_channels]

    def forward(self, x: torch.Tensor, actv: torch.Tensor,
                scale_shift: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        gamma, beta_s = torch.split(self.gamma_beta(actv), self.sizes, dim=1)
        if scale_shift is None:
            normalized = self.param_free_norm(x)
        else:  # the NHWC statistics already computed for norm_0 (same x)
            scale, shift = scale_shift
            normalized = x * scale[:, :, None, None].to(x.dtype) + shift[:, :, None, None].to(x.dtype)
        return self.conv_s(normalized * (1 + gamma)) + beta_s


class _RegroupedBlock(nn.Module):
    """SPADEResnetBlock with its norms' activations given (order: norm_s if learned, norm_0, norm_1)."""

    def __init__(self, block: SPADEResnetBlock, fold_shortcut_beta: bool = True) -> None:
        super().__init__()
        self.learned_shortcut = block.learned_shortcut
        self.conv_0, self.conv_1 = block.conv_0, block.conv_1
        self.norm_0, self.norm_1 = _RegroupedSPADE(block.norm_0), _RegroupedSPADE(block.norm_1)
        self.shortcut: nn.Module | None = None
        if self.learned_shortcut and fold_shortcut_beta:
            self.shortcut = _FoldedShortcut(block.norm_s, block.conv_s)
        elif self.learned_shortcut:
            self.conv_s, self.norm_s = block.conv_s, _RegroupedSPADE(block.norm_s)

    @staticmethod
    def norms_of(block: SPADEResnetBlock) -> list[SPADE]:
        return ([block.norm_s] if block.learned_shortcut else []) + [block.norm_0, block.norm_1]

    def forward(self, x: torch.Tensor, actvs: list[torch.Tensor]) -> torch.Tensor:
        stats = self.norm_0.scale_shift(x)  # norm_s normalises the same x
        if self.learned_shortcut:
            a_s, a_0, a_1 = actvs
            x_s = (self.shortcut(x, a_s, stats) if self.shortcut is not None
                   else self.conv_s(self.norm_s(x, a_s, scale_shift=stats)))
        else:
            (a_0, a_1), x_s = actvs, x
        dx = self.conv_0(self.norm_0(x, a_0, LEAKY_SLOPE, stats))
        dx = self.conv_1(self.norm_1(dx, a_1, LEAKY_SLOPE))
        return x_s + dx


def use_nhwc_spade_norms_(decoder: nn.Module, statistics: str | None = None) -> int:
    """Let the regrouped SPADE norms in ``decoder`` run on accel/group_norm_nhwc.py's kernels
    (statistics, then norm + modulation + LeakyReLU in one pass; PyTorch's ops where the kernels
    cannot run; ``statistics``: the statistics kernel, default its module's). In place; returns
    how many norms."""
    norms = [m for m in decoder.modules() if isinstance(m, _RegroupedSPADE)]
    for m in norms:
        m.nhwc, m.statistics = True, statistics
    return len(norms)


class RegroupedSPADEDecoder(nn.Module):
    """A (spectral-norm-folded) SPADEDecoder regrouped as described above; same forward."""

    def __init__(self, dec: SPADEDecoder, folds: bool = True) -> None:
        """``folds``: the learned shortcuts' beta through their 1x1 convs and the 4x phase upsampling's
        middle phases merged (module doc); off, the decoder as regrouped before them (benchmarks compare)."""
        super().__init__()
        if not dec.spectral_norm_folded:
            raise ValueError("regroup a SPADEDecoder after fold_spectral_norm_()")
        fold = bool(folds)
        self.fc, self.conv_img = dec.fc, dec.conv_img
        middle = dec.middle_blocks()
        self.middle = nn.ModuleList(_RegroupedBlock(b) for b in middle)
        self.middle_counts = [len(_RegroupedBlock.norms_of(b)) for b in middle]
        self.middle_shared = _StackedConv([n.mlp_shared[0] for b in middle for n in _RegroupedBlock.norms_of(b)], 1)
        self.up_0, self.up_1 = _RegroupedBlock(dec.up_0, fold), _RegroupedBlock(dec.up_1, fold)
        self.up_0_shared = _StackedConv([n.mlp_shared[0] for n in _RegroupedBlock.norms_of(dec.up_0)], 2)
        self.up_1_shared = _StackedConv([n.mlp_shared[0] for n in _RegroupedBlock.norms_of(dec.up_1)], 4, fold)

    def forward_logits(self, feature: torch.Tensor) -> torch.Tensor:
        seg = feature
        x = self.fc(feature)
        actvs = self.middle_shared(seg)
        start = 0
        for block, n in zip(self.middle, self.middle_counts):
            x = block(x, actvs[start:start + n])
            start += n
        x = self.up_0(F.interpolate(x, scale_factor=2.0, mode="nearest"), self.up_0_shared(seg))
        x = self.up_1(F.interpolate(x, scale_factor=2.0, mode="nearest"), self.up_1_shared(seg))
        return self.conv_img(F.leaky_relu(x, 0.2))

    def forward(self, feature: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.forward_logits(feature))
