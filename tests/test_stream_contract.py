"""The streaming generator's contract, with the classic engine on CPU."""
from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest
import torch

from newsstudio.media.audio import Audio
from newsstudio.stream import stream_classic_generator, stream_generator


def _speechlike(seconds: float, sr: int, channels: int = 1) -> np.ndarray:
    t = np.arange(int(seconds * sr)) / sr
    env = (np.sin(2 * np.pi * 3.0 * t) > 0).astype(np.float32)  # 3 Hz syllables
    x = 0.3 * env * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 900 * t))
    return np.stack([x * (1 - 0.1 * c) for c in range(channels)]).astype(np.float32)


@pytest.mark.parametrize("fps,sr,seconds,chunk", [(25, 16000, 1.37, 8), (30, 48000, 1.0, 7), (29.97, 22050, 0.83, 5)])
def test_chunk_contract(astronaut_packet, fps, sr, seconds, chunk):
    pcm = _speechlike(seconds, sr, channels=2)
    chunks = list(stream_classic_generator(astronaut_packet, (pcm, sr), fps=fps, chunk_frames=chunk))
    w, h = astronaut_packet.size
    expected_frames = math.ceil(pcm.shape[1] * fps / sr - 1e-9)
    assert sum(c["num_frames"] for c in chunks) == expected_frames
    assert [c["chunk_idx"] for c in chunks] == list(range(len(chunks)))
    start = 0
    for c in chunks:
        assert set(c) >= {"chunk_idx", "frame_start", "num_frames", "frames", "is_last", "audio", "pts", "sample_rate"}
        assert c["frame_start"] == start
        start += c["num_frames"]
        f = c["frames"]
        assert f.dtype == torch.uint8 and f.device.type == "cpu"
        assert tuple(f.shape) == (c["num_frames"], h * 3 // 2, w)
        assert np.allclose(c["pts"], np.arange(c["frame_start"], start) / fps)
        assert c["audio"].shape[0] == 2 and c["sample_rate"] == sr
    assert [c["is_last"] for c in chunks].count(True) == 1 and chunks[-1]["is_last"]
    audio = np.concatenate([c["audio"] for c in chunks], axis=1)
    assert np.array_equal(audio, pcm), "audio slices must concatenate back to the input exactly"


def test_ramped_chunks_start_and_end_small_and_render_the_same_frames(astronaut_packet):
    """What an MP4 writer relies on with ramp_frames: small first and last chunks, large ones in
    between, and the same frames and audio as fixed-size chunks."""
    sr, fps = 16000, 25
    pcm = _speechlike(6.6, sr)  # 165 frames
    fixed = list(stream_classic_generator(astronaut_packet, (pcm, sr), fps=fps, chunk_frames=32))
    ramped = list(stream_classic_generator(astronaut_packet, (pcm, sr), fps=fps, chunk_frames=32, ramp_frames=8))
    assert [c["num_frames"] for c in fixed] == [32, 32, 32, 32, 32, 5]
    assert [c["num_frames"] for c in ramped] == [8, 16, 32, 32, 32, 16, 8, 8, 8, 5]
    assert [c["frame_start"] for c in ramped] == list(np.cumsum([0] + [c["num_frames"] for c in ramped])[:-1])
    assert torch.equal(torch.cat([c["frames"] for c in ramped]), torch.cat([c["frames"] for c in fixed]))
    assert np.array_equal(np.concatenate([c["audio"] for c in ramped], axis=1), pcm)
    assert [c["is_last"] for c in ramped].count(True) == 1 and ramped[-1]["is_last"]
    with pytest.raises(ValueError, match="ramp_frames"):
        stream_classic_generator(astronaut_packet, (pcm, sr), fps=fps, chunk_frames=8, ramp_frames=16)


def test_rgb_output(astronaut_packet):
    pcm = _speechlike(0.5, 16000)
    chunks = list(stream_generator("classic", astronaut_packet, (pcm, 16000), fps=25, chunk_frames=4, output="rgb"))
    w, h = astronaut_packet.size
    assert all(tuple(c["frames"].shape[1:]) == (h, w, 3) for c in chunks)


def test_live_iterator_yields_before_exhaustion(astronaut_packet):
    sr = 16000
    pcm = _speechlike(3.0, sr)[0]
    consumed = {"n": 0}
    first_chunk_seen = threading.Event()

    def live():
        for i in range(0, pcm.size, 320):  # 20 ms chunks
            consumed["n"] = i + 320
            if first_chunk_seen.is_set():
                pass
            time.sleep(0.002)
            yield pcm[i : i + 320]

    gen = stream_generator("classic", astronaut_packet, live(), fps=25, chunk_frames=4, sample_rate=sr)
    first = next(gen)
    first_chunk_seen.set()
    assert first["frame_start"] == 0
    assert consumed["n"] < pcm.size / 2, "the first chunk must come while most audio has not arrived"
    rest = list(gen)
    assert sum(c["num_frames"] for c in [first, *rest]) == math.ceil(pcm.size * 25 / sr)
    assert rest[-1]["is_last"]


def test_silence_keeps_the_avatar_still(astronaut_packet):
    """Silence: no mouth motion at all (every frame identical for a photo avatar), and nothing
    changes outside the face ROI. (The classic engine closes a mouth that is open in the source,
    so the ROI itself may differ from the photo.)"""
    pcm = np.zeros((1, 16000), np.float32)
    chunks = list(stream_generator("classic", astronaut_packet, (pcm, 16000), fps=25, chunk_frames=8))
    frames = torch.cat([c["frames"] for c in chunks])
    assert (frames.int() - frames[:1].int()).abs().max() == 0, "the mouth moved during silence"
    bg = astronaut_packet.tensor("frames_nv12")[0]
    h = bg.shape[0] * 2 // 3
    x0, y0 = astronaut_packet.array("roi/origins")[0]
    rw, rh = astronaut_packet.meta["roi"]["size"]
    outside = torch.ones(h, bg.shape[1], dtype=torch.bool)
    outside[y0 : y0 + rh, x0 : x0 + rw] = False
    assert torch.equal(frames[0, :h][outside], bg[:h][outside])


def test_bad_inputs_are_clear(astronaut_packet):
    with pytest.raises(ValueError, match="empty|zero samples"):
        list(stream_generator("classic", astronaut_packet, (np.zeros(0, np.float32), 16000)))
    with pytest.raises(ValueError, match="output"):
        stream_generator("classic", astronaut_packet, (np.zeros(100, np.float32), 16000), output="yuv")
    with pytest.raises(ValueError, match="sample_rate"):
        list(stream_generator("classic", astronaut_packet, iter([np.zeros(100, np.float32)])))


def test_consumer_can_stop_early(astronaut_packet):
    gen = stream_generator("classic", astronaut_packet, Audio(_speechlike(2.0, 16000), 16000), chunk_frames=2)
    next(gen)
    gen.close()  # must not hang or leak the worker


def test_a_sessions_compose_through_its_plans_equals_composing_directly(astronaut_packet):
    """`ComposeGraphs` (compose/session_graphs.py; CUDA graphs on a GPU, the same steps eagerly here):
    each request's frames are the ones the session's own compose makes, whatever the previous
    request of that size left in the plan's buffers; sizes past ``max_sizes`` compose directly."""
    from fractions import Fraction

    from newsstudio.compose.session_graphs import ComposeGraphs
    from newsstudio.engines.classic.engine import ClassicEngine
    from newsstudio.stream import StreamSession, background_for

    engine = ClassicEngine(device="cpu")
    layer = engine.load_avatar(astronaut_packet)
    session = StreamSession(engine, layer, background_for(engine, layer.packet), Fraction(25))
    graphs = ComposeGraphs(torch.device("cpu"), max_sizes=2)
    g = torch.Generator().manual_seed(3)
    hr, wr = layer.roi_hw
    for n, output in ((4, "nv12"), (4, "nv12"), (2, "rgb"), (4, "nv12")):
        rois = torch.rand(n, hr, wr, 3, generator=g) * 255
        idx = torch.randint(0, layer.n_frames, (n,), generator=g)
        host, done = graphs.to_host(session._compose, rois, idx, output)
        assert done is None  # on the CPU: nothing to wait for
        assert torch.equal(host, session._compose(rois, idx, output))
    assert graphs.replays == 4
    assert graphs.to_host(session._compose, torch.rand(3, hr, wr, 3), torch.zeros(3, dtype=torch.long), "nv12") is None  # a third size


def test_a_session_that_composed_through_its_plans_is_freed_when_its_last_reference_goes(astronaut_packet):
    """A live session's compose graphs hold GPU memory (their pool, its frames): they must go when
    the session goes, not at the next full garbage collection (which may be minutes away, or never
    with the server's frozen generations). So no reference cycle: freed with the collector off."""
    import gc
    import weakref
    from fractions import Fraction

    from newsstudio.compose.session_graphs import ComposeGraphs
    from newsstudio.engines.classic.engine import ClassicEngine
    from newsstudio.stream import StreamSession, background_for

    engine = ClassicEngine(device="cpu")
    layer = engine.load_avatar(astronaut_packet)
    hr, wr = layer.roi_hw
    gc.collect()
    gc.disable()
    try:
        session = StreamSession(engine, layer, background_for(engine, layer.packet), Fraction(25))
        session._compose_graphs = ComposeGraphs(torch.device("cpu"))  # as its first request through graphs makes them
        session._compose_graphs.to_host(session._compose, torch.rand(2, hr, wr, 3) * 255, torch.zeros(2, dtype=torch.long), "nv12")
        gone = [weakref.ref(session), weakref.ref(session._compose_graphs)]
        del session
        assert all(r() is None for r in gone), "a session and its compose graphs outlive their last reference"
    finally:
        gc.enable()


def test_a_failed_compose_capture_leaves_the_session_composing_eagerly(astronaut_packet, monkeypatch):
    """A capture that fails mid-stream (on a GPU: a driver or capture-mode error) must not end the
    session: that request and every later one compose eagerly, the failure is named once in
    `accel.static.fallbacks`, and no capture is tried again. (CUDA capture cannot run here; the CUDA
    test in test_accel.py makes a real one fail.)"""
    from fractions import Fraction

    from newsstudio.accel import static
    from newsstudio.compose import session_graphs
    from newsstudio.compose.session_graphs import ComposeGraphs
    from newsstudio.engines.classic.engine import ClassicEngine
    from newsstudio.stream import StreamSession, background_for

    tries = []

    def failing_capture(fn, device, pool=None):
        tries.append(device)
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(session_graphs, "capture", failing_capture)
    engine = ClassicEngine(device="cpu")
    layer = engine.load_avatar(astronaut_packet)
    session = StreamSession(engine, layer, background_for(engine, layer.packet), Fraction(25))
    graphs = ComposeGraphs(torch.device("cpu"))
    graphs.use_graphs = True  # as on a GPU
    hr, wr = layer.roi_hw
    for n in (4, 2, 4):
        assert graphs.to_host(session._compose, torch.rand(n, hr, wr, 3) * 255, torch.zeros(n, dtype=torch.long), "nv12") is None
    assert len(tries) == 1 and graphs.failed is not None and "capturing" in graphs.failed
    assert any("ComposeGraphs" in why and "capturing" in why for why in static.fallbacks())


def _chunks_equal(a: list[dict], b: list[dict]) -> None:
    assert [c["num_frames"] for c in a] == [c["num_frames"] for c in b]
    assert [c["is_last"] for c in a] == [c["is_last"] for c in b]
    for x, y in zip(a, b):
        assert torch.equal(x["frames"], y["frames"]) and np.array_equal(x["audio"], y["audio"])
        assert x["frame_start"] == y["frame_start"] and np.array_equal(x["pts"], y["pts"])


@pytest.mark.parametrize("live", [False, True], ids=["whole input", "live input"])
def test_the_front_end_run_ahead_gives_the_same_chunks(astronaut_packet, live):
    """`front_end_ahead` (on by default on CUDA) moves the audio features and motion to a thread of
    their own: the chunks, frames and audio slices must not change for a whole input; for a live one
    the frames and audio (its chunk sizes shrink once its end is known, whenever that is)."""
    sr = 16000
    pcm = _speechlike(3.3, sr)

    def run(ahead: bool) -> list[dict]:
        audio = (iter(pcm[0, i:i + 320] for i in range(0, pcm.shape[1], 320)) if live else (pcm, sr))
        return list(stream_generator("classic", astronaut_packet, audio, fps=25, chunk_frames=16, ramp_frames=4,
                                     sample_rate=sr if live else None, front_end_ahead=ahead))

    inline, ahead = run(False), run(True)
    assert sum(c["num_frames"] for c in ahead) == math.ceil(pcm.shape[1] * 25 / sr)
    if live:
        assert torch.equal(torch.cat([c["frames"] for c in inline]), torch.cat([c["frames"] for c in ahead]))
        assert [c["frame_start"] for c in ahead] == list(np.cumsum([0] + [c["num_frames"] for c in ahead])[:-1])
    else:
        _chunks_equal(inline, ahead)
    assert np.array_equal(np.concatenate([c["audio"] for c in ahead], axis=1), pcm)


def test_the_front_end_run_ahead_reports_errors_and_stops(astronaut_packet):
    """Errors in the feed's own thread reach the consumer; a consumer that stops early does not hang."""
    with pytest.raises(ValueError, match="empty|zero samples"):
        list(stream_generator("classic", astronaut_packet, (np.zeros(0, np.float32), 16000), front_end_ahead=True))

    def failing():
        yield np.zeros(3200, np.float32)
        raise OSError("microphone unplugged")

    with pytest.raises(OSError, match="microphone unplugged"):
        list(stream_generator("classic", astronaut_packet, failing(), sample_rate=16000, chunk_frames=2, front_end_ahead=True))
    gen = stream_generator("classic", astronaut_packet, Audio(_speechlike(2.0, 16000), 16000), chunk_frames=2, front_end_ahead=True)
    next(gen)
    t0 = time.perf_counter()
    gen.close()
    assert time.perf_counter() - t0 < 5.0
