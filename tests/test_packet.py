"""Avatar packets: atomic writes, zero-copy opening, refusal of truncated or tampered files."""
from __future__ import annotations

import json
import mmap
import os

import numpy as np
import pytest

from newsstudio.avatar.packet import MANIFEST, PacketError, PacketWriter, open_packet
from newsstudio.avatar.store import resolve_avatar, validate_id


def _make(tmp_path, name="a1"):
    dest = tmp_path / name
    rng = np.random.default_rng(0)
    with PacketWriter(dest, name, {"n_frames": 3, "fps": 25.0, "size": [8, 6]}) as w:
        w.add("frames_nv12", rng.integers(0, 255, (3, 9, 8), dtype=np.uint8))
        w.add("roi/mask", rng.random((3, 4, 4), dtype=np.float32))
        w.add("empty", np.zeros((0, 3), np.float32))
        return w.commit()


def test_roundtrip_is_memory_mapped_and_exact(tmp_path):
    p = _make(tmp_path)
    q = open_packet(p.path)
    assert q.names() == ["empty", "frames_nv12", "roi/mask"]
    arr = q.array("frames_nv12")
    owner = arr
    while isinstance(owner, np.ndarray) and owner.base is not None:
        owner = owner.base
    owner = owner.obj if isinstance(owner, memoryview) else owner
    assert isinstance(owner, mmap.mmap), "frames must be memory-mapped, not read"
    assert not arr.flags.writeable  # a packet is never written through its arrays
    rng = np.random.default_rng(0)
    assert np.array_equal(arr, rng.integers(0, 255, (3, 9, 8), dtype=np.uint8))
    t = q.tensor("roi/mask")
    assert t.shape == (3, 4, 4) and t.data_ptr() == q.array("roi/mask").ctypes.data
    q.verify()


def test_flipped_byte_fails_verify_with_file_name(tmp_path):
    p = _make(tmp_path)
    f = p.path / p.specs["frames_nv12"].file
    data = bytearray(f.read_bytes())
    data[17] ^= 0x01
    f.write_bytes(bytes(data))
    q = open_packet(p.path)  # same size: opening is allowed, verify catches it
    with pytest.raises(PacketError, match="frames_nv12.*checksum"):
        q.verify()


def test_truncated_file_is_refused_at_open(tmp_path):
    p = _make(tmp_path)
    f = p.path / p.specs["roi/mask"].file
    with open(f, "r+b") as fh:
        fh.truncate(f.stat().st_size - 4)
    with pytest.raises(PacketError, match="truncated or resized"):
        open_packet(p.path)


def test_file_truncated_after_open_is_refused_when_mapped(tmp_path):
    p = _make(tmp_path)
    q = open_packet(p.path)  # sizes checked here
    with open(p.path / p.specs["frames_nv12"].file, "r+b") as f:
        f.truncate(5)
    with pytest.raises(PacketError, match="cannot map .*frames_nv12"):
        q.array("frames_nv12")


def test_missing_file_and_corrupt_manifest(tmp_path):
    p = _make(tmp_path)
    os.remove(p.path / p.specs["roi/mask"].file)
    with pytest.raises(PacketError, match="missing"):
        open_packet(p.path)
    (p.path / MANIFEST).write_text("{not json")
    with pytest.raises(PacketError, match="corrupt"):
        open_packet(p.path)


def test_manifest_cannot_point_outside(tmp_path):
    p = _make(tmp_path)
    m = json.loads((p.path / MANIFEST).read_text())
    m["arrays"]["roi/mask"]["file"] = "../../etc/passwd"
    (p.path / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(PacketError, match="outside"):
        open_packet(p.path)


def test_failed_write_leaves_nothing_and_keeps_old(tmp_path):
    p = _make(tmp_path)
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(RuntimeError):
        with PacketWriter(p.path, "a1", {"n_frames": 1, "fps": 25.0, "size": [8, 6]}) as w:
            w.add("frames_nv12", np.zeros((1, 9, 8), np.uint8))
            raise RuntimeError("boom")
    assert sorted(os.listdir(tmp_path)) == before, "temp folder left behind"
    assert open_packet(p.path).n_frames == 3, "old packet must survive a failed rebuild"


def test_add_arrays_commits_through_manifest(tmp_path):
    p = _make(tmp_path)
    q = p.add_arrays({"musetalk/latents": np.ones((3, 8, 4, 4), np.float16)}, engine="musetalk", engine_meta={"version": "v15"})
    assert q.engine_meta("musetalk") == {"version": "v15"}
    assert q.array("musetalk/latents").dtype == np.float16
    q.verify()


@pytest.mark.parametrize("bad", ["../x", "a/b", "", ".hidden", "x" * 65, "a b"])
def test_ids_reject_path_tricks(bad):
    with pytest.raises(ValueError):
        validate_id(bad)


def test_unknown_avatar_is_a_clear_error(tmp_path):
    with pytest.raises(PacketError, match="no avatar 'nobody'"):
        resolve_avatar("nobody", tmp_path)
