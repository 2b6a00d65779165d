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

import contextlib
import importlib.util
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, Iterator, Literal, Protocol, runtime_checkable

import numpy as np

from . import native_log
from .landmarks_68 import MESH_BROW_MID, MESH_CHIN, MESH_INNER_LIP_PAIRS, mesh_to_lm68

# Must be set before MediaPipe's native code initialises logging (harmless if already set).
os.environ.setdefault("GLOG_minloglevel", "2")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

__all__ = [
    "FaceLandmarks", "LandmarkBackend", "NoFaceError", "MediaPipeFaceMesh", "OneEuroFilter",
    "register_backend", "available_backends", "get_backend", "detect_sequence",
    "face_height", "mouth_opening", "mouth_width", "mouth_opening_mesh", "format_frame_ranges",
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


def _as_rgb(image: np.ndarray) -> np.ndarray:
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


def _quiet_native_stderr() -> None:
    """MediaPipe logs from its own threads at any moment: filter fd 2 for the process (see
    native_log) before the first graph starts."""
    native_log.install()


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


def _box_of(mesh: np.ndarray, width: int, height: int) -> tuple[float, float, float, float]:
    pts = mesh[:468]
    x1, y1 = pts.min(axis=0)
    x2, y2 = pts.max(axis=0)
    return (float(np.clip(x1, 0, width)), float(np.clip(y1, 0, height)),
            float(np.clip(x2, 0, width)), float(np.clip(y2, 0, height)))


def _square_window(cx: float, cy: float, side: float, width: int, height: int
                   ) -> tuple[int, int, int] | None:
    """Integer (x0, y0, side) crop window centred on (cx, cy); None if it would not be
    smaller than the image (then the full frame is used)."""
    side_i = int(round(side))
    if side_i >= max(width, height):
        return None
    return int(round(cx - side_i / 2)), int(round(cy - side_i / 2)), max(side_i, 32)


def _crop(rgb: np.ndarray, window: tuple[int, int, int]) -> np.ndarray:
    """Square crop, zero-padded where the window leaves the image."""
    x0, y0, s = window
    h, w = rgb.shape[:2]
    sx1, sy1, sx2, sy2 = max(x0, 0), max(y0, 0), min(x0 + s, w), min(y0 + s, h)
    if sx1 == x0 and sy1 == y0 and sx2 == x0 + s and sy2 == y0 + s:
        return np.ascontiguousarray(rgb[y0:y0 + s, x0:x0 + s])
    out = np.zeros((s, s, 3), np.uint8)
    if sx2 > sx1 and sy2 > sy1:
        out[sy1 - y0:sy2 - y0, sx1 - x0:sx2 - x0] = rgb[sy1:sy2, sx1:sx2]
    return out


# ----------------------------------------------------------------------------- smoothing


class OneEuroFilter:
    """One-Euro low-pass filter over a (N, 2) point set, adaptive per point.

    cutoff = min_cutoff + beta * speed, speed in units of ``scale`` per second (we pass the
    face height, so the settings are resolution independent). Still points get
    ``min_cutoff`` Hz (strong smoothing), fast points get little. Call ``reset()`` at a cut.
    """

    def __init__(self, min_cutoff: float = 1.5, beta: float = 60.0, d_cutoff: float = 5.0):
        self.min_cutoff = float(min_cutoff)
        self.beta = float(beta)
        self.d_cutoff = float(d_cutoff)
        self.reset()

    def reset(self) -> None:
        self._x: np.ndarray | None = None
        self._dx: np.ndarray | None = None

    @staticmethod
    def _alpha(cutoff: np.ndarray | float, dt: float) -> np.ndarray | float:
        tau = 1.0 / (2.0 * math.pi * cutoff)
        return 1.0 / (1.0 + tau / dt)

    def __call__(self, x: np.ndarray, dt: float, scale: float = 1.0) -> np.ndarray:
        x = np.asarray(x, np.float64)
        if self._x is None or self._x.shape != x.shape:
            self._x = x.copy()
            self._dx = np.zeros_like(x)
            return x.astype(np.float32)
        dx = (x - self._x) / (dt * max(scale, 1e-6))
        a_d = self._alpha(self.d_cutoff, dt)
        self._dx = a_d * dx + (1.0 - a_d) * self._dx
        speed = np.linalg.norm(self._dx, axis=-1, keepdims=True)
        a = self._alpha(self.min_cutoff + self.beta * speed, dt)
        self._x = a * x + (1.0 - a) * self._x
        return self._x.astype(np.float32)


# ----------------------------------------------------------------------------- MediaPipe


def _mediapipe_dir() -> Path | None:
    spec = importlib.util.find_spec("mediapipe")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _mediapipe_unavailable() -> str | None:
    root = _mediapipe_dir()
    if root is None:
        return "the 'mediapipe' package is not installed (pip install 'mediapipe<0.11')"
    model = root / "modules" / "face_landmark" / "face_landmark.tflite"
    graph = root / "modules" / "face_landmark" / "face_landmark_front_cpu.binarypb"
    if not (model.exists() and graph.exists()):
        return (f"this mediapipe build ships no legacy FaceMesh models ({graph.parent}); "
                "install mediapipe 0.10.x")
    return None


class _MeshGraph:
    """One MediaPipe FaceMesh graph that also exposes the detector's score."""

    def __init__(self, *, video: bool, refine: bool, min_det: float, min_track: float):
        from mediapipe.python.solution_base import SolutionBase
        from mediapipe.python.solutions import face_mesh as mp_face_mesh

        _quiet_native_stderr()
        self._graph = SolutionBase(
            binary_graph_path=mp_face_mesh._BINARYPB_FILE_PATH,
            side_inputs={"num_faces": 1, "with_attention": refine,
                         "use_prev_landmarks": video},
            calculator_params={
                "facedetectionshortrangecpu__facedetectionshortrange__facedetection__"
                "TensorsToDetectionsCalculator.min_score_thresh": min_det,
                "facelandmarkcpu__ThresholdingCalculator.threshold": min_track,
            },
            outputs=["multi_face_landmarks", "face_detections"])
        self.last_score = 0.0

    def process(self, rgb: np.ndarray) -> np.ndarray | None:
        """(N, 2) float32 pixel mesh of the face in ``rgb``, or None."""
        _quiet_native_stderr()
        out = self._graph.process({"image": rgb})
        if out.face_detections:
            self.last_score = float(out.face_detections[0].score[0])
        if not out.multi_face_landmarks:
            return None
        h, w = rgb.shape[:2]
        lms = out.multi_face_landmarks[0].landmark
        mesh = np.fromiter((c for p in lms for c in (p.x, p.y)), np.float32, 2 * len(lms))
        return mesh.reshape(-1, 2) * np.array([w, h], np.float32)

    def close(self) -> None:
        self._graph.close()


class MediaPipeFaceMesh:
    """Offline landmarks from MediaPipe's legacy FaceMesh (models ship in the wheel).

    refine_landmarks: use the attention model (478 points; better lips and eyes, ~+0.5 ms).
    small_face_fallback: when the mesh finds nothing in the full frame, locate faces with
        the full-range detector and fit the mesh in a crop (distant presenters).
    Not thread-safe (MediaPipe graphs are stateful): use one instance per thread.
    min_cutoff, beta, d_cutoff: One-Euro settings of ``track`` (Hz; Hz per face height per
        second; Hz of the speed estimate). The defaults halve the frame-to-frame jitter of
        yongen.mp4 (second difference x0.49) while a 4 Hz lip motion of 0.03 face heights
        keeps 92 % of its amplitude; raise ``beta`` for less lag, lower it for less jitter.
    """

    name = "mediapipe"

    def __init__(self, *, refine_landmarks: bool = True, min_detection_confidence: float = 0.5,
                 min_tracking_confidence: float = 0.5, small_face_fallback: bool = True,
                 min_cutoff: float = 1.5, beta: float = 60.0, d_cutoff: float = 5.0):
        why = _mediapipe_unavailable()
        if why is not None:
            raise RuntimeError(f"MediaPipe face mesh is not usable: {why}")
        self.refine_landmarks = refine_landmarks
        self.min_detection_confidence = min_detection_confidence
        self.min_tracking_confidence = min_tracking_confidence
        self.small_face_fallback = small_face_fallback
        self.min_cutoff = min_cutoff
        self.beta = beta
        self.d_cutoff = d_cutoff
        self._static: _MeshGraph | None = None
        self._full_range = None

    # -- plumbing
    def _graph(self, video: bool) -> _MeshGraph:
        return _MeshGraph(video=video, refine=self.refine_landmarks,
                          min_det=self.min_detection_confidence,
                          min_track=self.min_tracking_confidence)

    def _static_graph(self) -> _MeshGraph:
        if self._static is None:
            self._static = self._graph(video=False)
        return self._static

    def _find_small_face(self, rgb: np.ndarray) -> tuple[int, int, int] | None:
        """Crop window around the most confident full-range detection, or None."""
        if self._full_range is None:
            from mediapipe.python.solutions import face_detection as mp_fd
            _quiet_native_stderr()
            self._full_range = mp_fd.FaceDetection(
                model_selection=1, min_detection_confidence=self.min_detection_confidence)
        _quiet_native_stderr()
        out = self._full_range.process(rgb)
        if not out.detections:
            return None
        det = max(out.detections, key=lambda d: d.score[0])
        bb = det.location_data.relative_bounding_box
        h, w = rgb.shape[:2]
        bw, bh = bb.width * w, bb.height * h
        cx, cy = (bb.xmin + bb.width / 2) * w, (bb.ymin + bb.height / 2) * h
        return _square_window(cx, cy, 3.0 * max(bw, bh), w, h)

    @staticmethod
    def _run(graph: _MeshGraph, rgb: np.ndarray, window: tuple[int, int, int] | None
             ) -> np.ndarray | None:
        if window is None:
            return graph.process(rgb)
        mesh = graph.process(_crop(rgb, window))
        if mesh is None:
            return None
        return mesh + np.array(window[:2], np.float32)

    def _make(self, mesh: np.ndarray, rgb: np.ndarray, score: float) -> FaceLandmarks:
        h, w = rgb.shape[:2]
        mesh = np.ascontiguousarray(mesh, np.float32)
        return FaceLandmarks(box=_box_of(mesh, w, h), mesh=mesh, lm68=mesh_to_lm68(mesh),
                             score=score, backend=self.name)

    def _detect_raw(self, rgb: np.ndarray
                    ) -> tuple[np.ndarray, float, tuple[int, int, int] | None] | None:
        g = self._static_graph()
        mesh = g.process(rgb)
        if mesh is not None:
            return mesh, g.last_score, None
        if not self.small_face_fallback:
            return None
        window = self._find_small_face(rgb)
        if window is None:
            return None
        mesh = self._run(g, rgb, window)
        if mesh is None:
            return None
        return mesh, g.last_score, window

    # -- public
    def detect(self, rgb: np.ndarray) -> FaceLandmarks | None:
        """Landmarks of the most prominent face in one RGB image (static mode), or None."""
        rgb = _as_rgb(rgb)
        found = self._detect_raw(rgb)
        if found is None:
            return None
        return self._make(found[0], rgb, found[1])

    def iter_track(self, frames: Iterable[np.ndarray], *, fps: float = 25.0,
                   smooth: bool = True) -> Iterator[FaceLandmarks | None]:
        """Streaming form of ``track``: yields one result per frame as it arrives."""
        dt = 1.0 / float(fps)
        filt = OneEuroFilter(self.min_cutoff, self.beta, self.d_cutoff)
        graph: _MeshGraph | None = None
        window: tuple[int, int, int] | None = None
        score = 0.0
        try:
            for frame in frames:
                rgb = _as_rgb(frame)
                h, w = rgb.shape[:2]
                if graph is None:
                    graph = self._graph(video=True)
                mesh = self._run(graph, rgb, window)
                if mesh is None:
                    # Lost (or never found): re-acquire with the static path, which also
                    # finds small faces, then restart the tracker where the face is.
                    found = self._detect_raw(rgb)
                    if found is not None:
                        mesh, score, window = found
                        graph.close()
                        graph = self._graph(video=True)
                        seeded = self._run(graph, rgb, window)
                        if seeded is not None:
                            mesh = seeded
                else:
                    score = graph.last_score or score
                if mesh is None:
                    filt.reset()
                    yield None
                    continue
                if window is not None:
                    # Keep the face well inside the crop: re-centre before it reaches the edge.
                    x0, y0, s = window
                    bx1, by1 = mesh[:468].min(axis=0)
                    bx2, by2 = mesh[:468].max(axis=0)
                    m = 0.1 * s
                    if bx1 < x0 + m or by1 < y0 + m or bx2 > x0 + s - m or by2 > y0 + s - m:
                        window = _square_window((bx1 + bx2) / 2, (by1 + by2) / 2,
                                                2.5 * max(bx2 - bx1, by2 - by1), w, h)
                        graph.close()
                        graph = self._graph(video=True)
                if smooth:
                    fh = float(np.linalg.norm(mesh[list(MESH_BROW_MID)].mean(0) - mesh[MESH_CHIN]))
                    mesh = filt(mesh, dt, scale=max(fh, 1.0))
                yield self._make(mesh, rgb, score)
        finally:
            if graph is not None:
                graph.close()

    def track(self, frames: Iterable[np.ndarray], *, fps: float = 25.0,
              smooth: bool = True) -> list[FaceLandmarks | None]:
        """Landmarks for a video sequence (tracking mode + One-Euro smoothing), None where no
        face is found. ``fps`` sets the filter's time step; ``smooth=False`` gives raw output."""
        return list(self.iter_track(frames, fps=fps, smooth=smooth))

    def close(self) -> None:
        if self._static is not None:
            self._static.close()
            self._static = None
        if self._full_range is not None:
            self._full_range.close()
            self._full_range = None

    def __enter__(self) -> "MediaPipeFaceMesh":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


register_backend("mediapipe", MediaPipeFaceMesh, available=_mediapipe_unavailable, priority=0)


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
            results = [be.detect(_as_rgb(f)) for f in frames]
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


# ----------------------------------------------------------------------------- metrics


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
