"""Errors for media input/output.

Every failure to read or write a media file surfaces as a :class:`MediaError` that names the
file and says what is wrong with it, so a user who passes a broken upload sees "the file is
truncated" instead of a traceback from deep inside FFmpeg. ``MediaError`` subclasses
``ValueError`` because a bad file is a bad argument: callers (CLI, HTTP server) can map the
whole family to "400 / exit 2" with one ``except``.
"""
from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "MediaError",
    "MediaNotFoundError",
    "MediaDecodeError",
    "MediaEncodeError",
    "NoVideoStreamError",
    "NoAudioStreamError",
    "EmptyAudioError",
    "EmptyVideoError",
    "NonFiniteAudioError",
    "describe_source",
]


def describe_source(source: object) -> str:
    """A short human name for a path, bytes or file-like source, for error messages."""
    if isinstance(source, (str, os.PathLike)):
        return str(Path(source))
    if isinstance(source, (bytes, bytearray, memoryview)):
        return f"<{len(source)} bytes in memory>"
    name = getattr(source, "name", None)
    if isinstance(name, str):
        return name
    return f"<{type(source).__name__}>"


class MediaError(ValueError):
    """A media file could not be read or written; ``source`` names it, ``reason`` says why."""

    def __init__(self, source: object, reason: str) -> None:
        self.source = describe_source(source)
        self.reason = reason
        super().__init__(f"{self.source}: {reason}")


class MediaNotFoundError(MediaError, FileNotFoundError):
    """The path does not exist (also a ``FileNotFoundError`` for callers that expect one)."""

    def __init__(self, source: object, reason: str = "no such file") -> None:
        super().__init__(source, reason)


class MediaDecodeError(MediaError):
    """The file is corrupt, truncated, or not a format FFmpeg/Pillow understands."""


class MediaEncodeError(MediaError):
    """Writing the output failed (encoder or muxer error, or nothing was written)."""


class NoVideoStreamError(MediaError):
    """The container has no video stream (e.g. a .wav passed where a video is expected)."""


class NoAudioStreamError(MediaError):
    """The container has no audio stream (e.g. a silent .mp4 passed as speech)."""


class EmptyAudioError(MediaError):
    """An audio stream exists but holds zero samples."""


class EmptyVideoError(MediaError):
    """A video stream exists but no frame can be decoded from it."""


class NonFiniteAudioError(MediaError):
    """Audio samples that are NaN or infinite (float PCM from broken arithmetic): refused, since
    they would reach the models and the output as noise or silence instead of an error."""
