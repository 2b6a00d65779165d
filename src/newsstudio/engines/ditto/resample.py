"""Ditto at any output frame rate: its 25 fps motion rows resampled, not its video.

Ditto's LMDM was trained on 25 fps motion, so the motion is always generated at 25 fps. For
another output rate (30 fps for broadcast, 50 / 60 for smooth playback) each output frame ``k`` is
shown at source time ``s = k * 25 / fps`` (in 25 fps frames) and gets the driving row between
source rows ``i = floor(s)`` and ``i + 1`` at ``w = s - i``:

* the head angles (pitch, yaw, roll: 66-bin logits whose softmax expectation is the angle) are
  mixed as probabilities, ``p = (1 - w) softmax(a) + w softmax(b)``, and stored as ``log p``: the
  angle the stitcher reads back is exactly ``(1 - w) angle_a + w angle_b`` (linear in Euler
  angles: between neighbouring 25 fps rows a head turns by a degree or so, where this and a
  quaternion SLERP agree to well under a hundredth of a degree);
* scale, translation and expression are linear;
* the blink index (which row of the eye-open schedule) is the nearer row's, and an idle (rest)
  row on either side makes the whole frame the nearer row's, so speech and rest never blend.

Each frame's own source-frame index, the splice and the audio stay at the output rate; only the
motion is resampled. An output frame needs the 25 fps row after its own (one 40 ms row of
look-ahead), which LMDM windows already hand out in blocks, so the time to first frame does not
change. At 25 fps the engine does not wrap its driver in this at all.
"""
from __future__ import annotations

import math
import numbers
from fractions import Fraction

import torch

from ...frame_rate import MAX_FPS
from ..base import FrameQueue
from .motion_stitch import MOTION_LAYOUT, POSE_KEYS

#: Output frame rates accepted (frames per second): up to every entry point's ceiling (frame_rate.py)
MIN_FPS = 1


def _pose_columns(offset: int) -> list[slice]:
    """Column slices of the three 66-bin angle blocks of a motion row starting at ``offset``."""
    out, s = [], offset
    for key, n in MOTION_LAYOUT:
        if key in POSE_KEYS:
            out.append(slice(s, s + n))
        s += n
    return out


def interpolate_driving_rows(a: torch.Tensor, b: torch.Tensor, w: torch.Tensor, motion_dim: int) -> torch.Tensor:
    """Driving rows ``[motion | d0 | blink index]`` (N, 2 * motion_dim + 1) between ``a`` and ``b``
    at weights ``w`` (N,) in [0, 1) (module doc). Rows with ``w == 0`` are ``a`` exactly."""
    if a.shape != b.shape or a.dim() != 2 or a.shape[1] != 2 * motion_dim + 1 or w.shape != a.shape[:1]:
        raise ValueError(f"rows must be (N, {2 * motion_dim + 1}) with (N,) weights, got {tuple(a.shape)}, "
                         f"{tuple(b.shape)}, {tuple(w.shape)}")
    wc = w.to(a.dtype)[:, None]
    out = torch.lerp(a, b, wc)
    for half in (0, motion_dim):  # the motion row and the stream's reference row d0
        for cols in _pose_columns(half):
            p = torch.lerp(torch.softmax(a[:, cols], -1), torch.softmax(b[:, cols], -1), wc)
            out[:, cols] = p.clamp_min(torch.finfo(a.dtype).tiny).log()
    blink = 2 * motion_dim
    nearer = torch.where((w < 0.5)[:, None], a, b)
    out[:, blink] = nearer[:, blink]
    idle = (a[:, blink] < -0.5) | (b[:, blink] < -0.5)
    out = torch.where(idle[:, None], nearer, out)
    return torch.where((w == 0)[:, None], a, out)


def check_fps(fps: float) -> Fraction:
    """The output rate as a Fraction, or a clear error."""
    if not isinstance(fps, numbers.Real) or not math.isfinite(float(fps)) or not MIN_FPS <= float(fps) <= MAX_FPS:
        raise ValueError(f"Ditto renders at {MIN_FPS}-{MAX_FPS} fps (motion generated at 25 fps and resampled); got fps={fps!r}")
    return (fps if isinstance(fps, Fraction) else Fraction(float(fps))).limit_denominator(1001)


class MotionResampler(FrameQueue):
    """A 25 fps Ditto driver's rows, handed out at ``fps`` (module doc). Push / close go to the
    wrapped driver; ``take`` returns interpolated rows of the same layout."""

    def __init__(self, inner: FrameQueue, source_fps: float, fps: float, motion_dim: int):
        self.inner = inner
        self.motion_dim = int(motion_dim)
        self.step = Fraction(source_fps).limit_denominator(1001) / check_fps(fps)  # source frames per output frame
        self._rows: torch.Tensor | None = None  # buffered source rows; the first is source row self._base
        self._base = 0
        self._next = 0  # next output frame
        self._closed = False

    def push(self, value: torch.Tensor) -> None:
        self.inner.push(value)

    def close(self) -> None:
        self.inner.close()
        self._closed = True

    def _pull(self) -> None:
        n = self.inner.ready
        if n:
            rows = self.inner.take(n)
            self._rows = rows if self._rows is None else torch.cat([self._rows, rows])

    def _source(self, k: int) -> tuple[int, Fraction]:
        s = k * self.step
        i = math.floor(s)
        return i, s - i

    @property
    def ready(self) -> int:
        self._pull()
        have = 0 if self._rows is None else int(self._rows.shape[0])
        if not have:
            return 0
        last = self._base + have - 1  # the last source row held
        if self._closed and self.inner.ready == 0:  # no more rows: the last one holds to the end
            count = math.ceil((last + 1) / self.step)  # frames k with s_k < last + 1
        else:  # frames k with s_k <= last: rows floor(s_k) and floor(s_k) + 1 held (or s_k on a row)
            count = math.floor(last / self.step) + 1
        return max(0, count - self._next)

    def take(self, n: int) -> torch.Tensor:
        ready = self.ready
        if n > ready:
            raise ValueError(f"asked for {n} frames, {ready} ready")
        assert self._rows is not None
        held = int(self._rows.shape[0])
        # s_k = k * p / q in integers, made where the rows are (no host-to-device copy per take)
        p, q = self.step.numerator, self.step.denominator
        kp = torch.arange(self._next, self._next + n, device=self._rows.device) * p
        ia = torch.div(kp, q, rounding_mode="floor") - self._base
        ib = torch.clamp(ia + 1, max=held - 1)
        w = torch.remainder(kp, q).to(self._rows.dtype) / q
        out = interpolate_driving_rows(self._rows.index_select(0, ia), self._rows.index_select(0, ib), w, self.motion_dim)
        self._next += n
        drop = self._source(self._next)[0] - self._base  # rows no later frame needs
        if drop > 0:
            drop = min(drop, held)
            self._rows = self._rows[drop:] if drop < held else None
            self._base += drop
        return out
