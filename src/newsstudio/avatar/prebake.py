"""Prebake: turn a presenter video loop or a portrait photo into an avatar packet, once.

Everything that does not depend on the audio is computed here so rendering only gathers:
output-size NV12 background frames, face landmarks, the generic lower-face ROI (origins,
RGB crops, feathered masks), and, on request, each engine's own tensors (the engine's
`prebake` adds them to the same packet).
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm import tqdm

from ..compose.colour import rgb_to_nv12
from ..media.image import is_image_path, read_image
from ..media.video import iter_video_frames, probe_video
from .geometry import check_fit, lower_face_mask, lower_face_roi, make_framing
from .landmarks import FaceLandmarks, NoFaceError, detect_sequence, get_backend
from .packet import Packet, PacketWriter
from .store import packet_dir, source_digest, validate_id

if TYPE_CHECKING:
    from ..engines.base import Engine

ProgressCallback = Callable[[str, int, "int | None"], None]
DEFAULT_MAX_FRAMES = 750  # 30 s at 25 fps: a loop longer than that is rarely useful and costs memory
PHOTO_FPS = 25.0


def prebake(
    source: str | os.PathLike[str],
    avatar_id: str,
    *,
    root: str | os.PathLike[str] | None = None,
    size: tuple[int, int] | None = None,
    fit: str = "cover",
    max_frames: int = DEFAULT_MAX_FRAMES,
    engines: Sequence[str] = (),
    landmarks: str = "auto",
    no_face: str = "nearest",
    progress: bool = True,
    engine_kwargs: dict[str, Any] | None = None,
    faces: Sequence[FaceLandmarks] | None = None,
    progress_cb: ProgressCallback | None = None,
    source_name: str | None = None,
) -> Packet:
    """Build (or rebuild) the packet `avatar_id` from `source`; returns it opened. A failure
    leaves no new packet behind (the `engines` are loaded before anything is written).

    `faces`: landmarks detected earlier for exactly these source frames (see landmarks_io);
    detection is skipped then. `progress_cb(stage, done, total)` is told about every frame of
    each stage ("decode", "landmarks", "prebake"), e.g. for a server job's progress.
    `source_name`: the name the manifest records as the source (default: the file's own), for a
    caller whose `source` is a temp copy of someone's file (a server upload)."""

    def stage(items: Iterable, desc: str, total: int | None, leave: bool = False) -> Iterator:
        for i, x in enumerate(tqdm(items, total=total, desc=desc, unit="f", disable=not progress, leave=leave)):
            yield x
            if progress_cb is not None:
                progress_cb(desc, i + 1, total)

    validate_id(avatar_id)
    check_fit(fit)
    src = Path(source)
    if not src.is_file():
        raise FileNotFoundError(f"avatar source {src} does not exist")
    # Engines first: an unknown name or bad / missing weights fails before anything is written.
    engs = _load_engines(engines, engine_kwargs)
    photo = is_image_path(src)
    if photo:
        frames_src = [read_image(src)]
        fps = PHOTO_FPS
    else:
        info = probe_video(src)
        fps = float(info.fps)
        n = min(info.frame_count or max_frames, max_frames)
        frames_src = list(stage(iter_video_frames(src, limit=max_frames), "decode", n))
        if not frames_src:
            raise ValueError(f"{src}: the video holds no decodable frames")
    sh, sw = frames_src[0].shape[:2]
    framing = make_framing((sw, sh), size, fit)
    w, h = framing.out_size

    backend_name = faces[0].backend if faces else landmarks
    if faces is not None:
        if len(faces) != len(frames_src):
            raise ValueError(f"{len(faces)} precomputed landmark sets for {len(frames_src)} frames")
    elif photo:
        backend = get_backend(landmarks)
        backend_name = backend.name
        face = backend.detect(frames_src[0])
        if face is None:
            raise NoFaceError(f"no face found in {src.name}", [0], 1)
        faces = [face]
    else:
        backend = get_backend(landmarks)
        backend_name = backend.name
        frames_iter = stage(frames_src, "landmarks", len(frames_src))
        faces = detect_sequence(frames_iter, policy=no_face, backend=backend, fps=fps)
    lm68 = np.stack([framing.points(f.lm68) for f in faces]).astype(np.float32)
    mesh = np.stack([framing.points(f.mesh) for f in faces]).astype(np.float32)
    boxes = np.stack([framing.points(np.asarray(f.box, np.float32).reshape(2, 2)).reshape(4) for f in faces]).astype(np.float32)

    roi_size, origins = lower_face_roi(lm68, (w, h))
    rw, rh = roi_size
    n = len(frames_src)
    meta = {
        "n_frames": n,
        "fps": fps,
        "size": [w, h],
        "kind": "photo" if photo else "video",
        "cycle": "pingpong",
        "colour": {"matrix": "bt709", "range": "limited", "layout": "nv12"},
        "roi": {"size": [rw, rh]},
        "framing": {"fit": framing.fit, "scale": framing.scale, "offset": list(framing.offset), "source_size": [sw, sh]},
        "landmarks": {"backend": backend_name, "missing_policy": no_face},
        "source": {"name": source_name or src.name, "sha256": source_digest(src), "bytes": src.stat().st_size},
    }
    dest = packet_dir(avatar_id, root)
    existed = dest.exists()
    with PacketWriter(dest, avatar_id, meta) as writer:
        nv12 = np.lib.format.open_memmap(writer.tmp / "frames_nv12.scratch.npy", mode="w+", dtype=np.uint8, shape=(n, h * 3 // 2, w))
        roi_rgb = np.empty((n, rh, rw, 3), np.uint8)
        roi_mask = np.empty((n, rh, rw), np.uint8)
        out_rgb_iter = (framing.apply(f) for f in frames_src)
        for i, rgb in enumerate(stage(out_rgb_iter, "prebake", n, leave=True)):
            nv12[i] = rgb_to_nv12(rgb[None]).numpy()[0]  # numpy in: copied when read-only
            x0, y0 = origins[i]
            roi_rgb[i] = rgb[y0 : y0 + rh, x0 : x0 + rw]
            roi_mask[i] = lower_face_mask(lm68[i], origins[i], roi_size)
        writer.add("frames_nv12", nv12)
        del nv12
        (writer.tmp / "frames_nv12.scratch.npy").unlink()
        writer.add("landmarks68", lm68)
        writer.add("mesh", mesh)
        writer.add("face_boxes", boxes)
        writer.add("roi/origins", origins)
        writer.add("roi/rgb", roi_rgb)
        writer.add("roi/mask", roi_mask)
        packet = writer.commit()
    try:
        for eng in engs:
            packet = eng.prebake(packet, progress=progress)
    except BaseException:
        if not existed:  # a failed prebake leaves no new packet; one that was there is kept
            shutil.rmtree(dest, ignore_errors=True)
        raise
    return packet


def _load_engines(names: Sequence[str], engine_kwargs: dict[str, Any] | None) -> list[Engine]:
    """The engines whose tensors go into the packet, built on the default device."""
    if not names:
        return []
    from ..engines.registry import create_engine
    from ..stream import default_device

    return [create_engine(name, device=default_device(), **(engine_kwargs or {})) for name in names]
