"""Live sessions (newsstudio.live) without HTTP: idle loop, speech, barge-in, one media clock,
session cap, memory freed on close. Classic engine on CPU, 256x256 avatars, simulated time."""
from __future__ import annotations

import gc
import math
import tracemalloc
import weakref
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from newsstudio.audio.source import frame_sample
from newsstudio.engines.base import pingpong_index
from newsstudio.live import (
    LiveSession,
    MediaClock,
    ScaledTime,
    SessionLimitError,
    SessionManager,
    drive_simulated,
    has_speech,
)
from newsstudio.media.audio import Audio, load_audio
from newsstudio.stream import StreamSession, background_for, resolve_engine

HELLO = Path(__file__).resolve().parents[1] / "src" / "newsstudio" / "assets" / "hello.flac"
FPS = 25
SR = 48000


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    # Sessions render from several threads; one intra-op thread each avoids OpenMP spinning
    # on a loaded 2-core machine (what the server does on CPU too).
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def avatars(tmp_path_factory):
    """A 256x256 photo avatar and a 6-frame 256x256 video-loop avatar, from skimage's astronaut."""
    from PIL import Image
    from skimage import data

    from newsstudio.avatar.prebake import prebake
    from newsstudio.media.mp4_writer import encode_clip

    d = tmp_path_factory.mktemp("live_avatars")
    img = data.astronaut()
    Image.fromarray(img).save(d / "astronaut.png")
    photo = prebake(d / "astronaut.png", "astro", root=d / "avatars", size=(256, 256), progress=False)
    frames = np.stack([np.ascontiguousarray(img[8 + 2 * i : 456 + 2 * i, 20 + 3 * i : 468 + 3 * i]) for i in range(6)])
    encode_clip(d / "loop.mp4", [frames], fps=25, pixel_input="rgb", crf=10)
    loop = prebake(d / "loop.mp4", "loop", root=d / "avatars", size=(256, 256), progress=False)
    assert loop.n_frames == 6
    return {"photo": photo, "loop": loop}


@pytest.fixture(scope="module")
def engine():
    return resolve_engine("classic", "cpu")


@pytest.fixture(scope="module")
def hello():
    return load_audio(HELLO)


def new_session(engine, packet, **kw):
    ts = ScaledTime()
    ts.set(0.0)
    return LiveSession(engine, packet, fps=FPS, time_source=ts, **kw), ts


def mouth_box(packet, pad=3):
    lm = packet.array("landmarks68")[0][48:68]
    x0, y0 = np.floor(lm.min(0)).astype(int) - pad
    x1, y1 = np.ceil(lm.max(0)).astype(int) + pad
    return x0, y0, x1, y1


def mouth_diff(frame, ref, box):
    x0, y0, x1, y1 = box
    a = frame[y0:y1, x0:x1].float()
    b = ref[y0:y1, x0:x1].float()
    return float((a - b).abs().mean())


def roi_outside_equal(frame, ref, packet, k):
    """Pixels outside the frame's ROI box are untouched (luma and chroma)."""
    ox, oy = (int(v) for v in packet.array("roi/origins")[int(pingpong_index(k, packet.n_frames))])
    rw, rh = packet.meta["roi"]["size"]
    h = packet.size[1]
    mask = torch.ones_like(frame, dtype=torch.bool)
    mask[oy : oy + rh, ox : ox + rw] = False
    mask[h + oy // 2 : h + (oy + rh + 1) // 2, ox : ox + rw] = False
    return bool(torch.equal(frame[mask], ref[mask]))


def idle_frame(engine, packet, k):
    fresh = StreamSession(engine, engine.load_avatar(packet), background_for(engine, packet), Fraction(FPS))
    return fresh.idle_frames(k, 1, "nv12")[0]


def collect(session, ts, until, **kw):
    video: dict[int, torch.Tensor] = {}
    audio: dict[int, np.ndarray] = {}
    drive_simulated(session, ts, until, on_video=lambda k, f: video.__setitem__(k, f.clone()), on_audio=lambda s, a: audio.__setitem__(s, a.copy()), **kw)
    return video, audio


def audio_stream(audio: dict[int, np.ndarray]) -> np.ndarray:
    keys = sorted(audio)
    assert all(b - a == audio[a].size for a, b in zip(keys, keys[1:]))  # contiguous
    return np.concatenate([audio[k] for k in keys])


# ----------------------------------------------------------------------------------- idle


def test_idle_frames_equal_avatar_loop(engine, avatars):
    packet = avatars["loop"]
    s, ts = new_session(engine, packet)
    video, audio = collect(s, ts, 1.0)
    assert sorted(video) == list(range(26))
    fresh = StreamSession(engine, engine.load_avatar(packet), background_for(engine, packet), Fraction(FPS))
    loop = packet.tensor("frames_nv12")
    for k, f in video.items():
        src = int(pingpong_index(k, packet.n_frames))
        # exactly the engine's closed-mouth rendering of loop frame pingpong(k) ...
        assert torch.equal(f, fresh.idle_frames(k, 1, "nv12")[0]), k
        # ... which is the avatar's own frame everywhere outside the mouth ROI
        assert roi_outside_equal(f, loop[src], packet, k), k
        # the loop plays forwards then backwards: frame k equals every frame with the same source
        twin = 2 * packet.n_frames - 1 - src
        if twin in video and twin != k and int(pingpong_index(twin, packet.n_frames)) == src:
            assert torch.equal(f, video[twin])
    assert not torch.equal(video[0], video[3])  # the loop really moves
    assert all(not a.any() for a in audio.values())  # silence while idle
    assert s.state == "idle"
    s.close()


def test_silence_keeps_mouth_closed(engine, avatars):
    """Streamed silence (and room noise far below the gate) moves nothing."""
    packet = avatars["photo"]
    s, ts = new_session(engine, packet)
    idle, _ = collect(s, ts, 0.2)
    rng = np.random.default_rng(0)
    s.push_speech((rng.standard_normal(SR) * 10 ** (-75 / 20)).astype(np.float32), SR)
    s.end_speech()
    video, audio = collect(s, ts, 1.5)
    assert s.stats.speech_frames > 0
    for f in video.values():
        assert torch.equal(f, idle[0])


# ----------------------------------------------------------------------------------- speech


def test_whole_file_speech_moves_mouth_in_sync(engine, avatars, hello):
    packet = avatars["photo"]
    s, ts = new_session(engine, packet)
    idle, _ = collect(s, ts, 0.5)
    ref = idle[0]
    placed = s.speak(HELLO)  # a path: decoded here, any format FFmpeg reads
    f0 = placed["start_frame"]
    assert f0 == s.video_cursor
    assert s.state == "speaking"
    video, audio = collect(s, ts, 0.5 + hello.duration_s + 0.6)
    box = mouth_box(packet)
    n_speech = math.ceil(hello.duration_s * FPS)
    diffs = np.array([mouth_diff(video[k], ref, box) for k in range(f0, f0 + n_speech)])
    assert (diffs > 3.0).mean() > 0.3, f"mouth rarely moves: {np.percentile(diffs, [10, 50, 90])}"
    assert diffs.max() > 8.0
    for k in range(f0, f0 + n_speech):
        assert roi_outside_equal(video[k], ref, packet, k)
    # before and after the utterance: the idle loop
    for k, f in video.items():
        if k < f0 or k >= f0 + n_speech:
            assert torch.equal(f, ref), k
    assert s.state == "idle"
    info = s.info()  # all the speech was there from the start: every render got the frames it asked for
    assert info["speech_renders"] > 0 and info["short_renders"] == 0 and info["driving_ahead_frames_mean"] > 20, info
    # audio: the speech, resampled to 48 kHz, starting exactly at frame f0's first sample
    out = audio_stream(audio)
    base = min(audio)
    expected = hello.mono().resampled(SR).samples[0]
    a0 = frame_sample(f0, SR, Fraction(FPS))
    assert not out[: a0 - base].any()  # silence until the utterance's first frame
    seg = out[a0 - base : a0 - base + expected.size]
    assert np.abs(seg - expected).max() < 2e-3  # starts on frame f0's first sample, same sound
    assert not out[a0 - base + expected.size + 960 :].any()  # silence after
    s.close()


def test_streamed_speech_plays_as_it_arrives_and_underruns_stay_in_sync(engine, avatars, hello):
    packet = avatars["photo"]
    s, ts = new_session(engine, packet, prebuffer_s=0.1)
    speech = hello.mono().resampled(SR).samples[0][: SR * 2]
    # 20 ms chunks arriving in real time from t=0.30 s, with a 1 s network stall at 1.0 s
    stall_after = 35  # chunk 35 arrives at 1.00 s, chunk 36 at 2.02 s
    chunks = [(0.30 + 0.02 * i + (1.0 if i > stall_after else 0.0), speech[i * 960 : (i + 1) * 960]) for i in range(speech.size // 960)]
    pending = list(chunks)

    def feed(now):
        while pending and pending[0][0] <= now:
            s.push_speech(pending.pop(0)[1], SR)
        if not pending and s.state != "idle" and not getattr(feed, "ended", False):
            s.end_speech()
            feed.ended = True

    video, audio = collect(s, ts, 4.0, before=feed)
    info = s.info()
    ref = video[0]
    box = mouth_box(packet)
    # it starts speaking within 200 ms of the first chunk (0.1 s prebuffer + the engine's look-ahead)
    first_moving = next(k for k in sorted(video) if mouth_diff(video[k], ref, box) > 1.0)
    assert 0 <= first_moving / FPS - 0.30 <= 0.200, first_moving
    assert 900 <= info["underrun_ms"] <= 1300  # the 1 s stall became a gap inside the utterance
    # speech arriving just in time: renders get what is ready, short of the 4 frames they ask for
    assert info["short_renders"] > 0 and info["driving_ahead_frames_mean"] < 6, info
    out = audio_stream(audio)
    nz = np.flatnonzero(np.abs(out) > 0)
    a0 = nz[0]
    assert a0 % 1920 == 0 and a0 // 1920 <= first_moving  # sound starts on a frame boundary
    played = out[a0:]
    # the audio that arrived plays bit-exact (48 kHz in, 48 kHz out), split once by a
    # frame-aligned gap of silence at the play position where the speaker fell behind
    n_before = (stall_after + 1) * 960
    x = int(np.flatnonzero(played[: speech.size] != speech[: played[: speech.size].size])[0])
    x -= x % 1920  # the gap starts on a frame boundary
    assert n_before - 4 * 1920 <= x <= n_before
    np.testing.assert_array_equal(played[:x], speech[:x])
    gap_frames = next(g for g in range(1, 60) if np.array_equal(played[x + g * 1920 : x + g * 1920 + SR // 2], speech[x : x + SR // 2]))
    assert not played[x : x + gap_frames * 1920].any()
    rest = speech[x:]
    np.testing.assert_array_equal(played[x + gap_frames * 1920 : x + gap_frames * 1920 + rest.size], rest)
    assert gap_frames * 40 == pytest.approx(info["underrun_ms"], abs=1)
    # video: exactly the same frames are the gap (idle picture, mouth closed), speech around it
    k_gap = (a0 + x) // 1920
    for k in range(k_gap, k_gap + gap_frames):
        assert mouth_diff(video[k], ref, box) == 0.0, k
    assert mouth_diff(video[k_gap - 1], ref, box) > 0 or mouth_diff(video[k_gap - 2], ref, box) > 0
    s.close()


# ----------------------------------------------------------------------------------- barge-in


def _first_idle_after(video, ref, box, k0):
    return next(k for k in sorted(video) if k >= k0 and mouth_diff(video[k], ref, box) == 0.0)


def test_interrupt_cuts_within_100ms_and_drops_queued_frames(engine, avatars, hello):
    packet = avatars["photo"]
    s, ts = new_session(engine, packet, render_ahead=8)
    idle, _ = collect(s, ts, 0.1)
    ref = idle[0]
    s.speak(hello)
    collect(s, ts, 1.23)
    assert s.state == "speaking"
    t_cut = 1.23
    ts.set(t_cut)
    info = s.interrupt()
    assert info["interrupted"] and info["cut_latency_ms"] <= 100
    assert info["dropped_frames"] > 0  # frames rendered ahead were thrown away
    video, audio = collect(s, ts, 2.5)
    box = mouth_box(packet)
    # every frame and every audio block handed out after the cut is idle / silent
    k_first = min(video)
    assert (k_first / FPS) - t_cut <= 0.100
    for f in video.values():
        assert mouth_diff(f, ref, box) == 0.0
    s_first = min(audio)
    assert s_first / SR - t_cut <= 0.100
    assert all(not a.any() for a in audio.values())
    assert s.state == "idle" and s.stats.interrupts == 1
    s.close()


def test_new_speech_barges_in_with_fresh_conditioner(engine, avatars, hello):
    packet = avatars["photo"]
    a = hello
    b = Audio(np.ascontiguousarray(hello.samples[:, hello.sample_rate * 2 :]), hello.sample_rate)
    s, ts = new_session(engine, packet, render_ahead=6)
    s.speak(a)
    collect(s, ts, 1.5)
    t_cut = 1.5
    placed = s.speak(b)
    f0 = placed["start_frame"]
    assert placed["cut"]["cut_latency_ms"] <= 100
    assert (f0 / FPS) - t_cut <= 0.100
    video, audio = collect(s, ts, 3.0)
    # reference: a fresh session that says only b, starting at the same frame
    r, rts = new_session(engine, packet)
    collect(r, rts, (f0 - 1) / FPS)
    assert r.video_cursor == f0
    assert r.speak(b)["start_frame"] == f0
    rv, ra = collect(r, rts, 3.0)
    for k in range(f0, max(video) + 1):
        assert torch.equal(video[k], rv[k]), k  # no state carried over from utterance a
    common = sorted(set(audio) & set(ra))
    assert common and all(np.array_equal(audio[x], ra[x]) for x in common)
    assert s.stats.barge_ins == 1
    s.close()
    r.close()


# ----------------------------------------------------------------------------------- one clock


def test_one_hour_simulated_no_av_drift(engine, avatars, hello):
    """An hour of media in simulated time: idle, whole-file speech, streamed speech, interrupts.
    Audio samples handed out and video frames handed out never differ by more than one frame,
    end exactly together, and an utterance near the end still starts its sound and its mouth
    motion on the same frame."""
    packet = avatars["photo"]
    s, ts = new_session(engine, packet)
    short = Audio(np.ascontiguousarray(hello.samples[:, : hello.sample_rate * 2]), hello.sample_rate)
    rng = np.random.default_rng(1)
    events = {}
    for m in range(1, 60, 7):
        events[m * 60.0] = ("speak", None)
        events[m * 60.0 + 30] = ("stream", None)
    events[22 * 60.0 + 0.7] = ("interrupt", None)
    worst = [0.0]
    frame_s = 1.0 / FPS
    state = {"streaming": None}

    def before(t):
        for et in [e for e in events if e <= t]:
            kind, _ = events.pop(et)
            if kind == "speak":
                s.speak(short)
            elif kind == "stream":
                state["streaming"] = [t, 0]
            else:
                s.interrupt()
        st = state["streaming"]
        if st is not None:
            while st[0] + st[1] * 0.02 <= t and st[1] < 50:
                s.push_speech((rng.standard_normal(960) * 0.1).astype(np.float32), SR)
                st[1] += 1
            if st[1] >= 50:
                s.end_speech()
                state["streaming"] = None
        d = abs(s.audio_cursor / SR - s.video_cursor / FPS)
        worst[0] = max(worst[0], d)

    hour = 3600.0
    drive_simulated(s, ts, hour - 5.0, before=before)
    assert worst[0] <= frame_s + 1e-9, worst[0]
    assert s.stats.utterances >= 16 and s.stats.interrupts == 1
    # a click train near the end: sound onset and mouth onset on the same frame
    click = np.zeros(SR // 2, np.float32)
    click[: SR // 5] = (np.cos(2 * np.pi * 800 * np.arange(SR // 5) / SR) * 0.5).astype(np.float32)
    placed = s.speak(Audio(click[None], SR))
    f0 = placed["start_frame"]
    video, audio = collect(s, ts, hour)
    out_start = min(audio)
    out = audio_stream(audio)
    first_sound = out_start + int(np.argmax(np.abs(out) > 1e-3))
    assert first_sound == frame_sample(f0, SR, Fraction(FPS))
    ref = idle_frame(engine, packet, 0)
    box = mouth_box(packet)
    first_open = next(k for k in sorted(video) if mouth_diff(video[k], ref, box) > 1.0)
    assert first_open == f0
    # the hour ends with exactly 90,000 frames and 172,800,000 samples handed out
    assert s.video_cursor == int(hour * FPS) + 1
    assert s.audio_cursor == int(hour * SR) + 960
    assert abs(s.audio_cursor / SR - s.video_cursor / FPS) <= frame_s
    assert s.stats.skipped_frames == 0
    s.close()


def test_media_clock_is_exact():
    c = MediaClock(Fraction(30000, 1001), time_source=lambda: 0.0)
    k = 30000 * 3600  # ~33 hours of 29.97 fps
    assert c.video_pts(k) == k * 3003
    assert c.frame_sample(k) == k * 1001 * 48000 // 30000
    assert c.frame_of_sample(c.frame_sample(k)) == k
    c25 = MediaClock(Fraction(25), time_source=lambda: 0.0)
    assert c25.next_frame(3600.0) == 90000 and c25.frame_at(3600.0 - 1e-6) == 89999


# ----------------------------------------------------------------------------------- limits


def test_session_cap(engine, avatars):
    mgr = SessionManager(max_sessions=2)

    def make(**kw):
        return LiveSession(engine, avatars["photo"], fps=FPS, **kw)

    a = mgr.open(make)
    b = mgr.open(make)
    with pytest.raises(SessionLimitError, match="limit is 2"):
        mgr.open(make)
    assert mgr.count() == 2
    a.close()
    assert mgr.count() == 1
    c = mgr.open(make)
    assert {s.id for s in mgr.list()} == {b.id, c.id}
    # a failing build releases its reserved slot
    with pytest.raises(RuntimeError):
        mgr.open(lambda **kw: (_ for _ in ()).throw(RuntimeError("boom")))
    mgr.close_all()
    assert mgr.count() == 0 and mgr.closed_total == 3


def test_memory_freed_on_close(engine, avatars, hello):
    packet = avatars["photo"]
    cuda = torch.cuda.is_available()
    dev_engine = resolve_engine("classic", "cuda") if cuda else engine

    def run_once(keep_refs):
        s, ts = new_session(dev_engine, packet, render_ahead=8)
        s.speak(hello)
        collect(s, ts, 1.0)
        s.push_speech(np.random.default_rng(0).standard_normal(SR).astype(np.float32) * 0.1, SR)
        collect(s, ts, 1.5)
        if keep_refs is not None:
            keep_refs += [weakref.ref(s), weakref.ref(s._current), weakref.ref(s.stream)]
            keep_refs += [weakref.ref(f) for f in s._ahead.values()]
            keep_refs += [weakref.ref(t) for t in s._current._driving]
        s.close()
        assert s.state == "closed"
        with pytest.raises(Exception, match="closed"):
            s.video_frame(s.video_cursor)

    run_once(None)  # warm the engine's shared caches (avatar layer, idle loop)
    gc.collect()
    if cuda:
        torch.cuda.synchronize()
        before_gpu = torch.cuda.memory_allocated()
    tracemalloc.start()
    try:
        gc.collect()
        base = tracemalloc.get_traced_memory()[0]
        refs: list = []
        run_once(refs)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(refs) > 5
    alive = [r for r in refs if r() is not None]
    assert not alive, f"{len(alive)} objects survive close()"
    assert after - base < 256 * 1024, f"{(after - base) / 1024:.0f} KiB still held"
    if cuda:
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() == before_gpu


def test_speech_detector():
    sr = 16000
    t = np.arange(sr) / sr
    assert has_speech((0.2 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), sr)
    assert not has_speech(np.zeros(sr, np.float32), sr)
    assert not has_speech(np.full(sr, 0.5, np.float32), sr)  # DC offset is not speech
    assert not has_speech((0.5 * np.sin(2 * np.pi * 40 * t)).astype(np.float32), sr)  # rumble


def test_speech_intake_merges_what_queued_keeps_order_and_bounds_the_backlog(engine, avatars, hello):
    """The server's speech intake (server/speech_intake.py) on a real session: a client sending far
    faster than real time is held at `max_queued_s` of waiting speech, everything sent reaches the
    session in order, in fewer pushes than messages; an interrupt drops the speech still queued."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from newsstudio.server.speech_intake import SpeechIntake

    s, ts = new_session(engine, avatars["photo"])
    speech = hello.mono().resampled(SR).samples[0]
    pool = ThreadPoolExecutor(1)

    async def run() -> tuple[int, int, int, int]:
        intake = SpeechIntake(s, pool, SR, max_queued_s=0.5)
        feeder = asyncio.ensure_future(intake.feed())
        most = 0
        for a in range(0, speech.size, 960):  # 20 ms messages, as fast as they can go
            intake.pcm(speech[a : a + 960])
            most = max(most, intake._queued)
            await intake.room()
        intake.end()
        intake.close()
        await feeder
        return most, intake.messages, intake.pushes, s._current.n_src

    most, messages, pushes, received = asyncio.run(run())
    assert most <= 0.5 * SR + 960  # held back at the bound
    assert received == speech.size  # all of it, in one utterance
    assert pushes < messages

    async def interrupted() -> tuple[dict, int]:
        replies: list[dict] = []

        async def reply(info: dict) -> None:
            replies.append(info)

        intake = SpeechIntake(s, pool, SR, on_interrupted=reply)
        intake.pcm(speech[:9600])
        intake.interrupt()  # before the feeder ran: the queued speech is never pushed
        intake.close()
        await intake.feed()
        return replies[0], intake.pushes

    info, pushes = asyncio.run(interrupted())
    assert pushes == 0 and info["interrupted"]  # the utterance from above is what was cut
    assert s.state == "idle"
    s.close()
    pool.shutdown()


def test_stream_index_slices_follow_the_ping_pong_loop(engine, avatars):
    """`StreamSession._index` serves a request's avatar frames as a slice of a table (no kernels on
    the live path): for every start and request size it must equal `pingpong_index`, including
    requests longer than the table (it grows) and one-frame avatars; its CPU twin (`on_host`) too."""
    for packet in (avatars["loop"], avatars["photo"]):
        s = StreamSession(engine, engine.load_avatar(packet), background_for(engine, packet), Fraction(FPS))
        n_frames = packet.n_frames
        for start in (0, 1, 5, 11, 12, 13, 1000, 123457):
            for n in (1, 4, 8, 2 * n_frames, 2 * n_frames + 3, 100, 7):
                want = pingpong_index(torch.arange(start, start + n), n_frames)
                assert torch.equal(s._index(start, n).cpu(), want), (packet.name if hasattr(packet, "name") else n_frames, start, n)
                host = s._index(start, n, on_host=True)  # the CPU twin the stride renderer plans from
                assert host.device.type == "cpu" and torch.equal(host, want), (n_frames, start, n)


def _render_plans(session) -> list[tuple[int, int]]:
    """(first frame, frames) of every render the session plans from now on."""
    plans, execute = [], session._execute

    def record(plan):
        plans.append((plan[2], plan[3]))
        return execute(plan)

    session._execute = record
    return plans


def test_render_phase_puts_each_full_request_on_the_sessions_phase(engine, avatars):
    """Sessions that start together ask for frames together (one phase); a session given a render
    phase cuts its first request short once, then asks for its full render_ahead frames at that
    phase of the shared clock every period."""
    ahead = 8
    period = ahead / FPS
    starts = {}
    for frac in (None, 0.0, 0.3, 0.75):
        s, ts = new_session(engine, avatars["loop"], render_ahead=ahead)
        plans = _render_plans(s)
        if frac is not None:
            s.render_phase = frac * period
        for k in range(0, 64, 2):  # a consumer pulling 2-frame chunks, as the WebSocket pump does
            ts.set(k / FPS)
            s.video_frames(k, 2)
        s.close()
        assert plans[0][0] == 0 and all(b[0] == a[0] + a[1] for a, b in zip(plans, plans[1:])), plans  # each frame once
        assert all(m == ahead for _, m in plans[1:]), plans
        if frac is None:
            assert plans[0] == (0, ahead)
            starts[frac] = [k for k, _ in plans]
            continue
        for k, _ in plans[1:]:  # on the phase (to the nearest frame): due at phase + a whole number of periods
            off = (s.clock.origin + k / FPS - s.render_phase) % period
            assert min(off, period - off) <= 0.5 / FPS + 1e-9, (frac, plans)
        starts[frac] = [k for k, _ in plans]
    # all started at 0: unphased (and phase 0) they ask at the same frames; other phases elsewhere
    grid = {frac: {k % ahead for k in ks[1:]} for frac, ks in starts.items()}
    assert grid == {None: {0}, 0.0: {0}, 0.3: {2}, 0.75: {6}}, grid


def test_speech_intake_spaces_its_pushes_but_not_its_controls(engine, avatars, hello):
    """``push_interval_s`` (server/speech_intake.py): 20 ms messages arriving in real time reach the
    session in about one push per interval, all of the speech in order; the first push after a
    pause is not held, and an interrupt arriving while speech is gathered is not held either."""
    import asyncio
    import time
    from concurrent.futures import ThreadPoolExecutor

    from newsstudio.server.speech_intake import SpeechIntake

    s, ts = new_session(engine, avatars["photo"])
    speech = hello.mono().resampled(SR).samples[0][: SR * 6 // 10]  # 0.6 s: 30 messages of 20 ms
    pool = ThreadPoolExecutor(1)

    async def run(interval: float) -> tuple[int, int, float]:
        intake = SpeechIntake(s, pool, SR, push_interval_s=interval)
        feeder = asyncio.ensure_future(intake.feed())
        t0 = time.perf_counter()
        for i, a in enumerate(range(0, speech.size, SR // 50)):
            intake.pcm(speech[a : a + SR // 50])
            if i == 0:
                await asyncio.sleep(0.005)
                first = intake.pushes  # pushed at once: nothing was pushed before
            await asyncio.sleep(max(0.0, t0 + (i + 1) * 0.02 - time.perf_counter()))
        intake.end()
        intake.close()
        await feeder
        return first, intake.pushes, s._current.n_src

    first, pushes, received = asyncio.run(run(0.1))
    assert first == 1 and received == speech.size
    assert 5 <= pushes <= 9, pushes  # ~0.6 s / 0.1 s (+ the first and the last)
    _, pushes_at_once, _ = asyncio.run(run(0.0))
    assert pushes_at_once > 2 * pushes

    async def interrupted() -> float:
        replies: list[dict] = []

        async def reply(info: dict) -> None:
            replies.append(info)

        intake = SpeechIntake(s, pool, SR, on_interrupted=reply, push_interval_s=1.0)
        feeder = asyncio.ensure_future(intake.feed())
        intake.pcm(speech[:960])
        await asyncio.sleep(0.05)  # pushed at once; the next speech waits up to 1 s
        intake.pcm(speech[960:1920])
        await asyncio.sleep(0.05)
        t0 = time.perf_counter()
        intake.interrupt()
        while not replies:
            await asyncio.sleep(0.005)
        took = time.perf_counter() - t0
        intake.close()
        await feeder
        assert intake.pushes == 1  # the gathered speech was cut before it was pushed
        return took

    assert asyncio.run(interrupted()) < 0.5
    s.close()
    pool.shutdown()
