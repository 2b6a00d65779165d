"""Save and load detected landmarks, so a prebake can run where the detector cannot.

Why: the GPU machines have no landmark backend installed (mediapipe pins numpy < 2); the
detection (a few ms per frame) is done once on any machine and the result travels as a small
.npz, while the heavy parts of prebaking run next to the GPU.
"""
from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from .landmarks import FaceLandmarks


def save_faces(path: str | os.PathLike[str], faces: Sequence[FaceLandmarks]) -> None:
    np.savez_compressed(
        path,
        box=np.asarray([f.box for f in faces], np.float32),
        mesh=np.stack([f.mesh for f in faces]).astype(np.float32),
        lm68=np.stack([f.lm68 for f in faces]).astype(np.float32),
        score=np.asarray([f.score for f in faces], np.float32),
        backend=np.asarray([f.backend for f in faces]),
    )


def load_faces(path: str | os.PathLike[str]) -> list[FaceLandmarks]:
    d = np.load(path)
    return [
        FaceLandmarks(box=tuple(float(v) for v in d["box"][i]), mesh=d["mesh"][i], lm68=d["lm68"][i], score=float(d["score"][i]), backend=str(d["backend"][i]))
        for i in range(d["lm68"].shape[0])
    ]
