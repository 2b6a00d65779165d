"""Phase upsampling (accel/upsample_conv.py): nearest 2x + 3x3 conv as 2x2 phase convolutions."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from newsstudio.accel.upsample_conv import PhaseUpsampleConv, with_phase_upsampling


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
def test_phase_conv_equals_upsample_then_conv(bias, layout):
    torch.manual_seed(0)
    conv = nn.Conv2d(6, 5, 3, padding=1, bias=bias).to(memory_format=layout)
    x = torch.randn(3, 6, 7, 10).to(memory_format=layout)  # odd height: borders of both phases
    ref = conv(F.interpolate(x, scale_factor=2, mode="nearest"))
    got = PhaseUpsampleConv(conv)(x)
    assert got.shape == ref.shape == (3, 5, 14, 20)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    # the fused weights do 16 instead of 36 multiply-adds per channel pair and input pixel
    assert PhaseUpsampleConv(conv).weight.shape == (20, 6, 2, 2)


@pytest.mark.parametrize("conv", [nn.Conv2d(4, 4, 3, padding=0), nn.Conv2d(4, 4, 3, padding=1, stride=2),
                                  nn.Conv2d(4, 4, 5, padding=2), nn.Conv2d(4, 4, 3, padding=1, groups=2)])
def test_other_convolutions_are_refused(conv):
    with pytest.raises(ValueError, match="3x3 conv"):
        PhaseUpsampleConv(conv)


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
