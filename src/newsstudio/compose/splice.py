"""Splice rendered face ROIs into full NV12 frames, touching only the ROI rectangle.

Why NV12 and gather/scatter: the background frames are stored (and encoded) as NV12, so the
output is the background plus a small blended rectangle. Converting whole frames to RGB and
back per output frame would cost ~40x more memory traffic at 1080x1920 than the ROI itself.
Blending happens in Y at full resolution and in interleaved UV at half resolution with the
feathered mask averaged over each 2x2 block, in a handful of batched kernels (no per-frame
Python loop), on whatever device the tensors live on.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .colour import rgb_to_yuv_planes, yuv_coefficients


def roi_flat_indices(origins: torch.Tensor, roi_hw: tuple[int, int], frame_hw: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat byte offsets of each ROI's Y samples and interleaved UV samples inside an NV12 frame.

    origins: (B, 2) integer (x0, y0), both even. Returns (idx_y (B, Hr*Wr), idx_uv (B, Hr/2*Wr)).
    """
    hr, wr = roi_hw
    h, w = frame_hw
    dev = origins.device
    x0 = origins[:, 0].long().view(-1, 1, 1)
    y0 = origins[:, 1].long().view(-1, 1, 1)
    rows = torch.arange(hr, device=dev).view(1, -1, 1)
    cols = torch.arange(wr, device=dev).view(1, 1, -1)
    idx_y = ((y0 + rows) * w + x0 + cols).reshape(origins.shape[0], -1)
    rows_uv = torch.arange(hr // 2, device=dev).view(1, -1, 1)
    idx_uv = (h * w + (y0 // 2 + rows_uv) * w + x0 + cols).reshape(origins.shape[0], -1)
    return idx_y, idx_uv


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
    origins: torch.Tensor,
    *,
    matrix: str = "bt709",
    full_range: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Blend ROIs into NV12 frames.

    background: (B, H*3//2, W) uint8 NV12 frames (not modified).
    roi_rgb: (B, Hr, Wr, 3) RGB, uint8 or float in [0, 255].
    mask: (B, Hr, Wr) float in [0, 1] (1 = take the ROI).
    origins: (B, 2) even (x0, y0) of each ROI in the frame.
    out: optional preallocated (B, H*3//2, W) uint8 buffer (may be `background` itself).
    Returns the spliced NV12 frames (uint8, same device).
    """
    b, h3, w = background.shape
    h = h3 * 2 // 3
    hr, wr = int(roi_rgb.shape[1]), int(roi_rgb.shape[2])
    if roi_rgb.shape[0] != b or mask.shape != (b, hr, wr) or origins.shape != (b, 2):
        raise ValueError(f"batch shapes disagree: background {tuple(background.shape)}, roi {tuple(roi_rgb.shape)}, mask {tuple(mask.shape)}, origins {tuple(origins.shape)}")
    if out is None:
        out = background.clone()
    elif out.data_ptr() != background.data_ptr():
        out.copy_(background)
    if b == 0:
        return out
    dev = background.device
    idx_y, idx_uv = roi_flat_indices(origins.to(dev), (hr, wr), (h, w))
    flat = out.view(b, -1)
    rgb = roi_rgb.float() * (1.0 / 255.0)  # colour functions take floats in [0, 1]
    m = mask.to(dev, torch.float32)
    y, _ = rgb_to_yuv_planes(rgb, matrix=matrix, full_range=full_range)
    # Chroma blended exactly like "composite in RGB, then subsample": the block mean of
    # m * roi (premultiplied) plus (1 - block mean of m) times the background chroma.
    _, uv_pre = rgb_to_yuv_planes(rgb * m.unsqueeze(-1), matrix=matrix, full_range=full_range)
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
