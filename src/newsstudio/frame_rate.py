"""The output frame-rate rule: one range and one set of messages for every entry point (CLI
render / stream / serve, stream_generator, live sessions, HTTP /clips, the /ws start message,
WebRTC offers), so a rate is accepted or refused the same way wherever it is typed.

Why MAX_FPS = 120: it is the highest rate every engine renders. Ditto generates its motion at
25 fps and resamples it for 1-120 fps (engines/ditto/resample.py takes its ceiling from here); classic
and MuseTalk have no ceiling of their own, but a rate far above what displays show (`--fps 500`
wrote 500 frames per second of speech) is a typo, not a presenter, and one ceiling for all engines
means a rate that works with one engine works with the others.
"""
from __future__ import annotations

import math
import numbers
from fractions import Fraction

MAX_FPS = 120


def frame_rate_error(fps: object) -> str | None:
    """What is wrong with `fps` as an output frame rate, or None when it is usable."""
    if isinstance(fps, bool) or not isinstance(fps, numbers.Real):
        return f"fps must be a number, got {fps!r}"
    value = float(fps)
    if not math.isfinite(value):
        return f"fps must be a finite number, got {value:g}"
    if value <= 0:
        return f"fps must be positive, got {value:g}"
    if value > MAX_FPS:
        return f"fps must be at most {MAX_FPS} (the highest frame rate every engine renders), got {value:g}"
    return None


def check_frame_rate(fps: float | Fraction) -> Fraction:
    """`fps` as an exact Fraction, or ValueError with frame_rate_error's text."""
    from .audio.source import as_fraction  # here: the CLI imports MAX_FPS for its help, and numpy is slow to load

    error = frame_rate_error(fps)
    if error is not None:
        raise ValueError(error)
    return as_fraction(fps)
