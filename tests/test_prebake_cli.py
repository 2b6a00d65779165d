"""Prebake real media through the CLI; avatar info / verify; tampering is caught."""
from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import assert_user_error, media_path
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


@pytest.fixture
def photo(astronaut_packet):
    return next(astronaut_packet.path.parent.glob("*.png"))


def _left_in(root) -> list[str]:
    """Everything a prebake left under the avatars folder (packets, temp folders), bar the cached builtin sources."""
    return sorted(p.name for p in root.iterdir() if p.name != ".sources") if root.exists() else []


@pytest.mark.parametrize("args,needle", [
    (["--engines", "foo"], "unknown engine 'foo'"),
    (["--engines", "musetalk", "--models", "{tmp}/models"], "musetalk.json is missing"),
    (["--engines", "musetalk", "--weights", "bogus"], "weights must be 'official' or 'random', got 'bogus'"),
    (["--fit", "stretch"], "fit must be 'cover' or 'contain', got 'stretch'"),
    (["--fit", "stretch", "--size", "64x64"], "fit must be 'cover' or 'contain', got 'stretch'"),
])
def test_bad_engines_weights_or_fit_leave_no_packet(tmp_path, photo, args, needle):
    (tmp_path / "models").mkdir()
    root = tmp_path / "av"
    args = [a.format(tmp=tmp_path) for a in args]
    r = runner.invoke(app, ["prebake", str(photo), "--id", "p", "--avatars", str(root), *args])
    assert_user_error(r, needle)
    assert "prebake:" not in r.output, "refused before any work (no progress bar)"
    assert _left_in(root) == []
    r = runner.invoke(app, ["avatar", "list", "--avatars", str(root)])
    assert "no avatars" in r.output, r.output


def test_an_engine_failing_after_the_packet_is_written_removes_only_a_new_packet(tmp_path, photo, monkeypatch):
    from newsstudio.engines.classic.engine import ClassicEngine

    root = tmp_path / "av"
    assert runner.invoke(app, ["prebake", str(photo), "--id", "old", "--avatars", str(root)]).exit_code == 0

    def failing(self, packet, progress=True):
        raise ValueError("engine prebake failed")

    monkeypatch.setattr(ClassicEngine, "prebake", failing)
    r = runner.invoke(app, ["prebake", str(photo), "--id", "new", "--avatars", str(root), "--engines", "classic"])
    assert_user_error(r, "engine prebake failed")
    assert _left_in(root) == ["old"]
    r = runner.invoke(app, ["prebake", str(photo), "--id", "old", "--avatars", str(root), "--engines", "classic", "--replace"])
    assert_user_error(r, "engine prebake failed")
    assert _left_in(root) == ["old"] and open_packet(root / "old").n_frames == 1, "a packet that existed is never removed"


def test_an_existing_id_is_refused_unless_replace(tmp_path, photo):
    root = tmp_path / "av"
    args = ["prebake", str(photo), "--id", "p", "--avatars", str(root)]
    assert runner.invoke(app, args).exit_code == 0
    made = open_packet(root / "p").manifest["created_unix"]
    r = runner.invoke(app, [*args, "--size", "64x64"])
    assert_user_error(r, "avatar 'p' already exists", "--replace")
    assert open_packet(root / "p").manifest["created_unix"] == made and open_packet(root / "p").size != (64, 64)
    r = runner.invoke(app, [*args, "--size", "64x64", "--replace"])
    assert r.exit_code == 0, r.output
    assert open_packet(root / "p").size == (64, 64) and _left_in(root) == ["p"]
