"""A live server's GPU work on several CUDA streams (`ServerConfig.cuda_streams`): shared graph
runners stay ordered across the streams that call them, and sessions on streams of their own
render what they render alone. The CUDA tests run on the GPU machine; on a CPU the option
degrades to plain execution, which is checked here too."""
from __future__ import annotations

import shutil
import threading

import numpy as np
import pytest
import torch

from newsstudio.accel.static import StaticBatchRunner
from newsstudio.avatar.packet import open_packet
from newsstudio.engines.batching import RenderBatcher
from newsstudio.live import LiveSession, ScaledTime, drive_simulated

FPS = 25
SR = 16000
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _speech(seconds: float, gain: float) -> np.ndarray:
    t = np.arange(int(seconds * SR)) / SR
    env = (np.sin(2 * np.pi * 3.0 * t) > 0).astype(np.float32)
    return (gain * env * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 900 * t))).astype(np.float32)


def _musetalk(device: str, accel: str = "eager"):
    from newsstudio.engines.musetalk.engine import TINY_UNET_CONFIG, TINY_VAE_CONFIG, MuseTalkEngine

    return MuseTalkEngine(device, weights="random", unet_config=TINY_UNET_CONFIG, vae_config=TINY_VAE_CONFIG, accel=accel)


def _play(session: LiveSession, ts: ScaledTime, speech: np.ndarray, until: float) -> dict[int, torch.Tensor]:
    session.speak(speech, SR)
    frames: dict[int, torch.Tensor] = {}
    drive_simulated(session, ts, until, on_video=lambda k, f: frames.__setitem__(k, f.clone()))
    return frames


def _session(eng, packet, **kw) -> tuple[LiveSession, ScaledTime]:
    ts = ScaledTime()
    ts.set(0.0)
    return LiveSession(eng, packet, fps=FPS, time_source=ts, render_ahead=4, **kw), ts


@pytest.fixture(scope="module")
def packet_copy(astronaut_packet, tmp_path_factory):
    dest = tmp_path_factory.mktemp("streams") / "astronaut"
    shutil.copytree(astronaut_packet.path, dest)
    return dest


def test_a_session_asked_for_its_own_stream_on_the_cpu_renders_as_usual(packet_copy):
    eng = _musetalk("cpu")
    packet = eng.prebake(open_packet(packet_copy), progress=False)
    a, ts_a = _session(eng, packet)
    b, ts_b = _session(eng, packet, cuda_stream=True)
    assert b.cuda_stream is None
    speech = _speech(0.6, 0.3)
    fa, fb = _play(a, ts_a, speech, 0.4), _play(b, ts_b, speech, 0.4)
    assert sorted(fa) == sorted(fb) and all(torch.equal(fa[k], fb[k]) for k in fa)


def test_an_unknown_stream_layout_is_refused():
    from newsstudio.server.engines import EnginePool

    with pytest.raises(ValueError, match="cuda_streams must be one of shared, front-end, sessions"):
        EnginePool("classic", torch.device("cpu"), "random", None, "eager", True, "per-thread")  # type: ignore[arg-type]


@cuda
def test_graph_runner_called_from_two_streams_never_refills_inputs_under_a_running_replay():
    w = torch.randn(1024, 1024, device="cuda") / 32

    def slow(x: torch.Tensor) -> torch.Tensor:
        for _ in range(40):  # long enough that a refill under the replay would show
            x = torch.tanh(x @ w)
        return x

    runner = StaticBatchRunner(slow, 8, torch.randn(8, 1024, device="cuda"), mode="cudagraph")
    xs = [torch.randn(8, 1024, device="cuda") * (k + 1) for k in range(6)]
    streams = [torch.cuda.Stream() for _ in range(2)]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    outs = []
    with torch.no_grad():
        for k, x in enumerate(xs):
            with torch.cuda.stream(streams[k % 2]):
                outs.append(runner(x))
        for s in streams:
            torch.cuda.current_stream().wait_stream(s)
        for x, o in zip(xs, outs):
            torch.testing.assert_close(o, slow(x))


@cuda
@pytest.mark.parametrize("accel", ["eager", "cudagraph"])
def test_sessions_on_their_own_streams_render_what_they_render_alone(packet_copy, accel):
    """Three sessions with different speech, each on its own CUDA stream, pulled at the same time
    from three threads through one render batcher and the front-end batchers on streams of their
    own: every frame as the session renders it alone on the default stream."""
    eng = _musetalk("cuda", accel)
    packet = eng.prebake(open_packet(packet_copy), progress=False)
    gains = (0.3, 0.15, 0.05)
    speeches = [_speech(1.2, g) for g in gains]
    alone = []
    for sp in speeches:
        s, ts = _session(eng, packet)
        alone.append(_play(s, ts, sp, 1.0))
        s.close()
    batcher = RenderBatcher(eng, own_stream=True)
    shared = eng.use_stream_batchers(own_streams=True)
    got: list[dict[int, torch.Tensor] | None] = [None] * len(gains)
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            s, ts = _session(eng, packet, renderer=batcher.render, cuda_stream=True)
            assert s.cuda_stream is not None
            got[k] = _play(s, ts, speeches[k], 1.0)
            s.close()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(gains))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
    finally:
        batcher.close()
        for b in shared.values():
            b.close()
    assert not errors, errors[0]
    assert batcher.stats.requests > batcher.stats.batches  # requests of several sessions shared batches
    for mine, ref in zip(got, alone):
        assert mine is not None and sorted(mine) == sorted(ref)
        for k in ref:  # fp16 batches of other sizes round differently: a pixel level or two, never a wrong frame
            diff = (mine[k].int() - ref[k].int()).abs()
            assert diff.float().mean() < 0.25 and diff.max() <= 8, (k, diff.float().mean(), diff.max())
    differs = [(alone[0][k].int() - alone[2][k].int()).abs().max() for k in alone[0]]
    assert max(differs) > 8  # the sessions' mouths differ: a frame handed to the wrong session would fail
