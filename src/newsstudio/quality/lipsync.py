"""Lip-sync measured on rendered frames: mouth opening (landmarks) vs the audio's RMS envelope.

Why on the output: it checks the whole pipeline as a viewer sees it (warp, splice, colour),
not the engine's internal parameters. The opening is the inner-lip gap over face height from
the same offline landmark backend used for prebaking, detected independently per frame.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..avatar.face_metrics import mouth_opening
from ..avatar.mediapipe_mesh import MediaPipeFaceMesh


def rms_envelope(samples: np.ndarray, sample_rate: int, fps: float, n_frames: int) -> np.ndarray:
    """Per-frame RMS of mono audio, one value per video frame (window = the frame's duration)."""
    x = samples.mean(axis=0) if samples.ndim == 2 else samples
    out = np.zeros(n_frames, np.float64)
    for i in range(n_frames):
        a = int(round(i * sample_rate / fps))
        b = int(round((i + 1) * sample_rate / fps))
        seg = x[a:b]
        out[i] = float(np.sqrt(np.mean(seg.astype(np.float64) ** 2))) if seg.size else 0.0
    return out


def mouth_openings(frames_rgb, roi: tuple[int, int, int, int] | None = None) -> np.ndarray:
    """Mouth opening per RGB frame (NaN where no face is found). `roi` (x0, y0, x1, y1) crops
    first, which makes detection faster on large frames."""
    vals = []
    with MediaPipeFaceMesh() as det:
        for f in frames_rgb:
            img = f if roi is None else f[roi[1] : roi[3], roi[0] : roi[2]]
            lm = det.detect(np.ascontiguousarray(img))
            vals.append(float(mouth_opening(lm.lm68)) if lm is not None else np.nan)
    return np.asarray(vals)


@dataclass
class LipSyncReport:
    correlation: float
    silent_frames: int
    silent_max_opening: float
    silent_p95_opening: float
    speech_mean_opening: float
    missing_faces: int


def lipsync_report(opening: np.ndarray, envelope: np.ndarray, silence_rms: float) -> LipSyncReport:
    ok = ~np.isnan(opening)
    o, e = opening[ok], envelope[ok]
    corr = float(np.corrcoef(o, e)[0, 1]) if o.size > 2 and o.std() > 0 and e.std() > 0 else 0.0
    silent = e < silence_rms
    speech = ~silent
    return LipSyncReport(
        correlation=corr,
        silent_frames=int(silent.sum()),
        silent_max_opening=float(o[silent].max()) if silent.any() else 0.0,
        silent_p95_opening=float(np.percentile(o[silent], 95)) if silent.any() else 0.0,
        speech_mean_opening=float(o[speech].mean()) if speech.any() else 0.0,
        missing_faces=int((~ok).sum()),
    )
