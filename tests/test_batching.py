"""Render batching across live streams: every request gets exactly the frames its own render call
would give, requests queued together share one engine call, one bad request fails alone, and the
neural engines batch across different avatars."""
from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
import torch

from newsstudio.avatar.packet import open_packet
from newsstudio.engines.batching import Batcher, RenderBatcher, TensorBatcher
from newsstudio.engines.classic.engine import ClassicEngine
from tests.conftest import carried_faces, media_path

# Pixels are floats in [0, 255]; batched spline solves round differently from single ones on some
# CPUs (up to 0.04 seen on an AVX-512 machine). A frame from the wrong request differs by tens.
PIXEL_ATOL = 0.1


def _speech(seconds: float = 1.2, sr: int = 16000) -> np.ndarray:
    t = np.arange(int(seconds * sr)) / sr
    env = (np.sin(2 * np.pi * 3.0 * t) > 0).astype(np.float32)
    return (0.3 * env * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 900 * t))).astype(np.float32)


def _driving(engine, layer, seconds: float = 1.2, gain: float = 1.0) -> torch.Tensor:
    cond, drv = engine.conditioner(25), engine.driver(layer)
    cond.push(_speech(seconds, engine.sample_rate) * gain)
    cond.close()
    drv.push(cond.take(cond.ready))
    drv.close()
    return drv.take(drv.ready)


class CountingClassic(ClassicEngine):
    """The classic engine, counting its batched calls (what the batcher is supposed to save)."""

    def __init__(self) -> None:
        super().__init__(device="cpu")
        self.calls: list[int] = []

    def render_many(self, items):
        self.calls.append(len(items))
        return super().render_many(items)


@pytest.fixture(scope="module")
def two_layers(astronaut_packet, tmp_path_factory):
    """Two different avatars: the astronaut (256x256 photo) and the real portrait at another size."""
    from newsstudio.avatar.prebake import prebake

    root = tmp_path_factory.mktemp("batching")
    return astronaut_packet, prebake(media_path("portrait.png"), "portrait", root=root, size=(240, 320), progress=False,
                                      faces=carried_faces("portrait"))


def _requests(engine, layers, sizes):
    """(layer, driving, frame_idx) per size, alternating avatars, each from its own speech."""
    out = []
    for k, n in enumerate(sizes):
        layer = layers[k % len(layers)]
        d = _driving(engine, layer)[k: k + n]
        out.append((layer, d, torch.arange(k, k + n) % layer.n_frames))
    return out


def _queued(two_layers, sizes, max_frames):
    """Requests queued before the batcher starts: (engine, batcher, what it returned, direct renders)."""
    eng = CountingClassic()
    layers = [eng.load_avatar(p) for p in two_layers]
    reqs = _requests(eng, layers, sizes)
    direct = [eng.render(*r) for r in reqs]
    eng.calls.clear()
    b = RenderBatcher(eng, max_frames=max_frames, autostart=False)
    futures = [b.submit(*r) for r in reqs]
    b.start()
    got = [f.result(timeout=60) for f in futures]
    b.close()
    return eng, b, got, direct


def test_queued_requests_share_one_call_and_get_their_own_frames(two_layers):
    eng, b, got, direct = _queued(two_layers, [3, 2, 4, 3], 32)
    assert eng.calls == [4]  # all four in one batch
    assert b.stats.requests == 4 and b.stats.batches == 1 and b.stats.largest_batch == 12
    st = b.stats.as_dict()  # queued before the worker started: every request waited, the batch took time
    assert st["wait_s_total"] > 0 and 0 < st["max_wait_ms"] <= st["wait_s_total"] * 1e3 and st["busy_s_total"] > 0
    for g, d in zip(got, direct):
        assert g.shape == d.shape
        torch.testing.assert_close(g, d, atol=PIXEL_ATOL, rtol=0)


def test_max_frames_splits_batches_and_order_is_kept(two_layers):
    eng, b, got, direct = _queued(two_layers, [3, 2, 4, 1], 5)
    assert sum(eng.calls) == 4 and len(eng.calls) >= 2 and b.stats.largest_batch <= 5
    for g, d in zip(got, direct):
        torch.testing.assert_close(g, d, atol=PIXEL_ATOL, rtol=0)


class BucketedClassic(CountingClassic):
    """The classic engine as a compiled engine looks to its batcher: batches run as buckets of 4, 8, 12."""

    def render_buckets(self):
        return (4, 8, 12)


def _filled(two_layers, sizes, fill: bool, bad: int | None = None):
    """`sizes` requests queued on a bucketed batcher (max 12 frames), filling buckets or not; request
    `bad` asks for frames past its avatar. (engine, batcher, futures, requests)."""
    eng = BucketedClassic()
    layers = [eng.load_avatar(p) for p in two_layers]
    reqs = _requests(eng, layers, sizes)
    if bad is not None:
        layer, d, _ = reqs[bad]
        reqs[bad] = (layer, d, torch.full((d.shape[0],), 10_000))
    b = RenderBatcher(eng, max_frames=12, autostart=False, fill_buckets=fill)
    futures = [b.submit(*r) for r in reqs]
    b.start()
    for f in futures:
        f.exception(timeout=60)  # done, one way or the other
    return eng, b, futures, reqs


def test_filling_buckets_splits_a_request_across_batches_and_every_caller_gets_its_frames(two_layers):
    """Four requests of 5 frames: as queued they run as 10 + 10 frames in buckets of 12 (4 padding
    frames); filled, as 12 + 8, with the third request's 5 frames split 2 + 3 over the two batches."""
    eng, b, futures, reqs = _filled(two_layers, [5, 5, 5, 5], fill=False)
    assert eng.calls == [2, 2] and (b.stats.frames, b.stats.bucket_frames, b.stats.split_requests) == (20, 24, 0)
    b.close()
    eng, b, futures, reqs = _filled(two_layers, [5, 5, 5, 5], fill=True)
    assert eng.calls == [3, 2]  # the head of the third request joined the first batch
    assert (b.stats.frames, b.stats.bucket_frames, b.stats.split_requests) == (20, 20, 1)
    for f, r in zip(futures, reqs):
        got = f.result()
        assert got.shape[0] == 5
        torch.testing.assert_close(got, eng.render(*r), atol=PIXEL_ATOL, rtol=0)
    b.close()


def test_a_render_batcher_batches_up_to_the_engines_largest_bucket(two_layers):
    """A batch larger than the largest bucket would run as several graphs: the batcher stops there
    (32 frames where the engine runs batches as they come)."""
    assert RenderBatcher(BucketedClassic(), autostart=False).max_frames == 12
    assert RenderBatcher(CountingClassic(), autostart=False).max_frames == 32
    assert RenderBatcher(BucketedClassic(), max_frames=8, autostart=False).max_frames == 8


def test_a_split_request_that_fails_fails_whole_and_alone(two_layers):
    eng, b, futures, reqs = _filled(two_layers, [5, 5, 5, 5], fill=True, bad=2)
    with pytest.raises((IndexError, RuntimeError)):
        futures[2].result()
    for k in (0, 1, 3):
        torch.testing.assert_close(futures[k].result(), eng.render(*reqs[k]), atol=PIXEL_ATOL, rtol=0)
    assert b.render(*reqs[0]).shape[0] == 5  # still serving
    b.close()


def test_a_bad_request_fails_alone(two_layers):
    eng = CountingClassic()
    layers = [eng.load_avatar(p) for p in two_layers]
    good = _requests(eng, layers, [3, 2])
    bad = (layers[0], good[0][1][:2], torch.tensor([0, 10_000]))  # frame index past the avatar
    b = RenderBatcher(eng, autostart=False)
    futures = [b.submit(*good[0]), b.submit(*bad), b.submit(*good[1])]
    b.start()
    torch.testing.assert_close(futures[0].result(timeout=60), eng.render(*good[0]), atol=PIXEL_ATOL, rtol=0)
    torch.testing.assert_close(futures[2].result(timeout=60), eng.render(*good[1]), atol=PIXEL_ATOL, rtol=0)
    with pytest.raises((IndexError, RuntimeError)):
        futures[1].result(timeout=60)
    assert b.render(*good[1]).shape == futures[2].result().shape  # still serving
    b.close()
    with pytest.raises(RuntimeError, match="closed"):
        b.submit(*good[0])


def test_concurrent_streams_through_one_batcher(two_layers):
    eng = ClassicEngine(device="cpu")
    layers = [eng.load_avatar(p) for p in two_layers]
    b = RenderBatcher(eng)
    errors: list[BaseException] = []

    def stream(k: int) -> None:
        try:
            layer = layers[k % 2]
            drv = _driving(eng, layer)
            for s in range(0, 24, 4):
                idx = torch.arange(s, s + 4) % layer.n_frames
                got = b.render(layer, drv[s:s + 4], idx)
                torch.testing.assert_close(got, eng.render(layer, drv[s:s + 4], idx), atol=PIXEL_ATOL, rtol=0)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=stream, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    b.close()
    assert not errors, errors[0]
    assert b.stats.requests == 36 and b.stats.batches <= 36


@pytest.mark.parametrize("name", ["musetalk", "ditto"])
def test_neural_engines_batch_across_avatars(name, two_layers, tmp_path):
    """render_many over two different avatars in ONE network batch equals rendering each alone."""
    if name == "musetalk":
        from newsstudio.engines.musetalk.engine import TINY_UNET_CONFIG, TINY_VAE_CONFIG, MuseTalkEngine

        eng = MuseTalkEngine("cpu", weights="random", unet_config=TINY_UNET_CONFIG, vae_config=TINY_VAE_CONFIG)
    else:
        from newsstudio.engines.ditto.config import TINY_OPTIONS
        from newsstudio.engines.ditto.engine import DittoEngine

        eng = DittoEngine("cpu", weights="random", steps=2, smo_k_s=1, **TINY_OPTIONS)
    layers = []
    for p in two_layers:
        dest = tmp_path / p.path.name
        shutil.copytree(p.path, dest)
        layers.append(eng.load_avatar(eng.prebake(open_packet(dest), progress=False)))
    assert layers[0].roi_hw != layers[1].roi_hw or layers[0].packet.id != layers[1].packet.id
    reqs = _requests(eng, layers, [3, 2, 2])
    reqs = reqs + [reqs[-1], reqs[0]]  # consecutive requests of one avatar too (resized as one run by MuseTalk)
    alone = [eng.render(*r) for r in reqs]
    together = eng.render_many(reqs)
    assert len(together) == 5
    for t, a in zip(together, alone):
        assert t.shape == a.shape
        # equal up to batch-size-dependent float rounding (MuseTalk rounds faces to 8-bit levels: one level;
        # Ditto's seeded decoder amplifies rounding: 1.5 levels seen on an AVX2-only CPU)
        diff = (t - a).abs()
        assert float(diff.max()) <= (1.0 + 1e-3 if name == "musetalk" else 3.0) and float(diff.mean()) < 0.01
    # requests split across batches to fill buckets (as a compiled engine's; eager on the CPU has none) are
    # joined back into the frames each request gets alone
    assert eng.render_buckets() is None
    b = RenderBatcher(eng, max_frames=4, autostart=False, fill_buckets=True)
    b.buckets = (2, 4)
    futures = [b.submit(*r) for r in reqs]
    b.start()
    split = [f.result(timeout=300) for f in futures]
    b.close()
    assert b.stats.split_requests >= 2 and b.stats.frames == b.stats.bucket_frames == 12
    for t, a in zip(split, alone):
        assert t.shape == a.shape
        diff = (t - a).abs()
        assert float(diff.max()) <= (1.0 + 1e-3 if name == "musetalk" else 3.0) and float(diff.mean()) < 0.01


def test_lmdm_windows_of_several_streams_in_one_batch_equal_sampling_alone():
    """Each stream draws its own noises; the shared MotionBatcher samples all windows in one DDIM
    run; every stream gets exactly the motion it would have sampled alone."""
    from newsstudio.engines.ditto.ddim import DDIMSampler
    from newsstudio.engines.ditto.lmdm import MotionBatcher
    from newsstudio.engines.ditto.models.lmdm import LMDM
    from newsstudio.weights.seeded import fill_seeded_

    lmdm = fill_seeded_(LMDM(motion_feat_dim=265, audio_feat_dim=64, seq_frames=20), 5).eval()
    g = torch.Generator().manual_seed(2)
    conds = [torch.randn(1, 20, 64, generator=g) for _ in range(3)]
    kps = [torch.randn(1, 265, generator=g) * 0.1 for _ in range(3)]

    def sampler(seed, batcher=None):
        return DDIMSampler(lmdm, steps=4, generator=torch.Generator().manual_seed(seed), batcher=batcher)

    with torch.no_grad():
        alone = [sampler(10 + k).sample(kps[k], conds[k]) for k in range(3)]
        mb = MotionBatcher(lmdm, steps=4, autostart=False)
        streams = [sampler(10 + k, mb) for k in range(3)]
        futures = []
        for k, s in enumerate(streams):  # what sample() does with a batcher, without blocking: queue first
            x = s._randn((1, 20, 265), conds[k])
            futures.append(mb.submit((kps[k], conds[k], x, torch.stack(s.step_noise))))
        mb.start()
        together = [f.result(timeout=60) for f in futures]
        assert mb.stats.batches == 1 and mb.stats.requests == 3
        for t, a in zip(together, alone):  # equal up to batch-size-dependent float32 GEMM rounding
            assert float((t - a).norm() / a.norm()) < 1e-5
        # and the blocking path through DDIMSampler.sample itself
        s = sampler(10, mb)
        assert float((s.sample(kps[0], conds[0]) - alone[0]).norm() / alone[0].norm()) < 1e-5
        mb.close()
    assert not torch.allclose(alone[0], alone[1])  # the streams' noises differ: the test can fail



@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("accel", ["eager", "cudagraph"])
@pytest.mark.parametrize("own_stream", [False, True])
def test_lmdm_windows_of_streams_on_threads_batched_on_the_gpu_equal_sampling_alone(accel, own_stream):
    """What a server's Ditto sessions do: each on its own thread, blocking in DDIMSampler.sample
    while the shared MotionBatcher samples their windows together (graphs captured first, as the
    engine's warm-up does), on the shared CUDA stream or on the batcher's own. Every session gets
    its motion, equal to sampling alone, within a deadline (a hang fails, it does not block)."""
    import threading

    from newsstudio.engines.ditto.ddim import DDIMSampler

    from newsstudio.engines.ditto.lmdm import MotionBatcher

    from newsstudio.engines.ditto.models.lmdm import LMDM
    from newsstudio.weights.seeded import fill_seeded_

    dev = torch.device("cuda")
    lmdm = fill_seeded_(LMDM(motion_feat_dim=265, audio_feat_dim=64, seq_frames=20), 5).eval().to(dev)
    g = torch.Generator().manual_seed(2)
    conds = [torch.randn(1, 20, 64, generator=g).to(dev) for _ in range(4)]
    kps = [(torch.randn(1, 265, generator=g) * 0.1).to(dev) for _ in range(4)]

    def sampler(seed, batcher=None):
        return DDIMSampler(lmdm, steps=4, generator=torch.Generator().manual_seed(seed), batcher=batcher, accel=accel)

    with torch.no_grad():
        lmdm.ddim_program(4, 1.0, accel).warm_up(kps[0], conds[0])
        alone = [sampler(10 + k).sample(kps[k], conds[k]) for k in range(4)]
        mb = MotionBatcher(lmdm, steps=4, accel=accel, own_stream=own_stream)
    assert mb.own_stream == own_stream
    results: dict[int, torch.Tensor | BaseException] = {}

    def session(k: int) -> None:
        try:
            with torch.no_grad():
                s = sampler(10 + k, mb)
                results[k] = torch.stack([s.sample(kps[k], conds[k]) for _ in range(3)])  # three windows in a row
        except BaseException as exc:  # noqa: BLE001 - reported below
            results[k] = exc

    threads = [threading.Thread(target=session, args=(k,), daemon=True) for k in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert sorted(results) == [0, 1, 2, 3], f"sessions still waiting for their motion: {sorted(set(range(4)) - set(results))}"
        for k in range(4):
            assert isinstance(results[k], torch.Tensor), results[k]
            first = results[k][0]
            assert float((first - alone[k]).norm() / alone[k].norm()) < 1e-4
        assert mb.stats.requests == 12
    finally:
        mb.close()

def test_streams_share_one_ddim_program_per_model_and_plan():
    """Every stream's sampler of one LMDM runs the same DDIM program (on CUDA its graphs are
    captured once per batch bucket, not once per stream); the traced (eager, step by step) loop and
    the program give the same motion."""
    from newsstudio.engines.ditto.ddim import DDIMSampler, DDIMTrace
    from newsstudio.engines.ditto.models.lmdm import LMDM
    from newsstudio.weights.seeded import fill_seeded_

    lmdm = fill_seeded_(LMDM(motion_feat_dim=265, audio_feat_dim=64, seq_frames=20), 5).eval()
    a = DDIMSampler(lmdm, steps=4, generator=torch.Generator().manual_seed(1))
    b = DDIMSampler(lmdm, steps=4, generator=torch.Generator().manual_seed(2))
    assert a.program is b.program and a.program is lmdm.ddim_program(4, 1.0, "eager")
    assert DDIMSampler(lmdm, steps=3).program is not a.program
    # graphs captured with TF32 matmuls are other graphs: their own program, shared by the samplers that ask for it
    tf32 = DDIMSampler(lmdm, steps=4, tf32=True).program
    assert tf32 is not a.program and tf32 is lmdm.ddim_program(4, 1.0, "eager", tf32=True) and tf32.runner.tf32
    import copy

    twin = copy.deepcopy(lmdm)  # the lever benchmark copies models: the copy gets programs of its own
    assert twin.ddim_program(4, 1.0, "eager") is not a.program and twin.ddim_program(4, 1.0, "eager").lmdm is twin
    g = torch.Generator().manual_seed(3)
    cond, kp, x_T = torch.randn(2, 20, 64, generator=g), torch.randn(2, 265, generator=g) * 0.1, torch.randn(2, 20, 265, generator=g)
    with torch.no_grad():
        trace = DDIMTrace([], [], [])
        traced = a.sample(kp, cond, x_T=x_T, trace=trace)
        plain = a.sample(kp, cond, x_T=x_T)
    assert len(trace.x_start) == 4
    torch.testing.assert_close(plain, traced)
    assert not torch.allclose(plain, b.sample(kp, cond, x_T=x_T))  # b's step noises differ

@pytest.mark.parametrize("name", ["musetalk", "ditto"])
def test_streams_sharing_the_engine_batchers_get_what_they_get_alone(name, two_layers, tmp_path):
    """A server's streams share the engine's audio-encoder batcher (and Ditto's LMDM batcher): three
    streams with different speech, run at the same time, each get exactly their own conditioning."""
    if name == "musetalk":
        from newsstudio.engines.musetalk.engine import TINY_UNET_CONFIG, TINY_VAE_CONFIG, MuseTalkEngine

        eng = MuseTalkEngine("cpu", weights="random", unet_config=TINY_UNET_CONFIG, vae_config=TINY_VAE_CONFIG)
        seconds, stages = 1.2, {"audio"}
    else:
        from newsstudio.engines.ditto.config import TINY_OPTIONS
        from newsstudio.engines.ditto.engine import DittoEngine

        eng = DittoEngine("cpu", weights="random", steps=2, **TINY_OPTIONS)
        seconds, stages = 4.0, {"audio", "motion"}  # 4 s = two or more 80-frame LMDM windows
    dest = tmp_path / "a"
    shutil.copytree(two_layers[0].path, dest)
    layer = eng.load_avatar(eng.prebake(open_packet(dest), progress=False))
    gains = (1.0, 0.5, 0.25)
    alone = [_driving(eng, layer, seconds, g) for g in gains]
    shared = eng.use_stream_batchers()
    assert set(shared) == stages and eng.use_stream_batchers() == shared  # made once
    got: list[torch.Tensor | None] = [None] * len(gains)
    errors: list[BaseException] = []

    def stream(k: int) -> None:
        try:
            got[k] = _driving(eng, layer, seconds, gains[k])
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=stream, args=(k,)) for k in range(len(gains))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    for b in shared.values():
        b.close()
    assert not errors, errors[0]
    assert all(b.stats.requests >= len(gains) for b in shared.values())
    for g, a in zip(got, alone):  # equal up to batch-size-dependent float32 rounding
        torch.testing.assert_close(g, a, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(alone[0], alone[1])  # the streams differ: the test can fail
    g = got[0]
    g += 0  # normal tensors: a caller outside inference mode may update them in place


def test_a_batcher_asked_for_its_own_stream_on_the_cpu_runs_as_usual():
    b = TensorBatcher(lambda x: x * 2, max_rows=8, device="cpu", own_stream=True)
    try:
        assert not b.own_stream  # streams are a CUDA thing
        b.set_own_stream(True)
        assert not b.own_stream
        assert torch.equal(b(torch.arange(3.0)), torch.tensor([0.0, 2.0, 4.0]))
    finally:
        b.close()


def test_a_bound_on_batches_in_flight_is_checked_and_means_nothing_on_the_cpu():
    with pytest.raises(ValueError, match="max_in_flight must be >= 0"):
        Batcher(lambda items: items, len, device="cpu", max_in_flight=-1)
    b = Batcher(lambda items: [x * 2 for x in items], lambda x: 1, device="cpu", max_in_flight=1)
    try:
        assert b.max_in_flight == 0  # no GPU queue to bound
        assert [f.result(timeout=30) for f in [b.submit(k) for k in range(5)]] == [0, 2, 4, 6, 8]
    finally:
        b.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("bound", [1, 2])
def test_a_batcher_keeps_at_most_its_bound_of_batches_on_the_gpu(bound):
    """Requests that keep coming while a slow batch runs: with ``max_in_flight`` n, each batch
    starts only when fewer than n of the earlier ones are still queued or running on the GPU."""
    w = torch.randn(2048, 2048, device="cuda") / 45
    big = torch.randn(4096, 4096, device="cuda") / 64
    pending: list[torch.cuda.Event] = []
    seen: list[int] = []

    def slow(items: list[torch.Tensor]) -> list[torch.Tensor]:
        seen.append(sum(not e.query() for e in pending))  # this worker's earlier batches still on the GPU
        heavy = big
        for _ in range(6):  # a few ms of GPU work per batch, launched in microseconds
            heavy = heavy @ big
        x = torch.tanh(torch.cat(items) @ w + heavy[0, :2048])
        done = torch.cuda.Event()
        done.record()
        pending.append(done)
        return list(x.split(1))

    b = Batcher(slow, lambda x: int(x.shape[0]), max_frames=4, device="cuda", max_in_flight=bound)
    try:
        futures = []
        for k in range(24):
            futures.append(b.submit(torch.randn(1, 2048, device="cuda")))
            time.sleep(0.0005)
        for f in futures:
            f.result(timeout=60)
    finally:
        b.close()
    assert max(seen) <= bound - 1, seen
    unbounded = Batcher(slow, lambda x: int(x.shape[0]), max_frames=4, device="cuda")
    pending.clear()
    seen.clear()
    try:
        for f in [unbounded.submit(torch.randn(1, 2048, device="cuda")) for _ in range(24)]:
            f.result(timeout=60)
    finally:
        unbounded.close()
    assert max(seen) > bound - 1, seen  # without the bound the worker does run ahead: the test can fail


def _slow_rows() -> Callable[[torch.Tensor], torch.Tensor]:
    """A row-wise function with enough device work per call that a missing stream wait would show.
    The matrix is orthogonal, so the 20 layers do not amplify rounding: rows batched with others
    (another GEMM kernel) agree with rows run alone to float32 tolerance. (A Gaussian matrix has a
    gain of ~22 per layer, and its chaos made a 32-row batch differ from 4-row calls on an H200.)"""
    w = torch.linalg.qr(torch.randn(512, 512, device="cuda"))[0]

    def slow(x: torch.Tensor) -> torch.Tensor:
        for _ in range(20):
            x = torch.tanh(x @ w)
        return x

    return slow


def test_callers_of_a_stalled_batch_get_an_error_and_a_slow_queue_is_not_a_stall():
    """A batch that never finishes (a wedged device) must not hold its callers forever: with
    `stall_s` they get a BatchStalledError once the running batch is older than that. Time spent
    queued behind healthy batches is not a stall."""
    import threading

    from newsstudio.engines.batching import BatchStalledError

    gate = threading.Event()

    def fn(x):
        if float(x[0, 0]) < 0:
            gate.wait(30)  # the wedged batch
        else:
            time.sleep(0.15)  # a healthy but slow one
        return x * 2

    b = TensorBatcher(fn, max_rows=1, name="probe")
    b.stall_s = 0.4
    try:
        # healthy: three 0.15 s batches in a row; the last caller waits ~0.45 s in all, > stall_s
        futures = [b.submit(torch.full((1, 2), float(k + 1))) for k in range(3)]
        assert [float(b.wait(f)[0, 0]) for f in futures] == [2.0, 4.0, 6.0]
        assert not b.stalled() and b.busy_for_s == 0.0
        # wedged: the caller of the stuck batch and the one queued behind it both get the error
        stuck = b.submit(torch.full((1, 2), -1.0))
        behind = b.submit(torch.ones(1, 2))
        t0 = time.monotonic()
        for f in (stuck, behind):
            with pytest.raises(BatchStalledError, match="probe: its batch .* has run for"):
                b.wait(f)
        assert 0.4 <= time.monotonic() - t0 < 5 and b.stalled() and b.busy_for_s > 0.4
        gate.set()  # the device finishes: the queued request still gets its result
        assert float(behind.result(timeout=10)[0, 0]) == 2.0
        assert not b.stalled()
    finally:
        gate.set()
        b.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_own_stream_batcher_hands_over_finished_outputs_that_the_callers_stream_can_use():
    """Callers' inputs made on the default stream, a slow batch on the worker's stream, and the
    caller consuming the outputs on the default stream at once: every row as fn computes it."""
    slow = _slow_rows()
    b = TensorBatcher(slow, max_rows=16, device="cuda", own_stream=True)
    try:
        assert b.own_stream
        xs = [torch.randn(4, 512, device="cuda") * (k + 1) for k in range(6)]
        with torch.inference_mode():
            outs = [b(x) for x in xs]
            consumed = [o.sum(dim=1) for o in outs]  # on the default stream, right away
            for x, o, c in zip(xs, outs, consumed):
                ref = slow(x)
                torch.testing.assert_close(o, ref)
                torch.testing.assert_close(c, ref.sum(dim=1))
    finally:
        b.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_batchers_long_lived_streams_are_none_of_pytorchs_pooled_streams():
    """A batcher's own stream and the live sessions' compose stream live as long as the server, while
    an engine loaded later captures its graphs on pooled streams (graph families, Inductor): were
    ours pooled, the same CUDA stream could be both, and the sessions' work would break the capture."""
    from newsstudio.engines.classic.engine import ClassicEngine

    high = torch.cuda.Stream.priority_range()[1]
    pooled = {torch.cuda.Stream(priority=p).cuda_stream for p in (0, high) for _ in range(64)}
    b = TensorBatcher(_slow_rows(), max_rows=16, device="cuda", own_stream=True)
    render = RenderBatcher(ClassicEngine("cuda"), autostart=False)
    try:
        with torch.inference_mode():
            b(torch.randn(4, 512, device="cuda"))
        ours = {b._stream.cuda_stream, render.compose_stream().cuda_stream}
        assert len(ours) == 2 and not ours & pooled
    finally:
        b.close()
        render.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_batcher_switched_between_its_own_stream_and_the_shared_one_keeps_every_result():
    """A server switching its front-end batchers between levels: requests queued before the switch
    (no event to wait on) and after it end up in one batch, which must still see finished inputs;
    the in-flight bound holds only on the shared stream."""
    slow = _slow_rows()
    b = TensorBatcher(slow, max_rows=64, device="cuda", autostart=False)
    b.set_max_in_flight(2)
    try:
        xs = [torch.randn(4, 512, device="cuda") * (k + 1) for k in range(8)]
        with torch.inference_mode():
            futures = [b.submit(x) for x in xs[:4]]  # queued on the shared path
            b.set_own_stream(True)
            assert b.own_stream and b.max_in_flight == 0
            futures += [b.submit(x) for x in xs[4:]]  # queued with events, same batch as the first four
            b.start()
            outs = [f.result(timeout=60) for f in futures]
            b.set_own_stream(False)
            assert not b.own_stream and b.max_in_flight == 2
            outs.append(b(xs[0]))
            b.set_own_stream(True)
            outs.append(b(xs[1]))
            for x, o in zip(xs + xs[:2], outs):
                torch.testing.assert_close(o, slow(x))
    finally:
        b.close()


def test_finish_runs_in_the_worker_right_after_its_batch_and_fails_only_its_request():
    """What a live session relies on when its splice and copy-out ride on its render request: each
    request's `finish` gets that request's own result, runs on the worker thread before the next
    batch starts, and an error in one finish reaches only that caller."""
    log: list[str] = []
    worker: list[str] = []

    def run_many(items: list[int]) -> list[int]:
        log.append(f"batch {items}")
        return [x * 10 for x in items]

    def finish(tag: str):
        def f(out: int) -> tuple[str, int]:
            worker.append(threading.current_thread().name)
            log.append(f"finish {tag}")
            if tag == "bad":
                raise ValueError("splice failed")
            return tag, out
        return f

    b: Batcher[int, int] = Batcher(run_many, lambda x: 1, max_frames=2, autostart=False, name="finisher")
    futures = [b.submit(1, finish("a")), b.submit(2, finish("bad")), b.submit(3), b.submit(4, finish("d"))]
    b.start()
    assert futures[0].result(timeout=10) == ("a", 10)
    with pytest.raises(ValueError, match="splice failed"):
        futures[1].result(timeout=10)
    assert futures[2].result(timeout=10) == 30  # no finish: the plain result
    assert futures[3].result(timeout=10) == ("d", 40)
    b.close()
    assert log == ["batch [1, 2]", "finish a", "finish bad", "batch [3, 4]", "finish d"]
    assert set(worker) == {"finisher"}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("compose", ["session", "worker", "stream"])
def test_sessions_composing_through_the_render_batcher_get_the_frames_they_get_alone(two_layers, compose):
    """On CUDA a session that renders through a RenderBatcher splices and copies out where the
    batcher's ``compose`` mode says (its own thread, the batcher's worker, or a side stream that
    waits for its batch only: `StreamSession.render_frames_host`): the frames must equal the plain
    path's, byte for byte, for several sessions at once on two avatars."""
    from fractions import Fraction

    from newsstudio.stream import StreamSession, background_for

    eng = ClassicEngine(device="cuda")
    layers = [eng.load_avatar(p) for p in two_layers]
    batcher = RenderBatcher(eng, compose=compose)
    reqs = _requests(eng, layers, [8, 6, 8, 5])
    expected, got = [], [None] * len(reqs)
    for layer, d, idx in reqs:
        plain = StreamSession(eng, layer, background_for(eng, layer.packet), Fraction(25))
        expected.append(plain.render_frames(int(idx[0]), d.cuda(), "nv12").cpu())

    def run(k: int) -> None:
        layer, d, idx = reqs[k]
        s = StreamSession(eng, layer, background_for(eng, layer.packet), Fraction(25), renderer=batcher)
        host, done = s.render_frames_host(int(idx[0]), d.cuda(), "nv12")
        assert done is not None and host.device.type == "cpu" and host.is_pinned()
        done.synchronize()
        got[k] = host

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(reqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    batcher.close()
    assert batcher.stats.requests == len(reqs)
    for g, e in zip(got, expected):
        assert g is not None and torch.equal(g, e)
    assert not torch.equal(expected[0][:5], expected[2][:5])  # the sessions differ: the test can fail


def test_render_batcher_refuses_an_unknown_compose_mode():
    eng = ClassicEngine(device="cpu")
    with pytest.raises(ValueError, match="compose must be one of session, worker, stream"):
        RenderBatcher(eng, compose="gpu", autostart=False)
    b = RenderBatcher(eng, autostart=False)
    with pytest.raises(ValueError, match="compose must be one of"):
        b.set_compose("fused")
    assert b.compose == "session"  # unchanged by the refused mode


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("own_stream", [False, True])
def test_a_caller_on_a_stream_of_its_own_gets_its_rows_made_from_its_finished_inputs(own_stream):
    """A clip's front end run ahead (front_end_feed.py) calls the server's shared audio and motion
    batchers from a CUDA stream of its own. On the shared stream the batch must wait for that
    caller's inputs, and the caller's stream for the batch, or rows come from half-made inputs."""
    dev = torch.device("cuda")
    w = torch.randn(1024, 1024, device=dev) / 32
    batcher = TensorBatcher(lambda x: x @ w, max_rows=64, device=dev, own_stream=own_stream)
    side = torch.cuda.Stream(dev)
    outs, wants = [], []
    with torch.no_grad(), torch.cuda.stream(side):
        for k in range(4):
            x = torch.randn(16, 1024, device=dev)
            for _ in range(60):  # slow to make on the caller's stream: a batch that does not wait reads it early
                x = torch.tanh(x @ w) * 4
            y = batcher(x) + 0  # used on the caller's stream at once
            outs.append(y)
            wants.append(x @ w)
    torch.cuda.synchronize()
    for y, want in zip(outs, wants):
        torch.testing.assert_close(y, want)
    batcher.close()
