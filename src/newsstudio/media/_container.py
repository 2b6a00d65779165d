"""Opening inputs with PyAV so that every failure becomes a :class:`MediaError`.

FFmpeg reports a broken file in many ways (``InvalidDataError`` on open, on demux or on
decode, or simply an early EOF when an mp4 with its index first is cut short). These helpers
funnel all of them into messages that name the file and the problem.
"""
from __future__ import annotations

import io
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Union

import av
import av.container
import av.stream

from .errors import MediaDecodeError, MediaNotFoundError

# PyAV < 19 decodes container metadata strictly unless told otherwise (a file with a mis-encoded
# title would not open); PyAV 19 dropped the keyword, and ``av.open`` refuses it there.
_METADATA_ERRORS = {"metadata_errors": "replace"} if int(av.__version__.split(".")[0]) < 19 else {}

MediaSource = Union[str, os.PathLike, bytes, bytearray, memoryview, BinaryIO]


def ffmpeg_reason(exc: BaseException) -> str:
    """FFmpeg's own words for an error, without the errno noise."""
    text = getattr(exc, "strerror", None) or str(exc)
    return str(text).rstrip(".")


@contextmanager
def open_input(source: MediaSource) -> Iterator[av.container.InputContainer]:
    """Open a path, bytes or binary file object for reading; always closes it.

    A RIFF/WAVE file is opened without FFmpeg's stream probing: its header already states codec,
    rate and channels, and probing (decoding ahead to guess them) cost 5 ms of a 15 s speech
    file's 7 ms load, which every render and stream pays before its first frame."""
    target: object
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.exists():
            raise MediaNotFoundError(path)
        if path.is_dir():
            raise MediaDecodeError(path, "is a folder, not a media file")
        if path.stat().st_size == 0:
            raise MediaDecodeError(path, "file is empty (0 bytes)")
        target = str(path)
    elif isinstance(source, (bytes, bytearray, memoryview)):
        if len(source) == 0:
            raise MediaDecodeError(source, "no data (0 bytes)")
        target = io.BytesIO(bytes(source))
    elif hasattr(source, "read"):
        target = source
    else:
        raise TypeError(f"expected a path, bytes or a binary file object, got {type(source).__name__}")
    options = {"probesize": "32", "analyzeduration": "0"} if is_wav(source) else None
    try:
        container = av.open(target, mode="r", options=options, **_METADATA_ERRORS)
    except av.FFmpegError as exc:
        raise MediaDecodeError(
            source, f"cannot be opened as audio/video ({ffmpeg_reason(exc)}): corrupt, truncated, "
            "or not a media file"
        ) from exc
    try:
        yield container
    finally:
        container.close()


def source_size(source: MediaSource) -> int | None:
    """Size in bytes of a path or in-memory source (None for streams)."""
    if isinstance(source, (str, os.PathLike)):
        return Path(source).stat().st_size
    if isinstance(source, (bytes, bytearray, memoryview)):
        return len(source)
    return None


def check_not_truncated(source: MediaSource, stream: av.stream.Stream) -> None:
    """Refuse a file whose own index points past its end (an mp4 with 'moov' first, cut short).

    Such files open fine and decode until the data stops, so without this check a truncated
    upload would silently render a shorter clip.
    """
    size = source_size(source)
    if size is None:
        return
    try:
        entries = stream.index_entries
        end = max((e.pos + e.size for e in entries if e.pos >= 0), default=0)
    except (AttributeError, TypeError):  # older PyAV or a demuxer without an index
        return
    if end > size:
        raise MediaDecodeError(
            source,
            f"file is truncated: its index expects at least {end} bytes but it has {size}",
        )


def decode_error(source: MediaSource, exc: BaseException, what: str) -> MediaDecodeError:
    """A MediaDecodeError for an FFmpeg failure while demuxing/decoding ``what``."""
    return MediaDecodeError(
        source, f"corrupt or truncated {what} data ({ffmpeg_reason(exc)})"
    )


def _head(source: MediaSource, n: int) -> bytes | None:
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as fh:
            return fh.read(n)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source[:n])
    return None


def is_wav(source: MediaSource) -> bool:
    """Whether a path or in-memory source starts with a RIFF/WAVE header (streams: unknown, False)."""
    try:
        head = _head(source, 12)
    except OSError:
        return False
    return bool(head) and len(head) == 12 and head[:4] == b"RIFF" and head[8:12] == b"WAVE"


def check_wav_complete(source: MediaSource) -> None:
    """Refuse a RIFF/WAVE file whose ``data`` chunk claims more bytes than the file holds.

    FFmpeg quietly clamps such a chunk to the file size, so a cut-off upload would play as
    shorter speech. Sizes 0 and 0xFFFFFFFF mean "unknown" (streamed WAV) and are accepted.
    """
    head = _head(source, 1 << 16)
    if not head or len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return
    size = source_size(source)
    if size is None:
        return
    pos = 12
    while pos + 8 <= len(head):
        chunk_id = head[pos : pos + 4]
        chunk_size = int.from_bytes(head[pos + 4 : pos + 8], "little")
        if chunk_id == b"data":
            if chunk_size in (0, 0xFFFFFFFF):
                return
            expected = pos + 8 + chunk_size
            if expected > size:
                raise MediaDecodeError(
                    source,
                    f"WAV file is truncated: its header announces {chunk_size} bytes of audio "
                    f"but only {size - pos - 8} are present",
                )
            return
        pos += 8 + chunk_size + (chunk_size & 1)
