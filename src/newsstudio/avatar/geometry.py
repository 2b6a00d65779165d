"""Output framing and the generic face ROI of an avatar.

Framing: the source is scaled to the output size either to fill it and crop the overflow
(`cover`, what a broadcaster wants for a presenter) or to fit inside it with black bars
(`contain`). The ROI is one fixed-size, even-aligned rectangle per frame around the lower face
(fixed size so ROIs batch; even so NV12 chroma lines up), with a feathered mask that is 1 over
mouth, jaw and chin and falls to 0 well inside the rectangle, so splicing never shows a seam.
"""
from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np


@dataclass(frozen=True)
class Framing:
    """Source -> output mapping: out = src * scale + offset (pixels), then cropped to size."""

    src_size: tuple[int, int]
    out_size: tuple[int, int]
    scale: float
    offset: tuple[float, float]
    fit: str

    def apply(self, rgb: np.ndarray) -> np.ndarray:
        w, h = self.out_size
        m = np.array([[self.scale, 0, self.offset[0]], [0, self.scale, self.offset[1]]], np.float64)
        interp = cv2.INTER_AREA if self.scale < 1 else cv2.INTER_LINEAR
        if self.scale == 1 and self.offset == (0.0, 0.0) and self.src_size == self.out_size:
            return np.ascontiguousarray(rgb)
        return cv2.warpAffine(rgb, m, (w, h), flags=interp, borderMode=cv2.BORDER_CONSTANT, borderValue=(0, 0, 0))

    def points(self, pts: np.ndarray) -> np.ndarray:
        return (pts * self.scale + np.asarray(self.offset, np.float32)).astype(np.float32)


#: Sides of a requested output size, in pixels. 16: the smallest frame the ROI and the models
#: work with. 8192: H.264's largest level (6.2) holds 8192x4320 frames; anything wider is a typo
#: (100000x100000 would be a 15 GB frame), not a presenter.
MIN_SIDE, MAX_SIDE = 16, 8192


def even(v: float) -> int:
    return max(2, int(v) // 2 * 2)


def check_output_size(w: int, h: int) -> None:
    """ValueError saying what is wrong with a requested output size `w` x `h`: the one rule of
    the CLI, the library and the server (each side MIN_SIDE..MAX_SIDE and even, for 4:2:0)."""
    for name, v in (("width", w), ("height", h)):
        if not MIN_SIDE <= v <= MAX_SIDE:
            raise ValueError(f"output size {w}x{h}: the {name} must be {MIN_SIDE}..{MAX_SIDE} pixels")
    if w % 2 or h % 2:
        raise ValueError(f"output size {w}x{h} must be even on both sides (4:2:0 video has one colour sample per 2x2 pixels)")


FITS = ("cover", "contain")


def check_fit(fit: str) -> str:
    """`fit` if it is one of FITS, else a ValueError naming them (checked with or without a size,
    so a bad value is never stored in a packet)."""
    if fit not in FITS:
        raise ValueError(f"fit must be 'cover' or 'contain', got {fit!r}")
    return fit


def make_framing(src_size: tuple[int, int], out_size: tuple[int, int] | None, fit: str = "cover") -> Framing:
    check_fit(fit)
    sw, sh = src_size
    if out_size is None:
        return Framing(src_size, (even(sw), even(sh)), 1.0, (0.0, 0.0), fit)
    w, h = out_size
    check_output_size(w, h)
    s = max(w / sw, h / sh) if fit == "cover" else min(w / sw, h / sh)
    return Framing(src_size, (w, h), s, ((w - sw * s) / 2, (h - sh * s) / 2), fit)


def face_metrics(lm68: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per frame: face width (jaw 0..16), face height (brows to chin) and mouth centre."""
    fw = np.linalg.norm(lm68[:, 16] - lm68[:, 0], axis=-1)
    brow = lm68[:, 17:27].mean(axis=1)
    fh = np.linalg.norm(lm68[:, 8] - brow, axis=-1)
    mouth = lm68[:, 48:68].mean(axis=1)
    return fw, fh, mouth


def lower_face_roi(lm68: np.ndarray, frame_size: tuple[int, int]) -> tuple[tuple[int, int], np.ndarray]:
    """Fixed ROI size (w, h) and per-frame even origins (N, 2) covering mouth, jaw and chin.

    Sized from the largest face in the loop with room below the chin, so an opened jaw stays
    inside the ROI."""
    w, h = frame_size
    fw, fh, mouth = face_metrics(lm68)
    rw = min(even(1.5 * fw.max() + 8), even(w))
    rh = min(even(1.25 * fh.max() + 8), even(h))
    cx = mouth[:, 0]
    cy = mouth[:, 1] + 0.12 * fh
    x0 = np.clip(np.round(cx - rw / 2), 0, w - rw).astype(np.int64) // 2 * 2
    y0 = np.clip(np.round(cy - rh / 2), 0, h - rh).astype(np.int64) // 2 * 2
    return (rw, rh), np.stack([x0, y0], axis=1).astype(np.int32)


def lower_face_mask(lm68: np.ndarray, origin: np.ndarray, roi_size: tuple[int, int]) -> np.ndarray:
    """Feathered uint8 mask (h, w) in ROI coordinates: jaw contour grown outwards, cut at the
    nose, blurred; zero on the ROI border."""
    rw, rh = roi_size
    pts = lm68 - origin.astype(np.float32)
    fw = float(np.linalg.norm(pts[16] - pts[0]))
    centre = pts[[30, 33, 51, 57, 8]].mean(axis=0)
    jaw = pts[2:15]
    grown = centre + (jaw - centre) * 1.12 + np.array([0, 0.06 * fw], np.float32)
    nose_y = float(pts[29, 1])
    top = np.array([[grown[-1, 0], nose_y], [grown[0, 0], nose_y]], np.float32)
    poly = np.concatenate([grown, top]).round().astype(np.int32)
    mask = np.zeros((rh, rw), np.uint8)
    cv2.fillPoly(mask, [poly], 255)
    k = max(3, int(0.12 * fw) // 2 * 2 + 1)
    mask = cv2.GaussianBlur(mask, (k, k), 0)
    border = max(2, k // 4)
    mask[:border, :] = 0
    mask[-border:, :] = 0
    mask[:, :border] = 0
    mask[:, -border:] = 0
    return cv2.GaussianBlur(mask, (5, 5), 0)
