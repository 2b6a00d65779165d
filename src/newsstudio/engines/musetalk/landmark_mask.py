"""Blend mask from 68 landmarks, for when the BiSeNet weights are absent.

The parser mask of the v1.5 ``jaw`` mode covers the lower face: skin and lips below the nose,
reaching down to the jaw line. Without the parser we draw that region directly: the polygon
of jaw points 2..14 closed along the bottom of the nose (points 35..31), rasterised into a
512x512 "parser mask" of the enlarged crop. It then goes through exactly the same steps as a
parser mask (bicubic resize to the crop box, face-box restriction, upper-boundary cut,
Gaussian feathering), so everything downstream is unchanged.
"""
from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

from .blend import EXPAND, REALTIME_BLUR_FRACTION, UPPER_BOUNDARY_RATIO, Box, expanded_crop_box, prepare_mask
from .face_parsing import PARSE_SIZE

JAW_POINTS = tuple(range(2, 15))  # jaw line from the left cheek through the chin to the right cheek
NOSE_BOTTOM_POINTS = tuple(range(35, 30, -1))  # nose base right to left, closing the polygon
_SUBPIXEL_BITS = 4


def jaw_polygon(landmarks) -> np.ndarray:
    """Lower-face polygon ``[K, 2]`` (float, frame coordinates) from 68 iBUG landmarks."""
    lm = np.asarray(landmarks, dtype=np.float64)
    if lm.shape != (68, 2):
        raise ValueError(f"expected (68, 2) landmarks, got {lm.shape}")
    return lm[list(JAW_POINTS) + list(NOSE_BOTTOM_POINTS)]


def landmark_mask512(landmarks, crop_box: Sequence[int], size: int = PARSE_SIZE) -> np.ndarray:
    """The polygon as a 0/255 mask of the enlarged crop at parse size (a parser-mask stand-in)."""
    xs, ys, xe, ye = (int(v) for v in crop_box)
    scale = np.array([size / (xe - xs), size / (ye - ys)])
    pts = (jaw_polygon(landmarks) - np.array([xs, ys])) * scale
    fixed = np.round(pts * (1 << _SUBPIXEL_BITS)).astype(np.int32)
    mask = np.zeros((size, size), dtype=np.uint8)
    cv2.fillPoly(mask, [fixed.reshape(-1, 1, 2)], 255, lineType=cv2.LINE_8, shift=_SUBPIXEL_BITS)
    return mask


def landmark_prepare_mask(
    landmarks,
    face_box: Sequence[int],
    blur_fraction: float = REALTIME_BLUR_FRACTION,
    upper_boundary_ratio: float = UPPER_BOUNDARY_RATIO,
    expand: float = EXPAND,
) -> tuple[np.ndarray, Box]:
    """Drop-in for :func:`blend.prepare_material` without a parser: (mask ``[2s,2s]``, crop box)."""
    crop_box, _ = expanded_crop_box(face_box, expand)
    return prepare_mask(landmark_mask512(landmarks, crop_box), face_box, blur_fraction, upper_boundary_ratio, expand)
