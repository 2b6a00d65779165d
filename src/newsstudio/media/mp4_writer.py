"""H.264 + AAC MP4 writing with PyAV (libx264 and FFmpeg's AAC encoder ship in the wheel).

Why this shape:

* Frames arrive in batches straight from the pipeline, as NV12 ``(B, H*3//2, W)`` (what the
  GPU splicer produces) or RGB ``(B, H, W, 3)``. NV12 goes to libx264 as is: x264 works in
  NV12 internally, so there is no RGB round trip and no CPU colour conversion. RGB input is
  converted by the rule of :func:`newsstudio.compose.colour.rgb_to_nv12` (BT.709 limited,
  2x2-average chroma): on the GPU for CUDA tensors, by swscale's exact mode otherwise.
* Frame-exact: frame ``i`` gets pts ``i`` in time base ``1/fps``; N frames in, N frames in
  the file, for any rational fps (29.97 -> 30000/1001).
* The stream is tagged BT.709 limited range (matrix, primaries, transfer), matching the
  pixels, so players do not guess BT.601 and shift the skin tones.
* Audio is encoded as the video advances (never ahead of it, at most one AAC frame behind),
  so encoder and muxer buffers stay small, audio and video interleave in the file, and
  audio past the last video frame is trimmed.
* ``workers > 1``: x264 scales poorly past a few threads at 1080x1920 (105 fps with 16 cores
  measured on the H200 machine), so the video can instead be cut into closed segments of
  ``segment_frames`` frames, each encoded by its own x264 instance in a worker thread (PyAV
  releases the GIL while encoding) and muxed in order. Every segment starts with an IDR frame
  and has no B-frames, and every instance has the same settings, hence the same SPS/PPS
  (checked per segment), so the segments join into one valid stream. Cost: no B-frames and an
  IDR per segment make the file somewhat larger at the same ``crf`` (benchmarks/encode_bench.py).
  ``segment_threads``: x264 threads per segment instance (default: the cores shared out). More
  than that over-subscribes the cores in steady state but lets the last few segments, which
  alone decide when the file is done, finish on all cores: they run as *sliced* threads (one
  frame split across threads, no frame delay), costing a little compression per slice.
  ``total_frames`` (the clip's length, when the caller knows it: a render does, from the audio):
  the last ``TAIL_SEGMENTS`` segments' worth of frames go in shorter segments, so that the final
  frames, which arrive together and alone decide when the file is done, are spread over every
  worker instead of queueing behind one segment of ``segment_frames`` (each segment at least two
  frames). Off unless asked: the extra IDR frames cost bits (a 165-frame real clip at ultrafast:
  +3.5 % with 2 workers x 8 frames, +4.4 % with 8 x 4, +17.6 % with 12 x 8; CPU dev machine), and
  the time it saves is not yet measured where it would show (many cores; benchmarks' ``+`` specs).
* Atomic: everything goes to a hidden temp file in the target folder, renamed over ``path``
  only on a clean close; an exception inside ``with`` removes it, so a reader never sees a
  half-written MP4.
"""
from __future__ import annotations

import os
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path
from typing import Literal

import av
import numpy as np
import torch
from av.video.reformatter import ColorRange, Colorspace, Interpolation

from ..compose.colour import rgb_to_nv12
from ..cpus import usable_cpus
from ._container import ffmpeg_reason
from .audio import Audio
from .errors import MediaEncodeError

__all__ = ["Mp4Writer", "encode_clip", "as_frame_rate", "AAC_SAMPLE_RATES", "X264_PRESETS"]

#: Sample rates FFmpeg's AAC encoder accepts.
#: libx264's speed presets, fastest first.
X264_PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow", "placebo")
AAC_SAMPLE_RATES = (7350, 8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000, 64000, 88200, 96000)
_AAC_LAYOUTS = {1: "mono", 2: "stereo", 3: "3.0", 4: "quad", 5: "5.0", 6: "5.1", 7: "6.1", 8: "7.1"}
_AAC_FRAME = 1024
_NTSC = (Fraction(24000, 1001), Fraction(30000, 1001), Fraction(60000, 1001))
_FORMATS = {".mp4": "mp4", ".m4v": "mp4", ".mov": "mov", ".mkv": "matroska"}

PixelInput = Literal["nv12", "rgb"]
#: With ``total_frames`` known, how many full segments' worth of frames at the end are cut shorter
#: (one render chunk's worth at the benchmarks' 32-frame chunks and 8-frame segments): each extra
#: IDR frame costs bits, so only the very end, whose encoding alone decides when the file is done.
TAIL_SEGMENTS = 4


def as_frame_rate(fps: float | int | Fraction) -> Fraction:
    """Exact frame rate. Floats within 0.01 of an NTSC rate (23.976, 29.97, 59.94) snap to
    it (``30000/1001``), since that is what a float 29.97 means; others get the nearest
    fraction with denominator <= 1001."""
    if isinstance(fps, Fraction):
        rate = fps
    elif isinstance(fps, int):
        rate = Fraction(fps)
    else:
        f = float(fps)
        rate = next((n for n in _NTSC if abs(float(n) - f) < 0.01), None) or Fraction(f).limit_denominator(1001)
    if rate <= 0:
        raise ValueError(f"fps must be positive, got {fps!r}")
    return rate


def _aac_rate(rate: int) -> int:
    """The smallest AAC rate >= ``rate`` (no information lost), else the highest."""
    return next((r for r in AAC_SAMPLE_RATES if r >= rate), AAC_SAMPLE_RATES[-1])


_EXACT = Interpolation.AREA | Interpolation.ACCURATE_RND | Interpolation.FULL_CHR_H_INP


def _rgb_frame_to_nv12(rgb: np.ndarray) -> av.VideoFrame:
    """One RGB frame -> NV12 VideoFrame, BT.709 limited, 2x2-average chroma (our rule). swscale
    reads the array in place (no 6 MB copy per 1080p frame first) and writes a new frame."""
    frame = av.VideoFrame.from_numpy_buffer(rgb, format="rgb24")
    return frame.reformat(
        format="nv12", dst_colorspace=Colorspace.ITU709, dst_color_range=ColorRange.MPEG, interpolation=_EXACT
    )


def _nv12_frame(nv12: np.ndarray) -> av.VideoFrame:
    """A frame over the array's own memory: x264 copies its input picture when it is sent, so a
    3 MB memcpy per 1080p frame (under the GIL, ~0.08 s per 6.6 s segment) is not made first.
    The frame holds a reference to the array; callers hand over arrays they do not change."""
    return av.VideoFrame.from_numpy_buffer(nv12, format="nv12")


def _to_numpy_uint8(frames) -> np.ndarray:
    if isinstance(frames, torch.Tensor):
        frames = frames.detach()
        if frames.device.type != "cpu":
            frames = frames.cpu()  # a copy; CPU tensors are viewed without copying
        frames = frames.numpy()
    arr = np.asarray(frames)
    if arr.dtype != np.uint8:
        raise TypeError(f"frames must be uint8, got {arr.dtype}")
    return arr


class Mp4Writer:
    """Write an H.264 (+ optional AAC) MP4 frame batch by frame batch.

    Use as a context manager::

        with Mp4Writer("out.mp4", 1080, 1920, 25, audio=speech) as w:
            for batch in chunks:          # NV12 (B, H*3//2, W) uint8, numpy or torch
                w.write(batch)

    ``audio`` keeps its channels; its rate is kept when AAC supports it, else raised to the
    next AAC rate (soxr). Audio longer than the video is trimmed to the video's duration;
    shorter audio is muxed as is. ``metadata`` goes into the container (e.g. ``title``,
    ``comment``). ``faststart`` moves the index to the front so browsers can play the file
    while it downloads.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        width: int,
        height: int,
        fps: float | int | Fraction,
        *,
        audio: Audio | None = None,
        crf: int = 18,
        preset: str = "veryfast",
        pixel_input: PixelInput = "nv12",
        metadata: Mapping[str, str] | None = None,
        faststart: bool = True,
        workers: int = 1,
        segment_frames: int = 32,
        segment_threads: int | None = None,
        total_frames: int | None = None,
    ) -> None:
        if total_frames is not None and total_frames < 0:
            raise ValueError(f"total_frames must be >= 0, got {total_frames}")
        if workers < 1 or segment_frames < 1 or (segment_threads is not None and segment_threads < 1):
            raise ValueError(f"workers, segment_frames and segment_threads must be >= 1, "
                             f"got {workers}, {segment_frames}, {segment_threads}")
        if width <= 0 or height <= 0 or width % 2 or height % 2:
            raise ValueError(f"H.264 4:2:0 needs even, positive width and height, got {width}x{height}")
        if pixel_input not in ("nv12", "rgb"):
            raise ValueError(f"pixel_input must be 'nv12' or 'rgb', got {pixel_input!r}")
        if not 0 <= int(crf) <= 51:
            raise ValueError(f"crf must be in 0..51, got {crf}")
        if preset not in X264_PRESETS:
            raise ValueError(f"preset must be one of {', '.join(X264_PRESETS)}, got {preset!r}")
        self.path = Path(path)
        self.width, self.height = int(width), int(height)
        self.fps = as_frame_rate(fps)
        self.pixel_input: PixelInput = pixel_input
        self.frames_written = 0
        self.workers, self.segment_frames = int(workers), int(segment_frames)
        self.segment_threads = int(segment_threads) if segment_threads else max(1, usable_cpus() // self.workers)
        self.total_frames = None if total_frames is None else int(total_frames)
        self._segmented = 0  # frames handed to segments so far
        self._pool: ThreadPoolExecutor | None = None
        self._segments: deque[tuple[int, Future]] = deque()  # (frames, future) in stream order
        self._pending: list[tuple[Callable[[np.ndarray], av.VideoFrame], np.ndarray]] = []
        self._extradata: bytes | None = None
        self._closed = False
        fmt = _FORMATS.get(self.path.suffix.lower(), "mp4")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = self.path.with_name(f".{self.path.stem}.{uuid.uuid4().hex[:12]}.partial{self.path.suffix}")
        container_options = {"movflags": "+faststart"} if faststart and fmt in ("mp4", "mov") else {}
        try:
            self._container = av.open(str(self._tmp), mode="w", format=fmt, container_options=container_options)
        except av.FFmpegError as exc:
            raise MediaEncodeError(self.path, f"cannot create output ({ffmpeg_reason(exc)})") from exc
        try:
            self._setup_streams(audio, int(crf), preset, metadata)
        except BaseException:
            self.abort()
            raise

    # -- setup -------------------------------------------------------------------------

    def _setup_streams(
        self, audio: Audio | None, crf: int, preset: str, metadata: Mapping[str, str] | None
    ) -> None:
        c = self._container
        for key, value in (metadata or {}).items():
            c.metadata[str(key)] = str(value)
        self._x264 = {"crf": str(crf), "preset": preset}
        if self.workers > 1:
            self._x264["bframes"] = "0"  # segments must join with increasing dts
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="x264-segment")
        vs = c.add_stream("libx264", rate=self.fps, options=dict(self._x264))
        vs.width, vs.height = self.width, self.height
        vs.pix_fmt = "nv12"  # x264's native 4:2:0 layout; the stream is H.264 4:2:0 (yuv420p)
        self._tag_video(vs.codec_context)
        self._video = vs
        self._audio_stream = None
        self._audio: Audio | None = None
        self._audio_pos = 0
        if audio is not None and audio.num_samples > 0:
            if audio.channels not in _AAC_LAYOUTS:
                raise ValueError(f"AAC output supports 1..8 channels, audio has {audio.channels}")
            rate = _aac_rate(audio.sample_rate)
            self._audio = audio.resampled(rate)
            self._layout = _AAC_LAYOUTS[audio.channels]
            a_s = c.add_stream("aac", rate=rate, layout=self._layout)
            a_s.codec_context.bit_rate = min(64000 * audio.channels, 320000)
            a_s.codec_context.time_base = Fraction(1, rate)
            self._audio_stream = a_s

    def _tag_video(self, ctx) -> None:
        """Time base and BT.709 limited-range tags (the tags go into the SPS: identical everywhere)."""
        ctx.time_base = 1 / self.fps
        ctx.colorspace = 1  # AVCOL_SPC_BT709
        ctx.color_primaries = 1  # AVCOL_PRI_BT709
        ctx.color_trc = 1  # AVCOL_TRC_BT709
        ctx.color_range = 1  # AVCOL_RANGE_MPEG (limited)

    # -- parallel segments ---------------------------------------------------------------

    def _encode_segment(self, items: list[tuple[Callable[[np.ndarray], av.VideoFrame], np.ndarray]]
                        ) -> tuple[bytes, list[tuple[bytes, int, int, bool]]]:
        """One closed segment by a fresh x264 instance (worker thread): (its SPS/PPS, packets)."""
        ctx = av.CodecContext.create("libx264", "w")
        ctx.width, ctx.height, ctx.pix_fmt = self.width, self.height, "nv12"
        ctx.framerate = self.fps
        self._tag_video(ctx)
        ctx.flags |= av.codec.context.Flags.global_header  # headers out of band, as the MP4 stream's
        ctx.options = {**self._x264, "threads": str(self.segment_threads)}
        if self.segment_threads > 1:
            ctx.options = {**ctx.options, "x264-params": "sliced-threads=1"}
        ctx.open()
        out: list[tuple[bytes, int, int, bool]] = []
        for i, (make, image) in enumerate(items):
            frame = make(image)
            frame.pts = i
            frame.time_base = ctx.time_base
            out += [(bytes(p), p.pts, p.dts, p.is_keyframe) for p in ctx.encode(frame)]
        out += [(bytes(p), p.pts, p.dts, p.is_keyframe) for p in ctx.encode(None)]
        return bytes(ctx.extradata or b""), out

    def _segment_length(self) -> int:
        """Frames in the next segment: `segment_frames`, or in the last TAIL_SEGMENTS segments' worth
        of a clip of known length the frames still to come shared out over the workers (at least two
        per segment)."""
        left = None if self.total_frames is None else self.total_frames - self._segmented
        if left is None or left > TAIL_SEGMENTS * self.segment_frames:
            return self.segment_frames
        return max(min(2, self.segment_frames), min(self.segment_frames, -(-left // self.workers)))

    def _submit(self, final: bool) -> None:
        while len(self._pending) >= (size := self._segment_length()) or (final and self._pending):
            items, self._pending = self._pending[:size], self._pending[size:]
            assert self._pool is not None
            self._segmented += len(items)
            self._segments.append((len(items), self._pool.submit(self._encode_segment, items)))
            if len(self._segments) > 2 * self.workers:  # bounded memory: wait for the oldest
                self._mux_segments(block_first=True)
        self._mux_segments(block_first=final, all_=final)

    def _mux_segments(self, block_first: bool = False, all_: bool = False) -> None:
        """Mux finished segments in stream order (waiting for the oldest when asked)."""
        while self._segments and (all_ or block_first or self._segments[0][1].done()):
            n, fut = self._segments.popleft()
            block_first = False
            extradata, packets = fut.result()
            if self._extradata is None:
                self._extradata = extradata
            elif extradata != self._extradata:
                raise MediaEncodeError(self.path, "parallel x264 segments produced different stream headers")
            start = self.frames_written
            tb = self._video.codec_context.time_base
            for data, pts, dts, key in packets:
                pkt = av.Packet(data)
                pkt.pts, pkt.dts = pts + start, dts + start
                pkt.time_base = tb
                pkt.is_keyframe = key
                pkt.stream = self._video
                self._container.mux(pkt)
            self.frames_written += n
            self._write_audio(final=False)

    # -- writing -----------------------------------------------------------------------

    def write(self, frames: np.ndarray | torch.Tensor, *, owned: bool = False) -> int:
        """Encode a batch (or a single frame); returns the total frames written so far.

        NV12: ``(B, H*3//2, W)`` or ``(H*3//2, W)``; RGB: ``(B, H, W, 3)`` or ``(H, W, 3)``;
        uint8, numpy or torch. CPU RGB is converted by swscale in its exact mode (2x2 area
        chroma, accurate rounding: within one code value of :func:`rgb_to_nv12`, at SIMD
        speed); GPU RGB is converted on the GPU and only the (half-size) NV12 is copied.
        ``owned``: the caller hands the frames over and will not change them (each stream chunk
        is a fresh array), so parallel segments keep them instead of copying 3 MB per 1080p
        frame on the caller's thread; frames from the GPU are always owned (they arrive as copies).
        """
        if self._closed:
            raise ValueError(f"{self.path}: write() after close()")
        h, w = self.height, self.width
        if self.pixel_input == "rgb" and isinstance(frames, torch.Tensor) and frames.device.type != "cpu":
            self._check_shape(frames.shape, (h, w, 3), "RGB")
            if frames.dtype != torch.uint8:
                raise TypeError(f"frames must be uint8, got {frames.dtype}")
            batch = _to_numpy_uint8(rgb_to_nv12(frames.detach())).reshape(-1, h * 3 // 2, w)
            make = _nv12_frame
            owned = True
        elif self.pixel_input == "rgb":
            batch = _to_numpy_uint8(frames)
            self._check_shape(batch.shape, (h, w, 3), "RGB")
            batch = batch.reshape(-1, h, w, 3)
            make = _rgb_frame_to_nv12
        else:
            owned = owned or (isinstance(frames, torch.Tensor) and frames.device.type != "cpu")
            batch = _to_numpy_uint8(frames)
            self._check_shape(batch.shape, (h * 3 // 2, w), "NV12")
            batch = batch.reshape(-1, h * 3 // 2, w)
            make = _nv12_frame
        batch = np.ascontiguousarray(batch)  # no copy unless the caller passed a strided view
        try:
            if self._pool is not None:  # unless handed over, the caller may reuse its buffers: segments keep copies
                self._pending += [(make, image if owned else image.copy()) for image in batch]
                self._submit(final=False)
                return self.frames_written + len(self._pending) + sum(n for n, _ in self._segments)
            for image in batch:
                self._encode(make(image))
            self._write_audio(final=False)
        except av.FFmpegError as exc:
            raise MediaEncodeError(self.path, f"encoding failed ({ffmpeg_reason(exc)})") from exc
        return self.frames_written

    @staticmethod
    def _check_shape(shape, frame_shape: tuple[int, ...], what: str) -> None:
        shape = tuple(shape)
        n = len(frame_shape)
        if len(shape) not in (n, n + 1) or shape[-n:] != frame_shape:
            dims = ", ".join(map(str, frame_shape))
            raise ValueError(f"{what} frames must be (B, {dims}) or ({dims}), got {shape}")

    def _encode(self, frame: av.VideoFrame) -> None:
        frame.pts = self.frames_written
        frame.time_base = self._video.codec_context.time_base
        for packet in self._video.encode(frame):
            self._container.mux(packet)
        self.frames_written += 1

    def _audio_end(self) -> int:
        """Sample index that corresponds to the end of the video written so far."""
        assert self._audio is not None
        return min(self._audio.num_samples, int(self.frames_written * self._audio.sample_rate / self.fps))

    def _write_audio(self, *, final: bool) -> None:
        if self._audio is None or self._audio_stream is None:
            return
        end = self._audio_end()
        samples = self._audio.samples
        while self._audio_pos < end:
            stop = self._audio_pos + _AAC_FRAME
            if stop > end:
                if not final:
                    break  # wait for more video before a partial AAC frame
                stop = end
            chunk = np.ascontiguousarray(samples[:, self._audio_pos : stop])
            frame = av.AudioFrame.from_ndarray(chunk, format="fltp", layout=self._layout)
            frame.sample_rate = self._audio.sample_rate
            frame.pts = self._audio_pos
            frame.time_base = Fraction(1, self._audio.sample_rate)
            for packet in self._audio_stream.encode(frame):
                self._container.mux(packet)
            self._audio_pos = stop

    # -- finishing ---------------------------------------------------------------------

    def close(self) -> Path:
        """Flush encoders, finish the file and move it to ``path``. Idempotent."""
        if self._closed:
            return self.path
        if self._pool is not None:
            try:
                self._submit(final=True)
            except BaseException as exc:
                self.abort()
                if isinstance(exc, av.FFmpegError):
                    raise MediaEncodeError(self.path, f"encoding failed ({ffmpeg_reason(exc)})") from exc
                raise
            self._pool.shutdown()
        if self.frames_written == 0:
            self.abort()
            raise MediaEncodeError(self.path, "no frames were written; refusing to create an empty video")
        try:
            self._write_audio(final=True)
            for packet in self._video.encode(None):
                self._container.mux(packet)
            if self._audio_stream is not None:
                for packet in self._audio_stream.encode(None):
                    self._container.mux(packet)
            self._container.close()
        except BaseException as exc:
            self.abort()
            if isinstance(exc, av.FFmpegError):
                raise MediaEncodeError(self.path, f"finishing the file failed ({ffmpeg_reason(exc)})") from exc
            raise
        self._closed = True
        self._move_into_place()
        return self.path

    def _move_into_place(self) -> None:
        """Rename the finished temp file to ``path``. This runs after the ``with`` block ended
        cleanly, so ``__exit__`` no longer aborts: a failed rename (``path`` became a folder, a
        read-only or vanished directory) removes the temp file here instead of leaving it."""
        try:
            os.replace(self._tmp, self.path)
        except BaseException as exc:
            self._tmp.unlink(missing_ok=True)
            if isinstance(exc, OSError):
                raise MediaEncodeError(self.path, f"cannot move the finished file into place ({exc.strerror or exc})") from exc
            raise

    def abort(self) -> None:
        """Stop without producing ``path``; removes the temp file. Safe to call twice."""
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._segments.clear()
            self._pending = []
        try:
            self._container.close()
        except Exception:  # noqa: BLE001 - the file is being thrown away
            pass
        try:
            os.unlink(self._tmp)
        except FileNotFoundError:
            pass

    def __enter__(self) -> "Mp4Writer":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def encode_clip(
    path: str | os.PathLike,
    frames: Iterable[np.ndarray | torch.Tensor],
    *,
    fps: float | int | Fraction,
    audio: Audio | None = None,
    pixel_input: PixelInput = "rgb",
    width: int | None = None,
    height: int | None = None,
    **options,
) -> Path:
    """Encode an iterable of frames or batches to ``path`` in one call; returns the path.

    The size is taken from the first item unless given. ``options`` go to :class:`Mp4Writer`
    (``crf``, ``preset``, ``metadata``, ``faststart``, ``workers``, ``segment_frames``).
    """
    writer: Mp4Writer | None = None
    try:
        for item in frames:
            if writer is None:
                shape = tuple(item.shape)
                if pixel_input == "rgb":
                    ih, iw = shape[-3], shape[-2]
                else:
                    ih, iw = shape[-2] * 2 // 3, shape[-1]
                writer = Mp4Writer(
                    path, width or iw, height or ih, fps, audio=audio, pixel_input=pixel_input, **options
                )
            writer.write(item)
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    if writer is None:
        raise MediaEncodeError(path, "no frames were given; refusing to create an empty video")
    return writer.close()
