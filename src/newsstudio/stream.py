"""The runner: one streaming pipeline that drives every engine.

`stream_generator(engine, avatar, audio, ...)` yields chunks of finished frames while audio
is still arriving:

    {"chunk_idx", "frame_start", "num_frames", "frames", "is_last",
     "audio", "sample_rate", "pts", "audio_start"}

`frames` is (B, H*3//2, W) uint8 NV12 or (B, H, W, 3) uint8 RGB, on the CPU by default or on
the render device on request; `audio` is the ORIGINAL PCM, (channels, n) float32, that plays
with exactly those frames (slices concatenate back to the input); `pts` the frames'
presentation times in seconds. Frame count for a finite input is ceil(duration * fps).

Compute and copy-out overlap: a worker thread renders chunk k+1 while the caller consumes
chunk k (torch releases the GIL in its kernels; on CUDA the copy to pinned memory is async);
on CUDA the audio features and motion run ahead of the renders on a thread and stream of their
own (`front_end_feed.py`).
`stream_classic_generator`, `stream_musetalk_generator`, `stream_ditto_generator` are this
function with the engine fixed, so all engines share exactly this code.
"""
from __future__ import annotations

import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from collections.abc import Callable, Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import torch

from .audio.source import AudioSource, frame_sample, frames_for_samples
from .avatar.packet import Packet
from .compose.banner import random_weights_banner
from .compose.colour import nv12_to_rgb
from .compose.session_graphs import ComposeGraphs
from .compose.splice import roi_offsets, splice_nv12
from .frame_rate import check_frame_rate
from .front_end_feed import FrontEndFeed
from .accel.host_copy import to_host_async
from .engines.base import AvatarLayer, Engine, pingpong_index
from .engines.batching import RenderBatcher

Output = Literal["nv12", "rgb"]
_DONE = object()
# Render workers are pooled, not spawned per stream: each new thread pays for fresh cuBLAS/cuDNN
# handles and workspaces on its first kernels (measured ~0.6-0.9 s per stream on an H200).
_RENDER_POOL = ThreadPoolExecutor(max_workers=64, thread_name_prefix="newsstudio-render")


class BackgroundFrames:
    """An avatar's NV12 frames where the renderer needs them.

    On CUDA the whole loop is uploaded once (a 268-frame 1080x1920 loop is 0.8 GB) so each chunk
    gathers on the GPU; on the CPU the memory map is indexed directly (no upload, no copy)."""

    def __init__(self, packet: Packet, device: torch.device):
        frames = packet.tensor("frames_nv12")
        self.device = device
        self.frames = frames.to(device) if device.type != "cpu" else frames

    @property
    def frame_hw(self) -> tuple[int, int]:
        """(height, width) of the frames (an NV12 frame holds 1.5x its height in rows)."""
        return int(self.frames.shape[1]) * 2 // 3, int(self.frames.shape[2])

    def gather(self, idx: torch.Tensor) -> torch.Tensor:
        return self.frames.index_select(0, idx.to(self.frames.device)).to(self.device, non_blocking=True)


class StreamSession:
    """Per-stream state: one conditioner + driver + frame counter over a loaded avatar layer.

    ``renderer``: what renders the ROIs, ``engine.render`` by default; a server passes its
    `RenderBatcher` so concurrent sessions share GPU batches (on CUDA its ``compose`` mode says
    where each request's splice and copy-out run: `render_frames_host`)."""

    def __init__(self, engine: Engine, layer: AvatarLayer, background: BackgroundFrames, fps: Fraction,
                 renderer: RenderBatcher | Callable[[AvatarLayer, torch.Tensor, torch.Tensor], torch.Tensor] | None = None):
        self.engine = engine
        self.batcher = renderer if isinstance(renderer, RenderBatcher) else None
        self.renderer = self.batcher.render if self.batcher is not None else (renderer or engine.render)
        self.render_wait_s = 0.0  # summed time inside render calls (the shared batch's queue and launch)
        self._compose_graphs: ComposeGraphs | None = None  # made at the first request that composes through graphs
        self._loop_index: torch.Tensor | None = None  # `_index`'s table
        self._loop_index_host: torch.Tensor | None = None  # its CPU copy (`_render_index`)
        self.layer = layer
        self.background = background
        # once per session: each splice gathers its frames' rows
        self._roi_offsets = roi_offsets(layer.origins.to(background.device), background.frame_hw)
        self.fps = fps
        self.conditioner = engine.conditioner(float(fps))
        self.driver = engine.driver(layer, float(fps))
        self.banner = random_weights_banner(layer.packet.size, layer.device) if engine.random_weights else None

    def pump(self) -> None:
        """Move whatever conditioning is ready into the driver."""
        n = self.conditioner.ready
        if n:
            self.driver.push(self.conditioner.take(n))

    def _index(self, frame_start: int, n: int, on_host: bool = False) -> torch.Tensor:
        """Avatar frames of output frames [frame_start, +n): a slice of the ping-pong loop's index
        table (no kernel; the table is made once, longer if a request outgrows it); ``on_host``: of
        the table's CPU twin, made on the CPU once per table (no copy from the device, hence no sync)."""
        period = 2 * max(1, self.layer.n_frames)
        if self._loop_index is None or self._loop_index.shape[0] < period + n:  # any window is one slice
            length = period + max(period, n, 64)
            self._loop_index = pingpong_index(torch.arange(length, device=self.layer.device), self.layer.n_frames)
            self._loop_index_host = None
        table = self._loop_index
        if on_host:
            if self._loop_index_host is None:
                self._loop_index_host = pingpong_index(torch.arange(table.shape[0]), self.layer.n_frames)
            table = self._loop_index_host
        s = frame_start % period
        return table[s:s + n]

    @torch.inference_mode()
    def _compose(self, rois: torch.Tensor, idx: torch.Tensor, output: Output) -> torch.Tensor:
        """The rendered faces spliced into their background frames, banner drawn, as `output`."""
        bg = self.background.gather(idx)
        frames = splice_nv12(bg, rois, self.layer.masks.index_select(0, idx), offsets=self._roi_offsets.index_select(0, idx), out=bg)
        if self.banner is not None:
            self.banner.apply_(frames)
        if output == "rgb":
            frames = nv12_to_rgb(frames)
        return frames

    def _compose_to_host(self, idx: torch.Tensor, output: Output, rois: torch.Tensor) -> tuple[torch.Tensor, "torch.cuda.Event | None"]:
        return to_host_async(self._compose(rois, idx, output))

    def _render_index(self, frame_start: int, driving: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """The source frames to render ``driving`` on: ``idx`` (`_index`), or the same on the CPU when
        the engine reads them there and the rows came there (`Engine.rows_on_host`)."""
        if self.engine.rows_on_host and driving.device.type == "cpu" and idx.device.type != "cpu":
            return self._index(frame_start, int(idx.shape[0]), on_host=True)
        return idx

    @torch.inference_mode()
    def render_frames(self, frame_start: int, driving: torch.Tensor, output: Output) -> torch.Tensor:
        idx = self._index(frame_start, int(driving.shape[0]))
        rois = self._timed(self.renderer, self.layer, driving, self._render_index(frame_start, driving, idx))
        return self._compose(rois, idx, output)

    def _timed(self, render: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """``render(*args, **kw)``, its time added to `render_wait_s` (a live session's render call
        split into the wait for its batch and the rest: its splice and copy-out launches)."""
        t0 = time.perf_counter()
        try:
            return render(*args, **kw)
        finally:
            self.render_wait_s += time.perf_counter() - t0

    @torch.inference_mode()
    def render_frames_host(self, frame_start: int, driving: torch.Tensor, output: Output) -> tuple[torch.Tensor, "torch.cuda.Event | None"]:
        """`render_frames` on its way to the CPU: ``(host, done)`` as `accel.host_copy.to_host_async`
        gives them (wait on ``done`` before reading ``host``). With a shared `RenderBatcher` on CUDA,
        where the splice and the copy run is the batcher's ``compose`` mode: so they follow this
        request's batch on the GPU instead of queueing behind the batches launched while this
        thread waited ("worker", "stream"; see `RenderBatcher`)."""
        b = self.batcher
        mode = b.compose if b is not None and self.layer.device.type == "cuda" else "session"
        if mode == "session":
            return to_host_async(self.render_frames(frame_start, driving, output))
        idx = self._index(frame_start, int(driving.shape[0]))
        ridx = self._render_index(frame_start, driving, idx)
        if mode == "worker":
            return self._timed(b.render, self.layer, driving, ridx, finish=partial(self._compose_to_host, idx, output))
        side = b.compose_stream()
        rois = self._timed(b.render_for_stream, side, self.layer, driving, ridx)
        idx.record_stream(side)  # made on this thread's stream, read on the side stream below
        with torch.cuda.stream(side):
            if b.compose_graphs:  # the same compose in ~7 torch calls (compose/session_graphs.py)
                if self._compose_graphs is None:
                    self._compose_graphs = ComposeGraphs(self.background.device)
                done = self._compose_graphs.to_host(self._compose, rois, idx, output)
                if done is not None:
                    return done
            return self._compose_to_host(idx, output, rois)

    @torch.inference_mode()
    def idle_frames(self, frame_start: int, n: int, output: Output) -> torch.Tensor:
        """The avatar loop with a closed mouth (no speech), e.g. between utterances."""
        driving = self.engine.idle_driving(n)
        if driving is not None:
            return self.render_frames(frame_start, driving, output)
        return self._still_frames(frame_start, n, output)

    @torch.inference_mode()
    def idle_frames_host(self, frame_start: int, n: int, output: Output) -> tuple[torch.Tensor, "torch.cuda.Event | None"]:
        """`idle_frames` on its way to the CPU, like `render_frames_host`."""
        driving = self.engine.idle_driving(n)
        if driving is not None:
            return self.render_frames_host(frame_start, driving, output)
        return to_host_async(self._still_frames(frame_start, n, output))

    def _still_frames(self, frame_start: int, n: int, output: Output) -> torch.Tensor:
        """The avatar loop as it is (engines without an idle driving signal)."""
        frames = self.background.gather(self._index(frame_start, n))  # a fresh tensor: safe to draw the banner on
        if self.banner is not None:
            self.banner.apply_(frames)
        return nv12_to_rgb(frames) if output == "rgb" else frames


def resolve_engine(engine: str | Engine, device: str | torch.device | None = None, **kwargs: Any) -> Engine:
    if isinstance(engine, Engine):
        return engine
    from .engines.registry import create_engine

    return create_engine(engine, device=device or default_device(), **kwargs)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def check_device(device: str | torch.device | None) -> torch.device:
    """`device` as a torch.device that can run here (None: :func:`default_device`).

    Why: an unavailable CUDA device otherwise fails deep inside an engine, after the avatar and
    weights are loaded, with torch's "Torch not compiled with CUDA enabled" assertion."""
    if device is None:
        return default_device()
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise ValueError(f"unknown device {str(device)!r}; use cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = (f"this torch {torch.__version__} is built without CUDA" if torch.version.cuda is None
                   else "no CUDA GPU is visible")
            raise ValueError(f"device {str(device)!r} is not available: {why}; use cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {str(device)!r} is not available: {torch.cuda.device_count()} CUDA GPU(s) visible")
    return dev


def check_stream_options(fps: float | Fraction, chunk_frames: int, output: str, ramp_frames: int = 0) -> Fraction:
    """The exact frame rate, once fps, chunk size and output kind are known to be usable.

    Separate from :func:`stream_generator` so a caller (the CLI) can refuse bad values before it
    loads an engine, which takes minutes on a GPU. The frame rate follows the one rule of every
    entry point (frame_rate.py)."""
    if output not in get_args(Output):
        raise ValueError(f"output must be {' or '.join(map(repr, get_args(Output)))}, got {output!r}")
    if chunk_frames < 1:
        raise ValueError(f"chunk_frames must be >= 1, got {chunk_frames}")
    if not 0 <= ramp_frames <= chunk_frames:
        raise ValueError(f"ramp_frames must be in [0, chunk_frames={chunk_frames}], got {ramp_frames}")
    return check_frame_rate(fps)


def resolve_avatar(avatar: str | os.PathLike[str] | Packet) -> Packet:
    if isinstance(avatar, Packet):
        return avatar
    from .avatar.store import resolve_avatar as _resolve

    return _resolve(avatar)


def stream_generator(
    engine: str | Engine,
    avatar: str | os.PathLike[str] | Packet,
    audio: Any,
    fps: float = 25,
    chunk_frames: int = 8,
    output: Output = "nv12",
    device: str | torch.device | None = None,
    *,
    keep_on_device: bool = False,
    sample_rate: int | None = None,
    prefetch: int = 2,
    ramp_frames: int = 0,
    front_end_ahead: bool | None = None,
) -> Iterator[dict[str, Any]]:
    """Stream lip-synced frames chunk by chunk (see the module docstring for the chunk dict).

    audio: a path, an `Audio`, an (array, sample_rate) pair, or an iterator of PCM chunks
    (numpy arrays with `sample_rate=`, or `Audio` objects) arriving live; with an iterator the
    first chunk is yielded as soon as enough audio for it has arrived.

    ramp_frames > 0: chunk sizes ramp (see :func:`chunk_size`) so a consumer that pipelines
    (an MP4 encoder) gets its first frames sooner and waits less after the last ones.

    front_end_ahead: run the audio features and motion on a thread (and CUDA stream) of their own,
    ahead of the renders (`front_end_feed.py`); None: on CUDA devices. Same frames either way.
    """
    fr = check_stream_options(fps, chunk_frames, output, ramp_frames)
    eng = resolve_engine(engine, device)
    packet = resolve_avatar(avatar)
    layer = eng.load_avatar(packet)
    background = background_for(eng, packet)
    # File-like input is read in blocks the engine chooses (MuseTalk: whole 30 s Whisper pieces,
    # so file renders equal the official whole-file features); live input is taken as it comes.
    source = AudioSource(audio, eng.sample_rate, sample_rate=sample_rate, block_s=getattr(eng, "file_block_s", 0.5))
    session = StreamSession(eng, layer, background, fr)
    return _run(session, source, fr, chunk_frames, output, keep_on_device, prefetch, ramp_frames, front_end_ahead)


def chunk_size(chunk_idx: int, chunk_frames: int, ramp_frames: int = 0, remaining: int | None = None) -> int:
    """Frames in chunk `chunk_idx` (before clipping to what is left or ready).

    Without a ramp every chunk is `chunk_frames`. With one, chunk sizes start at `ramp_frames` and
    double up to `chunk_frames`; once the frames left are known, no chunk takes more than half of
    them (a multiple of `ramp_frames`, at least `ramp_frames`), so the last chunks shrink the same
    way. Why: whoever consumes the chunks in a pipeline (x264 segments) idles until the first chunk
    is in and finishes its work on the last one after the render is done, so both ends should be
    small; in between, large chunks keep the renderer at its batch efficiency."""
    if ramp_frames <= 0:
        return chunk_frames
    n = min(chunk_frames, ramp_frames << min(chunk_idx, 30))
    if remaining is not None:
        n = min(n, max(ramp_frames, remaining // 2 // ramp_frames * ramp_frames))
    return n


def background_for(engine: Engine, packet: Packet) -> BackgroundFrames:
    """Background frames cached on the engine per packet (shared by all its sessions)."""
    cache: dict[str, BackgroundFrames] = engine.__dict__.setdefault("_background_cache", {})
    key = str(Path(packet.path).resolve())
    if key not in cache:
        cache[key] = BackgroundFrames(packet, engine.device)
    return cache[key]


def _run(session: StreamSession, source: AudioSource, fps: Fraction, chunk_frames: int, output: Output, keep_on_device: bool, prefetch: int,
         ramp_frames: int = 0, front_end_ahead: bool | None = None) -> Iterator[dict[str, Any]]:
    q: queue.Queue = queue.Queue(maxsize=max(1, prefetch))
    stop = threading.Event()
    worker = _RENDER_POOL.submit(_produce, session, source, fps, chunk_frames, output, keep_on_device, q, stop, ramp_frames,
                                 front_end_ahead)
    try:
        while True:
            item = q.get()
            if item is _DONE:
                break
            if isinstance(item, BaseException):
                raise item
            if isinstance(item.get("_event"), torch.cuda.Event):
                item.pop("_event").synchronize()
            item.pop("_event", None)
            yield item
    finally:
        stop.set()
        while not worker.done():
            try:
                q.get_nowait()
            except queue.Empty:
                time.sleep(0.002)


def _put(q: queue.Queue, item: Any, stop: threading.Event) -> bool:
    while not stop.is_set():
        try:
            q.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


def _produce(session: StreamSession, source: AudioSource, fps: Fraction, chunk_frames: int, output: Output, keep_on_device: bool, q: queue.Queue, stop: threading.Event,
             ramp_frames: int = 0, front_end_ahead: bool | None = None) -> None:
    dev = session.layer.device
    feed = FrontEndFeed(session, source, fps, ahead=dev.type == "cuda" if front_end_ahead is None else front_end_ahead, stop=stop)
    try:
        frame_start = 0
        chunk_idx = 0
        sr = source.sample_rate
        copy_stream = torch.cuda.Stream(device=dev) if dev.type == "cuda" else None
        # the frame count for planning chunk sizes: known up front for a whole input, at its end for a live one
        expected = None if source.total_samples is None else frames_for_samples(source.total_samples, sr, fps)

        def wanted() -> int:
            known = feed.total if feed.total is not None else expected
            return chunk_size(chunk_idx, chunk_frames, ramp_frames, None if known is None else known - frame_start)

        while not stop.is_set():
            # Audio is fed until a full chunk is ready or the input has ended.
            available = feed.wait(wanted())
            if stop.is_set():
                break
            total = feed.total
            remaining = None if total is None else total - frame_start
            if remaining is not None and remaining <= 0:
                break
            want = wanted()  # a live input's end may have become known while feeding
            n = min(want, available) if remaining is None else min(want, remaining)
            if n <= 0:
                break
            if n > available:  # engine produced fewer frames than the audio spans: hold the last
                driving = feed.take(available) if available else None
                driving = _pad_driving(driving, n, session)
            else:
                driving = feed.take(n)
            frames = session.render_frames(frame_start, driving, output)
            is_last = total is not None and frame_start + n >= total
            a0 = frame_sample(frame_start, sr, fps)
            a1 = source.n_samples if is_last else frame_sample(frame_start + n, sr, fps)
            item: dict[str, Any] = {
                "chunk_idx": chunk_idx,
                "frame_start": frame_start,
                "num_frames": n,
                "is_last": is_last,
                "audio": np.ascontiguousarray(source.original(a0, a1)),
                "sample_rate": sr,
                "audio_start": a0,
                "pts": (np.arange(frame_start, frame_start + n, dtype=np.float64) * float(1 / fps)),
            }
            if keep_on_device or dev.type == "cpu":
                item["frames"] = frames
            else:
                host = torch.empty(frames.shape, dtype=frames.dtype, pin_memory=True)
                assert copy_stream is not None
                copy_stream.wait_stream(torch.cuda.current_stream(dev))
                with torch.cuda.stream(copy_stream):
                    host.copy_(frames, non_blocking=True)
                    frames.record_stream(copy_stream)
                    ev = torch.cuda.Event()
                    ev.record(copy_stream)
                item["frames"] = host
                item["_event"] = ev
            source.release_before(a0)
            if not _put(q, item, stop):
                return
            frame_start += n
            chunk_idx += 1
            if is_last:
                break
        _put(q, _DONE, stop)
    except BaseException as e:  # surfaced to the consumer
        _put(q, e, stop)
    finally:
        feed.close()


def _pad_driving(driving: torch.Tensor | None, n: int, session: StreamSession) -> torch.Tensor:
    if driving is None or driving.shape[0] == 0:
        idle = session.engine.idle_driving(n)
        if idle is None:
            raise RuntimeError("engine produced no driving frames for the audio")
        return idle
    pad = driving[-1:].expand(n - driving.shape[0], *driving.shape[1:])
    return torch.cat([driving, pad])


def stream_classic_generator(avatar: Any, audio: Any, fps: float = 25, **kw: Any) -> Iterator[dict[str, Any]]:
    """`stream_generator` with the weight-free classic engine."""
    return stream_generator(kw.pop("engine", "classic"), avatar, audio, fps, **kw)


def stream_musetalk_generator(avatar: Any, audio: Any, fps: float = 25, **kw: Any) -> Iterator[dict[str, Any]]:
    """`stream_generator` with MuseTalk."""
    return stream_generator(kw.pop("engine", "musetalk"), avatar, audio, fps, **kw)


def stream_ditto_generator(avatar: Any, audio: Any, fps: float = 25, **kw: Any) -> Iterator[dict[str, Any]]:
    """`stream_generator` with Ditto."""
    return stream_generator(kw.pop("engine", "ditto"), avatar, audio, fps, **kw)
