"""Live sessions with the neural engines (tiny seeded-random MuseTalk and Ditto on CPU): the
same session code idles, speaks streamed speech, keeps audio and video on one timeline, is
cut by barge-in and frees what it holds — whatever the engine's look-ahead (Ditto waits for
LMDM windows; that wait is the engine's latency, never filled with made-up silence)."""
from __future__ import annotations

import gc
import shutil
import weakref
from fractions import Fraction

import numpy as np
import pytest
import torch

from newsstudio.audio.source import frame_sample
from newsstudio.avatar.packet import open_packet
from newsstudio.live import LiveSession, ScaledTime, drive_simulated

FPS = 25
SR = 48000

pytestmark = pytest.mark.slow


def _speechlike(seconds: float, sr: int) -> np.ndarray:
    t = np.arange(int(round(seconds * sr))) / sr
    env = (np.sin(2 * np.pi * 3.0 * t) > 0).astype(np.float32)
    return (0.3 * env * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 900 * t))).astype(np.float32)


@pytest.fixture(scope="module", autouse=True)
def _threads():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _musetalk():
    from newsstudio.engines.musetalk.engine import TINY_UNET_CONFIG, TINY_VAE_CONFIG, MuseTalkEngine

    return MuseTalkEngine("cpu", weights="random", unet_config=TINY_UNET_CONFIG, vae_config=TINY_VAE_CONFIG)


def _ditto(**kw):
    from newsstudio.engines.ditto.config import TINY_OPTIONS
    from newsstudio.engines.ditto.engine import DittoEngine

    # overlap_v2=60: the first LMDM window needs 20 frames (0.8 s) of audio instead of 70 (2.8 s)
    return DittoEngine("cpu", weights="random", steps=2, overlap_v2=60, **TINY_OPTIONS, **kw)


def _prebaked(eng, astronaut_packet, dest):
    """A copy of the astronaut packet at ``dest`` with ``eng``'s arrays added."""
    shutil.copytree(astronaut_packet.path, dest)
    return eng.prebake(open_packet(dest), progress=False)


@pytest.fixture(scope="module", params=["musetalk", "ditto"])
def setup(request, astronaut_packet, tmp_path_factory):
    try:
        eng = _musetalk() if request.param == "musetalk" else _ditto()
    except Exception as e:  # noqa: BLE001 - an engine that cannot be built here is reported, not failed
        pytest.skip(f"{request.param} engine unavailable: {type(e).__name__}: {e}")
    return request.param, eng, _prebaked(eng, astronaut_packet, tmp_path_factory.mktemp(f"live_{request.param}") / "astronaut")


def _session(eng, packet, **kw):
    ts = ScaledTime()
    ts.set(0.0)
    return LiveSession(eng, packet, fps=FPS, time_source=ts, **kw), ts


def _collect(s, ts, until, **kw):
    video, audio = {}, {}
    drive_simulated(s, ts, until, on_video=lambda k, f: video.__setitem__(k, f.clone()), on_audio=lambda x, a: audio.__setitem__(x, a.copy()), **kw)
    return video, audio


def _speak_after_idle(s, ts, fps: int, t_idle: float, frames_after: int):
    """Play from ``t_idle`` until the session's (already pushed) speech goes on air, then
    ``frames_after`` more frames; asserts the sound starts on the first speech frame of the
    ``fps`` clock. Returns (frames by index, first speech frame)."""
    video, audio = {}, {}
    t = t_idle
    while s._current is None or s._current.start_frame is None:
        assert t < t_idle + 3.0, "the speech never went on air"
        t += 0.1
        v, a = _collect(s, ts, t)
        video.update(v), audio.update(a)
    f0 = s._current.start_frame
    v, a = _collect(s, ts, (f0 + frames_after) / fps + 1e-6)
    video.update(v), audio.update(a)
    keys = sorted(audio)
    out = np.concatenate([audio[k] for k in keys])
    first = keys[0] + int(np.flatnonzero(np.abs(out) > 1e-4)[0])
    assert frame_sample(f0, SR, Fraction(fps)) <= first < frame_sample(f0 + 1, SR, Fraction(fps))
    return video, f0


def test_streamed_speech_interrupt_and_close(setup):
    name, eng, packet = setup
    s, ts = _session(eng, packet, prebuffer_s=0.12, render_ahead=1)
    idle, _ = _collect(s, ts, 0.2)
    ks = sorted(idle)
    assert all(torch.equal(idle[k], idle[ks[0]]) for k in ks), "idle frames of a photo must not change"
    speech = _speechlike(2.4, SR)
    step = SR // 10  # 100 ms messages, arriving in real time
    chunks = [(0.2 + 0.1 * i, speech[i * step : (i + 1) * step]) for i in range(speech.size // step)]

    def feed(t):
        while chunks and chunks[0][0] <= t:
            s.push_speech(chunks.pop(0)[1], SR)

    # play until the speech goes on air, then 3 more frames (a CPU renders Ditto at ~2 s/frame)
    video, audio = {}, {}
    t = 0.2
    while s._current is None or s._current.start_frame is None:
        assert t < 2.4, "the speech never went on air"
        t += 0.1
        v, a = _collect(s, ts, t, before=feed)
        video.update(v), audio.update(a)
    f0 = s._current.start_frame
    v, a = _collect(s, ts, (f0 + 3) / FPS + 1e-6, before=feed)
    video.update(v), audio.update(a)
    info = s.info()
    assert info["utterances"] == 1 and info["speech_frames"] > 0
    u = s._current
    # the engine's look-ahead is waited for at the start, not padded with silence: no gaps
    # while the speaker keeps up in real time
    assert info["underrun_ms"] == 0.0, info
    # sound starts exactly on the first speech frame
    keys = sorted(audio)
    out = np.concatenate([audio[k] for k in keys])
    first = keys[0] + int(np.flatnonzero(np.abs(out) > 1e-4)[0])
    assert frame_sample(f0, SR, Fraction(FPS)) <= first < frame_sample(f0 + 1, SR, Fraction(FPS))
    # the face changes once speech is on air, and only then
    ref = idle[ks[0]]
    before = [k for k in video if k < f0]
    assert all(torch.equal(video[k], ref) for k in before)
    moved = [k for k in video if k >= f0 and not torch.equal(video[k], ref)]
    assert len(moved) >= 3, (f0, moved)
    # barge-in: an interrupt brings back the idle picture at the next frame
    t_cut = ts() - s.clock.origin
    cut = s.interrupt()
    assert cut["interrupted"] and cut["cut_latency_ms"] <= 100
    after, after_audio = _collect(s, ts, t_cut + 0.2)
    assert all(torch.equal(f, ref) for f in after.values())
    assert all(not a.any() for a in after_audio.values())
    # close frees the session's objects
    refs = [weakref.ref(s), weakref.ref(u), weakref.ref(u.conditioner), weakref.ref(u.driver)]
    del u, video, after
    s.close()
    del s
    gc.collect()
    assert all(r() is None for r in refs), f"{name}: session objects survive close()"


def test_speech_input_work_never_holds_up_frames(setup):
    """The engine's work on pushed speech (Whisper / HuBERT + LMDM) runs outside the session
    lock: a frame asked for while a long push is being processed comes at once, not after it."""
    import threading
    import time

    name, eng, packet = setup
    s, ts = _session(eng, packet, prebuffer_s=0.12, render_ahead=1)
    _collect(s, ts, 0.12)  # the idle frame is rendered (and cached) before the push
    timings: dict[str, float] = {}

    def push():
        t0 = time.perf_counter()
        s.push_speech(_speechlike(3.0, SR), SR)  # one long message: features (+ motion) for 3 s
        timings["push"] = time.perf_counter() - t0

    worker = threading.Thread(target=push)
    worker.start()
    deadline = time.monotonic() + 30
    while s._current is None:  # the utterance exists: the push is inside the engine's work now
        assert time.monotonic() < deadline
        time.sleep(0.001)
    t0 = time.perf_counter()
    frame = s.video_frames(s.video_cursor, 1)
    waited = time.perf_counter() - t0
    pushing = worker.is_alive()
    worker.join()
    assert frame.shape[0] == 1
    assert timings["push"] > 0.05, f"{name}: the push was too quick ({timings['push']:.3f} s) to show anything"
    assert pushing and waited < timings["push"] / 2, (name, waited, timings["push"])
    s.close()


@pytest.mark.parametrize("setup", ["ditto"], indirect=True)  # MuseTalk's conditioner works at any rate itself
def test_a_ditto_session_at_30_fps_speaks_on_its_own_frame_clock(setup):
    """Ditto's motion is generated at 25 fps; a 30 fps session gets it resampled: the speech goes
    on air, the face moves, and the sound starts on the first speech frame of the 30 fps clock."""
    _, eng, packet = setup
    fps = 30
    ts = ScaledTime()
    ts.set(0.0)
    s = LiveSession(eng, packet, fps=fps, time_source=ts, prebuffer_s=0.12, render_ahead=1)
    idle, _ = _collect(s, ts, 0.1)
    ref = idle[min(idle)]
    s.push_speech(_speechlike(1.6, SR), SR)
    s.end_speech()  # all of it in: the utterance's driving is complete now
    u = s._current
    assert u.closed and u.total_frames == 48 and u.ready_frames() >= 48  # 1.6 s at 30 fps, each with motion
    video, f0 = _speak_after_idle(s, ts, fps, 0.1, 3)
    assert len([k for k in video if k >= f0 and not torch.equal(video[k], ref)]) >= 3
    s.close()


def test_a_ditto_session_in_stride_mode_speaks_with_half_the_network_frames(astronaut_packet, tmp_path):
    """`serve --ditto-stride 2`: a live session on a stride-mode engine gets every frame of its
    utterance (the driver's held-back in-between rows come out once the speech ends), goes on air
    with its sound on the first speech frame, and its face moves; only keyframes (and the idle
    pose) go through warp + decoder."""
    eng = _ditto(stride=2)
    packet = _prebaked(eng, astronaut_packet, tmp_path / "astronaut")
    s, ts = _session(eng, packet, prebuffer_s=0.12, render_ahead=1)
    idle, _ = _collect(s, ts, 0.1)
    ref = idle[min(idle)]
    s.push_speech(_speechlike(1.2, SR), SR)
    s.end_speech()
    u = s._current
    assert u.closed and u.total_frames == 30 and u.ready_frames() >= 30  # 1.2 s at 25 fps, none held back now
    before = eng._strider.network_frames
    video, f0 = _speak_after_idle(s, ts, FPS, 0.1, 8)
    spoken = [k for k in video if k >= f0]
    assert len([k for k in spoken if not torch.equal(video[k], ref)]) >= 6
    through_networks = eng._strider.network_frames - before
    assert 0 < through_networks <= len(spoken) // 2 + 2, (through_networks, len(spoken))
    s.close()
