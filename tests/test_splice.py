"""NV12 ROI splicing against a straightforward float reference (composite in RGB, then convert).

Chroma is blended premultiplied (block mean of mask*ROI plus the uncovered share of the
background chroma), which is algebraically the reference. Measured on 6 random cases: max
|diff| 0 in Y and in UV; the test allows 1 level for float rounding order.
"""
from __future__ import annotations

import pytest
import torch

from newsstudio.compose.colour import nv12_to_planes, rgb_to_nv12, yuv_planes_to_rgb
from newsstudio.compose.splice import check_roi_geometry, sample_crops_to_roi, splice_nv12


def _reference(bg_nv12, roi, mask, origins):
    y, uv = nv12_to_planes(bg_nv12)
    rgb = yuv_planes_to_rgb(y, uv)  # float, unclamped: exact inverse of the forward matrix
    out = rgb.clone()
    hr, wr = mask.shape[1:]
    for b in range(bg_nv12.shape[0]):
        x0, y0 = origins[b].tolist()
        m = mask[b].unsqueeze(-1)
        out[b, y0 : y0 + hr, x0 : x0 + wr] = rgb[b, y0 : y0 + hr, x0 : x0 + wr] * (1 - m) + roi[b] * m
    return rgb_to_nv12(out.clamp(0, 255) / 255.0)


def _case(seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    b, h, w, hr, wr = 3, 48, 64, 20, 26
    # smooth (natural-image-like) background: per-pixel noise would make out-of-gamut RGB after
    # chroma subsampling, which no reference can reproduce without clamping
    low = torch.rand(b, 3, h // 8, w // 8, generator=g)
    rgb = (torch.nn.functional.interpolate(low, size=(h, w), mode="bilinear", align_corners=False) * 200 + 28).round().to(torch.uint8).permute(0, 2, 3, 1)
    bg = rgb_to_nv12(rgb)
    roi = torch.rand(b, hr, wr, 3, generator=g) * 255
    yy, xx = torch.meshgrid(torch.linspace(-1, 1, hr), torch.linspace(-1, 1, wr), indexing="ij")
    mask = (1.2 - (xx**2 + yy**2)).clamp(0, 1).expand(b, hr, wr).contiguous()
    origins = torch.tensor([[0, 0], [w - wr, h - hr], [10, 14]])
    return bg.to(device), roi.to(device), mask.to(device), origins.to(device)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_float_reference(seed):
    bg, roi, mask, origins = _case(seed)
    ours = splice_nv12(bg, roi, mask, origins)
    ref = _reference(bg, roi, mask, origins)
    h = bg.shape[1] * 2 // 3
    dy = (ours[:, :h].int() - ref[:, :h].int()).abs()
    duv = (ours[:, h:].int() - ref[:, h:].int()).abs()
    assert dy.max() <= 1, f"Y max error {dy.max()}"
    assert duv.max() <= 1, f"UV max error {duv.max()}"
    assert not torch.equal(ours, bg), "the ROI must change the frame"


def test_touches_only_the_roi_and_not_the_input():
    bg, roi, mask, origins = _case(3)
    keep = bg.clone()
    ours = splice_nv12(bg, roi, torch.ones_like(mask), origins)
    assert torch.equal(bg, keep), "background must not be modified unless passed as out"
    h = bg.shape[1] * 2 // 3
    hr, wr = mask.shape[1:]
    for b in range(bg.shape[0]):
        x0, y0 = origins[b].tolist()
        outside = torch.ones(h, bg.shape[2], dtype=torch.bool)
        outside[y0 : y0 + hr, x0 : x0 + wr] = False
        assert torch.equal(ours[b, :h][outside], bg[b, :h][outside])


def test_zero_mask_is_identity_and_bad_geometry_is_clear():
    bg, roi, mask, origins = _case(4)
    assert torch.equal(splice_nv12(bg, roi, torch.zeros_like(mask), origins), bg)
    with pytest.raises(ValueError, match="even"):
        check_roi_geometry(torch.tensor([[1, 0]]), (20, 26), (48, 64))
    with pytest.raises(ValueError, match="leaves"):
        check_roi_geometry(torch.tensor([[60, 0]]), (20, 26), (48, 64))


def test_sample_crops_identity_grid():
    crops = torch.rand(2, 3, 16, 16)
    ys, xs = torch.meshgrid(torch.linspace(-1 + 1 / 16, 1 - 1 / 16, 16), torch.linspace(-1 + 1 / 16, 1 - 1 / 16, 16), indexing="ij")
    grid = torch.stack([xs, ys], -1).expand(2, 16, 16, 2)
    assert torch.allclose(sample_crops_to_roi(crops, grid), crops.permute(0, 2, 3, 1), atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_cuda_equals_cpu():
    bg, roi, mask, origins = _case(5)
    cpu = splice_nv12(bg, roi, mask, origins)
    gpu = splice_nv12(*(t.cuda() for t in (bg, roi, mask, origins))).cpu()
    assert (cpu.int() - gpu.int()).abs().max() <= 1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_splicing_at_precomputed_offsets_gives_the_same_bytes_as_at_origins(seed):
    """A live session splices at its avatar's `roi_offsets` (computed once, gathered per request):
    the frames must be byte-identical to splicing at the origins, and the two ways are exclusive."""
    from newsstudio.compose.splice import roi_offsets

    bg, roi, mask, origins = _case(seed)
    h, w = bg.shape[1] * 2 // 3, bg.shape[2]
    at_origins = splice_nv12(bg, roi, mask, origins)
    at_offsets = splice_nv12(bg, roi, mask, offsets=roi_offsets(origins, (h, w)))
    assert torch.equal(at_offsets, at_origins)
    assert not torch.equal(at_origins, bg)  # the splice changed the frames: the comparison can fail
    with pytest.raises(ValueError, match="origins or their offsets, not both"):
        splice_nv12(bg, roi, mask, origins, offsets=roi_offsets(origins, (h, w)))
    with pytest.raises(ValueError, match="origins or their offsets"):
        splice_nv12(bg, roi, mask)
