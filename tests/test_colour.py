"""Colour conversion (newsstudio.compose.colour) against FFmpeg's own swscale, through PyAV.

swscale has several code paths. Its default (fast) path filters chroma with its own taps and
uses coarse fixed-point tables (neutral grey Y=128 comes back as 129 instead of 130.4), so the
exact-arithmetic checks use the flags that make swscale compute the textbook conversion:
``AREA | ACCURATE_RND | FULL_CHR_H_INP`` averages each 2x2 block for RGB -> 4:2:0 (our rule),
``POINT | ACCURATE_RND | FULL_CHR_H_INT`` replicates chroma for 4:2:0 -> RGB (our rule).
The default path is also checked, on smooth content where filters agree.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from av import VideoFrame
from av.video.reformatter import ColorRange, Colorspace, Interpolation
from PIL import Image

from newsstudio.compose.colour import (
    nv12_to_planes,
    nv12_to_rgb,
    planes_to_nv12,
    quantize_uint8,
    rgb_to_nv12,
    rgb_to_yuv420p,
    rgb_to_yuv_planes,
    yuv420p_to_rgb,
    yuv_coefficients,
    yuv_planes_to_rgb,
)

AREA_EXACT = Interpolation.AREA | Interpolation.ACCURATE_RND | Interpolation.FULL_CHR_H_INP
POINT_EXACT = Interpolation.POINT | Interpolation.ACCURATE_RND | Interpolation.FULL_CHR_H_INT

CASES = [
    ("bt709", Colorspace.ITU709, False, ColorRange.MPEG),
    ("bt709", Colorspace.ITU709, True, ColorRange.JPEG),
    ("bt601", Colorspace.ITU601, False, ColorRange.MPEG),
    ("bt601", Colorspace.ITU601, True, ColorRange.JPEG),
    ("bt2020", Colorspace.BT2020, False, ColorRange.MPEG),
]
IDS = [f"{m}-{'full' if f else 'limited'}" for m, _, f, _ in CASES]


def smooth_rgb(h: int = 64, w: int = 96) -> np.ndarray:
    """A smooth colour pattern: no chroma edges, so any sane chroma filter agrees."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 128 + 100 * np.sin(xx / 17 + yy / 29)
    g = 128 + 100 * np.cos(xx / 23 - yy / 13)
    b = 128 + 90 * np.sin((xx + yy) / 31)
    return np.clip(np.stack([r, g, b], -1), 0, 255).astype(np.uint8)


def noise_rgb(h: int = 48, w: int = 64, seed: int = 0) -> np.ndarray:
    """White noise: the harshest case for chroma subsampling (every 2x2 block differs)."""
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def ffmpeg_rgb_to(fmt: str, rgb: np.ndarray, cs, cr, interpolation=None) -> np.ndarray:
    frame = VideoFrame.from_ndarray(rgb, format="rgb24")
    out = frame.reformat(format=fmt, dst_colorspace=cs, dst_color_range=cr, interpolation=interpolation)
    return out.to_ndarray()


def ffmpeg_to_rgb(fmt: str, buf: np.ndarray, cs, cr, interpolation=None) -> np.ndarray:
    frame = VideoFrame.from_ndarray(buf, format=fmt)
    return frame.reformat(
        format="rgb24", src_colorspace=cs, src_color_range=cr, interpolation=interpolation
    ).to_ndarray()


def maxdiff(a, b) -> int:
    return int(np.abs(np.asarray(a, dtype=np.int32) - np.asarray(b, dtype=np.int32)).max())


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float(10 * np.log10(255.0**2 / mse))


@pytest.mark.parametrize("matrix,cs,full,cr", CASES, ids=IDS)
def test_rgb_to_nv12_matches_ffmpeg_default_on_smooth_image(matrix, cs, full, cr):
    """Default ``reformat(format='nv12', dst_colorspace, dst_color_range)``: measured max
    |diff| Y 1, UV 1 (bt601 full: UV 2); bound Y <= 1, UV <= 2."""
    rgb = smooth_rgb()
    h = rgb.shape[0]
    ref = ffmpeg_rgb_to("nv12", rgb, cs, cr)
    ours = rgb_to_nv12(torch.from_numpy(rgb), matrix, full).numpy()
    assert ours.shape == ref.shape == (h * 3 // 2, rgb.shape[1])
    assert maxdiff(ours[:h], ref[:h]) <= 1
    assert maxdiff(ours[h:], ref[h:]) <= 2


@pytest.mark.parametrize("matrix,cs,full,cr", CASES, ids=IDS)
def test_rgb_to_nv12_matches_ffmpeg_exact_path_on_noise(matrix, cs, full, cr):
    """swscale with 2x2 area averaging and accurate rounding: measured max |diff| Y 1, UV 1
    on white noise (so the 2x2 averaging rule is the same, not just similar)."""
    rgb = noise_rgb()
    h = rgb.shape[0]
    ref = ffmpeg_rgb_to("nv12", rgb, cs, cr, AREA_EXACT)
    ours = rgb_to_nv12(rgb, matrix, full).numpy()
    assert maxdiff(ours[:h], ref[:h]) <= 1
    assert maxdiff(ours[h:], ref[h:]) <= 1


@pytest.mark.parametrize("matrix,cs,full,cr", CASES[:4], ids=IDS[:4])
def test_rgb_to_yuv420p_matches_ffmpeg(matrix, cs, full, cr):
    """Planar I420 from the same planes: measured max |diff| 1 over the whole buffer."""
    rgb = noise_rgb(seed=1)
    ref = ffmpeg_rgb_to("yuv420p", rgb, cs, cr, AREA_EXACT)
    ours = rgb_to_yuv420p(rgb, matrix, full).numpy()
    assert ours.shape == ref.shape
    assert maxdiff(ours, ref) <= 1


def test_rgb_to_nv12_natural_image_matches_ffmpeg(media):
    """portrait.png (1432x1432, sharp painted edges), bt709 limited, exact swscale path:
    measured max |diff| Y 1, UV 1."""
    rgb = np.asarray(Image.open(media("portrait.png")).convert("RGB"))
    h = rgb.shape[0]
    ref = ffmpeg_rgb_to("nv12", rgb, Colorspace.ITU709, ColorRange.MPEG, AREA_EXACT)
    ours = rgb_to_nv12(rgb).numpy()
    assert maxdiff(ours[:h], ref[:h]) <= 1
    assert maxdiff(ours[h:], ref[h:]) <= 1


def random_420(h: int, w: int, full: bool, seed: int = 0) -> np.ndarray:
    """A random but in-range NV12 buffer (limited range: Y 16..235, C 16..240)."""
    rng = np.random.default_rng(seed)
    lo_y, hi_y, lo_c, hi_c = (0, 256, 0, 256) if full else (16, 236, 16, 241)
    buf = np.empty((h * 3 // 2, w), np.uint8)
    buf[:h] = rng.integers(lo_y, hi_y, (h, w))
    buf[h:] = rng.integers(lo_c, hi_c, (h // 2, w))
    return buf


@pytest.mark.parametrize("matrix,cs,full,cr", CASES, ids=IDS)
def test_nv12_to_rgb_matches_ffmpeg_exact_path(matrix, cs, full, cr):
    """Random NV12 -> RGB vs swscale with replicated chroma and accurate rounding: measured
    max |diff| 1 (on < 0.4 % of values)."""
    nv12 = random_420(48, 64, full)
    ref = ffmpeg_to_rgb("nv12", nv12, cs, cr, POINT_EXACT)
    ours = nv12_to_rgb(torch.from_numpy(nv12), matrix, full).numpy()
    assert ours.shape == ref.shape == (48, 64, 3)
    assert maxdiff(ours, ref) <= 1


def test_nv12_to_rgb_matches_ffmpeg_default_on_smooth_image():
    """swscale's default fast path (bilinear vertical chroma, coarse tables) on smooth
    content: measured max |diff| 7, mean 2.3 code values; bound max <= 8, mean <= 3."""
    nv12 = rgb_to_nv12(smooth_rgb()).numpy()
    ref = ffmpeg_to_rgb("nv12", nv12, Colorspace.ITU709, ColorRange.MPEG)
    ours = nv12_to_rgb(nv12).numpy()
    d = np.abs(ours.astype(np.int32) - ref.astype(np.int32))
    assert d.max() <= 8 and d.mean() <= 3.0


@pytest.mark.parametrize("matrix,cs,full,cr", CASES[:4], ids=IDS[:4])
def test_yuv420p_to_rgb_matches_ffmpeg(matrix, cs, full, cr):
    """I420 -> RGB, same reference path: measured max |diff| 1."""
    buf = random_420(48, 64, full, seed=2)  # same byte budget as NV12: a valid random I420
    ref = ffmpeg_to_rgb("yuv420p", buf, cs, cr, POINT_EXACT)
    assert maxdiff(yuv420p_to_rgb(buf, matrix, full).numpy(), ref) <= 1


def test_round_trip_natural_image_psnr(media):
    """rgb -> nv12 -> rgb on portrait.png: measured 44.9 dB (bt709 limited); bound 40 dB."""
    rgb = np.asarray(Image.open(media("portrait.png")).convert("RGB"))
    back = nv12_to_rgb(rgb_to_nv12(rgb)).numpy()
    assert psnr(back, rgb) > 40.0
    back420 = yuv420p_to_rgb(rgb_to_yuv420p(rgb)).numpy()
    np.testing.assert_array_equal(back420, back)  # same planes, only the layout differs


def test_known_code_values():
    """Black/white/grey and the primaries land on the code values the standards define."""
    px = torch.tensor([[0, 0, 0], [255, 255, 255], [128, 128, 128], [255, 0, 0]], dtype=torch.uint8)
    rgb = px.repeat_interleave(2, 0).reshape(4, 2, 1, 3).expand(4, 2, 2, 3)  # four 2x2 patches
    y, uv = nv12_to_planes(rgb_to_nv12(rgb))
    assert y[:, 0, 0].tolist() == [16, 235, 126, 63]  # 16 + 219 * (0, 1, 128/255, 0.2126)
    assert uv[:3, 0, 0].tolist() == [[128, 128]] * 3
    assert uv[3, 0, 0].tolist() == [102, 240]  # red: Cb = 128 - 224*0.2126/1.8556, Cr = 240
    yf, uvf = nv12_to_planes(rgb_to_nv12(rgb, full_range=True))
    assert yf[:2, 0, 0].tolist() == [0, 255]


def test_float_input_equals_uint8_input():
    rgb = noise_rgb(16, 24)
    as_float = torch.from_numpy(rgb).float() / 255.0
    assert torch.equal(rgb_to_nv12(as_float), rgb_to_nv12(rgb))
    # float16 cannot hold k/255 exactly: one code value of slack.
    assert maxdiff(rgb_to_nv12(as_float.half()), rgb_to_nv12(rgb)) <= 1


def test_leading_batch_dims():
    frames = torch.from_numpy(np.stack([noise_rgb(16, 24, seed=s) for s in range(6)]))
    single = [rgb_to_nv12(f) for f in frames]
    batched = rgb_to_nv12(frames.reshape(2, 3, 16, 24, 3))
    assert batched.shape == (2, 3, 24, 24)
    assert torch.equal(batched.reshape(6, 24, 24), torch.stack(single))
    back = nv12_to_rgb(batched)
    assert back.shape == (2, 3, 16, 24, 3)
    assert torch.equal(back[1, 2], nv12_to_rgb(single[5]))
    i420 = rgb_to_yuv420p(frames)
    assert i420.shape == (6, 24, 24)
    assert torch.equal(yuv420p_to_rgb(i420), nv12_to_rgb(rgb_to_nv12(frames)))


def test_height_not_multiple_of_four():
    """H = 2 mod 4: the I420 chroma planes do not fill whole rows; layout must still hold."""
    rgb = noise_rgb(18, 20, seed=3)
    ref = ffmpeg_rgb_to("yuv420p", rgb, Colorspace.ITU709, ColorRange.MPEG, AREA_EXACT)
    assert maxdiff(rgb_to_yuv420p(rgb).numpy(), ref) <= 1


def test_planes_are_float_and_invert_exactly():
    """The float planes the splicer blends in are unrounded, and invert to the 2x2-constant
    RGB exactly (to float precision)."""
    rgb = torch.from_numpy(noise_rgb(16, 24)).float()
    blocky = rgb.reshape(8, 2, 12, 2, 3).mean((1, 3), keepdim=True).expand(8, 2, 12, 2, 3).reshape(16, 24, 3)
    y, uv = rgb_to_yuv_planes(blocky / 255.0)
    assert y.dtype == uv.dtype == torch.float32
    assert y.shape == (16, 24) and uv.shape == (8, 12, 2)
    assert not torch.equal(y, torch.round(y))
    back = yuv_planes_to_rgb(y, uv)
    assert torch.allclose(back, blocky, atol=1e-3)
    assert torch.equal(planes_to_nv12(quantize_uint8(y), quantize_uint8(uv)), rgb_to_nv12(blocky / 255.0))


def test_coefficients_are_consistent():
    for matrix in ("bt709", "bt601", "bt2020"):
        for full in (False, True):
            c = yuv_coefficients(matrix, full)
            fwd, off, inv, inv_off = c.tensors(dtype=torch.float64)
            assert torch.allclose(inv @ fwd, torch.eye(3, dtype=torch.float64), atol=1e-12)
            white = fwd @ torch.full((3,), 255.0, dtype=torch.float64) + off
            assert torch.allclose(white, torch.tensor([c.y_range[1], 128.0, 128.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="unknown colour matrix"):
        yuv_coefficients("bt470")  # type: ignore[arg-type]


def test_clear_errors():
    with pytest.raises(ValueError, match="even"):
        rgb_to_nv12(torch.zeros(1, 15, 16, 3, dtype=torch.uint8))
    with pytest.raises(ValueError, match="even"):
        rgb_to_nv12(torch.zeros(16, 17, 3, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"\(\.\.\., H, W, 3\)"):
        rgb_to_nv12(torch.zeros(16, 16, 4, dtype=torch.uint8))
    with pytest.raises(ValueError, match="multiple of 3"):
        nv12_to_rgb(torch.zeros(25, 16, dtype=torch.uint8))
    with pytest.raises(ValueError, match="even"):
        nv12_to_rgb(torch.zeros(27, 15, dtype=torch.uint8))  # H = 18, W odd
    with pytest.raises(TypeError, match="uint8"):
        nv12_to_rgb(torch.zeros(24, 16, dtype=torch.float32))
    with pytest.raises(TypeError, match="uint8 or floating"):
        rgb_to_nv12(torch.zeros(16, 16, 3, dtype=torch.int32))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_cuda_matches_cpu():
    rgb = torch.from_numpy(np.stack([noise_rgb(32, 48, seed=s) for s in range(4)]))
    nv12_cpu = rgb_to_nv12(rgb)
    nv12_gpu = rgb_to_nv12(rgb.cuda())
    assert nv12_gpu.device.type == "cuda"
    assert maxdiff(nv12_gpu.cpu().numpy(), nv12_cpu.numpy()) <= 1
    assert maxdiff(nv12_to_rgb(nv12_cpu.cuda()).cpu().numpy(), nv12_to_rgb(nv12_cpu).numpy()) <= 1


def test_single_plane_conversions_equal_the_planes_of_the_pair():
    """`rgb_to_y` / `rgb_to_uv` (a splice needs one plane of each of two images) are the same
    operations as `rgb_to_yuv_planes`, so the same values to the bit."""
    from newsstudio.compose.colour import rgb_to_uv, rgb_to_y

    g = torch.Generator().manual_seed(3)
    for rgb in (torch.rand(2, 6, 8, 3, generator=g), (torch.rand(6, 8, 3, generator=g) * 255).to(torch.uint8)):
        y, uv = rgb_to_yuv_planes(rgb, "bt601", full_range=True)
        assert torch.equal(rgb_to_y(rgb, "bt601", full_range=True), y)
        assert torch.equal(rgb_to_uv(rgb, "bt601", full_range=True), uv)
    with pytest.raises(ValueError, match="rgb_to_uv: 4:2:0 needs even"):
        rgb_to_uv(torch.rand(5, 8, 3))
