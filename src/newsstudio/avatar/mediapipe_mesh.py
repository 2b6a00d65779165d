"""The MediaPipe FaceMesh landmark backend (the default; its models ship in the wheel).

landmarks.py says why this backend and how ``detect`` / ``track`` behave; this module holds the
graph wrapper, the small-face fallback's crop helpers and the backend class.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from . import native_log
from .landmarks import FaceLandmarks, as_rgb
from .landmarks_68 import MESH_BROW_MID, MESH_CHIN, mesh_to_lm68
from .one_euro import OneEuroFilter

# Must be set before MediaPipe's native code initialises logging (harmless if already set).
os.environ.setdefault("GLOG_minloglevel", "2")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _quiet_native_stderr() -> None:
    """MediaPipe logs from its own threads at any moment: filter fd 2 for the process (see
    native_log) before the first graph starts."""
    native_log.install()


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


def _mediapipe_dir() -> Path | None:
    spec = importlib.util.find_spec("mediapipe")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def mediapipe_unavailable() -> str | None:
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
        why = mediapipe_unavailable()
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
        rgb = as_rgb(rgb)
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
                rgb = as_rgb(frame)
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
