"""Phase slots: line live sessions' render requests up so that shared GPU batches fill.

A live session asks for `render_ahead` frames at a time, at instants set by its own media clock,
and that clock starts when the session opens. Sessions opened at random moments ask at random
phases, so the shared `RenderBatcher` (engines/batching.py) mostly finds one or two requests
queued: on an H200, 8-12 MuseTalk sessions at 30 fps made batches of ~10-12 frames and topped out
near 300 frames/s, against 420-466 for the same render at batch 32 (benchmarks/RESULTS.md).

With phase slots the server starts each session's clock on a shared grid instead. The period
(render_ahead / fps) is cut into `slots` equal slots; a new session takes the slot the fewest live
sessions hold and its media time 0 is put at that slot's latest instant not after now, so it opens
at some media time in [0, period): no added latency, its first frame just has an index > 0. Its
renders end on multiples of render_ahead (``LiveSession(render_align=True)``), so the sessions of
one slot ask at the same instants and their requests coalesce into one batch, and the slots spread
the batches evenly over the period. A slot's batch then lands at once, so the sessions need a
render lead of at least one batch's time (``ServerConfig.render_lead_s``).
"""
from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from fractions import Fraction


@dataclass(frozen=True)
class PhaseSlot:
    """One session's place on the grid: its slot and its media clock's origin (time-source seconds)."""

    key: Hashable
    index: int
    origin: float


class PhaseGrid:
    """Hands out phase slots (module doc), balancing each key's sessions (engine, fps, render_ahead)
    over `slots` slots. Thread-safe; `give_back` a slot when its session closes."""

    def __init__(self, slots: int, time_source: Callable[[], float] | None = None):
        if slots < 1:
            raise ValueError(f"a phase grid needs at least one slot, got {slots}")
        self.slots = int(slots)
        self.time_source = time_source or time.monotonic
        self._held: dict[Hashable, list[int]] = {}
        self._lock = threading.Lock()

    def take(self, engine: str, fps: Fraction, render_ahead: int) -> PhaseSlot:
        """The least-held slot of this engine, rate and request size, with the origin a session
        opening now gets in it."""
        period = float(Fraction(int(render_ahead)) / Fraction(fps))
        key = (engine, Fraction(fps), int(render_ahead))
        with self._lock:
            held = self._held.setdefault(key, [0] * self.slots)
            index = min(range(self.slots), key=held.__getitem__)
            held[index] += 1
        offset = period * index / self.slots
        now = float(self.time_source())
        origin = math.floor((now - offset) / period) * period + offset
        return PhaseSlot(key, index, min(origin, now))

    def give_back(self, slot: PhaseSlot) -> None:
        with self._lock:
            held = self._held.get(slot.key)
            if held is not None and held[slot.index] > 0:
                held[slot.index] -= 1

    def held(self) -> dict[str, list[int]]:
        """Sessions per slot, by key (for /metrics)."""
        with self._lock:
            return {f"{e}@{float(f):g}fps/{a}": list(h) for (e, f, a), h in self._held.items()}
