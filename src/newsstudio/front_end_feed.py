"""A stream's driving rows, made from its audio by the session's front end (conditioner + driver).

The runner (`stream.py`) asks for rows a chunk at a time. `FrontEndFeed` makes them in one of two ways:

* inline (the CPU default): the runner's thread feeds audio blocks through the front end when it asks,
  so a chunk's audio features and motion are made right before its render;
* ahead (the CUDA default): a thread of its own feeds the whole input as fast as it arrives, on a CUDA
  stream of its own, and hands rows over with an event each, so the next motion window (Ditto: HuBERT
  and four LMDM steps, thousands of small kernels) runs while the current chunk renders instead of
  between two renders. Measured on an H100 (fortieth session, `benchmarks.dense_stages`): Ditto dense
  303.6 -> 314.0 frames/s, the front end being 43 ms of a 544 ms, 165-frame stream.

Both give the same rows: one thread at a time drives the conditioner and driver, in the same order.
"""
from __future__ import annotations

import contextlib
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from fractions import Fraction
from typing import TYPE_CHECKING

import torch

from .accel.host_copy import to_host
from .accel.own_stream import borrowed_stream
from .audio.source import AudioSource, frames_for_samples

if TYPE_CHECKING:
    from .stream import StreamSession

# Pooled like the render workers (stream.py): a fresh thread pays for new cuBLAS handles on its first kernels.
_FRONT_END_POOL = ThreadPoolExecutor(max_workers=64, thread_name_prefix="newsstudio-front-end")


class FrontEndFeed:
    """Driving rows of one stream: ``wait(want)`` until ``want`` are ready or the input has ended
    (then ``total``, its frame count, is known), ``take(n)`` them in order. ``close()`` stops an
    ahead feed and waits for its thread (it may be waiting for live audio); so does ``stop``, the
    runner's own stop signal, at the feed's next audio block."""

    def __init__(self, session: "StreamSession", source: AudioSource, fps: Fraction, ahead: bool,
                 stop: threading.Event | None = None):
        self._session = session
        self._source = source
        self._fps = fps
        self.total: int | None = None  # frames of the whole input, once its end is known
        self._stop = threading.Event()
        self._outer_stop = stop
        self._finished = False  # the ahead thread has returned
        self._ahead = ahead
        self._cond = threading.Condition()
        self._pending: deque[tuple[torch.Tensor, torch.cuda.Event | None]] = deque()  # rows made, not yet taken
        self._error: BaseException | None = None
        self._future: Future | None = _FRONT_END_POOL.submit(self._run_ahead) if ahead else None

    # -- the front end itself ---------------------------------------------------------------------
    def _feed_block(self) -> int | None:
        """One audio block through the conditioner and driver; at the input's end, close both and
        return the input's frame count (None before)."""
        session, source = self._session, self._source
        block = source.pull()
        if block is not None and block.size:
            session.conditioner.push(block)
        if source.exhausted:
            session.conditioner.close()
            session.pump()
            session.driver.close()
            total = frames_for_samples(source.n_samples, source.sample_rate, self._fps)
            if total == 0:
                raise ValueError("the audio is empty (0 samples)")
            return total
        session.pump()
        return None

    def _run_ahead(self) -> None:
        dev = self._session.layer.device
        drv = self._session.driver
        try:
            with borrowed_stream(dev) as side, torch.cuda.stream(side) if side is not None else contextlib.nullcontext(), \
                    torch.inference_mode():
                while not self._stopped():
                    total = self._feed_block()
                    n = drv.ready
                    rows = drv.take(n) if n else None
                    event = None
                    if rows is not None and side is not None:
                        if self._session.engine.rows_on_host:
                            rows = to_host(rows)  # waits for this stream's work only (base.Engine.rows_on_host)
                        else:
                            event = torch.cuda.Event()
                            event.record(side)
                    with self._cond:  # the end is published with the last rows, never before them
                        if rows is not None:
                            self._pending.append((rows, event))
                        self.total = total
                        self._cond.notify_all()
                    if total is not None:
                        return
        except BaseException as e:  # noqa: BLE001 - raised in the runner's thread by wait()
            with self._cond:
                self._error = e
        finally:
            with self._cond:
                self._finished = True
                self._cond.notify_all()

    def _stopped(self) -> bool:
        return self._stop.is_set() or (self._outer_stop is not None and self._outer_stop.is_set())

    # -- the runner's side ------------------------------------------------------------------------
    def wait(self, want: int) -> int:
        """Rows ready once ``want`` are or the input has ended (fewer then: the engine may make
        fewer rows than the audio spans), or the feed was stopped before either."""
        if not self._ahead:
            drv = self._session.driver
            while drv.ready < want and self.total is None:
                self.total = self._feed_block()
            return drv.ready
        with self._cond:
            while self._ready() < want and self.total is None and self._error is None and not self._finished:
                self._cond.wait()
            if self._error is not None:
                raise self._error
            return self._ready()

    def _ready(self) -> int:
        """Rows made and not yet taken (under the lock)."""
        return sum(int(rows.shape[0]) for rows, _ in self._pending)

    def take(self, n: int) -> torch.Tensor:
        """The next ``n`` ready rows, usable on the caller's current CUDA stream."""
        if not self._ahead:
            return self._session.driver.take(n)
        parts: list[torch.Tensor] = []
        with self._cond:
            if n > self._ready():
                raise ValueError(f"take({n}) with only {self._ready()} rows ready")
            while n:
                rows, event = self._pending.popleft()
                if rows.shape[0] > n:
                    self._pending.appendleft((rows[n:], event))
                    rows = rows[:n]
                if event is not None:
                    here = torch.cuda.current_stream(rows.device)
                    here.wait_event(event)
                    rows.record_stream(here)  # made on the feed's stream: freed only once this one is done
                parts.append(rows)
                n -= int(rows.shape[0])
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def close(self) -> None:
        self._stop.set()
        if self._future is not None:
            self._future.result()  # never raises: the thread hands its error to wait()
