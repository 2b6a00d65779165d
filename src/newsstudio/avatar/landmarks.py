"""Face landmarks that work offline: one interface, pluggable detectors.

Why: every engine needs landmarks (MuseTalk's crop box from 68 points, Ditto's
registration, the classic engine's mouth warp, the lip-sync metrics), and on a fresh machine
no official detector weights exist. MediaPipe 0.10's legacy FaceMesh ships its TFLite models
inside the wheel, so it is the default backend: a dense 468-vertex mesh (478 with the
attention model, ``refine_landmarks=True``, which sharpens lips and eyes), mapped to the
iBUG-68 order by the fixed table in ``landmarks_68.py``. Official detectors (InsightFace
ONNX, DWPose) plug in through ``register_backend`` once their weights are present.

Two modes:

* ``detect(rgb)``: one photo, static-image mode (the detector runs every call). Faces too
  small for MediaPipe's short-range detector (below ~15 % of the longer image side, e.g. a
  presenter in a 1080x1920 frame) are found with the full-range detector first and the mesh
  is fitted in a square crop around them.
* ``track(frames)``: a video, tracking mode (the mesh of frame t seeds the ROI of frame t+1,
  which is steadier and cheaper than detecting every frame), followed by a One-Euro filter
  (Casiez et al. 2012) per vertex: strong low-pass when a vertex is still (kills the
  sub-pixel jitter that would make a pasted mouth crop shimmer), almost none when it moves
  fast (so speech motion is not lagged). Speeds are measured in face heights per second, so
  the same settings work at any resolution.

Frames without a face: ``detect_sequence(frames, policy=...)`` either raises ``NoFaceError``
naming the frames, or reuses the nearest frame that has one.

Measured speed (CPU, 2 cores shared with other jobs, load ~4; yongen.mp4 704x1216,
refine_landmarks=True): ``track`` 3.7 ms/frame (3.4 without smoothing, 3.0 with the
468-point model), ``detect`` 4.4 ms/frame. A small face in a 1080x1920 frame: ``detect``
11 ms (full-range detector + crop), ``track`` 4.3 ms/frame; no face at all: 7 ms/frame.
The first call of a new graph adds ~10-20 ms (model load). Faces below ~50 px are not
found reliably.

MediaPipe and TFLite write INFO/WARNING lines straight to file descriptor 2 while a graph
loads its models; those are swallowed (and replayed if the call fails) so CLI output stays
clean.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Iterable, Literal, Protocol, runtime_checkable

import numpy as np


__all__ = [
    "FaceLandmarks", "LandmarkBackend", "NoFaceError", "register_backend", "available_backends", "get_backend",
    "detect_sequence", "format_frame_ranges", "as_rgb",
]


# ----------------------------------------------------------------------------- interface


@dataclass
class FaceLandmarks:
    """One face in one image, all coordinates in image pixels (x right, y down).

    box:   (x1, y1, x2, y2) bounding box of the dense mesh, clipped to the image.
    mesh:  (N, 2) float32 dense landmarks (MediaPipe: 468 or 478); may lie slightly outside
           the image when the face is cut by the border.
    lm68:  (68, 2) float32 in iBUG-68 order (jaw 0-16, brows 17-26, nose 27-35, eyes 36-47,
           outer lips 48-59, inner lips 60-67).
    score: detector confidence in [0, 1] of the detection that found (or, when tracking,
           started tracking) this face.
    backend: name of the backend that produced it.
    """

    box: tuple[float, float, float, float]
    mesh: np.ndarray
    lm68: np.ndarray
    score: float
    backend: str = ""

    def copy(self) -> "FaceLandmarks":
        return replace(self, mesh=self.mesh.copy(), lm68=self.lm68.copy())


class NoFaceError(ValueError):
    """No face in some (or all) frames; ``missing`` lists their indices, ``total`` the count."""

    def __init__(self, message: str, missing: list[int], total: int):
        super().__init__(message)
        self.missing = missing
        self.total = total


@runtime_checkable
class LandmarkBackend(Protocol):
    """A face landmark detector. Backends may also offer ``track(frames)`` for video."""

    name: str

    def detect(self, rgb: np.ndarray) -> FaceLandmarks | None: ...


# ----------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class _BackendSpec:
    factory: Callable[..., LandmarkBackend]
    available: Callable[[], str | None]
    priority: int


_BACKENDS: dict[str, _BackendSpec] = {}


def register_backend(name: str, factory: Callable[..., LandmarkBackend], *,
                     available: Callable[[], str | None] | None = None,
                     priority: int = 0) -> None:
    """Add a backend. ``available()`` returns None when usable, else the reason it is not
    (e.g. "weights not found in ..."); "auto" picks the usable one with the highest priority.
    Official detectors should register with a priority above MediaPipe's 0."""
    _BACKENDS[name] = _BackendSpec(factory, available or (lambda: None), priority)


def available_backends() -> dict[str, str | None]:
    """Every registered backend -> None if usable now, else why not."""
    return {name: spec.available() for name, spec in _BACKENDS.items()}


def get_backend(name: str = "auto", **kwargs) -> LandmarkBackend:
    """A new backend instance by name ("auto": best usable one)."""
    if name == "auto":
        reasons = {}
        for n, spec in sorted(_BACKENDS.items(), key=lambda kv: -kv[1].priority):
            why = spec.available()
            if why is None:
                return spec.factory(**kwargs)
            reasons[n] = why
        detail = "; ".join(f"{n}: {r}" for n, r in reasons.items()) or "none registered"
        raise RuntimeError(f"no face landmark backend is usable ({detail})")
    spec = _BACKENDS.get(name)
    if spec is None:
        raise ValueError(f"unknown landmark backend {name!r}; known: {sorted(_BACKENDS)}")
    why = spec.available()
    if why is not None:
        raise RuntimeError(f"landmark backend {name!r} is not usable: {why}")
    return spec.factory(**kwargs)


# ----------------------------------------------------------------------------- helpers


def as_rgb(image: np.ndarray) -> np.ndarray:
    """Validate/convert to a contiguous (H, W, 3) uint8 RGB array, with a clear error."""
    a = np.asarray(image)
    if a.ndim == 2:
        a = np.repeat(a[:, :, None], 3, axis=2)
    if a.ndim != 3 or a.shape[2] not in (3, 4):
        raise ValueError(f"expected an (H, W, 3) RGB image, got shape {a.shape}")
    if a.shape[2] == 4:
        a = a[:, :, :3]
    if a.dtype != np.uint8:
        if np.issubdtype(a.dtype, np.floating) and a.size and float(np.nanmax(a)) <= 1.0:
            a = a * 255.0
        a = np.clip(np.nan_to_num(a), 0, 255).astype(np.uint8)
    if a.shape[0] < 8 or a.shape[1] < 8:
        raise ValueError(f"image too small for face detection: {a.shape[1]}x{a.shape[0]}")
    return np.ascontiguousarray(a)


def format_frame_ranges(indices: Iterable[int]) -> str:
    """[0, 1, 2, 3, 17] -> '0-3, 17'."""
    idx = sorted(set(int(i) for i in indices))
    parts: list[str] = []
    i = 0
    while i < len(idx):
        j = i
        while j + 1 < len(idx) and idx[j + 1] == idx[j] + 1:
            j += 1
        parts.append(str(idx[i]) if i == j else f"{idx[i]}-{idx[j]}")
        i = j + 1
    return ", ".join(parts)


# ----------------------------------------------------------------------------- sequences


def detect_sequence(frames: Iterable[np.ndarray], policy: Literal["error", "nearest"] = "error",
                    backend: LandmarkBackend | str | None = None, *, fps: float = 25.0,
                    smooth: bool = True) -> list[FaceLandmarks]:
    """Landmarks for every frame of a sequence, or a clear ``NoFaceError``.

    policy="error": raise NoFaceError naming the frames without a face
        ("no face found in frames 0-3, 17 of 40").
    policy="nearest": a frame without a face gets a copy of the landmarks of the nearest
        frame (in index distance; the earlier one on a tie) that has one. Right for avatar
        loops where a few frames lose the face (blur, a hand): the mouth region is then
        taken from the neighbour. If no frame has a face, NoFaceError is raised anyway.
    Backends with ``track`` are used in tracking mode; others frame by frame.
    """
    if policy not in ("error", "nearest"):
        raise ValueError(f"policy must be 'error' or 'nearest', got {policy!r}")
    own = backend is None or isinstance(backend, str)
    be = get_backend(backend or "auto") if own else backend
    try:
        track = getattr(be, "track", None)
        if callable(track):
            results = list(track(frames, fps=fps, smooth=smooth))
        else:
            results = [be.detect(as_rgb(f)) for f in frames]
    finally:
        if own and hasattr(be, "close"):
            be.close()
    n = len(results)
    if n == 0:
        raise ValueError("detect_sequence got no frames")
    have = [i for i, r in enumerate(results) if r is not None]
    missing = [i for i, r in enumerate(results) if r is None]
    if not have:
        raise NoFaceError(f"no face found in any of the {n} frames", missing, n)
    if missing and policy == "error":
        raise NoFaceError(f"no face found in frames {format_frame_ranges(missing)} of {n}",
                          missing, n)
    if missing:
        have_arr = np.asarray(have)
        for i in missing:
            j = int(have_arr[np.argmin(np.abs(have_arr - i))])  # argmin: first (earlier) on ties
            results[i] = results[j].copy()
    return results  # type: ignore[return-value]


def _mediapipe_backend(**kwargs) -> LandmarkBackend:
    from .mediapipe_mesh import MediaPipeFaceMesh

    return MediaPipeFaceMesh(**kwargs)


def _mediapipe_unavailable() -> str | None:
    from .mediapipe_mesh import mediapipe_unavailable

    return mediapipe_unavailable()


register_backend("mediapipe", _mediapipe_backend, available=_mediapipe_unavailable, priority=0)
