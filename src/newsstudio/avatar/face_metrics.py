"""Scale-free mouth metrics from iBUG-68 (or dense mesh) landmarks: opening, width, face height."""
from __future__ import annotations

import numpy as np

from .landmarks_68 import MESH_BROW_MID, MESH_CHIN, MESH_INNER_LIP_PAIRS


def _pts(a: np.ndarray, n: int, what: str) -> np.ndarray:
    a = np.asarray(a, np.float64)
    if a.ndim < 2 or a.shape[-2] < n or a.shape[-1] < 2:
        raise ValueError(f"{what}: expected (..., {n}, 2) points, got shape {a.shape}")
    return a[..., :2]


def _out(x: np.ndarray) -> float | np.ndarray:
    return float(x) if np.ndim(x) == 0 else x


def _dist(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.linalg.norm(a - b, axis=-1)


def _face_height(p: np.ndarray, brow: tuple[int, int], chin: int, what: str) -> np.ndarray:
    fh = _dist(p[..., list(brow), :].mean(axis=-2), p[..., chin, :])
    if np.any(~(fh > 0)):
        raise ValueError(f"{what}: degenerate landmarks (zero face height)")
    return fh


def face_height(lm68: np.ndarray) -> float | np.ndarray:
    """Pixels from the brow line (mean of 19 and 24) to the chin (8). Accepts (..., 68, 2)."""
    p = _pts(lm68, 68, "face_height")
    return _out(_face_height(p, (19, 24), 8, "face_height"))


def mouth_opening(lm68: np.ndarray) -> float | np.ndarray:
    """Inner-lip opening: mean of the gaps 61-67, 62-66, 63-65 over the face height.

    Scale free (~0 closed, ~0.1-0.2 wide open). Accepts (68, 2) or a batch (..., 68, 2)."""
    p = _pts(lm68, 68, "mouth_opening")
    gap = (_dist(p[..., 61, :], p[..., 67, :]) + _dist(p[..., 62, :], p[..., 66, :])
           + _dist(p[..., 63, :], p[..., 65, :])) / 3.0
    return _out(gap / _face_height(p, (19, 24), 8, "mouth_opening"))


def mouth_width(lm68: np.ndarray) -> float | np.ndarray:
    """Mouth corner distance (48-54) over the face height (multiply by ``face_height`` for
    pixels). Accepts (68, 2) or (..., 68, 2)."""
    p = _pts(lm68, 68, "mouth_width")
    return _out(_dist(p[..., 48, :], p[..., 54, :]) / _face_height(p, (19, 24), 8, "mouth_width"))


def mouth_opening_mesh(mesh: np.ndarray) -> float | np.ndarray:
    """Finer opening from the dense MediaPipe mesh: mean gap of the seven inner-lip vertex
    pairs (13-14 on the midline, then 82-87, 312-317, 81-178, 311-402, 80-88, 310-318) over
    the same face height as ``mouth_opening`` (brow vertices 105/334 = iBUG 19/24, chin 152
    = iBUG 8), so both measures share a scale. Accepts (N>=468, 2) or (..., N, 2)."""
    p = _pts(mesh, 468, "mouth_opening_mesh")
    up = [a for a, _ in MESH_INNER_LIP_PAIRS]
    lo = [b for _, b in MESH_INNER_LIP_PAIRS]
    gap = _dist(p[..., up, :], p[..., lo, :]).mean(axis=-1)
    return _out(gap / _face_height(p, MESH_BROW_MID, MESH_CHIN, "mouth_opening_mesh"))
