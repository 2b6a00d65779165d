"""Properties of the Ditto image networks that the golden cases do not cover: batching, the
spectral-norm implementation and its folding, and graph-break-free forwards (for torch.compile)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from newsstudio.engines.ditto.models import AppearanceFeatureExtractor, MotionExtractor, SPADEDecoder, WarpingNetwork
from newsstudio.engines.ditto.models.blocks import SpectralNormConv2d
from newsstudio.weights.seeded import fill_seeded_, seeded_input


def _relerr(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@torch.no_grad()
def test_warping_batch_of_two_equals_two_single_runs() -> None:
    m = fill_seeded_(WarpingNetwork(), salt=5).eval()
    feat = seeded_input("t.feat", (2, 32, 16, 32, 32))
    kp_s = seeded_input("t.kps", (2, 21, 3), scale=0.3)
    kp_d = kp_s + seeded_input("t.kpd", (2, 21, 3), scale=0.05)
    out, dense = m.forward_debug(feat, kp_s, kp_d)
    assert out.shape == (2, 256, 32, 32)
    for i in range(2):
        o1, d1 = m.forward_debug(feat[i : i + 1], kp_s[i : i + 1], kp_d[i : i + 1])
        assert _relerr(out[i : i + 1], o1) < 1e-5
        for k in ("mask", "deformation", "occlusion_map"):
            assert _relerr(dense[k][i : i + 1], d1[k]) < 1e-5, k
    # The two samples really differ (so equality above is not trivial).
    assert _relerr(out[0:1], out[1:2]) > 0.1


def _reference_style_conv(cin: int, cout: int, k: int, bias: bool) -> nn.Module:
    """The official way: old-style torch.nn.utils.spectral_norm around a Conv2d."""
    return torch.nn.utils.spectral_norm(nn.Conv2d(cin, cout, k, padding=k // 2, bias=bias))


@pytest.mark.parametrize("bias,k", [(True, 3), (False, 1)])
def test_spectral_norm_conv_matches_torch_utility(bias: bool, k: int) -> None:
    torch.manual_seed(0)
    ref = _reference_style_conv(6, 5, k, bias)
    ours = SpectralNormConv2d(6, 5, k, padding=k // 2, bias=bias)
    assert list(ours.state_dict()) == list(ref.state_dict())  # same keys, same order
    ours.load_state_dict(ref.state_dict(), strict=True)  # incl. the utility's state_dict metadata
    x = torch.randn(2, 6, 7, 7)
    ref.eval(), ours.eval()
    with torch.no_grad():
        assert torch.allclose(ours(x), ref(x), rtol=1e-5, atol=1e-6)
    # Training mode: one power iteration updates u, v identically.
    ref.train(), ours.train()
    with torch.no_grad():
        assert torch.allclose(ours(x), ref(x), rtol=1e-5, atol=1e-6)
    assert torch.allclose(ours.weight_u, ref.weight_u, atol=1e-6)
    assert torch.allclose(ours.weight_v, ref.weight_v, atol=1e-6)


@torch.no_grad()
def test_fold_spectral_norm_keeps_outputs() -> None:
    m = fill_seeded_(SPADEDecoder(), salt=7).eval()
    x = seeded_input("t.spade", (2, 256, 8, 8))
    before = m.forward_logits(x)
    n_sn = sum(isinstance(mod, SpectralNormConv2d) for mod in m.modules())
    assert n_sn == 6 * 2 + 2 * 3  # conv_0, conv_1 per block + conv_s in the two up blocks
    assert not m.spectral_norm_folded
    m.fold_spectral_norm_()
    assert m.spectral_norm_folded
    assert not any(k.endswith(("weight_orig", "weight_u", "weight_v")) for k in m.state_dict())
    after = m.forward_logits(x)
    assert before.shape == after.shape == (2, 3, 64, 64)
    assert _relerr(after, before) < 1e-6
    assert _relerr(torch.sigmoid(after), m(x)) == 0.0


@pytest.mark.parametrize("name", ["afe", "motion", "warp", "spade", "spade_folded"])
def test_forward_has_no_graph_breaks(name: str) -> None:
    """Dynamo captures each forward as ONE graph (no .item(), no data-dependent Python branches)."""
    torch._dynamo.reset()
    if name == "afe":
        m, args = AppearanceFeatureExtractor(), (torch.rand(1, 3, 32, 32),)
    elif name == "motion":
        m, args = MotionExtractor(), (torch.rand(1, 3, 64, 64),)
    elif name == "warp":
        m, args = WarpingNetwork(), (torch.randn(1, 32, 16, 32, 32), torch.randn(1, 21, 3) * 0.3, torch.randn(1, 21, 3) * 0.3)
    else:
        m, args = SPADEDecoder(), (torch.randn(1, 256, 4, 4),)
        if name == "spade_folded":
            m.fold_spectral_norm_()
    m.eval()
    compiled = torch.compile(m, backend="eager", fullgraph=True, dynamic=False)
    with torch.no_grad():
        out = compiled(*args)
        ref = m(*args)
    outs, refs = (out, ref) if isinstance(out, tuple) else ((out,), (ref,))
    for o, r in zip(outs, refs):
        assert torch.allclose(o, r, rtol=1e-5, atol=1e-6)
