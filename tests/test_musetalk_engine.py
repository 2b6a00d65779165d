"""MuseTalk engine integration on CPU with seeded random weights.

The real architecture (850M-parameter UNet, full VAE) is built once for this module and runs in
the CLI render and in one direct render check; the stream/geometry/re-prebake tests use a tiny
test-only architecture (`TINY_*_CONFIG`) so they take seconds, not minutes, on 2 cores.
"""
from __future__ import annotations

import math
import shutil
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from newsstudio.avatar.packet import PacketError, open_packet
from newsstudio.avatar.prebake import prebake
from newsstudio.compose.banner import random_weights_banner
from newsstudio.compose.colour import nv12_to_rgb
from newsstudio.engines.base import pingpong_index
from newsstudio.engines.musetalk import prebake as mp
from newsstudio.engines.musetalk.audio_features import FrameWindowing, audio_prompts, gather_windows, row_count, whisper_hidden_states
from newsstudio.engines.musetalk.crop import crop_boxes, crop_face
from newsstudio.engines.musetalk.engine import TINY_UNET_CONFIG, TINY_VAE_CONFIG, MuseTalkConditioner, MuseTalkEngine
from newsstudio.engines.musetalk.landmark_mask import landmark_prepare_mask
from newsstudio.engines.musetalk.unet import unet_step
from newsstudio.engines.musetalk.vae import decode_to_uint8, latents_for_unet
from newsstudio.engines.registry import create_engine
from newsstudio.media.audio import Audio, write_wav
from newsstudio.media.mp4_writer import Mp4Writer
from newsstudio.media.video import iter_video_frames, probe_video
from newsstudio.stream import stream_generator

TINY = {"unet_config": TINY_UNET_CONFIG, "vae_config": TINY_VAE_CONFIG}
ROOT = Path(__file__).resolve().parents[1]


def _speechlike(seconds: float, sr: int, channels: int = 1) -> np.ndarray:
    t = np.arange(int(round(seconds * sr))) / sr
    env = (np.sin(2 * np.pi * 3.0 * t) > 0).astype(np.float32)
    x = 0.3 * env * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 900 * t))
    return np.stack([x * (1 - 0.1 * c) for c in range(channels)]).astype(np.float32)


def _copy_packet(packet, dest: Path):
    shutil.copytree(packet.path, dest)
    return open_packet(dest)


@pytest.fixture(scope="module")
def tiny():
    return MuseTalkEngine("cpu", weights="random", **TINY)


@pytest.fixture(scope="module")
def full():
    """The real architecture, built once (the CLI's engine reuses the same networks)."""
    return MuseTalkEngine("cpu", weights="random")


@pytest.fixture(scope="module")
def full_packet(astronaut_packet, tmp_path_factory, full):
    p = _copy_packet(astronaut_packet, tmp_path_factory.mktemp("mt_full") / "astronaut")
    return full.load_avatar(p).packet


@pytest.fixture(scope="module")
def video_packet(tmp_path_factory):
    """A 4-frame 320x256 'video' of the astronaut moving and growing (per-frame boxes differ)."""
    from skimage import data

    root = tmp_path_factory.mktemp("mt_video")
    face = data.astronaut()
    w, h = 320, 256
    src = root / "moving.mp4"
    with Mp4Writer(src, w, h, 25, pixel_input="rgb", crf=10) as wr:
        for k in range(4):
            s = 250 + 12 * k
            img = cv2.resize(face, (s, s), interpolation=cv2.INTER_AREA)
            canvas = np.full((h, w, 3), 40, np.uint8)
            x0, y0 = 10 + 13 * k, 3 * k - 4
            ys, xs = max(0, y0), max(0, x0)
            canvas[ys : min(h, y0 + s), xs : min(w, x0 + s)] = img[ys - y0 : min(h, y0 + s) - y0, xs - x0 : min(w, x0 + s) - x0]
            wr.write(canvas[None])
    return prebake(src, "moving", root=root, progress=False)


# ------------------------------------------------------------------------------ end to end

@pytest.mark.slow
def test_cli_render_random_weights(full, full_packet, tmp_path):
    """`newsstudio render --engine musetalk --weights random`: right frame count, banner, the face
    box changes and the rest of the frame is the avatar."""
    from newsstudio.cli import app

    wav = tmp_path / "speech.wav"
    write_wav(wav, Audio(_speechlike(0.5, 16000), 16000))
    out = tmp_path / "out.mp4"
    fps = 10
    r = CliRunner().invoke(app, ["render", "--avatar", str(full_packet.path), "--audio", str(wav), "-o", str(out),
                                 "--engine", "musetalk", "--weights", "random", "--device", "cpu", "--fps", str(fps),
                                 "--chunk", "3"])
    assert r.exit_code == 0, r.output
    assert "RANDOM WEIGHTS" in r.output
    info = probe_video(out)
    frames = list(iter_video_frames(out))
    assert len(frames) == math.ceil(0.5 * fps) == (info.frame_count or len(frames))
    w, h = full_packet.size
    bg_nv12 = full_packet.tensor("frames_nv12")[0].clone()
    bg = nv12_to_rgb(bg_nv12).numpy().astype(np.int16)
    banner = random_weights_banner((w, h), torch.device("cpu"))
    band = banner.alpha.shape[0]
    expected_band = nv12_to_rgb(banner.apply_(bg_nv12[None].clone())[0]).numpy().astype(np.int16)[:band]
    got = frames[0].astype(np.int16)
    assert np.abs(got[:band] - expected_band).mean() < 6, "banner missing"
    assert np.abs(bg[:band] - expected_band).mean() > 20
    x1, y1, x2, y2 = full_packet.array("musetalk/crop_boxes")[0]
    mask = full_packet.array("musetalk/mask")[0]
    ox, oy = full_packet.array("musetalk/origins")[0]
    inner = np.zeros((h, w), bool)
    inner[oy : oy + mask.shape[0], ox : ox + mask.shape[1]] = mask > 200
    assert inner.sum() > 50
    assert np.abs(got[inner] - bg[inner]).mean() > 8, "the rendered face is not in the frame"
    outside = np.ones((h, w), bool)
    outside[:band] = False
    outside[y1 - 4 : y2 + 4, x1 - 4 : x2 + 4] = False
    assert np.abs(got[outside] - bg[outside]).mean() < 3


@pytest.mark.slow
def test_real_architecture_render_matches_official_composition(full, full_packet):
    """One frame through the real UNet + VAE: render == unet_step -> decode_latents -> cv2 resize
    into the box (within 1 level)."""
    layer = full.load_avatar(full_packet)
    g = torch.Generator().manual_seed(3)
    prompts = torch.randn(1, 50, 384, generator=g)
    roi = full.render(layer, prompts, torch.zeros(1, dtype=torch.long))
    hr, wr = layer.roi_hw
    assert roi.shape == (1, hr, wr, 3) and roi.dtype == torch.float32
    m = full.models
    lat = layer.data["latents"][:1]
    pred = unet_step(m.unet, lat, m.pe(prompts))
    face = decode_to_uint8(m.vae, pred, channel_order="rgb")[0].numpy()
    x1, y1, x2, y2 = (int(v) for v in full_packet.array("musetalk/boxes")[0])
    ref = cv2.resize(face, (x2 - x1, y2 - y1), interpolation=cv2.INTER_LINEAR).astype(np.int16)
    got = roi[0, y1:y2, x1:x2].round().to(torch.int16).numpy()
    assert np.abs(got - ref).max() <= 1
    assert face.std() > 5, "degenerate decode"


# ------------------------------------------------------------------------------ prebake

def test_prebake_arrays_shapes_and_geometry(tiny, video_packet, tmp_path):
    packet = tiny.prebake(_copy_packet(video_packet, tmp_path / "v"), progress=False)
    n = packet.n_frames
    w, h = packet.size
    meta = packet.engine_meta("musetalk")
    wr, hr = meta["roi"]
    assert n == 4 and hr % 2 == 0 and wr % 2 == 0
    lat, org, msk, box, absb = (packet.array(a) for a in mp.ARRAYS)
    assert lat.shape == (n, 8, 32, 32) and lat.dtype == np.float16
    assert org.shape == (n, 2) and org.dtype == np.int32 and (org % 2 == 0).all()
    assert msk.shape == (n, hr, wr) and msk.dtype == np.uint8
    assert box.shape == (n, 4) and box.dtype == np.int32 and absb.shape == (n, 4)
    assert (org >= 0).all() and (org[:, 0] + wr <= w).all() and (org[:, 1] + hr <= h).all()
    assert (box[:, :2] >= 0).all() and (box[:, 2] <= wr).all() and (box[:, 3] <= hr).all()
    assert np.array_equal(absb, box + np.concatenate([org, org], axis=1))
    assert len({tuple(b) for b in absb}) == n, "the moving face must give per-frame boxes"
    # boxes: the official v1.5 rule on our output-frame landmarks
    lm = packet.array("landmarks68")
    ref, _ = crop_boxes(lm, packet.array("face_boxes"), np.ones(n, bool), h, version="v15")
    assert np.array_equal(absb, mp.clip_boxes(ref, (w, h)))
    for k in ("version", "weights", "salt", "vae_id", "mask", "latent", "latents_fp16_relerr"):
        assert k in meta
    assert meta["weights"] == "random" and meta["salt"] == 0 and meta["mask"] == "landmark" and meta["version"] == "v15"
    # alpha: zero outside the face box, the landmark jaw mask (realtime feathering) inside
    frames = nv12_to_rgb(packet.tensor("frames_nv12")).numpy()
    for i in range(n):
        x1, y1, x2, y2 = box[i]
        outside = msk[i].copy()
        outside[y1:y2, x1:x2] = 0
        assert outside.max() == 0
        prepared, cbox = landmark_prepare_mask(lm[i], absb[i])
        assert np.array_equal(msk[i, y1:y2, x1:x2], mp.alpha_in_box(prepared, absb[i], cbox))
        assert msk[i].max() == 255
    # latents: the VAE on the LANCZOS crops, masked first; fp16 storage within the measured bound
    crops = np.stack([crop_face(frames[i], absb[i]) for i in range(n)])
    ref_lat = latents_for_unet(tiny.models.vae, crops, channel_order="rgb").numpy()
    rel = np.linalg.norm(lat.astype(np.float64) - ref_lat) / np.linalg.norm(ref_lat)
    assert rel <= mp.FP16_MAX_RELERR
    assert meta["latents_fp16_relerr"] <= mp.FP16_MAX_RELERR
    assert math.isclose(meta["latents_fp16_relerr"], mp.fp16_error(ref_lat)[0], rel_tol=1e-3)
    assert not np.allclose(ref_lat[:, :4], ref_lat[:, 4:], atol=1e-2), "masked and reference latents must differ"


def test_fp16_error_measure():
    x = np.random.default_rng(0).standard_normal((3, 8, 32, 32)).astype(np.float32) * 3
    rel, mx, finite = mp.fp16_error(x)
    assert finite and 1e-5 < rel < 3e-4 and mx <= 2 ** -11 * 16
    assert not mp.fp16_error(np.array([1e6], np.float32))[2]


@pytest.mark.parametrize("box", [(3, 5, 303, 345), (10, 7, 110, 127), (0, 0, 128, 128), (1, 2, 257, 99), (5, 4, 37, 300)])
def test_grid_resize_matches_cv2_inter_linear(box):
    rng = np.random.default_rng(1)
    img = cv2.GaussianBlur(rng.integers(0, 256, (256, 256, 3), dtype=np.uint8), (5, 5), 0)
    img[::37] = 255  # sharp lines: interpolation errors would show
    x1, y1, x2, y2 = box
    hr, wr = y2 + 3 + (y2 + 3) % 2, x2 + 1 + (x2 + 1) % 2
    t = torch.from_numpy(img).permute(2, 0, 1)[None].float()
    roi = mp.resize_into_boxes(t, torch.tensor([box]), (hr, wr))[0]
    got = roi[y1:y2, x1:x2].round().to(torch.int16).numpy()
    ref = cv2.resize(img, (x2 - x1, y2 - y1), interpolation=cv2.INTER_LINEAR).astype(np.int16)
    d = np.abs(got - ref)
    assert d.max() <= 1, d.max()
    assert (d > 0).mean() < 0.2


def test_grid_gathered_from_an_avatars_axes_equals_the_batchs_own_grid():
    """A render batch gathers its frames' rows of the grid axes the avatar computed once at load:
    the grid (and so the resized faces) must be the one `box_grid` makes for the batch's boxes."""
    g = torch.Generator().manual_seed(4)
    lo = torch.rand(40, 2, generator=g) * 100
    boxes = torch.cat([lo, lo + 60 + torch.rand(40, 2, generator=g) * 150], dim=1)
    gx, gy = mp.box_grid_axes(boxes, (260, 300))
    idx = torch.tensor([7, 3, 3, 39, 0, 12])
    gathered = mp.grid_from_axes(gx.index_select(0, idx), gy.index_select(0, idx))
    assert torch.equal(gathered, mp.box_grid(boxes.index_select(0, idx), (260, 300)))
    crops = torch.rand(6, 3, 64, 64, generator=g)
    assert torch.equal(mp.resize_with_grid(crops, gathered), mp.resize_into_boxes(crops, boxes.index_select(0, idx), (260, 300)))


def test_roi_geometry_edges():
    boxes = np.array([[0, 0, 31, 41], [289, 215, 320, 256], [101, 33, 131, 73]])
    (hr, wr), org, rel = mp.roi_geometry(boxes, (320, 256))
    assert hr % 2 == 0 and wr % 2 == 0 and (org % 2 == 0).all()
    assert (org[:, 0] + wr <= 320).all() and (org[:, 1] + hr <= 256).all()
    assert (rel[:, :2] >= 0).all() and (rel[:, 2] <= wr).all() and (rel[:, 3] <= hr).all()
    with pytest.raises(ValueError, match=r"frame\(s\) \[1\]"):
        mp.clip_boxes(np.array([[10, 10, 50, 60], [330, 10, 400, 60]]), (320, 256))


# ------------------------------------------------------------------------------ stream

@pytest.mark.parametrize("fps,sr,seconds,chunk", [(25, 16000, 0.62, 4), (29.97, 48000, 0.45, 5)])
def test_stream_contract(tiny, video_packet, tmp_path, fps, sr, seconds, chunk):
    packet = _copy_packet(video_packet, tmp_path / "v")
    pcm = _speechlike(seconds, sr, channels=2)
    chunks = list(stream_generator(tiny, packet, (pcm, sr), fps=fps, chunk_frames=chunk))
    packet = open_packet(packet.path)
    w, h = packet.size
    total = math.ceil(pcm.shape[1] * fps / sr - 1e-9)
    assert sum(c["num_frames"] for c in chunks) == total
    assert [c["is_last"] for c in chunks].count(True) == 1 and chunks[-1]["is_last"]
    assert np.array_equal(np.concatenate([c["audio"] for c in chunks], axis=1), pcm)
    frames = torch.cat([c["frames"] for c in chunks])
    assert frames.shape == (total, h * 3 // 2, w) and frames.dtype == torch.uint8
    start = 0
    for c in chunks:
        assert c["frame_start"] == start and np.allclose(c["pts"], np.arange(start, start + c["num_frames"]) / fps)
        start += c["num_frames"]
    # outside the face boxes (and the banner band) every output frame is its avatar frame, exactly
    idx = pingpong_index(torch.arange(total), packet.n_frames)
    bg = packet.tensor("frames_nv12").index_select(0, idx)
    band = random_weights_banner((w, h), torch.device("cpu")).alpha.shape[0]
    changed = torch.zeros(total, dtype=torch.bool)
    for k in range(total):
        x1, y1, x2, y2 = packet.array("musetalk/crop_boxes")[int(idx[k])]
        keep = torch.ones(h, w, dtype=torch.bool)
        keep[:band] = False
        keep[y1:y2, x1:x2] = False
        assert torch.equal(frames[k, :h][keep], bg[k, :h][keep])
        changed[k] = (frames[k, y1:y2, x1:x2].int() - bg[k, y1:y2, x1:x2].int()).abs().float().mean() > 1
    assert changed.all(), "every frame is rendered (none dropped, the last included)"


def test_conditioner_matches_whole_file(tiny):
    enc = tiny.models.whisper_encoder
    wave = _speechlike(0.73, 16000)[0]
    ref = audio_prompts(enc, torch.from_numpy(wave), 25)  # the reference's floor(L/sr*fps) frames
    c = MuseTalkConditioner(enc, 25)
    for i in range(0, wave.size, 1600):
        c.push(wave[i : i + 1600])
    assert 0 < c.ready < ref.shape[0], "frames come out before the end (2-frame look-ahead)"
    early = c.take(c.ready)
    c.close()
    got = torch.cat([early, c.take(c.ready)])
    assert got.shape[0] == math.ceil(wave.size * 25 / 16000) == ref.shape[0] + 1
    # streamed frames before the piece is complete are approximations; all-at-once is exact
    c2 = MuseTalkConditioner(enc, 25)
    c2.push(wave)
    c2.close()
    allin = c2.take(c2.ready)
    assert torch.equal(allin[: ref.shape[0]], ref)
    # the extra frame continues the reference's own zero padding
    rows = whisper_hidden_states(enc, torch.from_numpy(wave))[0]
    win = FrameWindowing(25)
    extra = gather_windows(rows, 0, row_count(wave.size), torch.tensor([ref.shape[0]]), win)
    assert torch.equal(allin[ref.shape[0]:], extra)
    rel = (got[: ref.shape[0]] - ref).norm() / ref.norm()
    assert rel < 0.5  # streamed approximation (audio_features documents the bound)


def test_live_feature_step_sets_how_often_frames_come(tiny):
    """`serve --musetalk-feature-step-ms 200`: a live stream's features come in 200 ms steps (half the
    Whisper runs of the default 100 ms), and the step must sit on the 20 ms row grid."""
    wave = _speechlike(1.2, 16000)[0]

    def updates(conditioner) -> int:
        steps, ready = 0, 0
        for i in range(0, wave.size, 320):  # 20 ms chunks, as a microphone sends them
            conditioner.push(wave[i : i + 320])
            steps += conditioner.ready > ready
            ready = conditioner.ready
        return steps

    slow = MuseTalkEngine("cpu", weights="random", feature_step_ms=200, **TINY)
    assert slow.conditioner(25).update_rows == 10 and tiny.conditioner(25).update_rows == 5
    default, every_200 = updates(tiny.conditioner(25)), updates(slow.conditioner(25))
    assert every_200 < default and abs(every_200 * 2 - default) <= 2, (every_200, default)
    with pytest.raises(ValueError, match="multiple of 20"):
        MuseTalkEngine("cpu", weights="random", feature_step_ms=50, **TINY)


def test_conditioner_exact_frame_times_at_2997(tiny):
    enc = tiny.models.whisper_encoder
    wave = _speechlike(0.5, 16000)[0]
    c = MuseTalkConditioner(enc, 29.97)
    c.push(wave)
    c.close()
    got = c.take(c.ready)
    n = math.ceil(wave.size * 30000 / 1001 / 16000)
    assert got.shape == (n, 50, 384)
    rows = whisper_hidden_states(enc, torch.from_numpy(wave))[0]
    valid = row_count(wave.size)
    for i in range(n):
        start = (i * 50 * 1001) // 30000 - 4  # floor(i * 50 / fps) - 2 * ceil(50 / fps)
        expect = torch.zeros(10, 5, 384)
        for t in range(10):
            r = start + t
            if 0 <= r < valid:
                expect[t] = rows[r]
        assert torch.equal(got[i], expect.reshape(50, 384)), i


def test_idle_driving_is_silence_and_consistent(tiny, video_packet, tmp_path):
    layer = tiny.load_avatar(_copy_packet(video_packet, tmp_path / "v"))
    idle = tiny.idle_driving(3)
    assert idle.shape == (3, 50, 384) and torch.equal(idle[0], idle[2])
    assert idle.abs().sum() > 0, "silence through Whisper is not all zeros"
    a = tiny.render(layer, idle[:2], torch.tensor([1, 1]))
    b = tiny.render(layer, tiny.idle_driving(2), torch.tensor([1, 1]))
    assert torch.equal(a, b) and torch.equal(a[0], a[1])


# ------------------------------------------------------------------------------ weights / re-prebake

def test_other_weights_trigger_reprebake_or_error(tiny, astronaut_packet, tmp_path, capsys):
    p0 = tiny.load_avatar(_copy_packet(astronaut_packet, tmp_path / "a")).packet
    lat0 = np.array(p0.array("musetalk/latents"))
    other = MuseTalkEngine("cpu", weights="random", salt=1, **TINY)
    assert other.vae_id != tiny.vae_id
    strict = MuseTalkEngine("cpu", weights="random", salt=1, reprebake=False, **TINY)
    with pytest.raises(PacketError, match="salt"):
        strict.load_avatar(p0)
    capsys.readouterr()
    layer = other.load_avatar(p0)  # p0 is the stale view: salt 0 arrays
    assert "re-prebaking" in capsys.readouterr().err
    meta = layer.packet.engine_meta("musetalk")
    assert meta["salt"] == 1 and meta["vae_id"] == other.vae_id
    assert not np.array_equal(np.array(layer.packet.array("musetalk/latents")), lat0)
    assert open_packet(p0.path).engine_meta("musetalk")["salt"] == 1, "written to the packet"
    assert other.load_avatar(p0) is layer, "a stale packet view must not prebake again"
    # the packet has salt 1 now: the first engine re-prebakes in turn
    assert tiny.load_avatar(p0).packet.engine_meta("musetalk")["salt"] == 0


def test_bisenet_mask_option(tiny, astronaut_packet, tmp_path):
    eng = MuseTalkEngine("cpu", weights="random", mask="bisenet", **TINY)
    p = eng.load_avatar(_copy_packet(astronaut_packet, tmp_path / "a")).packet
    meta = p.engine_meta("musetalk")
    assert meta["mask"] == "bisenet" and meta["parsing_mode"] == "jaw"
    msk = p.array("musetalk/mask")[0]
    x1, y1, x2, y2 = p.array("musetalk/boxes")[0]
    outside = msk.copy()
    outside[y1:y2, x1:x2] = 0
    assert outside.max() == 0
    # the landmark-mask engine sees a different option and re-prebakes
    assert tiny.load_avatar(p).packet.engine_meta("musetalk")["mask"] == "landmark"


def test_half_precision_engine_prebakes_in_fp32_and_renders(tiny, astronaut_packet, tmp_path):
    """The CUDA configuration (render in half precision, prebake in float32), here with bfloat16 on CPU."""
    eng = MuseTalkEngine("cpu", dtype=torch.bfloat16, weights="random", **TINY)
    layer = eng.load_avatar(_copy_packet(astronaut_packet, tmp_path / "a"))
    assert layer.data["latents"].dtype == torch.bfloat16
    p = layer.packet
    assert p.engine_meta("musetalk")["latents_dtype"] == "float16"
    ref = tiny.load_avatar(_copy_packet(astronaut_packet, tmp_path / "b")).packet
    a, b = (np.array(q.array("musetalk/latents"), np.float64) for q in (p, ref))
    assert np.linalg.norm(a - b) / np.linalg.norm(b) < 0.05, "fp32 encode with bf16-rounded weights"
    roi = eng.render(layer, eng.idle_driving(2), torch.zeros(2, dtype=torch.long))
    assert roi.dtype == torch.float32 and roi.shape == (2, *layer.roi_hw, 3) and torch.isfinite(roi).all()
    assert 0 <= float(roi.min()) and float(roi.max()) <= 255 + 1e-3


def test_registry_and_bad_options(tmp_path):
    with pytest.raises(ValueError, match="weights"):
        MuseTalkEngine("cpu", weights="nope")
    with pytest.raises(FileNotFoundError, match="random"):
        create_engine("musetalk", device="cpu", weights="official", models=tmp_path)
    eng = create_engine("musetalk", device="cpu", weights="random", **TINY)
    assert eng.name == "musetalk" and eng.random_weights and eng.sample_rate == 16000 and eng.dtype == torch.float32


# ------------------------------------------------------------------------------ reference pipeline

def test_reference_pipeline_equals_ours(tiny, video_packet, tmp_path):
    """benchmarks/musetalk_reference.py (official layout, PIL blending on the CPU) and our pipeline
    (grid resize + NV12 splice on the device) give the same frames, ping-pong cycle included."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks.musetalk_reference import build_reference_avatar, run_reference
    from newsstudio.compose.colour import rgb_to_nv12

    packet = tiny.prebake(_copy_packet(video_packet, tmp_path / "v"), progress=False)
    wav = tmp_path / "a.wav"
    write_wav(wav, Audio(_speechlike(0.45, 16000), 16000))  # one 0.5 s block: streamed prompts are exact
    folder = build_reference_avatar(packet, tmp_path / "official" / "moving")
    ref = run_reference(tiny.models, folder, wav, 25, batch_size=5, keep_frames=True)
    assert ref.frames == len(ref.kept) == 11 and ref.first_frame_s <= ref.total_s
    ours = torch.cat([c["frames"] for c in stream_generator(tiny, packet, wav, fps=25, chunk_frames=4)])
    assert ours.shape[0] == math.ceil(0.45 * 25) == ref.frames + 1  # the reference floors the frame count
    w, h = packet.size
    band = random_weights_banner((w, h), torch.device("cpu")).alpha.shape[0]
    theirs = rgb_to_nv12(torch.from_numpy(np.stack(ref.kept)[..., ::-1].copy()))
    d = (ours[: ref.frames].int() - theirs.int()).abs()
    d[:, :band] = 0  # our random-weights banner
    d[:, h : h + band // 2] = 0
    bg = packet.tensor("frames_nv12").index_select(0, pingpong_index(torch.arange(ref.frames), packet.n_frames))
    moved = (theirs.int() - bg.int()).abs()
    moved[:, :band] = 0
    for k in range(ref.frames):
        x1, y1, x2, y2 = packet.array("musetalk/crop_boxes")[int(pingpong_index(k, packet.n_frames))]
        assert moved[k, y1:y2, x1:x2].float().mean() > 5, "the reference changed nothing"
    assert d.max() <= 3, d.max()
    assert (d > 1).float().mean() < 1e-3


@pytest.mark.slow
def test_benchmark_section_runs_on_cpu(video_packet, tmp_path, capsys):
    """benchmarks/musetalk_bench.py end to end on tiny inputs (the GPU run uses the same code)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks.musetalk_bench import print_table, run_section

    wav = tmp_path / "a.wav"
    write_wav(wav, Audio(_speechlike(1.2, 22050, channels=2), 22050))
    packet = _copy_packet(video_packet, tmp_path / "v")
    sec = run_section(packet, "cpu", 0.25, 4, 1, tmp_path / "work", quick=True, audio=wav, official_repeat=1)
    assert sec["ours"]["frames"] == math.ceil(0.25 * 25) and sec["reference"]["frames"] == 6
    for k in ("dense_fps", "dense_fps_on_device", "ttff_ms", "segment_mp4_s"):
        assert sec["ours"][k] > 0
    assert sec["reference"]["dense_fps"] > 0 and sec["cold_start"]["ratio"] > 0
    assert sec["flops_per_frame"]["total_gflop"] > 0 and sec["tiny_test_networks"]
    print_table(sec)
    assert "dense fps" in capsys.readouterr().out


def test_channels_last_engine_gets_its_own_weights_and_the_same_faces():
    """A CUDA graph reads weights at fixed addresses: an engine asking for NHWC weights must get
    its own copy, never convert the networks another engine already runs."""
    plain = MuseTalkEngine("cpu", weights="random", channels_last=False, **TINY)
    before = [p.data_ptr() for p in plain.models.unet.parameters()]
    nhwc = MuseTalkEngine("cpu", weights="random", channels_last=True, **TINY)
    assert nhwc.models is not plain.models
    assert [p.data_ptr() for p in plain.models.unet.parameters()] == before
    conv = [p for p in plain.models.vae.parameters() if p.dim() == 4 and p.shape[2] > 1][0]
    conv_cl = [p for p in nhwc.models.vae.parameters() if p.dim() == 4 and p.shape[2] > 1][0]
    assert conv.is_contiguous() and not conv_cl.is_contiguous()
    assert conv_cl.is_contiguous(memory_format=torch.channels_last)
    g = torch.Generator().manual_seed(3)
    latents, prompts = torch.randn(2, 8, 32, 32, generator=g), torch.randn(2, 50, 384, generator=g)
    with torch.inference_mode():
        torch.testing.assert_close(nhwc._faces(latents, prompts), plain._faces(latents, prompts), atol=1.0, rtol=0)


# ------------------------------------------------------------------------------ lower-face decoding

def test_lower_face_decoding_changes_no_blended_pixel_of_silence_and_refuses_avatars_it_cannot_cover(tiny, video_packet, tmp_path):
    """``first_face_row``: the rows the blend shows come from the lower decoder. With the silence
    prompt its skipped-row statistics are the frame's own, so every pixel with alpha equals the
    whole decode's (rounding aside); speech is an approximation; a row above the blend's first is refused."""
    from newsstudio.engines.musetalk.prebake import first_blended_face_rows

    layer = tiny.load_avatar(_copy_packet(video_packet, tmp_path / "v"))
    boxes = layer.packet.tensor("musetalk/boxes").float()
    first = int(first_blended_face_rows(layer.masks, boxes).min())
    assert 80 < first < 140  # the blend shows the lower face only (upper half cut, feathered ~20 rows up)
    lower = MuseTalkEngine("cpu", weights="random", first_face_row=first, **TINY)
    lower_layer = lower.load_avatar(layer.packet)
    assert lower_layer.data["upper_stats"].shape[:2] == (layer.n_frames, len(lower._lower_decoder.plan.norm_starts))
    shown = layer.masks > 0
    idx = torch.arange(layer.n_frames)
    silence = tiny.idle_driving(layer.n_frames)
    a, b = tiny.render(layer, silence, idx), lower.render(lower_layer, silence, idx)
    assert (a - b).abs()[shown].max() <= 1.0
    speech = torch.randn(layer.n_frames, 50, 384, generator=torch.Generator().manual_seed(0))
    a, b = tiny.render(layer, speech, idx), lower.render(lower_layer, speech, idx)
    mse = float(((a - b)[shown] ** 2).mean())
    assert 0 < mse < 255.0 ** 2 / 10 ** 2.0  # approximate (> 20 dB), not exact
    too_low = MuseTalkEngine("cpu", weights="random", first_face_row=first + 8, **TINY)
    with pytest.raises(PacketError, match=f"uses face rows from {first}"):
        too_low.load_avatar(layer.packet)


def test_face_rows_default_to_the_lower_decoder_only_where_it_was_measured_to_pay():
    """``first_face_row``: the lower-face decoder by default on CUDA with a compile mode (dense +25 %
    on an H100), the whole face elsewhere; ``"auto"`` never refuses an avatar, a row number does."""
    from newsstudio.engines.musetalk.face_rows import AUTO_FIRST_FACE_ROW, FaceRows, parse_first_face_row, resolve_face_rows

    assert resolve_face_rows(None, "cpu", "eager") == FaceRows(0, strict=True)
    assert resolve_face_rows("default", "cuda", "cudagraph") == FaceRows(0, strict=True)
    assert resolve_face_rows(None, "cuda", "compile+cudagraph") == FaceRows(AUTO_FIRST_FACE_ROW, strict=False)
    assert resolve_face_rows("auto", "cpu", "eager") == FaceRows(AUTO_FIRST_FACE_ROW, strict=False)
    assert resolve_face_rows("112", "cuda", "compile") == FaceRows(112, strict=True)
    assert resolve_face_rows(0, "cuda", "compile") == FaceRows(0, strict=True)
    for bad in ("256", "-1", "top", 1.5):
        with pytest.raises(ValueError, match="first_face_row"):
            parse_first_face_row(bad)


def test_auto_face_rows_render_an_avatar_whose_blend_reaches_higher_with_the_whole_face(tiny, video_packet, tmp_path, monkeypatch, capsys):
    """Under ``"auto"`` an avatar whose blend shows rows above the cut is not refused: its frames come
    from the whole-face decoder, exactly the whole-face engine's."""
    from newsstudio.engines.musetalk import face_rows
    from newsstudio.engines.musetalk.prebake import first_blended_face_rows

    layer = tiny.load_avatar(_copy_packet(video_packet, tmp_path / "v"))
    first = int(first_blended_face_rows(layer.masks, layer.packet.tensor("musetalk/boxes").float()).min())
    monkeypatch.setattr(face_rows, "AUTO_FIRST_FACE_ROW", first + 8)
    auto = MuseTalkEngine("cpu", weights="random", first_face_row="auto", **TINY)
    assert auto.first_face_row == first + 8 and not auto.face_rows.strict
    auto_layer = auto.load_avatar(layer.packet)
    assert "upper_stats" not in auto_layer.data
    assert "renders with the whole-face decoder" in capsys.readouterr().err
    idx = torch.arange(layer.n_frames)
    speech = torch.randn(layer.n_frames, 50, 384, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(auto.render(auto_layer, speech, idx), tiny.render(layer, speech, idx), atol=1.0, rtol=0)


def test_prebake_stores_the_upper_row_statistics_and_loading_uses_them(tiny, video_packet, tmp_path, monkeypatch):
    """With a lower-face decoder the skipped rows' statistics are made once, at prebake (or at the
    first load of a packet baked without them, then kept in it) and read at later loads (no decode
    then); stats made for another row, or tampered to NaN, are recomputed."""
    from newsstudio.engines.musetalk.face_rows import UPPER_STATS_ARRAY, UPPER_STATS_META, store_upper_stats
    from newsstudio.engines.musetalk.prebake import first_blended_face_rows

    baked = tiny.prebake(video_packet)
    packet = _copy_packet(baked, tmp_path / "v")
    masks, boxes = packet.tensor("musetalk/mask").float(), packet.tensor("musetalk/boxes").float()
    first = int(first_blended_face_rows(masks, boxes).min())
    lower = MuseTalkEngine("cpu", weights="random", first_face_row=first, **TINY)
    assert UPPER_STATS_ARRAY not in packet
    computed = lower.load_avatar(packet).data["upper_stats"]  # none stored: computed at load, and kept
    assert open_packet(packet.path).engine_meta("musetalk")[UPPER_STATS_META]["first_face_row"] == first
    packet = lower.prebake(_copy_packet(baked, tmp_path / "p"), progress=False)  # or made at prebake
    assert packet.engine_meta("musetalk")[UPPER_STATS_META]["first_face_row"] == first
    torch.testing.assert_close(packet.tensor(UPPER_STATS_ARRAY), computed, atol=1e-5, rtol=1e-4)

    calls: list[int] = []
    real = lower._upper_stats
    monkeypatch.setattr(lower, "_upper_stats", lambda latents, progress=True: calls.append(1) or real(latents, progress))
    lower._layers.clear()
    torch.testing.assert_close(lower.load_avatar(packet).data["upper_stats"], computed, atol=1e-5, rtol=1e-4)
    assert calls == []  # read from the packet
    assert lower.prebake(packet) is packet and calls == []  # nothing to add

    key = dict(packet.engine_meta("musetalk")[UPPER_STATS_META])
    nan = np.full(packet.specs[UPPER_STATS_ARRAY].shape, np.nan, dtype=np.float32)
    for stats, k in ((nan, key), (np.asarray(packet.array(UPPER_STATS_ARRAY)).copy(), {**key, "first_face_row": first - 8})):
        bad = store_upper_stats(packet, stats, k)
        lower._layers.clear()
        calls.clear()
        torch.testing.assert_close(lower.load_avatar(bad).data["upper_stats"], computed, atol=1e-5, rtol=1e-4)
        assert calls == [1]


# ------------------------------------------------------------------------------ one-avatar batches

@pytest.mark.parametrize("lower", [False, True])
def test_one_avatar_batches_through_the_batch_graph_path_equal_the_general_path(video_packet, tmp_path, lower):
    """``batch_graphs``: a batch of one avatar is gathered into the face runner's bucket buffers and
    resized from them (batch_graphs.py; CUDA graphs on a GPU, the same functions eagerly here). Each
    request gets the faces the general path renders for it, whatever an earlier batch left in the
    bucket's rows past this one's, and batches it does not cover fall back to the general path."""
    from newsstudio.engines.musetalk.prebake import first_blended_face_rows

    packet = _copy_packet(video_packet, tmp_path / "v")
    kw = dict(TINY)
    if lower:
        probe = MuseTalkEngine("cpu", weights="random", **TINY).load_avatar(packet)
        kw["first_face_row"] = int(first_blended_face_rows(probe.masks, probe.packet.tensor("musetalk/boxes").float()).min())
    eng = MuseTalkEngine("cpu", weights="random", batch_graphs=True, **kw)
    assert MuseTalkEngine("cpu", weights="random", **TINY).batch_graphs is None  # not built without CUDA graphs
    assert eng.batch_graphs.enabled
    layer = eng.load_avatar(packet)
    assert ("upper_stats" in layer.data) == lower
    g = torch.Generator().manual_seed(7)
    n = layer.n_frames

    def request(frames: int) -> tuple:
        return layer, torch.randn(frames, 50, 384, generator=g), torch.randint(0, n, (frames,), generator=g)

    for sizes in ([3, 2], [1], [4, 3, 1], [2]):  # buckets 8, 4, 8 (rows left by a larger batch), 4
        items = [request(k) for k in sizes]
        before = eng.batch_graphs.batches
        fast = eng.render_many(items)
        assert eng.batch_graphs.batches == before + 1
        eng.batch_graphs.enabled = False
        general = eng.render_many(items)
        eng.batch_graphs.enabled = True
        assert [f.shape for f in fast] == [t.shape for t in general] == [(k, *layer.roi_hw, 3) for k in sizes]
        for f, t in zip(fast, general):  # the same networks on other batch sizes: CPU rounding, one 8-bit face level
            diff = (f - t).abs()
            assert float(diff.max()) <= 1.0 + 1e-3 and float(diff.mean()) < 0.01
    big = [request(20), request(20)]  # past the largest bucket: the general path
    before = eng.batch_graphs.batches
    assert [f.shape[0] for f in eng.render_many(big)] == [20, 20] and eng.batch_graphs.batches == before
