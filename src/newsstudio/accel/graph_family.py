"""Which CUDA graphs may run at the same time, and what they must not share when they do.

A captured CUDA graph keeps the raw address of the cuBLAS workspace it was captured with, and
PyTorch hands out cuBLAS workspaces per (handle, stream): every graph captured on the same stream
by the same thread embeds the *same* workspace (pytorch/pytorch#193402 describes the sharing).
Graphs that only ever replay on one stream run one after another, so that is harmless. A live
server with front-end streams replays graphs on several streams at once (the render on the
default stream, the audio encoder and Ditto's LMDM windows on streams of their own): two such
graphs sharing a workspace can write each other's split-K partial sums and counters. That is the
suspected cause (not yet confirmed) of a Ditto LMDM batch on an H200 that never finished, leaving
the sessions' speech silent (benchmarks/RESULTS.md, tenth session).

A `GraphFamily` is a set of graphs of which at most one replays at a time, like the batch-size
buckets of one network (`BucketedRunner`):

* its graphs are captured on a capture stream of its own (from PyTorch's high-priority stream
  pool, which nothing else here draws from, checked to be no other live family's), so each family
  gets its own cuBLAS workspace;
* its replays are ordered on the GPU across streams: a replay on another stream than the previous
  one first waits for that one's end (an event), so two callers on different streams never refill
  the family's static inputs or use its workspace at the same time;
* its graphs share one memory pool (`memory_pool`): since they never replay at once, one graph's
  intermediates may live where another's do, and the family holds about its largest graph's
  memory instead of the sum (each graph's static outputs stay its own: they are alive, so no later
  capture takes them). Ditto's six plain-CUDA-graph render buckets held 49.8 GB in separate pools
  and the last capture failed on an 80 GB H100 (fortieth session).
"""
from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections.abc import Iterator

import torch

from .own_stream import device_index

log = logging.getLogger(__name__)

_POOL_SIZE = 32  # streams per priority in PyTorch's per-device pool (c10/cuda/CUDAStream.cpp)
_taken: dict[int, set[int]] = {}  # device index -> capture streams (cuda_stream handles) of live families
_taken_lock = threading.Lock()


def _release(index: int, handle: int) -> None:
    """A family is gone (with its graphs): its capture stream may serve another one."""
    with _taken_lock:
        _taken.get(index, set()).discard(handle)


def _unique_capture_stream(device: torch.device) -> tuple[torch.cuda.Stream, bool]:
    """(a high-priority pool stream no other family captures on, True) (the pool is handed out
    round robin, so asking again gives the next one); once all are taken, (a shared one, False),
    with a warning."""
    index = device_index(device)
    high = torch.cuda.Stream.priority_range()[1]
    with _taken_lock:
        taken = _taken.setdefault(index, set())
        for _ in range(_POOL_SIZE):
            stream = torch.cuda.Stream(device=index, priority=high)
            if stream.cuda_stream not in taken:
                taken.add(stream.cuda_stream)
                return stream, True
    log.warning("more than %d CUDA graph families on cuda:%d: capture streams (and cuBLAS workspaces) are shared; "
                "do not replay graphs of different families on different streams at once", _POOL_SIZE, index)
    return stream, False


class GraphFamily:
    """Graphs that replay one at a time (see the module doc): one capture stream, one GPU order."""

    def __init__(self) -> None:
        self._stream: torch.cuda.Stream | None = None
        self._stream_lock = threading.Lock()
        self._lock = threading.RLock()
        self._last: tuple[torch.cuda.Stream, torch.cuda.Event] | None = None  # the latest replay: (stream, its end)
        self._pool: tuple[int, int] | None = None

    def memory_pool(self) -> tuple[int, int]:
        """The memory pool the family's graphs are captured into (made on first use)."""
        with self._stream_lock:
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            return self._pool

    def capture_stream(self, device: torch.device) -> torch.cuda.Stream:
        """The stream this family's graphs are captured on (made on first use)."""
        with self._stream_lock:
            if self._stream is None:
                self._stream, unique = _unique_capture_stream(device)
                if unique:  # free it for another family once this one (and its graphs) is gone
                    weakref.finalize(self, _release, self._stream.device_index, self._stream.cuda_stream)
            return self._stream

    @contextlib.contextmanager
    def replay_on(self, stream: torch.cuda.Stream) -> Iterator[None]:
        """Around one call's GPU work on ``stream`` (staging, replay, copy-out): after the family's
        previous call when that ran on another stream, and before the next one."""
        with self._lock:
            if self._last is not None and self._last[0] != stream:
                stream.wait_event(self._last[1])
            yield
            done = torch.cuda.Event()
            done.record(stream)
            self._last = (stream, done)
