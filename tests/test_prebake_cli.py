"""Prebake real media through the CLI; avatar info / verify; tampering is caught."""
from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import media_path
from newsstudio.avatar.landmarks_io import load_faces, save_faces
from newsstudio.avatar.packet import open_packet
from newsstudio.avatar.prebake import prebake
from newsstudio.cli import app

runner = CliRunner()


@pytest.mark.parametrize("name,size,frames", [("yongen.mp4", None, 60), ("portrait.png", "540x960", 1)])
def test_prebake_info_verify_and_tamper(tmp_path, name, size, frames):
    src = media_path(name)
    args = ["prebake", str(src), "--id", "a1", "--avatars", str(tmp_path), "--max-frames", str(frames)]
    if size:
        args += ["--size", size]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    p = open_packet(tmp_path / "a1")
    assert p.n_frames == frames
    if size:
        assert p.size == (540, 960)
    w, h = p.size
    assert p.array("frames_nv12").shape == (frames, h * 3 // 2, w)
    lm = p.array("landmarks68")
    assert lm.shape == (frames, 68, 2)
    assert (lm[..., 0] > 0).all() and (lm[..., 0] < w).all() and (lm[..., 1] < h).all()
    x0, y0 = p.array("roi/origins")[0]
    rw, rh = p.meta["roi"]["size"]
    mouth = lm[0, 48:68]
    assert (mouth[:, 0] > x0).all() and (mouth[:, 0] < x0 + rw).all() and (mouth[:, 1] > y0).all() and (mouth[:, 1] < y0 + rh).all()

    r = runner.invoke(app, ["avatar", "info", "a1", "--avatars", str(tmp_path)])
    assert r.exit_code == 0 and "roi" in r.output and f"{w}x{h}" in r.output, r.output
    r = runner.invoke(app, ["avatar", "verify", "a1", "--avatars", str(tmp_path)])
    assert r.exit_code == 0 and "OK" in r.output, r.output
    r = runner.invoke(app, ["avatar", "list", "--avatars", str(tmp_path)])
    assert r.exit_code == 0 and "a1" in r.output and f"{frames} frames" in r.output, r.output

    f = p.path / p.specs["roi/rgb"].file
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x40
    f.write_bytes(bytes(data))
    r = runner.invoke(app, ["avatar", "verify", "a1", "--avatars", str(tmp_path)])
    assert r.exit_code != 0 and "checksum" in r.output, r.output

    with open(f, "r+b") as fh:
        fh.truncate(100)
    r = runner.invoke(app, ["avatar", "info", "a1", "--avatars", str(tmp_path)])
    assert r.exit_code != 0 and "truncated" in r.output, r.output


def test_no_face_is_a_clear_error(tmp_path):
    from PIL import Image

    src = tmp_path / "wall.png"
    Image.fromarray(np.full((128, 128, 3), 90, np.uint8)).save(src)
    r = runner.invoke(app, ["prebake", str(src), "--id", "wall", "--avatars", str(tmp_path / "av")])
    assert r.exit_code == 2 and "no face" in r.output, r.output
    assert not (tmp_path / "av" / "wall").exists()


def test_precomputed_landmarks_give_the_same_packet(tmp_path, astronaut_packet):
    src = next((astronaut_packet.path.parent).glob("*.png"))
    a = prebake(src, "a", root=tmp_path, progress=False)
    from newsstudio.avatar.landmarks import get_backend
    from newsstudio.media.image import read_image

    faces = [get_backend("auto").detect(read_image(src))]
    save_faces(tmp_path / "faces.npz", faces)
    b = prebake(src, "b", root=tmp_path, progress=False, faces=load_faces(tmp_path / "faces.npz"))
    for name in a.names():
        assert np.array_equal(a.array(name), b.array(name)), name
