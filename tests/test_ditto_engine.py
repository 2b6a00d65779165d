"""The Ditto engine end to end on CPU with seeded random weights.

Rendering one 512 crop costs ~1.2 TFLOP (warp + decoder), tens of seconds on a CPU core, so the
pipeline tests use the developer architecture ``config.TINY_OPTIONS`` (128 inputs, 256 crops;
the same layers a quarter as wide; a 2-layer random HuBERT), 2 DDIM steps and a fraction of a
second of audio. The real HuBERT-large configuration runs once on one window; the full-width
networks are checked against the official ones in tests/golden and test_ditto_regrouped.py.
"""
from __future__ import annotations

import json
import math
import os
import pickle
import shutil
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from conftest import shifted_video_packet
from newsstudio.avatar.packet import open_packet
from newsstudio.compose.splice import sample_crops_to_roi
from newsstudio.engines.ditto import config as dcfg
from newsstudio.engines.ditto.config import TINY_OPTIONS
from newsstudio.engines.ditto import weights as dweights
from newsstudio.engines.ditto.engine import DRIVING_DIM, OPTIONS_ENV, DittoEngine
from newsstudio.engines.ditto.putback import get_mask
from newsstudio.engines.ditto.registration import (
    CropParams,
    crop_matrices,
    crop_params_from_lm68,
    eye_state,
    mean_filter,
    points_to_crop,
    roi_geometry,
    roi_grids,
)
from newsstudio.media.audio import Audio, write_wav
from newsstudio.stream import stream_generator

OPTS = {**TINY_OPTIONS, "steps": 2}
ROOT = Path(__file__).resolve().parents[1]


def _speechlike(seconds: float, sr: int, channels: int = 1) -> np.ndarray:
    t = np.arange(int(round(seconds * sr))) / sr
    env = (np.sin(2 * np.pi * 3.0 * t) > 0).astype(np.float32)
    x = 0.3 * env * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 900 * t))
    return np.stack([x * (1 - 0.1 * c) for c in range(channels)]).astype(np.float32)


@pytest.fixture(scope="module")
def engine():
    return DittoEngine("cpu", weights="random", **OPTS)


@pytest.fixture(scope="module")
def packet(astronaut_packet, tmp_path_factory, engine):
    """A private copy of the astronaut packet with Ditto's arrays."""
    dest = tmp_path_factory.mktemp("ditto_avatar") / "astronaut"
    shutil.copytree(astronaut_packet.path, dest)
    return engine.prebake(open_packet(dest), progress=False)


def _make_video_packet(src, dest):
    """A 3-frame 'video loop': the astronaut translated by a few pixels per frame."""
    return shifted_video_packet(src, dest, SHIFTS)


SHIFTS = [(0, 0), (6, 2), (12, -4)]


@pytest.fixture(scope="module")
def video_engine():
    """Crop / x_s_info smoothing off (the default window of 13 frames would average 3 frames into one)."""
    return DittoEngine("cpu", weights="random", smo_k_s=1, **OPTS)


@pytest.fixture(scope="module")
def video_packet(astronaut_packet, tmp_path_factory, video_engine):
    p = _make_video_packet(astronaut_packet, tmp_path_factory.mktemp("ditto_video") / "loop")
    return video_engine.prebake(p, progress=False)


# ---------------------------------------------------------------------------------- registration


def test_registration_arrays(packet):
    n = packet.n_frames
    meta = packet.engine_meta("ditto")
    rw, rh = meta["roi"]
    # the developer architecture (quarter-width image networks) names itself apart from full-width random weights
    assert meta["weights"] == "random:0/w4" and meta["input_size"] == 128 and meta["crop_size"] == 256
    expect = {
        "ditto/f_s": ((n, 8, 16, 32, 32), "float16"),
        "ditto/x_s_info_pitch": ((n, 66), "float32"), "ditto/x_s_info_yaw": ((n, 66), "float32"),
        "ditto/x_s_info_roll": ((n, 66), "float32"), "ditto/x_s_info_t": ((n, 3), "float32"),
        "ditto/x_s_info_exp": ((n, 63), "float32"), "ditto/x_s_info_scale": ((n, 1), "float32"),
        "ditto/x_s_info_kp": ((n, 63), "float32"), "ditto/sc": ((1, 63), "float32"),
        "ditto/eye_open": ((n, 2), "float32"), "ditto/eye_ball": ((n, 6), "float32"),
        "ditto/m_c2o": ((n, 3, 3), "float32"), "ditto/origins": ((n, 2), "int32"),
        "ditto/mask": ((n, rh, rw), "uint8"), "ditto/grid": ((n, rh, rw, 2), "float16"),
    }
    for name, (shape, dtype) in expect.items():
        a = packet.array(name)
        assert a.shape == shape and a.dtype == np.dtype(dtype), (name, a.shape, a.dtype)
        assert np.isfinite(a.astype(np.float64)).all(), name
    w, h = packet.size
    o = packet.array("ditto/origins")
    assert rw % 2 == 0 and rh % 2 == 0 and (o % 2 == 0).all()
    assert (o[:, 0] >= 0).all() and (o[:, 0] + rw <= w).all() and (o[:, 1] >= 0).all() and (o[:, 1] + rh <= h).all()
    mask = packet.array("ditto/mask")
    m_c2o = packet.array("ditto/m_c2o").astype(np.float64)
    for k in range(n):  # the official feather mask, warped into the ROI like PutBack does into the frame
        shift = np.array([[1, 0, -o[k, 0]], [0, 1, -o[k, 1]], [0, 0, 1]], np.float64)
        ref = cv2.warpAffine(get_mask(256, 256)[:, :, 0], (shift @ m_c2o[k])[:2], (rw, rh), flags=cv2.INTER_LINEAR)
        assert np.abs(mask[k] / 255.0 - ref).max() < 4e-3 and mask[k].max() == 255
    # sc is the first frame's canonical keypoints
    assert np.array_equal(packet.array("ditto/sc")[0], packet.array("ditto/x_s_info_kp")[0])
    # every landmark lies inside the crop, and the crop removes the roll (eyes level)
    lm = points_to_crop(packet.array("landmarks68"), np.linalg.inv(m_c2o), 1) / 256
    assert (lm > 0.05).all() and (lm < 0.95).all()
    eye = (lm[:, [36, 39]].mean(1) + lm[:, [42, 45]].mean(1)) / 2
    lip = (lm[:, 48] + lm[:, 54]) / 2
    assert np.allclose(eye[:, 0], lip[:, 0], atol=1e-6)
    eo = packet.array("ditto/eye_open")
    assert (eo > 0.05).all() and (eo < 2).all()


def test_crop_and_grid_round_trip(packet, video_packet):
    """Cropping a frame with M_o2c and sampling the crop back with the ROI grid gives the frame's
    ROI again wherever the alpha is on: the crop and the paste-back agree pixel for pixel."""
    from newsstudio.compose.colour import nv12_to_rgb
    from newsstudio.engines.ditto.registration import crop_frames

    for p in (packet, video_packet):
        rw, rh = p.engine_meta("ditto")["roi"]
        rgb = nv12_to_rgb(p.tensor("frames_nv12")[:])
        crops = crop_frames(rgb, torch.from_numpy(p.array("ditto/m_c2o").astype(np.float64)), 256)
        back = sample_crops_to_roi(crops, torch.from_numpy(np.array(p.array("ditto/grid"))))
        mask = torch.from_numpy(np.array(p.array("ditto/mask"))) > 200
        o = p.array("ditto/origins")
        for k in range(p.n_frames):
            x0, y0 = o[k]
            roi = rgb[k, y0 : y0 + rh, x0 : x0 + rw].float()
            err = (back[k] - roi).abs()[mask[k]]
            assert mask[k].float().mean() > 0.3 and err.mean() < 2.5 and err.median() < 1.5, (k, err.mean(), err.median())


def test_crop_follows_the_face():
    """A similarity applied to the landmarks (roll, zoom, shift) moves the crop with it: the
    landmarks land on the same crop coordinates, and the stated conventions hold."""
    rng = np.random.default_rng(0)
    lm = np.zeros((68, 2))
    lm[0:17] = np.stack([np.linspace(-60, 60, 17), 40 - 0.02 * np.linspace(-60, 60, 17) ** 2 + 20], 1)
    lm[17:27] = np.stack([np.linspace(-45, 45, 10), np.full(10, -40.0)], 1)
    lm[27:36] = np.stack([np.zeros(9), np.linspace(-30, 5, 9)], 1)
    lm[36:42] = np.stack([np.linspace(-40, -15, 6), np.full(6, -20.0)], 1)
    lm[42:48] = np.stack([np.linspace(15, 40, 6), np.full(6, -20.0)], 1)
    lm[48:68] = np.stack([np.linspace(-22, 22, 20), 30 + rng.normal(0, 1, 20)], 1)
    lm[48], lm[54] = (-22, 30), (22, 30)
    lm[36], lm[39], lm[42], lm[45] = (-40, -20), (-15, -20), (15, -20), (40, -20)
    lm += (300, 400)
    p = crop_params_from_lm68(lm[None], 2.3, 0.0, -0.125)
    assert abs(p.angle[0]) < 1e-9
    ext = lm.max(0) - lm.min(0)
    assert p.size[0] == pytest.approx(max(ext) * 2.3)
    centre_box = (lm.max(0) + lm.min(0)) / 2
    assert p.center[0] == pytest.approx(centre_box + [0, -0.125 * p.size[0]])
    m_o2c, m_c2o = crop_matrices(p, 512)
    assert np.allclose(m_o2c[0] @ [*p.center[0], 1], [256, 256, 1])
    assert np.allclose(m_o2c[0] @ m_c2o[0], np.eye(3))
    a = np.deg2rad(14.0)
    sim = np.array([[1.3 * np.cos(a), -1.3 * np.sin(a), 57.0], [1.3 * np.sin(a), 1.3 * np.cos(a), -31.0]])
    lm2 = lm @ sim[:, :2].T + sim[:, 2]
    p2 = crop_params_from_lm68(lm2[None])
    assert p2.angle[0] == pytest.approx(a)
    m2, _ = crop_matrices(p2, 512)
    c1 = points_to_crop(lm[None], m_o2c, 512)
    c2 = points_to_crop(lm2[None], m2, 512)
    assert np.abs(c1 - c2).max() < 1e-9


def test_mean_filter_and_eye_state():
    x = np.arange(10, dtype=np.float64)[:, None] ** 2
    ref = np.stack([x[max(0, i - 2) : i + 3].mean(0) for i in range(10)])
    assert np.allclose(mean_filter(x, 5), ref)
    p = CropParams(np.zeros((3, 2)), np.array([1.0, 2.0, 6.0]), np.zeros(3))
    assert np.allclose(p.smoothed(3).size, [1.5, 3.0, 4.0])
    mesh = np.zeros((1, 478, 2))
    # a left eye 0.2 wide with 0.05 openings, the iris 0.02 above the eye centre
    mesh[0, 33], mesh[0, 133] = (0.2, 0.5), (0.4, 0.5)
    for lo, up in ((145, 159), (144, 160), (153, 158)):
        mesh[0, lo], mesh[0, up] = (0.3, 0.525), (0.3, 0.475)
    mesh[0, 468] = (0.3, 0.48)
    mesh[0, 263], mesh[0, 362] = (0.8, 0.5), (0.6, 0.5)
    mesh[0, 473] = (0.7, 0.5)
    for lo, up in ((374, 386), (373, 387), (380, 385)):
        mesh[0, lo], mesh[0, up] = (0.7, 0.51), (0.7, 0.49)
    eo, eb = eye_state(mesh)
    assert eo[0] == pytest.approx([0.15 / 0.2, 0.06 / 0.2], rel=1e-5)
    # ball move: (dir(ball - centre) - dir(outer - inner)) * |ball - centre|, layout [x_L, x_R, y_L, y_R, z_L, z_R]
    assert eb[0] == pytest.approx([0.02, 0.0, -0.02, 0.0, 0.0, 0.0], abs=1e-6)


def test_grid_sampling_equals_warpaffine():
    """The ROI grids sample a crop exactly where cv2.warpAffine(crop, M_c2o) puts it, and the
    ROI mask is get_mask warped the same way (1080x1920 frame, rotated face, partly outside)."""
    lm_centre, size, ang = np.array([[930.0, 500.0]]), np.array([420.0]), np.array([0.21])
    p = CropParams(lm_centre, size, ang)
    cs = 256
    m_o2c, m_c2o = crop_matrices(p, cs)
    (rw, rh), origins = roi_geometry(m_c2o, cs, (1080, 1920))
    assert rw % 2 == 0 and rh % 2 == 0 and origins[0, 0] + rw <= 1080
    grid = roi_grids(torch.from_numpy(m_o2c), torch.from_numpy(origins), (rh, rw), cs)
    yy, xx = np.mgrid[0:cs, 0:cs] / cs
    img = np.stack([127 + 100 * np.sin(2 * np.pi * (xx + 0.5 * yy)), 127 + 90 * np.cos(2 * np.pi * 1.5 * yy),
                    127 + 80 * np.sin(2 * np.pi * (xx - yy))], -1).astype(np.float32)
    ours = sample_crops_to_roi(torch.from_numpy(img).permute(2, 0, 1)[None], grid.to(torch.float16))[0].numpy()
    shift = np.array([[1, 0, -origins[0, 0]], [0, 1, -origins[0, 1]], [0, 0, 1]], np.float64)
    ref = cv2.warpAffine(img, (shift @ m_c2o[0])[:2], (rw, rh), flags=cv2.INTER_LINEAR)
    mask_ref = cv2.warpAffine(get_mask(cs, cs)[:, :, 0], (shift @ m_c2o[0])[:2], (rw, rh), flags=cv2.INTER_LINEAR)
    inside = mask_ref > 0.05
    assert inside.mean() > 0.3
    diff = np.abs(ours - ref)[inside]
    assert diff.max() < 2.5 and diff.mean() < 0.3, (diff.max(), diff.mean())
    tmpl = torch.from_numpy(get_mask(cs, cs)[:, :, 0]).double()[None, None]
    mask = torch.nn.functional.grid_sample(tmpl, grid, mode="bilinear", padding_mode="zeros", align_corners=False)[0, 0].numpy()
    assert np.abs(mask - mask_ref).max() < 2e-3


def test_video_registration_follows_frames(video_packet, engine, astronaut_packet, tmp_path):
    """Per-frame crops/grids for a moving source (the crop moves with the face); with the default
    smoothing window (13 > 3 frames) every frame gets the mean crop and the mean motion."""
    p = video_packet
    assert p.n_frames == 3 and p.array("ditto/f_s").shape[0] == 3
    m = p.array("ditto/m_c2o").astype(np.float64)
    for k, (dx, dy) in enumerate(SHIFTS):
        t = np.array([[1, 0, dx], [0, 1, dy], [0, 0, 1]], np.float64)
        assert np.allclose(m[k], t @ m[0], atol=1e-3)
    g = p.array("ditto/grid").astype(np.float32)
    o = p.array("ditto/origins")
    assert not np.array_equal(o[0], o[2]) or not np.allclose(g[0], g[2])
    smooth = engine.prebake(_make_video_packet(astronaut_packet, tmp_path / "loop13"), progress=False)
    ms = smooth.array("ditto/m_c2o").astype(np.float64)
    assert np.allclose(ms, ms[:1], atol=1e-4) and np.allclose(ms[0][:2, 2], m[:, :2, 2].mean(0), atol=1e-2)
    for k in ("kp", "exp", "pitch"):
        a = smooth.array(f"ditto/x_s_info_{k}")
        assert np.allclose(a, a[:1], atol=1e-6)


# ---------------------------------------------------------------------------------- driver / stream


def test_front_end_tf32_reaches_every_graph_of_the_front_end(packet):
    """`front_end_tf32` is a capture-time setting: HuBERT's runner, the sessions' samplers and the
    server's shared motion batcher must all get graphs made with it (off: all without; on by default)."""
    for on in (False, None):
        eng = DittoEngine("cpu", weights="random", **({} if on is None else {"front_end_tf32": on}), **OPTS)
        layer = eng.load_avatar(packet)
        runners = [eng._hubert_runner, eng.driver(layer).sampler.program.runner]
        runners.append(eng.use_stream_batchers()["motion"].sampler.program.runner)
        want = on is not False
        assert [r.tf32 for r in runners] == [want, want, want]
        eng.use_stream_batchers()["motion"].close()
        if eng.audio_batcher is not None:
            eng.audio_batcher.close()


def test_online_driver_emits_before_all_audio(engine, packet):
    layer = engine.load_avatar(packet)
    cond = engine.conditioner(25)
    drv = engine.driver(layer)
    sr = 16000
    pcm = _speechlike(4.0, sr)[0]
    first_at = None
    for i in range(0, pcm.size, 3200):  # 0.2 s chunks
        cond.push(pcm[i : i + 3200])
        if cond.ready:
            drv.push(cond.take(cond.ready))
        if first_at is None and drv.ready:
            first_at = i + 3200
    assert first_at is not None and first_at < pcm.size * 0.9, "no motion before the end of the audio"
    # 80-frame windows with 10 warm-up rows: the first window needs 70 audio frames (+ look-ahead)
    assert first_at >= 70 * 640
    early = drv.take(drv.ready)
    cond.close()
    if cond.ready:
        drv.push(cond.take(cond.ready))
    drv.close()
    rest = drv.take(drv.ready)
    rows = torch.cat([early, rest])
    assert rows.shape == (math.ceil(pcm.size / 640), DRIVING_DIM) and torch.isfinite(rows).all()
    assert torch.equal(rows[:, 265:530], rows[:1, 265:530].expand(rows.shape[0], -1))  # one d0 per stream
    x_s, x_d = engine.keypoints(layer, rows, torch.zeros(rows.shape[0], dtype=torch.long))
    assert x_s.shape == x_d.shape == (rows.shape[0], 21, 3)
    assert torch.equal(x_s, x_s[:1].expand_as(x_s))  # photo: one source
    assert (x_d - x_s).abs().amax() > 1e-4  # the driving keypoints move


def test_driver_is_chunk_invariant(engine, packet, video_engine, video_packet):
    """Any split of the conditioning gives the same driving rows (online = offline)."""
    feats = torch.randn(100, 1024, generator=torch.Generator().manual_seed(3))
    for eng, p in ((engine, packet), (video_engine, video_packet)):
        layer = eng.load_avatar(p)
        outs = []
        for sizes in ([100], [7, 30, 1, 31, 31]):
            drv = eng.driver(layer)
            got = []
            s = 0
            for k in sizes:
                drv.push(feats[s : s + k])
                s += k
                got.append(drv.take(drv.ready))
            drv.close()
            got.append(drv.take(drv.ready))
            outs.append(torch.cat(got))
        assert outs[0].shape == (100, DRIVING_DIM)
        assert torch.allclose(outs[1], outs[0], atol=1e-5)


def test_stitching_uses_the_frame_shown(video_engine, video_packet):
    """Keypoints depend on the source frame a driving row is shown on, not on when the row was
    made: a live session may show an utterance's frame j on any loop frame."""
    from newsstudio.engines.ditto.motion_stitch import transform_info

    layer = video_engine.load_avatar(video_packet)
    drv = video_engine.driver(layer)
    drv.push(torch.randn(12, 1024, generator=torch.Generator().manual_seed(4)))
    drv.close()
    rows = drv.take(drv.ready)
    info = layer.data["x_s_info"]
    for frames in ([0, 1, 2, 2, 1, 0], [2, 2, 1, 0, 0, 1]):
        idx = torch.tensor(frames)
        x_s, x_d = video_engine.keypoints(layer, rows[:6], idx)
        assert torch.allclose(x_s, transform_info({k: v[idx] for k, v in info.items()}), atol=1e-6)
        # video: only the expression is driven (relative to d0); pose, t, scale are the frame's own
        assert torch.isfinite(x_d).all()
    a = video_engine.keypoints(layer, rows[:1], torch.tensor([0]))[1]
    b = video_engine.keypoints(layer, rows[:1], torch.tensor([2]))[1]
    assert not torch.allclose(a, b)
    idle_s, idle_d = video_engine.keypoints(layer, video_engine.idle_driving(3), torch.tensor([0, 1, 2]))
    assert torch.equal(idle_s, idle_d) and torch.equal(idle_s, layer.data["x_s"])


def test_stateless_stitch_equals_the_reference_stitcher(packet):
    """Render-side stitching (per-row d0 and blink index) == the reference's stateful MotionStitch
    called frame by frame, blinks included."""
    from newsstudio.engines.ditto.motion_stitch import MotionStitchConfig, MotionStitcher, blink_schedule, motion_rows_to_info

    eye = torch.randn(15, 63, generator=torch.Generator().manual_seed(5)).numpy() * 0.01
    eng = DittoEngine("cpu", weights="random", delta_eye_arr=eye, delta_eye_open_n=4, **OPTS)
    layer = eng.load_avatar(packet)
    drv = eng.driver(layer)
    drv.push(torch.randn(40, 1024, generator=torch.Generator().manual_seed(6)))
    drv.close()
    rows = drv.take(drv.ready)
    assert rows[:, 530].max() > 0  # blinks scheduled
    x_s, x_d = eng.keypoints(layer, rows, torch.zeros(40, dtype=torch.long))
    ref = MotionStitcher(eng.models.stitch)
    info = layer.data["x_s_info"]
    ref.setup(MotionStitchConfig(delta_eye_arr=torch.from_numpy(eye), delta_eye_open_n=4, is_image_flag=True),
              x_s_info=info, d0=motion_rows_to_info(rows[:1, 265:530]))
    assert ref.blink_idx[:40] == blink_schedule(3000, 15, 4)[:40] == [int(v) for v in rows[:, 530]]
    for i in range(40):
        r = ref(info, motion_rows_to_info(rows[i : i + 1, :265]))
        assert torch.allclose(r.x_d[0], x_d[i], atol=1e-5) and torch.allclose(r.x_s[0], x_s[i])


def test_file_block_is_the_first_window_and_changes_no_motion(engine, packet):
    """Finite inputs are pushed in blocks of the first LMDM window's audio (one HuBERT push before
    the first motion instead of six: lower time to first frame); the motion equals 0.5 s blocks'."""
    cfg = engine.config
    assert engine.file_block_s == pytest.approx((cfg.seq_frames - cfg.overlap_v2 + 10) / 25)
    assert engine.file_block_s == pytest.approx(3.2) or cfg.overlap_v2 != 10
    pcm = _speechlike(engine.file_block_s + 0.7, 16000)[0]
    layer = engine.load_avatar(packet)

    def motion(block: int) -> torch.Tensor:
        cond, drv = engine.conditioner(25), engine.driver(layer)
        for s in range(0, pcm.shape[0], block):
            cond.push(pcm[s : s + block])
            drv.push(cond.take(cond.ready))
        cond.close()
        drv.push(cond.take(cond.ready))
        drv.close()
        return drv.take(drv.ready)

    file_rows, small_rows = motion(int(engine.file_block_s * 16000)), motion(8000)
    assert file_rows.shape[0] == math.ceil(pcm.shape[0] / 640)
    torch.testing.assert_close(file_rows, small_rows, rtol=1e-4, atol=1e-4)


def test_ditto_stream_contract(engine, packet):
    sr = 22050
    pcm = _speechlike(0.2, sr, channels=2)
    chunks = list(stream_generator(engine, packet, (pcm, sr), fps=25, chunk_frames=3))
    w, h = packet.size
    assert sum(c["num_frames"] for c in chunks) == math.ceil(pcm.shape[1] * 25 / sr) == 5
    start = 0
    for i, c in enumerate(chunks):
        assert c["chunk_idx"] == i and c["frame_start"] == start
        start += c["num_frames"]
        assert c["frames"].dtype == torch.uint8 and tuple(c["frames"].shape) == (c["num_frames"], h * 3 // 2, w)
    assert chunks[-1]["is_last"] and [c["is_last"] for c in chunks].count(True) == 1
    assert np.array_equal(np.concatenate([c["audio"] for c in chunks], axis=1), pcm)
    # the face ROI was rendered (random weights: the pixels change there)
    frames = torch.cat([c["frames"] for c in chunks])
    meta = packet.engine_meta("ditto")
    rw, rh = meta["roi"]
    x0, y0 = packet.array("ditto/origins")[0]
    bg = packet.tensor("frames_nv12")[0]
    roi = (frames[:, y0 : y0 + rh, x0 : x0 + rw].int() - bg[y0 : y0 + rh, x0 : x0 + rw].int()).abs()
    assert roi.float().mean() > 1.0
    for bad in (0, 500, float("nan")):
        with pytest.raises(ValueError, match="fps"):
            engine.conditioner(bad)


def test_ditto_front_end_run_ahead_renders_the_same_frames(engine, packet):
    """HuBERT and the LMDM on the feed's own thread (the CUDA default) drive the same frames as on
    the runner's thread, live audio arriving in 20 ms pieces."""
    sr = 16000
    pcm = _speechlike(1.0, sr)[0]

    def run(ahead: bool) -> torch.Tensor:
        pieces = iter(pcm[i:i + 320] for i in range(0, pcm.size, 320))
        return torch.cat([c["frames"] for c in stream_generator(engine, packet, pieces, fps=25, chunk_frames=8, sample_rate=sr,
                                                                 front_end_ahead=ahead)])

    inline, ahead = run(False), run(True)
    assert inline.shape[0] == 25
    assert torch.equal(inline, ahead)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_ditto_front_end_run_ahead_on_its_own_cuda_stream_renders_the_same_frames(packet):
    """The CUDA default: HuBERT and the LMDM on the feed's thread and stream, rows handed over with
    events. The frames must equal those of the inline front end (same graphs, same seeds)."""
    eng = DittoEngine("cuda", weights="random", **OPTS)
    sr = 16000
    pcm = _speechlike(4.0, sr)  # two of the engine's 3.2 s audio blocks: a window made while chunks render

    def run(ahead: bool) -> torch.Tensor:
        return torch.cat([c["frames"] for c in stream_generator(eng, packet, (pcm, sr), fps=25, chunk_frames=8,
                                                                 front_end_ahead=ahead)])

    inline = run(False)
    assert inline.shape[0] == 100
    for _ in range(3):
        assert torch.equal(run(True), inline)


def test_ditto_streams_at_30_fps_with_its_25_fps_motion_resampled(engine, packet):
    """Another output rate: every frame of the audio's span at that rate, the audio cut on its
    frames, and the motion the 25 fps stream's, resampled (resample.py)."""
    sr = 16000
    pcm = _speechlike(0.6, sr)
    chunks = list(stream_generator(engine, packet, (pcm, sr), fps=30, chunk_frames=4, output="rgb"))
    assert sum(c["num_frames"] for c in chunks) == math.ceil(pcm.shape[1] * 30 / sr) == 18
    assert np.array_equal(np.concatenate([c["audio"] for c in chunks], axis=1), pcm)
    assert np.allclose(np.concatenate([c["pts"] for c in chunks]), np.arange(18) / 30)
    layer = engine.load_avatar(packet)

    def rows(fps: float | None) -> torch.Tensor:
        cond, drv = engine.conditioner(fps or 25), engine.driver(layer, fps)
        cond.push(pcm[0])
        cond.close()
        drv.push(cond.take(cond.ready))
        drv.close()
        return drv.take(drv.ready)

    native, at30 = rows(None), rows(30)
    assert native.shape[0] == 15 and at30.shape[0] == 18
    # output frames 0, 6, 12 fall on 25 fps rows 0, 5, 10 (same seeded noise per stream): the same rows
    torch.testing.assert_close(at30[::6], native[::5][:3])


def test_idle_driving_is_the_source_at_rest(engine, packet):
    layer = engine.load_avatar(packet)
    idx = torch.zeros(1, dtype=torch.long)
    idle = engine.render(layer, engine.idle_driving(1), idx)
    x_s = layer.data["x_s"][:1]
    with torch.inference_mode():
        # the engine's (regrouped) networks: equal to the plain ones up to rounding (test_ditto_regrouped.py),
        # which the seeded decoder's huge logits amplify to ~1 level on a few pixels
        feat = engine._warp(layer.data["f_s"][:1].float(), x_s, x_s)
        crop = engine._decoder(feat).clamp(0, 1) * 255
    from newsstudio.compose.splice import sample_crops_to_roi as s2r

    explicit = s2r(crop, layer.data["grid"][:1])
    assert idle.shape == (1, *layer.roi_hw, 3) and torch.allclose(idle, explicit, atol=1e-3)
    rest = engine.idle_driving(3)
    assert bool(torch.all(rest == rest[:1]))  # constant: live sessions cache idle frames by loop index
    assert 0 <= float(idle.min()) and float(idle.max()) <= 255


def test_half_precision_render_path(packet):
    """Half-precision networks under autocast (bfloat16 on the CPU stands in for CUDA's float16)."""
    e16 = DittoEngine("cpu", dtype=torch.bfloat16, weights="random", **OPTS)
    assert next(e16.models.decoder.parameters()).dtype == torch.bfloat16 and e16.models.lmdm.model.final_layer.weight.dtype == torch.float32
    layer = e16.load_avatar(packet)
    assert e16.channels_last  # half precision on the CPU runs NHWC: NCHW bfloat16 convs took 571 s for this test on AVX2
    drv = e16.idle_driving(1)
    out = e16.render(layer, drv, torch.zeros(1, dtype=torch.long))
    assert out.dtype == torch.float32 and out.shape == (1, *layer.roi_hw, 3) and torch.isfinite(out).all()


@pytest.mark.parametrize("stride", [[], ["--stride", "3", "--stride-mode", "blend"]], ids=["dense", "stride3"])
def test_cli_render_ditto_random(packet, tmp_path, monkeypatch, stride):
    from newsstudio.cli import app
    from newsstudio.media.video import probe_video

    monkeypatch.setenv(OPTIONS_ENV, json.dumps(OPTS))
    wav = tmp_path / "speech.wav"
    write_wav(wav, Audio(_speechlike(0.15, 16000), 16000))
    out = tmp_path / "ditto.mp4"
    r = CliRunner().invoke(app, ["render", "--avatar", str(packet.path), "--audio", str(wav), "-o", str(out),
                                 "--engine", "ditto", "--weights", "random", "--device", "cpu", "--chunk", "4", *stride])
    assert r.exit_code == 0, r.output
    assert ("engine ditto (stride 3, blend) on cpu" in r.output) == bool(stride), r.output
    info = probe_video(out)
    assert info.frame_count == math.ceil(0.15 * 25) and (info.width, info.height) == packet.size and info.has_audio


@pytest.mark.parametrize("args, message", [
    (["--engine", "musetalk", "--stride", "2"], "--stride is Ditto's stride mode; the musetalk engine renders every frame"),
    (["--engine", "ditto", "--stride", "0"], "stride must be an integer >= 1"),
    (["--engine", "ditto", "--stride", "2", "--stride-mode", "lerp"], "stride-mode must be one of mask, heatmap, blend, nearest"),
])
def test_cli_refuses_a_stride_the_engine_cannot_use_before_any_work(packet, tmp_path, args, message):
    from conftest import assert_user_error
    from newsstudio.cli import app

    out = tmp_path / "x.mp4"
    r = CliRunner().invoke(app, ["render", "--avatar", str(tmp_path / "not-there.mp4"), "--audio", "builtin:hello",
                                 "-o", str(out), "--weights", "random", "--device", "cpu", *args])
    assert_user_error(r, message)  # before the (missing) avatar is even looked at
    assert not out.exists()


def test_a_server_runs_ditto_in_the_stride_mode_it_was_started_with(monkeypatch):
    from newsstudio.cli import app
    from newsstudio.server.engines import EnginePool

    monkeypatch.setenv(OPTIONS_ENV, json.dumps(OPTS))
    pool = EnginePool("ditto", torch.device("cpu"), "random", None, ditto_stride=3, ditto_stride_mode="heatmap")
    _, eng = pool.get("ditto")
    assert (eng.stride, eng.stride_mode, eng.render_buckets()) == (3, "heatmap", None)
    _, dense = EnginePool("ditto", torch.device("cpu"), "random", None).get("ditto")
    assert dense.stride == 1
    for flags, message in ((["--ditto-stride", "1.5"], "--ditto-stride"),
                           (["--ditto-stride-mode", "lerp"], "--ditto-stride-mode must be one of mask, heatmap, blend, nearest")):
        r = CliRunner().invoke(app, ["serve", "--port", "1", *flags])  # (port 1: it must not get that far)
        assert r.exit_code == 2 and message in r.output, r.output


# ---------------------------------------------------------------------------------- config / weights


class _ReleaseClass:  # stands for a class of the release that we must not import
    def __init__(self):
        self.model_path = "ditto_pytorch/models/decoder.pth"
        self.device = "cuda"


class _Evil:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_cfg_pickle_is_read_safely(tmp_path):
    eye = np.arange(15 * 63, dtype=np.float32).reshape(15, 63) / 1000
    evil_file = tmp_path / "pwned"
    cfg = {
        "base_cfg": {"decoder_cfg": _ReleaseClass(), "hubert_cfg": {"model_path": "aux_models/hubert.onnx"}},
        "audio2motion_cfg": {"motion_feat_dim": 265, "audio_feat_dim": 1103, "seq_frames": 80, "use_emo": True,
                             "use_sc": True, "use_eye_open": True, "use_eye_ball": True, "w2f_type": "hubert",
                             "device": "cuda"},
        "default_kwargs": {"sampling_timesteps": 10, "overlap_v2": 70, "fix_kp_cond": 1, "delta_eye_arr": eye,
                           "delta_eye_open_n": 0, "fade_type": "d0", "overall_ctrl_info": {"delta_pitch": 2},
                           "emo": 4, "smo_k_d": 1, "crop_scale": 2.2, "hook": _Evil(evil_file)},
    }
    path = tmp_path / dcfg.CFG_FILE
    path.parent.mkdir(parents=True)
    path.write_bytes(pickle.dumps(cfg))
    got = dcfg.read_cfg_pickle(path, warn=False)
    assert not evil_file.exists(), "unpickling ran code"
    assert any(n.endswith("system") for n in got.unknown_classes)
    assert any(n.endswith("_ReleaseClass") for n in got.unknown_classes)
    dec = got.base_cfg["decoder_cfg"]
    assert isinstance(dec, dcfg.UnknownObject) and dec["model_path"] == "ditto_pytorch/models/decoder.pth"
    c = dcfg.load_config(tmp_path, steps=3)
    assert c.overlap_v2 == 70 and c.fix_kp_cond == 1 and c.cfg_sampling_timesteps == 10 and c.steps == 3
    assert c.fade_type == "d0" and dict(c.overall_ctrl_info) == {"delta_pitch": 2} and c.smo_k_d == 1
    assert c.crop_scale == 2.2 and np.array_equal(c.delta_eye_arr, eye) and c.source == str(path)
    assert dcfg.load_config(tmp_path, steps="cfg").steps == 10
    # defaults without a pickle, and clear errors
    d = dcfg.load_config(tmp_path / "none")
    assert (d.overlap_v2, d.steps, d.crop_scale, d.crop_vy_ratio, d.emo, d.source) == (10, 4, 2.3, -0.125, 4, "defaults")
    assert d.emotion_rows().shape == (1, 8) and d.emotion_rows()[0].argmax() == 4
    bad = tmp_path / "bad.pkl"
    bad.write_bytes(pickle.dumps([1, 2]))
    with pytest.raises(dcfg.DittoConfigError, match="dict"):
        dcfg.read_cfg_pickle(bad)
    bad.write_bytes(b"not a pickle")
    with pytest.raises(dcfg.DittoConfigError):
        dcfg.read_cfg_pickle(bad)
    with pytest.raises(TypeError, match="unknown Ditto option"):
        d.with_overrides(stepz=3)
    with pytest.raises(ValueError, match="multiple of 128"):
        d.with_overrides(input_size=100)


def test_weights_layout_and_errors(tmp_path, monkeypatch):
    from newsstudio.engines.musetalk.weights import ModelFile

    files = dweights.MODEL_FILES
    assert all(isinstance(f, ModelFile) and f.repo_id == "digital-avatar/ditto-talkinghead" for f in files)
    locals_ = {f.local for f in files}
    for name in ("appearance_extractor", "motion_extractor", "warp_network", "decoder", "stitch_network", "lmdm_v0.4_hubert"):
        assert f"ditto_pytorch/models/{name}.pth" in locals_
    assert "ditto_pytorch/aux_models/hubert_streaming_fix_kv.onnx" in locals_ and dcfg.CFG_FILE in locals_
    assert all(not f.local.startswith("ditto_trt") and not f.local.startswith("ditto_onnx") for f in files)
    assert len(dweights.missing_files(tmp_path)) == len(files)

    import huggingface_hub

    def offline(*a, **k):
        raise OSError("network is unreachable")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    with pytest.raises(dweights.DittoWeightsError, match="could not download .*network"):
        dweights.fetch(tmp_path)
    with pytest.raises(dweights.DittoWeightsMissing, match="weights fetch ditto"):
        dweights.load_official(tmp_path)
    # the stitching checkpoint: DDP keys under 'retarget_shoulder', loaded strictly
    from newsstudio.engines.ditto.checkpoints import DittoCheckpointError, load_ditto_module
    from newsstudio.engines.ditto.models.stitching_network import StitchingNetwork
    from newsstudio.weights.seeded import fill_seeded_

    net = fill_seeded_(StitchingNetwork(), 5)
    ck = tmp_path / "stitch_network.pth"
    torch.save({"retarget_shoulder": {"module." + k: v for k, v in net.state_dict().items()}}, ck)
    got = load_ditto_module("StitchingNetwork", ck)
    assert all(torch.equal(a, b) for a, b in zip(got.state_dict().values(), net.state_dict().values()))
    lm = tmp_path / "lmdm.pth"
    torch.save({"model_state_dict": {"final_layer.weight": torch.zeros(265, 512)}}, lm)
    with pytest.raises(DittoCheckpointError, match="lmdm.pth.*missing keys"):
        dweights.load_lmdm(lm, dcfg.DittoConfig())


def test_the_developer_architecture_is_kept_apart(packet, tmp_path):
    """Quarter-width arrays are never taken for full-width ones: the weights id differs (so a
    full-width engine prebakes again), and an f_s of another width is a clear PacketError at load,
    not a convolution error mid-render. The option is refused with real weights."""
    from newsstudio.avatar.packet import PacketError
    from newsstudio.engines.ditto.registration import expected_meta, prebake_mismatch

    full = expected_meta(dcfg.DittoConfig(input_size=128), "random:0")
    assert "weights" in prebake_mismatch(packet, full)
    with pytest.raises(ValueError, match="width_divisor .*weights='random'"):
        DittoEngine("cpu", weights="official", width_divisor=4)
    with pytest.raises(ValueError, match="hubert_layers .*weights='random'"):
        DittoEngine("cpu", weights="official", hubert_layers=1)
    with pytest.raises(ValueError, match="width_divisor must divide 32"):
        DittoEngine("cpu", weights="random", **{**OPTS, "width_divisor": 3})
    dest = tmp_path / "tampered"
    shutil.copytree(packet.path, dest)
    n = packet.n_frames
    wide = open_packet(dest).add_arrays({"ditto/f_s": np.zeros((n, 32, 16, 32, 32), np.float16)})
    eng = DittoEngine("cpu", weights="random", reprebake=False, **OPTS)
    with pytest.raises(PacketError, match="inconsistent shapes"):
        eng.load_avatar(wide)


def test_random_models_and_real_hubert_config():
    """The seeded HuBERT-large (the real configuration) runs one window -> 20 rows of 1024."""
    from newsstudio.engines.ditto.wav2feat import select_frames, split_len

    enc = dweights.random_hubert(0, "cpu")
    c = enc.model.config
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.intermediate_size) == (1024, 24, 16, 4096)
    assert c.feat_extract_norm == "layer" and c.conv_bias and c.do_stable_layer_norm
    assert sum(p.numel() for p in enc.parameters()) > 3.1e8
    win = torch.from_numpy(_speechlike(split_len() / 16000, 16000))[:, : split_len()]
    out = enc(win)
    assert out.shape == (1, 20, 1024) and torch.isfinite(out).all()
    assert select_frames(out).shape == (1, 5, 1024)
    # seeded: same salt -> same weights
    k = "encoder.layers.23.feed_forward.output_dense.weight"
    from newsstudio.weights.seeded import seeded_tensor

    assert torch.equal(enc.model.state_dict()[k], seeded_tensor(k, (1024, 4096), 0))


def test_hubert_weight_norm_folded_once_same_features():
    """The encoder holds the weight its weight-norm parametrization computes (not recomputed per
    call); features are identical to the parametrized model's."""
    from torch.nn.utils import parametrize

    from newsstudio.engines.ditto.wav2feat import fold_weight_norm_

    enc = dweights.random_hubert(0, "cpu", num_layers=2)
    assert not any(parametrize.is_parametrized(m) for m in enc.modules())
    plain = dweights.random_hubert(0, "cpu", num_layers=2).model
    conv = plain.encoder.pos_conv_embed.conv  # a parametrized copy, as transformers builds it
    torch.nn.utils.parametrizations.weight_norm(conv, name="weight", dim=2)
    with torch.no_grad():
        conv.parametrizations.weight.original0.copy_(torch.linalg.vector_norm(enc.model.encoder.pos_conv_embed.conv.weight, dim=(0, 1), keepdim=True))
        conv.parametrizations.weight.original1.copy_(enc.model.encoder.pos_conv_embed.conv.weight)
    win = torch.from_numpy(_speechlike(0.405, 16000))[:, :6480]
    with torch.no_grad():
        ref = plain(win).last_hidden_state
    torch.testing.assert_close(enc(win), ref, rtol=1e-5, atol=1e-5)
    fold_weight_norm_(plain)
    assert not parametrize.is_parametrized(conv)
    with torch.no_grad():
        torch.testing.assert_close(plain(win).last_hidden_state, ref, rtol=0, atol=0)


# ---------------------------------------------------------------------------------- benchmark reference


def test_benchmark_section_runs_on_cpu(packet, tmp_path, capsys):
    """benchmarks/ditto_bench.py end to end on the developer architecture: two configurations in one
    process as on the GPU (the first one's graphs dropped before the second's), neither fell back."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks.ditto_bench import print_table, run_section

    dest = tmp_path / "avatar"
    shutil.copytree(packet.path, dest)
    sec = run_section(open_packet(dest), "cpu", 0.2, 4, 1, tmp_path / "work", quick=True, skip_reference=True,
                      variants=["eager", "eager:nofold"])
    assert list(sec["variants"]) == ["eager", "eager:nofold"] and sec["ours"] is sec["variants"]["eager"]
    for fig in sec["variants"].values():
        assert fig["dense_fps"] > 0 and fig["ttff_ms"] > 0 and fig["runner_fallbacks"] == []
    fl = sec["flops_per_frame"]  # quarter width: ~32 GFLOP a frame at 128 inputs (full width ~300)
    assert 10 < fl["total_gflop"] < 100 and fl["executed_gflop"] > 0
    print_table(sec)
    assert "dense fps" in capsys.readouterr().out


def test_reference_style_pipeline(engine, packet):
    """benchmarks/ditto_reference.py: two-pass CFG == our batched CFG (same noise), and the
    threaded per-frame pipeline produces every frame, pasted back on the CPU."""
    from benchmarks.ditto_reference import TwoPassCFG, build_source, reference_image_nets, run_reference
    from newsstudio.engines.ditto.ddim import DDIMSampler

    lm = engine.models.lmdm
    g = torch.Generator().manual_seed(7)
    cond, kp, x_t = torch.randn(1, 80, 1103, generator=g), torch.randn(1, 265, generator=g), torch.randn(1, 80, 265, generator=g)
    ours = DDIMSampler(lm, steps=3, generator=torch.Generator().manual_seed(0))
    two = DDIMSampler(TwoPassCFG(lm), steps=3, generator=torch.Generator().manual_seed(0))
    assert all(torch.equal(a, b) for a, b in zip(ours.step_noise, two.step_noise))
    with torch.no_grad():
        assert torch.allclose(ours.sample(kp, cond, x_T=x_t), two.sample(kp, cond, x_T=x_t), atol=1e-4)

    source = build_source(packet)
    warp, dec = reference_image_nets(0, torch.device("cpu"), engine.config.width_divisor)
    audio = _speechlike(0.1, 16000)[0]
    run = run_reference(engine.models, engine.config, source, audio, warp=warp, decoder=dec, steps=2, keep_frames=True)
    w, h = packet.size
    assert run.frames == 3 and len(run.kept) == 3 and run.first_frame_s <= run.seconds
    assert all(f.shape == (h, w, 3) and f.dtype == np.uint8 for f in run.kept)
    rw, rh = packet.engine_meta("ditto")["roi"]
    x0, y0 = packet.array("ditto/origins")[0]
    outside = np.ones((h, w), bool)
    outside[y0 : y0 + rh, x0 : x0 + rw] = False
    assert np.array_equal(run.kept[0][outside], source["img_rgb_lst"][0][outside])
    assert np.abs(run.kept[0][~outside].astype(int) - source["img_rgb_lst"][0][~outside]).mean() > 1
