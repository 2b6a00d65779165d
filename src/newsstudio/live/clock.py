"""The media clock of a live session and the time sources it reads (a scaled one for tests)."""
from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable
from fractions import Fraction
from typing import Literal

from ..audio.source import as_fraction, frame_sample


OUT_RATE = 48000
"""Output audio rate of a session (WebRTC/Opus native rate)."""

TimeSource = Callable[[], float]
State = Literal["idle", "buffering", "speaking", "closed"]


class ScaledTime:
    """A time source that runs `rate` times faster than the monotonic clock and can jump.

    `jump(seconds)` moves it forward at once (a test's "an hour passes"); `set(t)` pins it
    (fully simulated time: `advance(dt)` then moves it by hand)."""

    def __init__(self, rate: float = 1.0, start: float = 0.0):
        self.rate = float(rate)
        self._m0 = time.monotonic()
        self._offset = float(start)
        self._pinned: float | None = None
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            if self._pinned is not None:
                return self._pinned
            return self._offset + (time.monotonic() - self._m0) * self.rate

    def jump(self, seconds: float) -> None:
        with self._lock:
            if self._pinned is not None:
                self._pinned += seconds
            else:
                self._offset += seconds

    def set(self, t: float) -> None:
        with self._lock:
            self._pinned = float(t)

    def advance(self, dt: float) -> None:
        self.jump(dt)


class MediaClock:
    """The one clock audio and video share: media time 0 is the session's start.

    Positions are counters; `video_time(k) = k / fps` and `audio_time(s) = s / sr` are exact
    fractions, so a frame and the samples that play with it are due at the same instant."""

    def __init__(self, fps: Fraction, time_source: TimeSource | None = None, out_rate: int = OUT_RATE):
        self.fps = as_fraction(fps)
        self.out_rate = int(out_rate)
        self.time_source = time_source or time.monotonic
        self.origin = float(self.time_source())

    def now(self) -> float:
        """Media seconds since the session started."""
        return float(self.time_source()) - self.origin

    def video_time(self, k: int) -> float:
        return float(Fraction(k) / self.fps)

    def audio_time(self, s: int) -> float:
        return s / self.out_rate

    def frame_at(self, t: float) -> int:
        """Index of the frame on screen at media time t."""
        return int(math.floor(Fraction(t) * self.fps + Fraction(1, 10**9)))

    def next_frame(self, t: float) -> int:
        """First frame due at or after media time t."""
        return int(math.ceil(Fraction(t) * self.fps - Fraction(1, 10**9)))

    def frame_sample(self, k: int) -> int:
        """First output-audio sample of frame k (exact rational rounding, see audio.source)."""
        return frame_sample(k, self.out_rate, self.fps)

    def frame_of_sample(self, s: int) -> int:
        """First frame boundary at or after output sample s."""
        k = int(math.floor(Fraction(s) * self.fps / self.out_rate))
        while self.frame_sample(k) < s:
            k += 1
        return k

    def video_pts(self, k: int, clock_rate: int = 90000) -> int:
        """RTP-style pts of frame k at `clock_rate` (exact for 25, 30, 29.97, 24, 50 fps)."""
        return int(Fraction(k * clock_rate) / self.fps)

    async def sleep_until(self, t: float) -> None:
        """Sleep until media time t (re-reads the clock, so a jump or a scaled rate is honoured)."""
        rate = float(getattr(self.time_source, "rate", 1.0)) or 1.0
        while True:
            dt = t - self.now()
            if dt <= 0:
                return
            await asyncio.sleep(min(dt / rate, 0.25))
