"""Reading video files (any container/codec FFmpeg knows) as RGB frames.

Frames come out as ``(H, W, 3)`` uint8 RGB in *display* orientation: a phone video stored
landscape with a "rotate 90" display matrix comes out portrait, as every player shows it.
The YUV -> RGB conversion uses the colour matrix and range the stream is tagged with; an
untagged stream is read as BT.601 limited range, FFmpeg's convention. Sample aspect ratio and
display-matrix flips are not applied (rare in talking-head sources).
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction

import av
import av.stream
import av.video.stream
import numpy as np

from ._container import MediaSource, check_not_truncated, decode_error, open_input
from .errors import EmptyVideoError, MediaDecodeError, NoVideoStreamError

__all__ = ["VideoInfo", "probe_video", "iter_video_frames", "frame_to_rgb"]


@dataclass(frozen=True)
class VideoInfo:
    """What the pipeline needs to know about a video before decoding it.

    ``width``/``height`` are the displayed size (after ``rotation``), i.e. the shape of the
    frames :func:`iter_video_frames` yields. ``rotation`` is the display rotation in degrees
    counter-clockwise (FFmpeg's convention; a portrait phone clip is usually -90).
    ``duration_s`` is the stream's duration (``frame_count / fps`` when the container has none).
    """

    width: int
    height: int
    fps: Fraction
    frame_count: int
    duration_s: float
    rotation: int
    codec: str
    has_audio: bool


def _video_stream(container: av.container.InputContainer, source: MediaSource) -> av.video.stream.VideoStream:
    for stream in container.streams.video:
        if not stream.disposition & av.stream.Disposition.attached_pic:  # skip cover art
            return stream
    kinds = ", ".join(s.type for s in container.streams) or "no streams"
    raise NoVideoStreamError(source, f"has no video stream (found: {kinds})")


def _frame_rate(stream: av.video.stream.VideoStream, source: MediaSource) -> Fraction:
    for rate in (stream.average_rate, stream.guessed_rate, stream.base_rate):
        if rate:
            return Fraction(rate)
    raise MediaDecodeError(source, "video stream has no frame rate")


def _rotation_quarters(frame: av.VideoFrame) -> int:
    """Display rotation of a decoded frame as quarter turns CCW (0..3)."""
    try:
        degrees = float(frame.rotation)
    except (AttributeError, TypeError, ValueError):
        return 0
    return int(round(degrees / 90.0)) % 4


def frame_to_rgb(frame: av.VideoFrame, *, apply_rotation: bool = True) -> np.ndarray:
    """A decoded frame as ``(H, W, 3)`` uint8 RGB, honouring its colour tags and rotation."""
    kwargs = {}
    if frame.color_range:  # tagged full ("JPEG") or limited; untagged stays FFmpeg's default
        kwargs["src_color_range"] = frame.color_range
    rgb = frame.to_ndarray(format="rgb24", **kwargs)
    if apply_rotation:
        k = _rotation_quarters(frame)
        if k:
            rgb = np.ascontiguousarray(np.rot90(rgb, k=k))
    return rgb


def _count_packets(container: av.container.InputContainer, stream, source: MediaSource) -> int:
    """Exact frame count by demuxing (no decoding) when the container does not store one."""
    count = 0
    try:
        for packet in container.demux(stream):
            if packet.size:
                count += 1
    except av.FFmpegError as exc:
        raise decode_error(source, exc, "video") from exc
    return count


def probe_video(path: str | os.PathLike | bytes) -> VideoInfo:
    """Size, rate, frame count, duration and rotation of a video, decoding only one frame.

    Raises :class:`NoVideoStreamError`, :class:`EmptyVideoError` (no decodable frame) or
    :class:`MediaDecodeError` (corrupt/truncated) naming the file.
    """
    with open_input(path) as container:
        stream = _video_stream(container, path)
        check_not_truncated(path, stream)
        fps = _frame_rate(stream, path)
        has_audio = len(container.streams.audio) > 0
        codec = stream.codec_context.name
        declared = int(stream.frames or 0)
        duration = float(stream.duration * stream.time_base) if stream.duration and stream.time_base else 0.0
        stream.thread_type = "AUTO"
        first = None
        try:
            for first in container.decode(stream):
                break
        except av.FFmpegError as exc:
            raise decode_error(path, exc, "video") from exc
        if first is None:
            raise EmptyVideoError(path, "video stream has no decodable frames")
        quarters = _rotation_quarters(first)
        width, height = first.width, first.height
        if declared > 0:
            frame_count = declared
        else:
            container.seek(0)
            frame_count = _count_packets(container, stream, path)
    if quarters % 2:
        width, height = height, width
    if duration <= 0:
        duration = float(frame_count / fps)
    return VideoInfo(
        width=width,
        height=height,
        fps=fps,
        frame_count=frame_count,
        duration_s=duration,
        rotation=(0, 90, 180, -90)[quarters],
        codec=codec,
        has_audio=has_audio,
    )


def iter_video_frames(
    path: str | os.PathLike | bytes, *, start: int = 0, limit: int | None = None
) -> Iterator[np.ndarray]:
    """Yield frames ``start, start+1, ...`` (at most ``limit``) as ``(H, W, 3)`` uint8 RGB.

    Frames are counted in decode (presentation) order from the first frame, which is exact
    for variable frame rate too; frames before ``start`` are decoded and dropped, so a large
    ``start`` costs decode time. The file is closed when the iterator is exhausted or closed.
    """
    if start < 0:
        raise ValueError(f"start must be >= 0, got {start}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}")
    if limit == 0:
        return
    with open_input(path) as container:
        stream = _video_stream(container, path)
        check_not_truncated(path, stream)
        stream.thread_type = "AUTO"
        index = 0
        yielded = 0
        frames = container.decode(stream)
        while True:
            try:
                frame = next(frames)
            except StopIteration:
                break
            except av.FFmpegError as exc:
                raise decode_error(path, exc, "video") from exc
            if index >= start:
                yield frame_to_rgb(frame)
                yielded += 1
                if limit is not None and yielded >= limit:
                    return
            index += 1
        if index == 0:
            raise EmptyVideoError(path, "video stream has no decodable frames")
