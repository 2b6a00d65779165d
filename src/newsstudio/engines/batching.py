"""One GPU, many live streams: merge the render calls that streams make at the same time.

Each live session renders a few frames at a time (its chunk), from its own thread. On a GPU,
16 sessions each running a batch of 2-4 frames leave most of the chip idle, and the network
calls queue up behind each other anyway. `RenderBatcher` puts every `render` request in one
queue; a single render thread takes *everything queued when it becomes free* (up to
`max_frames`) and runs it as one `engine.render_many` call -- across streams and across avatars
where the engine supports it (MuseTalk, Ditto) -- then hands each stream its slice.

No request waits for company: at low load a request is rendered alone at once (no added
latency); under load requests pile up while the previous batch runs, and the next batch takes
them all, so the GPU works on bigger batches exactly when it is busy. `window_s` > 0 adds a short
wait for more requests (throughput over latency). A batch that fails is retried request by
request, so one stream's bad input fails only that stream.

``max_in_flight`` (CUDA only): on the shared stream a finished *dispatch* is not a finished batch, so
the worker can queue batch after batch ahead of the GPU, each holding only what arrived during the
last dispatch (~a millisecond), and every session's splice and copy-out then waits behind all of
them. With ``max_in_flight=n`` the worker takes its next batch only once at most n-1 of its batches
are still running on the GPU (it sleeps on their events), so requests gather while the GPU works and
batches are formed at the GPU's pace.

`Batcher` is the generic queue + worker; `RenderBatcher` batches `engine.render_many`, and
`engines.ditto.lmdm.MotionBatcher` batches Ditto's LMDM windows (each stream still draws its own
noises, so its motion is what it would sample alone).

``own_stream`` (CUDA only): the worker runs its batches on a CUDA stream of its own instead of the
default stream every server thread shares. Why: that stream is one in-order queue, so a front-end
burst (an LMDM window, a Whisper re-encode) delays every session's render and copy-out queued
behind it. The worker makes its stream wait for each caller's inputs (an event recorded on the
caller's stream at submit), waits for its own batch to finish, and marks each output as used by its caller's stream
(``record_stream``) before handing it over: callers get finished tensors and the memory is not
reused under them.

``finish`` (per request): a function the worker applies to that request's result right after its
batch, before the next batch is launched. Why: a live session splices its faces into its frames and
copies them out; done on the session's own thread, that work is queued on the shared stream *behind*
whatever batch the worker launched meanwhile, so every chunk waited one more batch. Run in the
worker, it follows its own batch directly. A failing ``finish`` fails only its request.

``batch_done`` (CUDA, shared stream): each request's future carries the event recorded right after
its batch's GPU work. Why: a caller that continues on another stream (`RenderBatcher.render_for_stream`)
waits for *its* batch only, not for the batches the worker queued on the shared stream since.

``stall_s``: a batch that has run longer than this is a stall (a wedged GPU stream: an H200 server
once kept one batch of Ditto's motion batcher waiting in ``synchronize`` for good, and every live
session waiting on it fell silent with no error). Callers waiting through :meth:`Batcher.wait`
then get a :class:`BatchStalledError` instead of waiting forever, and :meth:`Batcher.busy_for_s`
lets a server's health check report it. Queue time does not count, only the batch running now.

``fill_buckets`` (with ``buckets``, the sizes the render actually runs, and ``split``/``join``): when the
next request does not fit in what is left of ``max_frames``, its first frames top the batch up to the bucket
it runs in anyway, and the rest goes first into the next batch. Why: a compiled render runs a batch of n
frames at the cost of the smallest bucket that holds n, so under load, where requests of ~16 frames
from 16 sessions met as batches of 25-29 frames, 3-7 of every 32 frames rendered were padding (an H100,
twenty-sixth session: 15.5 batches/s of ~28 frames = 433 frames/s, where full batches would make ~496).
The split request's caller gets all its frames, joined, after the second batch.
"""
from __future__ import annotations

import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import torch

from ..accel.own_stream import new_stream
from ..accel.static import GRAPH_MODES, _tree_map
from .base import AvatarLayer, Engine


T = TypeVar("T")
R = TypeVar("R")


class BatchStalledError(RuntimeError):
    """The batch a caller waits for (or the one ahead of it) has run longer than the batcher's
    ``stall_s``: the device is not finishing its work."""


@dataclass
class _Request(Generic[T]):
    item: T
    size: int
    finish: "Callable[[Any], Any] | None" = None  # run by the worker on this request's result (module doc)
    future: Future = field(default_factory=Future)
    queued_at: float = field(default_factory=time.monotonic)
    stream: "torch.cuda.Stream | None" = None  # the caller's CUDA stream (own_stream batchers)
    ready: "torch.cuda.Event | None" = None  # recorded on it at submit: the inputs are made by then
    parent: "_Request | None" = None  # set on the head of a split request: its result waits in parent.parts
    parts: list = field(default_factory=list)  # results of this request's frames rendered in earlier batches


@dataclass
class BatcherStats:
    """Counters since start (cumulative, so a monitor takes differences over its own window).
    ``wait_s``: time requests spent queued before their batch started (summed; ``max_wait_s`` the
    longest); ``busy_s``: time the worker spent inside ``run_many`` (on a GPU, dispatch time:
    kernels may still run after it returns)."""

    requests: int = 0
    batches: int = 0
    frames: int = 0
    largest_batch: int = 0
    wait_s: float = 0.0
    max_wait_s: float = 0.0
    busy_s: float = 0.0
    bucket_frames: int = 0  # frames the batches ran as (padded up to their buckets), where buckets are known
    split_requests: int = 0  # requests split across two batches to fill a bucket (module doc)

    def as_dict(self) -> dict[str, float]:
        return {"requests": self.requests, "batches": self.batches, "frames": self.frames,
                "largest_batch_frames": self.largest_batch, "bucket_frames": self.bucket_frames,
                "split_requests": self.split_requests,
                "requests_per_batch": self.requests / self.batches if self.batches else 0.0,
                "wait_s_total": round(self.wait_s, 6), "max_wait_ms": round(self.max_wait_s * 1e3, 3),
                "busy_s_total": round(self.busy_s, 6)}


class Batcher(Generic[T, R]):
    """`run_many(items) -> results` on whatever is queued when the worker thread is free (see the
    module doc); `submit(item)` from any thread returns a Future. ``size_of(item)`` counts frames
    toward ``max_frames`` per batch. `close()` stops the thread (pending requests fail)."""

    def __init__(self, run_many: Callable[[list[T]], list[R]], size_of: Callable[[T], int], *, max_frames: int = 32,
                 window_s: float = 0.0, autostart: bool = True, name: str = "batcher",
                 device: torch.device | str | None = None, own_stream: bool = False, max_in_flight: int = 0,
                 split: "Callable[[T, int], tuple[T, T]] | None" = None, join: "Callable[[list[R]], R] | None" = None,
                 buckets: tuple[int, ...] | None = None, fill_buckets: bool = False):
        if max_frames < 1:
            raise ValueError(f"max_frames must be >= 1, got {max_frames}")
        self.device = torch.device(device) if device is not None else None
        self.own_stream = False
        self._bound = 0  # the bound asked for; `max_in_flight` is what is in force
        self.set_own_stream(own_stream)
        self.set_max_in_flight(max_in_flight)
        self._in_flight: deque[torch.cuda.Event] = deque()
        self._stream: torch.cuda.Stream | None = None
        self.run_many, self.size_of = run_many, size_of
        self.split, self.join = split, join
        self.buckets = buckets  # the sizes batches run as (None: as they come)
        self.fill_buckets = bool(fill_buckets)  # see the module doc; needs buckets, split and join
        self._carry: deque[_Request[T]] = deque()  # split tails: first into the next batch (worker thread only)
        self.max_frames = int(max_frames)
        self.window_s = float(window_s)
        self.name = name
        self.stats = BatcherStats()
        self.stall_s: float | None = None  # see the module doc; None: wait as long as it takes
        self._running_since: float | None = None  # monotonic start of the batch running now
        self._q: queue.Queue[_Request[T] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._closed = False
        self._autostart = autostart

    def set_max_in_flight(self, n: int) -> None:
        """Bound the batches on the GPU at once (module doc; 0: no bound). Takes effect at the next
        batch; nothing to bound off CUDA or on an own stream (each batch is waited for there)."""
        if n < 0:
            raise ValueError(f"max_in_flight must be >= 0 (0: no bound), got {n}")
        self._bound = int(n)

    @property
    def max_in_flight(self) -> int:
        """The bound in force: the one asked for on the shared CUDA stream, else 0."""
        on_shared_cuda_stream = self.device is not None and self.device.type == "cuda" and not self.own_stream
        return self._bound if on_shared_cuda_stream else 0

    def set_own_stream(self, on: bool) -> None:
        """Run the next batches on a CUDA stream of this worker's own (module doc) or on the shared
        one; nothing changes off CUDA. Requests queued before the switch run the way they were
        submitted (a batch goes to the own stream only if every request in it came with its event),
        so a server can switch between live sessions' requests without losing any."""
        self.own_stream = bool(on) and self.device is not None and self.device.type == "cuda"

    # -- callers ------------------------------------------------------------------------------
    def submit(self, item: T, finish: Callable[[R], Any] | None = None) -> Future:
        """Queue `item`; the future gets its result, or ``finish(result)`` where given (run by the
        worker right after the batch: see the module doc)."""
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed")
        req = _Request(item, int(self.size_of(item)), finish)
        caller = _foreign_stream(self.device) if not self.own_stream else torch.cuda.current_stream(self.device)
        if caller is not None:  # an own-stream batch, or a caller off the shared stream: its inputs' event
            req.stream = caller
            req.ready = torch.cuda.Event()
            req.ready.record(caller)
        self._q.put(req)
        if self._autostart:
            self.start()
        return req.future

    @property
    def busy_for_s(self) -> float:
        """Seconds the batch running now has been running (0 when the worker is idle)."""
        since = self._running_since
        return 0.0 if since is None else time.monotonic() - since

    def stalled(self) -> bool:
        """Whether the batch running now has run longer than ``stall_s``."""
        return self.stall_s is not None and self.busy_for_s > self.stall_s

    def wait(self, future: Future) -> R:
        """The result of a submitted request; with ``stall_s`` set, a `BatchStalledError` once the
        worker's current batch has run longer than that, instead of waiting for good."""
        if self.stall_s is None:
            return self._handed_over(future, future.result())
        while True:
            try:
                return self._handed_over(future, future.result(timeout=min(1.0, self.stall_s)))
            except FutureTimeout:
                if self.stalled():
                    raise BatchStalledError(
                        f"{self.name}: its batch on {self.device or 'the device'} has run for {self.busy_for_s:.1f} s "
                        f"(limit {self.stall_s:g} s); the device is not finishing its work") from None

    def _handed_over(self, future: Future, out: R) -> R:
        """``out`` made usable on a caller off the shared stream (a stream's front end run ahead on
        its own: front_end_feed.py): its stream waits for the request's batch, and the output's
        memory is not reused before that stream is done with it. Callers on the shared stream, and
        own-stream batches (handed over finished), need nothing."""
        done = getattr(future, "batch_done", None)
        caller = _foreign_stream(self.device) if done is not None else None
        if caller is not None:
            _hand_to(caller, out, done)
        return out

    def start(self) -> None:
        with self._start_lock:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self._thread.start()

    def close(self) -> None:
        self._closed = True
        self._q.put(None)
        if self._thread is not None:
            self._thread.join(timeout=30)
        while self._carry:  # split tails the worker did not get to
            self._q.put(self._carry.popleft())
        while True:  # anything still queued
            try:
                req = self._q.get_nowait()
            except queue.Empty:
                break
            if req is not None and not req.future.done():
                req.future.set_exception(RuntimeError(f"{type(self).__name__} closed before this request ran"))

    # -- the worker thread ----------------------------------------------------------------------
    def bucket_of(self, n: int) -> int:
        """The size a batch of n frames runs as: its bucket (n itself without buckets or past the largest)."""
        return next((b for b in self.buckets or () if b >= n), n)

    def _take_batch(self, first: _Request[T]) -> tuple[list[_Request[T]], bool]:
        batch, n, stop = [first], first.size, False
        deadline = time.monotonic() + self.window_s
        while n < self.max_frames:
            try:
                wait = deadline - time.monotonic()
                req = self._q.get_nowait() if wait <= 0 else self._q.get(timeout=wait)
            except queue.Empty:
                break
            if req is None:
                stop = True
                break
            if n + req.size > self.max_frames:
                head = self._split_off(req, n)
                if head is None:
                    self._q.put(req)  # next batch (order between streams does not matter)
                else:
                    batch.append(head)
                    n += head.size
                    self._carry.append(req)  # its other frames lead the next batch
                break
            batch.append(req)
            n += req.size
        return batch, stop

    def _split_off(self, req: _Request[T], n: int) -> "_Request[T] | None":
        """The first frames of `req` that fill a batch of n frames up to the bucket it runs as (`req`
        keeps the rest), or None where nothing is to gain or splitting is off."""
        if not (self.fill_buckets and self.buckets and self.split is not None and self.join is not None):
            return None
        room = min(self.bucket_of(n), self.max_frames) - n
        if room <= 0 or room >= req.size:
            return None
        head_item, req.item = self.split(req.item, room)
        req.size -= room
        self.stats.split_requests += 1
        return _Request(head_item, room, stream=req.stream, ready=req.ready, parent=req)

    def _loop(self) -> None:
        while True:
            first = self._carry.popleft() if self._carry else self._q.get()
            if first is None:
                return
            if first.future.done():  # a split tail whose head failed
                continue
            self._running_since = time.monotonic()  # a stall clock from here: the wait for earlier batches counts
            self._wait_for_gpu()
            batch, stop = self._take_batch(first)
            now = time.monotonic()
            waits = [now - r.queued_at for r in batch]
            s = self.stats
            s.requests += len(batch)
            s.wait_s += sum(waits)
            s.max_wait_s = max(s.max_wait_s, *waits)
            t0 = time.perf_counter()
            try:
                self._run(batch)
            finally:
                self._running_since = None
            s.busy_s += time.perf_counter() - t0
            if self.max_in_flight:
                done = torch.cuda.Event(blocking=True)  # sleep on it, do not spin
                done.record(torch.cuda.current_stream(self.device))
                self._in_flight.append(done)
            if stop:
                return

    def _wait_for_gpu(self) -> None:
        """Until fewer than ``max_in_flight`` of this worker's batches are still on the GPU."""
        while self._in_flight and len(self._in_flight) >= self.max_in_flight:
            self._in_flight.popleft().synchronize()
        while self._in_flight and self._in_flight[0].query():
            self._in_flight.popleft()

    def _run(self, batch: list[_Request[T]]) -> None:
        """One `run_many` call (stats count every call; a failed batch's retries are calls too)."""
        s = self.stats
        s.batches += 1
        frames = sum(r.size for r in batch)
        s.frames += frames
        s.largest_batch = max(s.largest_batch, frames)
        s.bucket_frames += self.bucket_of(frames) if self.buckets else 0
        own = self.own_stream and all(r.ready is not None for r in batch)
        try:
            with torch.inference_mode():
                items = [r.item for r in batch]
                if not own:  # on the shared stream: after the inputs of callers off it (their events)
                    for r in batch:
                        if r.ready is not None:
                            torch.cuda.current_stream(self.device).wait_event(r.ready)
                outs = self._run_on_own_stream(items, batch) if own else self._joined(batch, self.run_many(items))
        except BaseException as exc:  # noqa: BLE001 - retried one by one below
            if len(batch) == 1:
                failed = batch[0].parent or batch[0]  # a split head fails its whole request
                if not failed.future.done():
                    failed.future.set_exception(exc)
                return
            for r in batch:
                self._run([r])
            return
        done = self._batch_done_event(own)
        for r, out in zip(batch, outs):
            if r.parent is not None or r.future.done():  # a split head (its frames wait), or already failed
                continue
            r.future.batch_done = done  # type: ignore[attr-defined]
            if r.finish is None:
                r.future.set_result(out)
                continue
            try:
                r.future.set_result(r.finish(out))
            except BaseException as exc:  # noqa: BLE001 - this request's own failure
                r.future.set_exception(exc)

    def _joined(self, batch: list[_Request[T]], outs: list[R]) -> list[R]:
        """Each split head's result set aside on its request; a request's last part joined with its
        earlier ones (queued on the batch's stream, before its done event)."""
        joined = list(outs)
        for k, (r, out) in enumerate(zip(batch, outs)):
            if r.parent is not None:
                r.parent.parts.append(out)
            elif r.parts:
                joined[k] = self.join([*r.parts, out])  # type: ignore[misc]
                r.parts = []
        return joined

    def _batch_done_event(self, own: bool) -> "torch.cuda.Event | None":
        """An event after the batch just launched on the shared CUDA stream (module doc); None off
        CUDA or on an own stream (its outputs are handed over finished)."""
        if own or self.device is None or self.device.type != "cuda":
            return None
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(self.device))
        return done

    def _run_on_own_stream(self, items: list[T], batch: list[_Request[T]]) -> list[R]:
        """`run_many` on this worker's CUDA stream, handed over finished (see the module doc)."""
        if self._stream is None:  # not a pooled stream: an engine loaded meanwhile may capture graphs on one
            self._stream = new_stream(self.device)
        own = self._stream
        for r in batch:  # the inputs were made on the callers' streams (other work queued there since is not waited for)
            own.wait_event(r.ready)
        with torch.cuda.stream(own):
            outs = self._joined(batch, self.run_many(items))
        # sleep until the batch is done: a stream's synchronize spins a CPU core (CUDA's default on a host
        # with more cores than GPUs) for as long as the batch queues behind the render's on the GPU
        done = torch.cuda.Event(blocking=True)
        done.record(own)
        done.synchronize()
        for r, out in zip(batch, outs):  # freed by its caller: not reused before that caller's queued work is done
            _hand_to(r.stream, out, None)
        return outs


def _hand_to(stream: torch.cuda.Stream, out: Any, done: "torch.cuda.Event | None") -> None:
    """A batch's output ``out`` given to ``stream``: the stream waits for the batch (its ``done`` event,
    None where it is finished already), and the output's memory is not reused before the stream is
    done with it."""
    if done is not None:
        stream.wait_event(done)
    _tree_map(lambda t: t.record_stream(stream) if t.is_cuda else None, out)


def _foreign_stream(device: torch.device | None) -> "torch.cuda.Stream | None":
    """The calling thread's CUDA stream where it is not the shared (default) stream a worker runs its
    shared-stream batches on; None on the shared stream or off CUDA."""
    if device is None or device.type != "cuda":
        return None
    here = torch.cuda.current_stream(device)
    return None if here == torch.cuda.default_stream(device) else here


COMPOSE_MODES = ("session", "worker", "stream")


def check_compose(mode: str) -> str:
    """``mode`` if it is one of `COMPOSE_MODES`, else a ValueError naming them."""
    if mode not in COMPOSE_MODES:
        raise ValueError(f"compose must be one of {', '.join(COMPOSE_MODES)}, got {mode!r}")
    return mode


class RenderBatcher(Batcher[tuple[AvatarLayer, torch.Tensor, torch.Tensor], torch.Tensor]):
    """`render(layer, driving, frame_idx)` with the engine's signature, from any thread, through
    one `engine.render_many` call per batch (see the module doc).

    ``compose``: where the sessions that render through it splice their faces into their frames and
    start the copy-out (`StreamSession.render_frames_host`; CUDA only, elsewhere always "session"):
    "session": on the session's thread and the shared stream, queued behind whatever batches the
    worker launched meanwhile; "worker": in the worker right after the batch (``finish``);
    "stream": on the session's thread but on `compose_stream`, a high-priority stream that waits for
    the session's own batch only, so the splice and copy run next to the following batch instead
    of after it."""

    def __init__(self, engine: Engine, max_frames: int | None = None, window_s: float = 0.0, autostart: bool = True,
                 max_in_flight: int = 0, compose: str = "session", fill_buckets: bool = False):
        buckets = engine.render_buckets()
        if max_frames is None:  # the engine's largest bucket (a larger batch would run as several), else 32
            max_frames = max(buckets) if buckets else 32
        super().__init__(engine.render_many, lambda item: int(item[2].shape[0]), max_frames=max_frames,
                         window_s=window_s, autostart=autostart, name=f"render-batcher-{engine.name}",
                         device=engine.device, max_in_flight=max_in_flight, split=_split_render, join=torch.cat,
                         buckets=buckets, fill_buckets=fill_buckets)
        self.engine = engine
        self.compose = check_compose(compose)
        # "stream" compose of each session through CUDA graphs of its own (compose/session_graphs.py),
        # where the engine replays CUDA graphs: the same bytes in ~7 torch calls instead of ~36 (live
        # levels of 16 MuseTalk sessions on time with it, thirty-third session); `serve --no-compose-graphs`
        self.compose_graphs = engine.device.type == "cuda" and getattr(engine, "accel", None) in GRAPH_MODES
        self._compose_stream: torch.cuda.Stream | None = None

    def set_compose(self, mode: str) -> None:
        """Where sessions compose from their next render on (see the class doc)."""
        self.compose = check_compose(mode)

    def compose_stream(self) -> torch.cuda.Stream:
        """The CUDA stream sessions compose on in "stream" mode: one for all of them (their splices
        are small and in order), at the highest priority so its kernels go ahead of a batch's."""
        with self._start_lock:
            if self._compose_stream is None:  # not from the high-priority pool, whose streams graph families capture on
                self._compose_stream = new_stream(self.device, high_priority=True)
            return self._compose_stream

    def render_for_stream(self, stream: torch.cuda.Stream, layer: AvatarLayer, driving: torch.Tensor,
                          frame_idx: torch.Tensor) -> torch.Tensor:
        """`render`, handed over for use on ``stream``: the stream waits for this request's batch only
        (its ``batch_done`` event), and the output's memory is not reused before ``stream`` is done
        with it."""
        future = self.submit(layer, driving, frame_idx)
        out = self.wait(future)
        _hand_to(stream, out, getattr(future, "batch_done", None))  # None: an own-stream batch, handed over finished
        return out

    def submit(self, layer: AvatarLayer, driving: torch.Tensor, frame_idx: torch.Tensor,  # type: ignore[override]
               finish: Callable[[torch.Tensor], Any] | None = None) -> Future:
        """Queue one render; the future's result is what `engine.render` would return (or
        ``finish`` of it)."""
        return super().submit((layer, driving, frame_idx), finish)

    def render(self, layer: AvatarLayer, driving: torch.Tensor, frame_idx: torch.Tensor,
               finish: Callable[[torch.Tensor], Any] | None = None) -> Any:
        return self.wait(self.submit(layer, driving, frame_idx, finish))


def _split_render(item: tuple[AvatarLayer, torch.Tensor, torch.Tensor], k: int) -> tuple[tuple, tuple]:
    """A render request's first k frames and the rest (each frame's driving row and source frame)."""
    layer, driving, frame_idx = item
    return (layer, driving[:k], frame_idx[:k]), (layer, driving[k:], frame_idx[k:])


class TensorBatcher(Batcher[torch.Tensor, torch.Tensor]):
    """``fn(rows)`` for row batches ``[b, ...]`` submitted from many threads, through one call on
    their concatenation: for networks whose rows are independent (the streams' audio encoders).
    ``batcher(x)`` blocks and returns ``fn(x)`` for the caller's own rows, as normal tensors."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor], max_rows: int = 16, name: str = "tensor-batcher",
                 autostart: bool = True, device: torch.device | str | None = None, own_stream: bool = False):
        super().__init__(self._run_rows, lambda x: int(x.shape[0]), max_frames=max_rows, autostart=autostart, name=name,
                         device=device, own_stream=own_stream)
        self.fn = fn

    def _run_rows(self, items: list[torch.Tensor]) -> list[torch.Tensor]:
        out = self.fn(torch.cat(items) if len(items) > 1 else items[0])
        parts = torch.split(out, [int(x.shape[0]) for x in items])
        with torch.inference_mode(False):  # callers may update them in place outside inference mode
            return [p.clone() for p in parts]

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        return self.wait(self.submit(rows))
