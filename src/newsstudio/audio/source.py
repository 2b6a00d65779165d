"""Audio input for the runner: a file, an array, or a live iterator of PCM chunks.

Why one abstraction: the runner must (a) feed the engine mono PCM at its model rate as it
arrives, and (b) hand back, with every chunk of frames, the ORIGINAL audio that plays with
exactly those frames, so muxers and WebRTC tracks get the source quality and the slices
concatenate back to the input bit for bit.
"""
from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterable, Iterator
from fractions import Fraction

import numpy as np
import soxr

from ..media.audio import Audio, audio_from_array, load_audio


def as_fraction(fps: float | Fraction) -> Fraction:
    """fps as an exact fraction (29.97 -> 30000/1001), so frame/sample boundaries never drift."""
    if isinstance(fps, Fraction):
        return fps
    if not math.isfinite(fps):  # Fraction() raises OverflowError / an unclear ValueError for these
        raise ValueError(f"fps must be positive, got {fps}")
    f = Fraction(fps).limit_denominator(1001)
    if abs(float(f) - float(fps)) > 1e-9:
        f = Fraction(fps).limit_denominator(1_000_000)
    if f <= 0:
        raise ValueError(f"fps must be positive, got {fps}")
    return f


def frame_sample(k: int, sample_rate: int, fps: Fraction) -> int:
    """First sample (at `sample_rate`) of frame k: round(k * sr / fps), exact."""
    return int(math.floor(Fraction(k * sample_rate) / fps + Fraction(1, 2)))


def frames_for_samples(n: int, sample_rate: int, fps: Fraction) -> int:
    """ceil(duration * fps) for n samples: the frame count of a finite input."""
    return int(math.ceil(Fraction(n) * fps / sample_rate))


class AudioSource:
    """Pulls PCM from any input, keeps the original samples, resamples to the model rate.

    `pull()` returns the next block of mono model-rate samples (or None at the end); the
    original multi-channel samples are retained so `original(a, b)` can slice any range.
    """

    def __init__(
        self,
        audio: str | os.PathLike[str] | Audio | tuple[np.ndarray, int] | Iterable[np.ndarray] | Iterable[Audio],
        model_rate: int,
        sample_rate: int | None = None,
        block_s: float = 0.5,
    ):
        self.model_rate = model_rate
        self._iter: Iterator[Audio]
        self.live = False
        self.total_samples: int | None = None  # known up front for a whole input, None for a live one
        if isinstance(audio, (str, os.PathLike)):
            a = load_audio(audio)
            self._iter = _blocks(a, block_s)
            self.total_samples = a.samples.shape[1]
            self.sample_rate, self.channels = a.sample_rate, a.samples.shape[0]
        elif isinstance(audio, Audio):
            self._iter = _blocks(audio, block_s)
            self.total_samples = audio.samples.shape[1]
            self.sample_rate, self.channels = audio.sample_rate, audio.samples.shape[0]
        elif isinstance(audio, tuple) and len(audio) == 2 and isinstance(audio[1], (int, np.integer)):
            a = audio_from_array(audio[0], int(audio[1]))
            self._iter = _blocks(a, block_s)
            self.total_samples = a.samples.shape[1]
            self.sample_rate, self.channels = a.sample_rate, a.samples.shape[0]
        else:
            self.live = True
            self._iter = _live(iter(audio), sample_rate)
            first = next(self._iter, None)
            if first is None:
                raise ValueError("the audio iterator produced no audio")
            self.sample_rate, self.channels = first.sample_rate, first.samples.shape[0]
            self._iter = _chain(first, self._iter)
        self._kept: list[np.ndarray] = []
        self._kept_lock = threading.Lock()  # pull() may run on a front-end thread while the runner slices
        self._base = 0  # absolute index of the first kept original sample
        self.n_samples = 0
        self.exhausted = False
        self._resampler = None if self.sample_rate == model_rate else soxr.ResampleStream(self.sample_rate, model_rate, 1, dtype="float32", quality="HQ")

    def pull(self) -> np.ndarray | None:
        """Next block of mono float32 samples at the model rate; None once the input ended."""
        if self.exhausted:
            return None
        a = next(self._iter, None)
        if a is None:
            self.exhausted = True
            if self._resampler is not None:
                tail = self._resampler.resample_chunk(np.zeros(0, np.float32), last=True)
                return tail.astype(np.float32, copy=False)
            return None
        if a.sample_rate != self.sample_rate or a.samples.shape[0] != self.channels:
            raise ValueError(f"audio chunk format changed mid-stream ({a.sample_rate} Hz x {a.samples.shape[0]} ch, expected {self.sample_rate} Hz x {self.channels} ch)")
        with self._kept_lock:
            self._kept.append(a.samples)
            self.n_samples += a.samples.shape[1]
        mono = a.samples.mean(axis=0).astype(np.float32, copy=False)
        if self._resampler is not None:
            mono = self._resampler.resample_chunk(mono, last=False).astype(np.float32, copy=False)
        return mono

    def original(self, start: int, stop: int) -> np.ndarray:
        """Original samples [start, stop) as (channels, n) float32 (clipped to what arrived)."""
        with self._kept_lock:
            if start < self._base:
                raise ValueError(f"samples before {self._base} were already released")
            if len(self._kept) > 1:
                self._kept = [np.concatenate(self._kept, axis=1)]
            if not self._kept:
                return np.zeros((self.channels, 0), np.float32)
            return self._kept[0][:, start - self._base : stop - self._base]

    def release_before(self, sample: int) -> None:
        """Forget original samples before `sample`, so hour-long live streams stay bounded."""
        with self._kept_lock:
            cut = sample - self._base
            if cut <= 0 or not self._kept:
                return
            if len(self._kept) > 1:
                self._kept = [np.concatenate(self._kept, axis=1)]
            self._kept = [self._kept[0][:, cut:]]
            self._base = sample


def _blocks(a: Audio, block_s: float) -> Iterator[Audio]:
    n = a.samples.shape[1]
    if n == 0:
        raise ValueError("the audio is empty (0 samples)")
    step = max(1, int(block_s * a.sample_rate))
    for i in range(0, n, step):
        yield a.slice_samples(i, i + step)


def _live(it: Iterator, sample_rate: int | None) -> Iterator[Audio]:
    for chunk in it:
        if isinstance(chunk, Audio):
            yield chunk
            continue
        if sample_rate is None:
            raise ValueError("live PCM chunks need sample_rate=... (or yield Audio objects)")
        yield audio_from_array(np.asarray(chunk), sample_rate)


def _chain(first: Audio, rest: Iterator[Audio]) -> Iterator[Audio]:
    yield first
    yield from rest
