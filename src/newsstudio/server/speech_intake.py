"""Streamed speech from a socket into a live session, without the socket waiting on the model.

A client streams speech as many small PCM messages (20 ms each is usual). Each `push_speech` runs
the engine's share of the input (resampling, audio features, motion) and may wait on a shared GPU
batcher: MuseTalk re-encodes its Whisper piece every 100 ms through one batcher for all streams.
Read and pushed one message at a time, a stream whose pushes average more than 20 ms falls behind
real time for good: its speech prebuffer drains, renders get fewer frames than they ask for and
the avatar stalls in underruns, however fast the renderer is.

`SpeechIntake` decouples the two: the socket reader only queues what arrives, and one feeder task
pushes everything queued since its last call in a single `push_speech` (the streaming features are
the same either way up to their documented streaming error, which depends on when updates run).
Control messages keep their order with the speech: `speech_end` is queued behind it, and an
interrupt drops the speech queued before it (the cut would remove it anyway) and then runs
behind the one push in progress, if any. A reader that can wait (a WebSocket) calls `room()` after
each message: a client sending faster than the engine takes it is then held back by the socket's
flow control once `max_queued_s` of its speech waits, as when each message was pushed in turn.

``push_interval_s`` spaces the pushes: after one, speech that arrives is gathered for at least that
long before the next (controls still go at once, and the first push after a pause is not held).
Why: each push is a round trip through the speech pool on the event loop (~0.1 ms of its time with
the GIL held on the dev CPU) and a wake-up of a pool thread; with 16 sessions sending 20 ms
messages that is 800 a second. The cost: speech reaches the engine up to that much later, which
matters where it is not already waiting for a longer window (MuseTalk re-encodes every 100 ms).
"""
from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import Any

import numpy as np

from ..live import LiveSession

_END = "end"
_INTERRUPT = "interrupt"


class SpeechIntake:
    """Ordered speech input for one session (module doc). Call `pcm`, `end` and `interrupt` from the
    event loop; run `feed()` as a task: it returns when `close()` was called and the queue is empty.
    A failing step (a ValueError for speech the engine cannot take, a SessionError once the session
    closed) is raised from `feed`, or handed to `on_error` and feeding goes on when one is given."""

    def __init__(self, session: LiveSession, pool: Executor, sample_rate: int,
                 on_interrupted: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
                 on_error: Callable[[Exception], None] | None = None, max_queued_s: float = 10.0,
                 push_interval_s: float = 0.0):
        self.session = session
        self.pool = pool
        self.sample_rate = int(sample_rate)
        self.on_interrupted = on_interrupted
        self.on_error = on_error
        self._items: deque[Any] = deque()
        self._wake = asyncio.Event()
        self._queued = 0  # samples waiting in _items
        self._max_queued = max(1, int(max_queued_s * self.sample_rate))
        self._drained = asyncio.Event()
        self._drained.set()
        self._closed = False
        self.push_interval_s = max(0.0, float(push_interval_s))
        self._control = asyncio.Event()  # a control (end, interrupt, close) queued: stop gathering speech
        self._last_push = float("-inf")  # event-loop time of the last push
        self.pushes = 0  # push_speech calls made (tests check that pushes merge)
        self.messages = 0  # PCM messages received

    def pcm(self, samples: np.ndarray) -> None:
        if samples.size:
            self._items.append(samples)
            self.messages += 1
            self._count(samples.size)
            self._wake.set()

    async def room(self) -> None:
        """Until at most `max_queued_s` of speech waits to be pushed."""
        await self._drained.wait()

    def _count(self, samples: int) -> None:
        self._queued += samples
        if self._queued > self._max_queued:
            self._drained.clear()
        else:
            self._drained.set()

    def end(self) -> None:
        self._items.append(_END)
        self._wake.set()
        self._control.set()

    def interrupt(self) -> None:
        self._items.clear()  # speech that arrived before the interrupt: cut anyway, never pushed
        self._count(-self._queued)
        self._items.append(_INTERRUPT)
        self._wake.set()
        self._control.set()

    def close(self) -> None:
        """No more input: `feed` pushes what is queued, then returns."""
        self._closed = True
        self._wake.set()
        self._control.set()

    async def _gathered(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Whether the speech at the head of the queue waited `push_interval_s` since the last push
        (else: waited now, until then or a control; False to look at the queue again)."""
        wait = self._last_push + self.push_interval_s - loop.time()
        if wait <= 0 or self._closed or not all(isinstance(i, np.ndarray) for i in self._items):
            return True
        self._control.clear()
        try:
            await asyncio.wait_for(self._control.wait(), wait)
        except asyncio.TimeoutError:
            pass
        return False

    async def feed(self) -> None:
        loop = asyncio.get_running_loop()
        s = self.session
        while True:
            if not self._items:
                if self._closed:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            if self.push_interval_s and isinstance(self._items[0], np.ndarray) and not await self._gathered(loop):
                continue
            item = self._items.popleft()
            try:
                if isinstance(item, np.ndarray):
                    parts = [item]
                    while self._items and isinstance(self._items[0], np.ndarray):
                        parts.append(self._items.popleft())
                    pcm = parts[0] if len(parts) == 1 else np.concatenate(parts)
                    self._count(-pcm.size)
                    self.pushes += 1
                    self._last_push = loop.time()
                    await loop.run_in_executor(self.pool, s.push_speech, pcm, self.sample_rate)
                elif item == _END:
                    await loop.run_in_executor(self.pool, s.end_speech)
                else:
                    info = s.interrupt()
                    if self.on_interrupted is not None:
                        await self.on_interrupted(info)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - raised, or reported and fed on (see the class doc)
                if self.on_error is None:
                    raise
                self.on_error(e)
