"""Prepare what a GPU benchmark run carries: real media and their detected landmarks.

The GPU machines cannot install our landmark backend (mediapipe pins numpy < 2), so landmarks are
detected here once and saved next to a copy of the media in .carry/ (git-ignored).

    python -m benchmarks.prepare_carry
"""
from __future__ import annotations

import shutil

from newsstudio.avatar.landmarks import detect_sequence, get_backend
from newsstudio.avatar.landmarks_io import save_faces
from newsstudio.media.image import read_image
from newsstudio.media.video import iter_video_frames

from .common import CARRY, ROOT


def main() -> None:
    shared = ROOT.parent / "shared" / "media"
    (CARRY / "media").mkdir(parents=True, exist_ok=True)
    for f in ("yongen.mp4", "yongen.wav", "portrait.png", "speech.wav"):
        shutil.copy2(shared / f, CARRY / "media" / f)
    faces = detect_sequence(iter_video_frames(shared / "yongen.mp4"), policy="nearest")
    save_faces(CARRY / "yongen.faces.npz", faces)
    save_faces(CARRY / "portrait.faces.npz", [get_backend("auto").detect(read_image(shared / "portrait.png"))])
    from skimage import data  # the load test's avatar (benchmarks/load_test.py)

    save_faces(CARRY / "astronaut.faces.npz", [get_backend("auto").detect(data.astronaut())])
    print(f"carried: {len(faces)} yongen frames, portrait; {sum(p.stat().st_size for p in CARRY.rglob('*') if p.is_file()) / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
