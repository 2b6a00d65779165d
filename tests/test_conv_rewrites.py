"""Exact convolution rewrites (accel/upsample_conv.py, accel/depth_sliced_conv3d.py): same results up to rounding, fewer FLOPs or better-shaped kernels."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from newsstudio.accel.upsample_conv import PhaseUpsampleConv, with_phase_upsampling


class _PlainConv(nn.Module):
    """What a `PhaseUpsampleConv` slot computes (its padding-1 conv), by F.conv2d."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.weight, self.bias = weight, bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.weight, self.bias, padding=1)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("scale", [2, 3, 4])
def test_phase_conv_equals_upsample_then_conv(bias, layout, scale):
    torch.manual_seed(0)
    conv = nn.Conv2d(6, 5, 3, padding=1, bias=bias).to(memory_format=layout)
    x = torch.randn(3, 6, 7, 10).to(memory_format=layout)  # odd height: borders of every phase
    ref = conv(F.interpolate(x, scale_factor=scale, mode="nearest"))
    got = PhaseUpsampleConv(conv, scale)(x)
    assert got.shape == ref.shape == (3, 5, 7 * scale, 10 * scale)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert got.is_contiguous(memory_format=layout)  # channel-minor interleave: the next layer reads no gather
    # another implementation in the conv slot (the Triton conv): the same result, in the input's
    # layout, so a channels-last network's next layer reads it without a gather
    slotted = PhaseUpsampleConv(conv, scale)
    slotted.conv = _PlainConv(slotted.weight, slotted.bias)
    got = slotted(x)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert got.is_contiguous(memory_format=layout)
    # either interleave asked for: the same result; "nchw" always in NCHW order (benchmarks/levers.py times it)
    for interleave, out_layout in (("channels_last", layout), ("nchw", torch.contiguous_format)):
        plain = PhaseUpsampleConv(conv, scale)
        plain.interleave = interleave
        got = plain(x)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
        assert got.is_contiguous(memory_format=out_layout)
    # 4 taps per phase: 16 instead of 36 multiply-adds per channel pair and input pixel (scale 2); at
    # larger scales the middle phases are alike and computed once (9 kernels: 36 instead of 144 at 4)
    distinct = min(scale, 3) ** 2
    assert PhaseUpsampleConv(conv, scale).weight.shape == (5 * distinct, 6, 2, 2)
    unmerged = PhaseUpsampleConv(conv, scale, merge_middle_phases=False)  # the benchmarks' comparison
    assert unmerged.weight.shape == (5 * scale * scale, 6, 2, 2)
    torch.testing.assert_close(unmerged(x), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("conv", [nn.Conv2d(4, 4, 3, padding=0), nn.Conv2d(4, 4, 3, padding=1, stride=2),
                                  nn.Conv2d(4, 4, 5, padding=2), nn.Conv2d(4, 4, 3, padding=1, groups=2)])
def test_other_convolutions_are_refused(conv):
    with pytest.raises(ValueError, match="3x3 conv"):
        PhaseUpsampleConv(conv)


def test_unknown_interleave_is_refused():
    up = PhaseUpsampleConv(nn.Conv2d(4, 4, 3, padding=1))
    up.interleave = "nhwc"
    with pytest.raises(ValueError, match="interleave must be one of"):
        up(torch.randn(1, 4, 3, 3))


def test_vae_decoder_copy_matches_and_leaves_the_original_alone():
    from newsstudio.engines.musetalk.engine import TINY_VAE_CONFIG
    from newsstudio.engines.musetalk.weights import random_vae

    vae = random_vae(3, "cpu", config=TINY_VAE_CONFIG)
    before = {k: v.clone() for k, v in vae.state_dict().items()}
    fast, n = with_phase_upsampling(vae.decoder)
    assert n == 3  # the SD VAE decoder's three Upsample2D layers
    assert sum(type(m).__name__ == "Upsample2D" for m in vae.decoder.modules()) == 3  # original untouched
    shared = {id(p) for p in vae.decoder.parameters()}
    assert all(id(p) in shared for name, p in fast.named_parameters() if "up_conv" not in name)  # no weight copy
    z = torch.randn(2, 4, 16, 16, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        ref = vae.decoder(vae.post_quant_conv(z))
        got = fast(vae.post_quant_conv(z))
    assert ((got - ref).norm() / ref.norm()).item() < 1e-5
    assert all(torch.equal(v, vae.state_dict()[k]) for k, v in before.items())


@pytest.mark.parametrize("shape,kernel,padding", [((6, 22, 5, 9, 8), 7, 3), ((5, 3, 4, 6, 7), 3, 1), ((4, 8, 3, 5, 5), (3, 1, 1), (1, 0, 0))])
def test_depth_sliced_conv3d_equals_conv3d(shape, kernel, padding):
    from newsstudio.accel.depth_sliced_conv3d import DepthSlicedConv3d

    cin, cout, d, h, w = shape
    torch.manual_seed(1)
    conv = nn.Conv3d(cin, cout, kernel, padding=padding)
    x = torch.randn(2, cin, d, h, w)
    ref = conv(x)
    got = DepthSlicedConv3d(conv)(x)
    assert got.shape == ref.shape
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="stride-1"):
        DepthSlicedConv3d(nn.Conv3d(cin, cout, 3, stride=2))


def test_depth_sliced_conv3d_of_an_upsampled_volume():
    from newsstudio.accel.depth_sliced_conv3d import DepthSlicedConv3d

    torch.manual_seed(2)
    conv = nn.Conv3d(16, 8, 3, padding=1)
    x = torch.randn(2, 16, 4, 5, 6)
    ref = conv(F.interpolate(x, scale_factor=(1.0, 2.0, 2.0), mode="nearest"))
    got = DepthSlicedConv3d(conv, upsample_hw=2)(x)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cin,cout,kernel,padding", [(72, 1, 7, 3), (16, 3, 5, 2), (8, 2, (3, 5), (0, 1))])
def test_tap_sum_conv_equals_conv2d(cin, cout, kernel, padding):
    from newsstudio.accel.tap_sum_conv import TapSumConv2d

    torch.manual_seed(3)
    conv = nn.Conv2d(cin, cout, kernel, padding=padding)
    x = torch.randn(2, cin, 9, 11)
    ref = conv(x)
    got = TapSumConv2d(conv)(x)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert TapSumConv2d(conv).weight.shape[0] % 8 == 0  # the GEMM's N stays tensor-core aligned
    with pytest.raises(ValueError, match="stride-1"):
        TapSumConv2d(nn.Conv2d(cin, cout, 3, stride=2))

