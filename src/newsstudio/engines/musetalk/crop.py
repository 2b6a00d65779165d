"""MuseTalk face crop box from 68 landmarks (+ detector box), and the 256x256 crop.

Follows the official ``get_landmark_and_bbox`` and the scripts' v1.5 margin:

* landmarks are truncated toward zero to int32 (numpy ``astype``);
* no detection -> placeholder box ``(0, 0, 0, 0)`` whatever the landmarks say;
* ``nose_y = y[29] + bbox_shift`` (also written back into landmark 29, so it can become the
  lowest point), ``bottom = max y``, ``top = max(0, nose_y - (bottom - nose_y))``,
  ``x1 = min x``, ``x2 = max x``;
* a degenerate landmark box (empty, or ``x1 < 0``) falls back to the detector box unchanged;
* v1.5 forces ``bbox_shift = 0`` and then sets ``y2 = min(y2 + extra_margin, frame_height)``
  on every non-placeholder box (landmark or detector alike).
"""
from __future__ import annotations

from enum import IntEnum

import cv2
import numpy as np

NOSE_BRIDGE_INDEX = 29  # iBUG-68 point used as the "half face" line
CROP_SIZE = 256


class BoxSource(IntEnum):
    """Where a frame's crop box came from (the ``source`` code of the golden cases)."""

    LANDMARK = 0
    DETECTOR = 1
    NONE = 2  # placeholder (0, 0, 0, 0): the frame gets no latent


def truncate_landmarks(landmarks) -> np.ndarray:
    """Float landmarks -> int32, truncating toward zero as the reference's ``astype`` does."""
    lm = np.asarray(landmarks)
    if lm.shape[-2:] != (68, 2):
        raise ValueError(f"expected (..., 68, 2) landmarks, got {lm.shape}")
    return lm.astype(np.float32).astype(np.int32)


def face_box(landmarks, det_box=None, bbox_shift: int = 0) -> tuple[tuple[int, int, int, int], BoxSource]:
    """Crop box ``(x1, y1, x2, y2)`` (exclusive right/bottom) of one frame, and its source.

    ``det_box`` is the detector's first box (already clipped at 0 and made int by the
    detector) or ``None`` when nothing was detected.
    """
    if det_box is None:
        return (0, 0, 0, 0), BoxSource.NONE
    lm = truncate_landmarks(landmarks).copy()
    lm[NOSE_BRIDGE_INDEX, 1] = lm[NOSE_BRIDGE_INDEX, 1] + int(bbox_shift)
    nose_y = int(lm[NOSE_BRIDGE_INDEX, 1])
    bottom = int(lm[:, 1].max())
    top = max(0, nose_y - (bottom - nose_y))
    x1, x2 = int(lm[:, 0].min()), int(lm[:, 0].max())
    if bottom - top <= 0 or x2 - x1 <= 0 or x1 < 0:
        d = [max(0, int(v)) for v in det_box]
        return (d[0], d[1], d[2], d[3]), BoxSource.DETECTOR
    return (x1, top, x2, bottom), BoxSource.LANDMARK


def face_boxes(landmarks, det_boxes, det_valid, bbox_shift: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``face_box`` for a sequence: boxes ``int64 [T, 4]`` and source codes ``int64 [T]``."""
    lms = np.asarray(landmarks)
    dets = np.asarray(det_boxes)
    valid = np.asarray(det_valid).astype(bool)
    if not (len(lms) == len(dets) == len(valid)):
        raise ValueError(f"length mismatch: {len(lms)} landmarks, {len(dets)} boxes, {len(valid)} flags")
    boxes = np.zeros((len(lms), 4), dtype=np.int64)
    sources = np.zeros((len(lms),), dtype=np.int64)
    for t in range(len(lms)):
        box, src = face_box(lms[t], dets[t] if valid[t] else None, bbox_shift)
        boxes[t] = box
        sources[t] = int(src)
    return boxes, sources


def add_margin(boxes, sources, extra_margin: int, frame_height: int) -> np.ndarray:
    """v1.5: ``y2 = min(y2 + extra_margin, frame_height)`` on every box that is not a placeholder."""
    out = np.array(boxes, dtype=np.int64, copy=True)
    keep = np.asarray(sources) != int(BoxSource.NONE)
    out[keep, 3] = np.minimum(out[keep, 3] + int(extra_margin), int(frame_height))
    return out


def crop_boxes(
    landmarks,
    det_boxes,
    det_valid,
    frame_height: int,
    version: str = "v15",
    bbox_shift: int = 0,
    extra_margin: int = 10,
) -> tuple[np.ndarray, np.ndarray]:
    """Final per-frame crop boxes as the official scripts use them, with their source codes.

    v1.5 ignores ``bbox_shift`` (forced to 0) and adds ``extra_margin``; v1.0 uses
    ``bbox_shift`` and no margin.
    """
    if version == "v15":
        boxes, src = face_boxes(landmarks, det_boxes, det_valid, 0)
        return add_margin(boxes, src, extra_margin, frame_height), src
    if version in ("v1", "v10"):
        return face_boxes(landmarks, det_boxes, det_valid, bbox_shift)
    raise ValueError(f"unknown MuseTalk version {version!r} (v15 or v1)")


def crop_face(frame_bgr: np.ndarray, box, size: int = CROP_SIZE) -> np.ndarray:
    """``frame[y1:y2, x1:x2]`` resized to ``size x size`` with LANCZOS4 (the VAE input).

    Slicing follows numpy semantics exactly like the reference (x2 is not clamped to the width).
    """
    x1, y1, x2, y2 = (int(v) for v in box)
    crop = np.ascontiguousarray(np.asarray(frame_bgr)[y1:y2, x1:x2])
    if crop.size == 0:
        raise ValueError(f"empty crop for box {(x1, y1, x2, y2)} in a frame of shape {np.shape(frame_bgr)}")
    return cv2.resize(crop, (size, size), interpolation=cv2.INTER_LANCZOS4)
