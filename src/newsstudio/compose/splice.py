"""Splice rendered face ROIs into full NV12 frames, touching only the ROI rectangle.

Why NV12 and gather/scatter: the background frames are stored (and encoded) as NV12, so the
output is the background plus a small blended rectangle. Converting whole frames to RGB and
back per output frame would cost ~40x more memory traffic at 1080x1920 than the ROI itself.
Blending happens in Y at full resolution and in interleaved UV at half resolution with the
feathered mask averaged over each 2x2 block, in a handful of batched kernels (no per-frame
Python loop), on whatever device the tensors live on.
"""
from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F

from ..accel.host_copy import to_device
from .colour import rgb_to_uv, rgb_to_y, yuv_coefficients


def roi_offsets(origins: torch.Tensor, frame_hw: tuple[int, int]) -> torch.Tensor:
    """(B, 2) int64: where each ROI starts in an NV12 frame's flat bytes, in the Y plane and in the
    interleaved UV plane (relative to the UV plane's start). An avatar's are computed once: per
    splice they are one gather instead of a dozen index kernels."""
    w = frame_hw[1]
    x0, y0 = origins[:, 0].long(), origins[:, 1].long()
    return torch.stack([y0 * w + x0, (y0 // 2) * w + x0], dim=1)


@lru_cache(maxsize=32)
def roi_base_indices(roi_hw: tuple[int, int], frame_hw: tuple[int, int], device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat byte offsets of an ROI's Y samples and interleaved UV samples relative to its
    `roi_offsets`, the same for every frame (cached per geometry and device)."""
    hr, wr = roi_hw
    h, w = frame_hw
    cols = torch.arange(wr).view(1, -1)
    base_y = (torch.arange(hr).view(-1, 1) * w + cols).reshape(-1)
    base_uv = (h * w + torch.arange(hr // 2).view(-1, 1) * w + cols).reshape(-1)
    return to_device(base_y, device), to_device(base_uv, device)


def _flat_indices(offsets: torch.Tensor, roi_hw: tuple[int, int], frame_hw: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    base_y, base_uv = roi_base_indices(tuple(roi_hw), tuple(frame_hw), str(offsets.device))
    return base_y + offsets[:, :1], base_uv + offsets[:, 1:]


def check_roi_geometry(origins: torch.Tensor, roi_hw: tuple[int, int], frame_hw: tuple[int, int]) -> None:
    """Clear errors for ROIs that NV12 cannot address (odd sizes/origins, outside the frame)."""
    hr, wr = roi_hw
    h, w = frame_hw
    if hr % 2 or wr % 2:
        raise ValueError(f"ROI size {wr}x{hr} must be even for NV12 splicing")
    if origins.numel():
        if bool((origins % 2 != 0).any()):
            raise ValueError("ROI origins must be even for NV12 splicing")
        x0, y0 = origins[:, 0], origins[:, 1]
        if bool((x0 < 0).any() or (y0 < 0).any() or (x0 + wr > w).any() or (y0 + hr > h).any()):
            raise ValueError(f"ROI {wr}x{hr} at some origin leaves the {w}x{h} frame")


def splice_nv12(
    background: torch.Tensor,
    roi_rgb: torch.Tensor,
    mask: torch.Tensor,
    origins: torch.Tensor | None = None,
    *,
    offsets: torch.Tensor | None = None,
    matrix: str = "bt709",
    full_range: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Blend ROIs into NV12 frames.

    background: (B, H*3//2, W) uint8 NV12 frames (not modified).
    roi_rgb: (B, Hr, Wr, 3) RGB, uint8 or float in [0, 255].
    mask: (B, Hr, Wr) float in [0, 1] (1 = take the ROI).
    origins: (B, 2) even (x0, y0) of each ROI in the frame; or ``offsets``, their `roi_offsets`
    (a live session gathers its avatar's, computed once).
    out: optional preallocated (B, H*3//2, W) uint8 buffer (may be `background` itself).
    Returns the spliced NV12 frames (uint8, same device).
    """
    b, h3, w = background.shape
    h = h3 * 2 // 3
    hr, wr = int(roi_rgb.shape[1]), int(roi_rgb.shape[2])
    if (origins is None) == (offsets is None):
        raise ValueError("give the ROIs' origins or their offsets, not both")
    where = origins if origins is not None else offsets
    assert where is not None
    if roi_rgb.shape[0] != b or mask.shape != (b, hr, wr) or where.shape != (b, 2):
        raise ValueError(f"batch shapes disagree: background {tuple(background.shape)}, roi {tuple(roi_rgb.shape)}, mask {tuple(mask.shape)}, origins {tuple(where.shape)}")
    if out is None:
        out = background.clone()
    elif out.data_ptr() != background.data_ptr():
        out.copy_(background)
    if b == 0:
        return out
    dev = background.device
    if offsets is None:
        assert origins is not None
        offsets = roi_offsets(origins.to(dev), (h, w))
    idx_y, idx_uv = _flat_indices(offsets.to(dev), (hr, wr), (h, w))
    flat = out.view(b, -1)
    rgb = roi_rgb.float()  # 0..255
    m = mask.to(dev, torch.float32)
    y = rgb_to_y(rgb, matrix=matrix, full_range=full_range, in_255=True)
    # Chroma blended exactly like "composite in RGB, then subsample": the block mean of
    # m * roi (premultiplied) plus (1 - block mean of m) times the background chroma.
    uv_pre = rgb_to_uv(rgb * m.unsqueeze(-1), matrix=matrix, full_range=full_range, in_255=True)
    uv_off = yuv_coefficients(matrix, full_range).tensors(dev)[1][1:]
    m_uv = F.avg_pool2d(m.unsqueeze(1), 2).squeeze(1).unsqueeze(-1)  # (B, Hr/2, Wr/2, 1)

    bg_y = flat.gather(1, idx_y).float()
    new_y = bg_y + m.reshape(b, -1) * (y.reshape(b, -1) - bg_y)
    flat.scatter_(1, idx_y, new_y.round_().clamp_(0, 255).to(torch.uint8))

    bg_uv = flat.gather(1, idx_uv).float().view(b, hr // 2, wr // 2, 2)
    new_uv = uv_pre + (1 - m_uv) * (bg_uv - uv_off)
    flat.scatter_(1, idx_uv, new_uv.reshape(b, -1).round_().clamp_(0, 255).to(torch.uint8))
    return out


def sample_crops_to_roi(crops: torch.Tensor, grids: torch.Tensor) -> torch.Tensor:
    """Resample engine crops (B, 3, Hc, Wc) float into ROI space with per-frame grids.

    grids: (B, Hr, Wr, 2) normalised (align_corners=False) crop coordinates of every ROI pixel
    (from the packet; float16 is fine). Returns (B, Hr, Wr, 3) float in the crops' value range.
    """
    g = grids.to(crops.device, crops.dtype)
    roi = F.grid_sample(crops, g, mode="bilinear", padding_mode="border", align_corners=False)
    return roi.permute(0, 2, 3, 1)
