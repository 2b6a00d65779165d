"""Driving a session with a simulated client, for tests and the load benchmark."""
from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

import numpy as np
import torch

from .clock import ScaledTime
from .session import LiveSession


def drive_simulated(
    session: LiveSession,
    time_source: ScaledTime,
    until: float,
    *,
    audio_block: int = 960,
    on_video: Callable[[int, torch.Tensor], None] | None = None,
    on_audio: Callable[[int, np.ndarray], None] | None = None,
    before: Callable[[float], None] | None = None,
) -> None:
    """Play a session in simulated time: pull video frames and `audio_block`-sample audio
    blocks in the order they fall due, pinning the clock to each due time, until media time
    `until`. This is what the real-time consumers (WebRTC tracks) do, minus the waiting, so a
    test can run an hour of media in seconds. `before(t)` runs before each pull (e.g. to
    feed streamed speech that has "arrived" by t)."""
    fps = session.fps
    rate = session.out_rate
    while True:
        k, s = session.video_cursor, session.audio_cursor
        tv, ta = Fraction(k) / fps, Fraction(s, rate)
        t = min(tv, ta)
        if t > until + 1e-9:
            return
        time_source.set(session.clock.origin + float(t))
        if before is not None:
            before(float(t))
        if tv <= ta:
            f = session.video_frame(k)
            if on_video is not None:
                on_video(k, f)
        else:
            a = session.audio_samples(s, audio_block)
            if on_audio is not None:
                on_audio(s, a)
