"""RGB <-> YUV 4:2:0 (NV12 and planar I420) in torch, batched, on any device.

Why here and not in FFmpeg: the pipeline renders face ROIs on the GPU and splices them into
background frames that are stored as NV12 (what the H.264 encoder and WebRTC take), so the
conversion has to run where the frames are, on whole batches, without a trip to the CPU.
The splicing code blends in the Y and UV planes directly, so the float planes are public
(:func:`rgb_to_yuv_planes`, :func:`yuv_planes_to_rgb`) alongside the packed uint8 formats.

Conventions (all functions):

* Shapes: RGB is ``(..., H, W, 3)``; NV12 and I420 are ``(..., H*3//2, W)`` uint8 (the
  usual single-buffer layout: H rows of Y, then H/2 rows of interleaved UV for NV12, or the
  U plane then the V plane, each ``H/2 * W/2`` bytes, for I420). Any number of leading batch
  dims, including none. H and W must be even (4:2:0 has one chroma sample per 2x2 block).
* Input RGB may be uint8 (0..255) or floating point in **[0, 1]** (what renderers produce);
  float input is scaled by 255. Arrays from numpy are accepted and turned into tensors.
* Matrix: ``"bt709"`` (HD, the default: what our MP4s are tagged with), ``"bt601"`` (SD, and
  FFmpeg's assumption for untagged video), ``"bt2020"``. Range: limited/"MPEG"
  (Y 16..235, C 16..240; the default, what players assume for H.264) or full/"JPEG".
* Chroma subsampling averages each 2x2 block of RGB (centre-sited chroma). Because the
  conversion is affine, that equals averaging the per-pixel U and V. Upsampling replicates
  each chroma sample over its 2x2 block (nearest), which is what FFmpeg's swscale does for
  same-size 4:2:0 -> RGB, and is the exact adjoint of the averaging.
* Rounding to uint8 is round-half-up (``floor(x + 0.5)``) after clamping to [0, 255]: it is
  deterministic across devices and matches the +0.5 bias of fixed-point converters.
* Arithmetic is float32 whatever the input dtype (float16 loses a code value on Y).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import numpy as np
import torch

__all__ = [
    "Matrix",
    "YuvCoefficients",
    "yuv_coefficients",
    "rgb_to_yuv_planes",
    "rgb_to_y",
    "rgb_to_uv",
    "yuv_planes_to_rgb",
    "rgb_to_nv12",
    "nv12_to_rgb",
    "rgb_to_yuv420p",
    "yuv420p_to_rgb",
    "nv12_to_planes",
    "planes_to_nv12",
    "quantize_uint8",
]

Matrix = Literal["bt709", "bt601", "bt2020"]

# Luma weights (Kr, Kb) of each standard; Kg = 1 - Kr - Kb.
_KR_KB: dict[str, tuple[float, float]] = {
    "bt709": (0.2126, 0.0722),
    "bt601": (0.299, 0.114),
    "bt2020": (0.2627, 0.0593),
}


@dataclass(frozen=True)
class YuvCoefficients:
    """An RGB -> YCbCr affine map in 8-bit code values: ``yuv = forward @ rgb + offset``.

    ``rgb`` is in 0..255; ``yuv`` rows are Y, U (Cb), V (Cr). ``inverse``/``inverse_offset``
    give ``rgb = inverse @ yuv + inverse_offset``. Kept as plain tuples so the object is
    hashable and device-free; :meth:`tensors` makes (cached) torch copies.
    """

    matrix: str
    full_range: bool
    forward: tuple[tuple[float, float, float], ...]
    offset: tuple[float, float, float]
    inverse: tuple[tuple[float, float, float], ...]
    inverse_offset: tuple[float, float, float]

    @property
    def y_range(self) -> tuple[float, float]:
        """(black, white) Y code values."""
        return (0.0, 255.0) if self.full_range else (16.0, 235.0)

    def tensors(
        self, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(forward (3,3), offset (3,), inverse (3,3), inverse_offset (3,))`` on ``device``."""
        return _coefficient_tensors(self, str(torch.device(device or "cpu")), dtype)


@lru_cache(maxsize=None)
def yuv_coefficients(matrix: Matrix = "bt709", full_range: bool = False) -> YuvCoefficients:
    """Coefficients of ``matrix`` (bt709/bt601/bt2020) in limited or full range."""
    if matrix not in _KR_KB:
        raise ValueError(f"unknown colour matrix {matrix!r}; expected one of {sorted(_KR_KB)}")
    kr, kb = _KR_KB[matrix]
    kg = 1.0 - kr - kb
    y_scale, y_off = (255.0, 0.0) if full_range else (219.0, 16.0)
    c_scale = 255.0 if full_range else 224.0
    # Y' = kr R + kg G + kb B;  Pb = (B - Y') / (2 (1 - kb));  Pr = (R - Y') / (2 (1 - kr)).
    luma = np.array([kr, kg, kb])
    pb = (np.array([0.0, 0.0, 1.0]) - luma) / (2.0 * (1.0 - kb))
    pr = (np.array([1.0, 0.0, 0.0]) - luma) / (2.0 * (1.0 - kr))
    fwd = np.stack([luma * y_scale, pb * c_scale, pr * c_scale]) / 255.0
    off = np.array([y_off, 128.0, 128.0])
    inv = np.linalg.inv(fwd)
    inv_off = -inv @ off
    as_rows = lambda m: tuple(tuple(float(v) for v in row) for row in m)  # noqa: E731
    return YuvCoefficients(
        matrix=matrix,
        full_range=bool(full_range),
        forward=as_rows(fwd),
        offset=tuple(float(v) for v in off),  # type: ignore[arg-type]
        inverse=as_rows(inv),
        inverse_offset=tuple(float(v) for v in inv_off),  # type: ignore[arg-type]
    )


@lru_cache(maxsize=64)
def _coefficient_tensors(
    coeffs: YuvCoefficients, device: str, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    mk = lambda v: torch.tensor(v, dtype=dtype, device=device)  # noqa: E731
    return mk(coeffs.forward), mk(coeffs.offset), mk(coeffs.inverse), mk(coeffs.inverse_offset)


def _as_tensor(x: torch.Tensor | np.ndarray, what: str) -> torch.Tensor:
    if isinstance(x, np.ndarray):
        x = np.ascontiguousarray(x)
        return torch.from_numpy(x if x.flags.writeable else x.copy())
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor or numpy array, got {type(x).__name__}")
    return x


def _check_even(h: int, w: int, what: str) -> None:
    if h <= 0 or w <= 0 or h % 2 or w % 2:
        raise ValueError(
            f"{what}: 4:2:0 needs even, non-zero height and width, got {h}x{w} (HxW); "
            "crop or pad the frame by one pixel"
        )


def _rgb_float(rgb: torch.Tensor) -> torch.Tensor:
    """RGB as float32 in 0..255 (uint8 as is, floats scaled from [0, 1])."""
    if rgb.dtype == torch.uint8:
        return rgb.to(torch.float32)
    if rgb.is_floating_point():
        return rgb.to(torch.float32) * 255.0
    raise TypeError(f"RGB must be uint8 or floating point in [0, 1], got {rgb.dtype}")


def quantize_uint8(x: torch.Tensor) -> torch.Tensor:
    """Clamp to [0, 255] and round half up to uint8 (see module docstring)."""
    return torch.floor(x.clamp(0.0, 255.0) + 0.5).to(torch.uint8)


def rgb_to_yuv_planes(
    rgb: torch.Tensor | np.ndarray, matrix: Matrix = "bt709", full_range: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """RGB ``(..., H, W, 3)`` -> float32 code values ``Y (..., H, W)``, ``UV (..., H/2, W/2, 2)``.

    Unrounded and unclamped, so blending in these planes loses nothing before the final
    :func:`quantize_uint8`. UV comes from the 2x2 average of RGB.
    """
    x, c = _planes_input(rgb, matrix, full_range, "rgb_to_yuv_planes")
    return _luma(x, c), _chroma(x, c)


def rgb_to_y(rgb: torch.Tensor, matrix: Matrix = "bt709", full_range: bool = False, *, in_255: bool = False) -> torch.Tensor:
    """The ``Y`` of :func:`rgb_to_yuv_planes` alone (the same operations, so the same values): for a
    caller that needs one plane, at half the kernels (a live splice launches from many threads).
    ``in_255``: float ``rgb`` is already in 0..255 (a splice's ROIs: no scaling pass over them)."""
    return _luma(*_planes_input(rgb, matrix, full_range, "rgb_to_y", in_255))


def rgb_to_uv(rgb: torch.Tensor, matrix: Matrix = "bt709", full_range: bool = False, *, in_255: bool = False) -> torch.Tensor:
    """The ``UV`` of :func:`rgb_to_yuv_planes` alone (see :func:`rgb_to_y`)."""
    return _chroma(*_planes_input(rgb, matrix, full_range, "rgb_to_uv", in_255))


def _planes_input(rgb: torch.Tensor | np.ndarray, matrix: Matrix, full_range: bool,
                  what: str, in_255: bool = False) -> tuple[torch.Tensor, YuvCoefficients]:
    """Checked float RGB in 0..255 and the forward coefficients."""
    rgb = _as_tensor(rgb, "rgb")
    if rgb.ndim < 3 or rgb.shape[-1] != 3:
        raise ValueError(f"RGB must have shape (..., H, W, 3), got {tuple(rgb.shape)}")
    _check_even(rgb.shape[-3], rgb.shape[-2], what)
    x = rgb.to(torch.float32) if in_255 and rgb.is_floating_point() else _rgb_float(rgb)
    return x, yuv_coefficients(matrix, full_range)


def _weighted_channels(x: torch.Tensor, row: tuple[float, ...], offset: float, scale: float = 1.0) -> torch.Tensor:
    """``scale * (row . x[..., c]) + offset`` over the last axis (RGB, or UV going back), as scaled adds
    rather than a (N, 3) x (3,) matmul: 4x faster on the CPU; on an H100 the two are within 0.1 ms per
    32 ROIs (704x704: 0.82 vs 0.91 ms; 256x320: 0.29 vs 0.23 ms; benchmarks/splice_cost.py)."""
    out = x[..., 0] * (row[0] * scale)
    for c in range(1, len(row)):
        out.add_(x[..., c], alpha=row[c] * scale)
    return out.add_(offset)


def _luma(x: torch.Tensor, c: YuvCoefficients) -> torch.Tensor:
    return _weighted_channels(x, c.forward[0], c.offset[0])


def _chroma(x: torch.Tensor, c: YuvCoefficients) -> torch.Tensor:
    """U, V of each 2x2 block's mean RGB: the block's four pixels summed as strided views (a generic
    mean over the two split axes is a slow reduction), the 1/4 folded into the coefficients."""
    sums = x[..., 0::2, 0::2, :] + x[..., 0::2, 1::2, :]
    sums.add_(x[..., 1::2, 0::2, :]).add_(x[..., 1::2, 1::2, :])
    return torch.stack([_weighted_channels(sums, c.forward[1], c.offset[1], 0.25),
                        _weighted_channels(sums, c.forward[2], c.offset[2], 0.25)], dim=-1)


def yuv_planes_to_rgb(
    y: torch.Tensor, uv: torch.Tensor, matrix: Matrix = "bt709", full_range: bool = False
) -> torch.Tensor:
    """Float (or uint8) ``Y (..., H, W)`` + ``UV (..., H/2, W/2, 2)`` -> float RGB 0..255.

    Unrounded and unclamped (out-of-gamut YUV gives values outside 0..255);
    :func:`quantize_uint8` finishes it. Chroma is upsampled by replication.
    """
    h, w = y.shape[-2], y.shape[-1]
    _check_even(h, w, "yuv_planes_to_rgb")
    if tuple(uv.shape[-3:]) != (h // 2, w // 2, 2) or uv.shape[:-3] != y.shape[:-2]:
        raise ValueError(
            f"UV must have shape {tuple(y.shape[:-2]) + (h // 2, w // 2, 2)} to match Y "
            f"{tuple(y.shape)}, got {tuple(uv.shape)}"
        )
    yf = y.to(torch.float32)
    uvf = uv.to(torch.float32)
    c = yuv_coefficients(matrix, full_range)
    # Per output channel: the chroma term per 2x2 block (4x fewer multiplies than upsampling first),
    # broadcast over its block against Y seen as (H/2, 2, W/2, 2), plus the luma term: scaled adds,
    # no GEMV and no upsampled copy (as in the forward direction).
    lead, (h2, w2) = uvf.shape[:-3], uvf.shape[-3:-1]
    y_blocks = yf.reshape(*lead, h2, 2, w2, 2)
    channels = []
    for row, off in zip(c.inverse, c.inverse_offset):
        chroma = _weighted_channels(uvf, row[1:], off)
        channels.append(torch.add(chroma[..., :, None, :, None], y_blocks, alpha=row[0]).reshape(*lead, h, w))
    return torch.stack(channels, dim=-1)


def _split_420(buf: torch.Tensor, what: str) -> tuple[int, int]:
    if buf.dtype != torch.uint8:
        raise TypeError(f"{what} must be uint8, got {buf.dtype}")
    if buf.ndim < 2:
        raise ValueError(f"{what} must have shape (..., H*3//2, W), got {tuple(buf.shape)}")
    rows, w = buf.shape[-2], buf.shape[-1]
    if rows % 3:
        raise ValueError(f"{what} has {rows} rows; a 4:2:0 buffer has H*3//2 rows (a multiple of 3)")
    h = rows // 3 * 2
    _check_even(h, w, what)
    return h, w


def nv12_to_planes(nv12: torch.Tensor | np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Views of an NV12 buffer: ``Y (..., H, W)`` and ``UV (..., H/2, W/2, 2)`` (no copy)."""
    nv12 = _as_tensor(nv12, "nv12")
    h, w = _split_420(nv12, "NV12")
    lead = nv12.shape[:-2]
    return nv12[..., :h, :], nv12[..., h:, :].reshape(*lead, h // 2, w // 2, 2)


def planes_to_nv12(y: torch.Tensor, uv: torch.Tensor) -> torch.Tensor:
    """uint8 ``Y (..., H, W)`` + ``UV (..., H/2, W/2, 2)`` -> NV12 ``(..., H*3//2, W)``."""
    h, w = y.shape[-2], y.shape[-1]
    return torch.cat([y, uv.reshape(*uv.shape[:-3], h // 2, w)], dim=-2)


def rgb_to_nv12(
    rgb: torch.Tensor | np.ndarray, matrix: Matrix = "bt709", full_range: bool = False
) -> torch.Tensor:
    """RGB ``(..., H, W, 3)`` uint8 or float [0, 1] -> NV12 ``(..., H*3//2, W)`` uint8."""
    y, uv = rgb_to_yuv_planes(rgb, matrix, full_range)
    return planes_to_nv12(quantize_uint8(y), quantize_uint8(uv))


def nv12_to_rgb(
    nv12: torch.Tensor | np.ndarray, matrix: Matrix = "bt709", full_range: bool = False
) -> torch.Tensor:
    """NV12 ``(..., H*3//2, W)`` uint8 -> RGB ``(..., H, W, 3)`` uint8."""
    y, uv = nv12_to_planes(nv12)
    return quantize_uint8(yuv_planes_to_rgb(y, uv, matrix, full_range))


def rgb_to_yuv420p(
    rgb: torch.Tensor | np.ndarray, matrix: Matrix = "bt709", full_range: bool = False
) -> torch.Tensor:
    """RGB ``(..., H, W, 3)`` -> planar I420 ``(..., H*3//2, W)`` uint8 (Y, then U, then V)."""
    y, uv = rgb_to_yuv_planes(rgb, matrix, full_range)
    h, w = y.shape[-2], y.shape[-1]
    lead = y.shape[:-2]
    chroma = quantize_uint8(uv).movedim(-1, -3).reshape(*lead, h // 2 * w)  # U plane, V plane
    return torch.cat([quantize_uint8(y), chroma.reshape(*lead, h // 2, w)], dim=-2)


def yuv420p_to_rgb(
    yuv: torch.Tensor | np.ndarray, matrix: Matrix = "bt709", full_range: bool = False
) -> torch.Tensor:
    """Planar I420 ``(..., H*3//2, W)`` uint8 -> RGB ``(..., H, W, 3)`` uint8."""
    yuv = _as_tensor(yuv, "yuv420p")
    h, w = _split_420(yuv, "I420")
    lead = yuv.shape[:-2]
    chroma = yuv[..., h:, :].reshape(*lead, 2, h // 2, w // 2).movedim(-3, -1)
    return quantize_uint8(yuv_planes_to_rgb(yuv[..., :h, :], chroma, matrix, full_range))
