"""Shared fixtures: where the real media and the golden vectors live."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
MEDIA_DIR = Path(os.environ.get("NEWSSTUDIO_MEDIA_DIR", SHARED / "media"))

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
if not torch.cuda.is_available():
    # Triton kernels (accel/triton_conv.py) run in Triton's CPU interpreter here; Triton reads the
    # switch when it is imported, so it is set before any test module can import it.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def media_path(name: str) -> Path:
    """Path of a file in ../shared/media; skips the test with a reason when it is absent."""
    p = MEDIA_DIR / name
    if not p.exists():
        pytest.skip(f"real test media {p} is absent (tests read ../shared/media; none is committed)")
    return p


@pytest.fixture
def media():
    return media_path


def carried_faces(stem: str, scale: float = 1.0):
    """Landmarks of a test image carried to the GPU machine (`benchmarks.common.carried_faces`, at
    the image's full size; scaled by `scale`): it has no landmark backend, and with these the CUDA
    tests can prebake their avatars there. None where a backend is usable: tests detect."""
    from benchmarks.common import carried_faces as carried
    from newsstudio.avatar.landmarks import available_backends

    faces = None if any(why is None for why in available_backends().values()) else carried(stem)
    if faces is None:
        return None
    return [dataclasses.replace(x, box=tuple(v * scale for v in x.box), mesh=x.mesh * scale, lm68=x.lm68 * scale)
            for x in faces]


@pytest.fixture(scope="session")
def astronaut_packet(tmp_path_factory):
    """A small avatar (256x256) prebaked once per test session from scikit-image's astronaut."""
    from PIL import Image
    from skimage import data

    from newsstudio.avatar.prebake import prebake

    root = tmp_path_factory.mktemp("avatars")
    src = root / "astronaut.png"
    Image.fromarray(data.astronaut()).resize((256, 256)).save(src)
    return prebake(src, "astronaut", root=root, progress=False, faces=carried_faces("astronaut", 256 / 512))


def shifted_video_packet(src, dest, shifts):
    """A small "video loop" packet: frame 0 of `src` translated by each (dx, dy) in `shifts`, with
    its landmarks and mesh moved along (the ping-pong source pattern matters to some engines)."""
    import cv2
    import numpy as np

    from newsstudio.avatar.packet import PacketWriter
    from newsstudio.compose.colour import nv12_to_rgb, rgb_to_nv12

    base = src.array("frames_nv12")[0]
    h, w = base.shape[0] * 2 // 3, base.shape[1]
    rgb = nv12_to_rgb(torch.from_numpy(np.array(base))[None])[0].numpy()
    frames, lms, meshes = [], [], []
    for dx, dy in shifts:
        m = np.float32([[1, 0, dx], [0, 1, dy]])
        frames.append(rgb_to_nv12(cv2.warpAffine(rgb, m, (w, h), borderMode=cv2.BORDER_REPLICATE)[None]).numpy()[0])
        lms.append(src.array("landmarks68")[0] + np.float32([dx, dy]))
        meshes.append(src.array("mesh")[0] + np.float32([dx, dy]))
    with PacketWriter(dest, dest.name, {**src.meta, "n_frames": len(shifts), "kind": "video"}) as wr:
        wr.add("frames_nv12", np.stack(frames))
        wr.add("landmarks68", np.stack(lms))
        wr.add("mesh", np.stack(meshes))
        return wr.commit()


def assert_user_error(result, *needles: str) -> str:
    """A CLI result that reports a user mistake the way every command does: exit status 2 and
    one `error: ...` line holding each of `needles`, no traceback. Returns that line."""
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and all(n in errors[0] for n in needles), result.output
    return errors[0]
