"""Ditto's regrouped warp network and SPADE decoder (engines/ditto/models/regrouped.py) give the
plain modules' outputs up to rounding and leave the plain modules untouched."""
from __future__ import annotations

import pytest
import torch

from newsstudio.accel.depth_sliced_conv3d import DepthSlicedConv3d
from newsstudio.accel.tap_sum_conv import TapSumConv2d
from newsstudio.engines.ditto.models import SPADEDecoder, WarpingNetwork
from newsstudio.engines.ditto.models.regrouped import PhaseUpBlock3d, RegroupedSPADEDecoder, regrouped_warp
from newsstudio.weights.seeded import fill_seeded_, seeded_input


def _relerr(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@torch.no_grad()
def test_regrouped_warp_equals_warp() -> None:
    m = fill_seeded_(WarpingNetwork(), salt=5).eval()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    fast = regrouped_warp(m)
    dense = fast.dense_motion_network
    assert isinstance(dense.mask, DepthSlicedConv3d) and isinstance(dense.hourglass.decoder.conv, DepthSlicedConv3d)
    assert isinstance(dense.hourglass.encoder.down_blocks[0].conv, DepthSlicedConv3d)
    assert all(isinstance(b, PhaseUpBlock3d) for b in dense.hourglass.decoder.up_blocks)
    assert isinstance(dense.occlusion, TapSumConv2d)
    feat = seeded_input("t.feat", (2, 32, 16, 32, 32))
    kp_s = seeded_input("t.kps", (2, 21, 3), scale=0.3)
    kp_d = kp_s + seeded_input("t.kpd", (2, 21, 3), scale=0.05)
    ref, ref_dense = m.forward_debug(feat, kp_s, kp_d)
    got, got_dense = fast.forward_debug(feat, kp_s, kp_d)
    assert _relerr(got, ref) < 1e-5
    for k in ("mask", "deformation", "occlusion_map"):
        assert _relerr(got_dense[k], ref_dense[k]) < 1e-5, k
    assert all(torch.equal(v, m.state_dict()[k]) for k, v in before.items())  # the plain network is unchanged
    assert type(m.dense_motion_network.mask) is torch.nn.Conv3d


@torch.no_grad()
def test_regrouped_spade_decoder_equals_decoder() -> None:
    m = fill_seeded_(SPADEDecoder(), salt=7).eval().fold_spectral_norm_()
    fast = RegroupedSPADEDecoder(m)
    # the learned shortcuts' beta through their 1x1 convs: gamma + beta of 256 / 64 channels, not 512 / 256
    assert fast.up_0.shortcut.gamma_beta.out_channels == 512 + 256 and fast.up_1.shortcut.gamma_beta.out_channels == 256 + 64
    x = seeded_input("t.spade", (2, 256, 8, 8))
    ref = m.forward_logits(x)
    got = fast.forward_logits(x)
    assert got.shape == ref.shape == (2, 3, 64, 64)
    assert _relerr(got, ref) < 1e-5
    assert torch.equal(fast(x), torch.sigmoid(got))
    unfolded = RegroupedSPADEDecoder(m, folds=False)  # the benchmarks' comparison
    assert unfolded.up_1.shortcut is None and _relerr(unfolded.forward_logits(x), ref) < 1e-5
    # 4x phase upsampling of the 256x256 activations: 9 distinct phase kernels merged, 16 unmerged
    assert fast.up_1_shared.conv.weight.shape[0] == 9 * 384 and unfolded.up_1_shared.conv.weight.shape[0] == 16 * 384


def test_regrouping_needs_a_folded_decoder() -> None:
    with pytest.raises(ValueError, match="fold_spectral_norm_"):
        RegroupedSPADEDecoder(SPADEDecoder())


@pytest.mark.parametrize("name", ["warp", "spade"])
def test_regrouped_forwards_have_no_graph_breaks(name: str) -> None:
    """Dynamo captures each regrouped forward as ONE graph, as the plain ones (torch.compile)."""
    torch._dynamo.reset()
    if name == "warp":
        m = regrouped_warp(WarpingNetwork().eval())
        args = (torch.randn(1, 32, 16, 32, 32), torch.randn(1, 21, 3) * 0.3, torch.randn(1, 21, 3) * 0.3)
    else:
        m, args = RegroupedSPADEDecoder(SPADEDecoder().eval().fold_spectral_norm_()), (torch.randn(1, 256, 4, 4),)
    compiled = torch.compile(m.eval(), backend="eager", fullgraph=True, dynamic=False)
    with torch.no_grad():
        torch.testing.assert_close(compiled(*args), m(*args), rtol=1e-5, atol=1e-6)
