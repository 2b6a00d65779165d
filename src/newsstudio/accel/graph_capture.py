"""Capture a small function over static buffers as a CUDA graph while a live server keeps running.

`torch.cuda.graph` synchronises the device, collects garbage and empties the allocator's cache on
entry: fine at start-up, a stall of every session when an avatar's or a session's graphs are made
mid-stream. `capture` runs the function once eagerly (lazy kernel set-up), then captures it in
thread-local mode (other threads keep launching meanwhile) into ``pool``, and returns the graph's
replay. Both run on the process's capture stream (`own_stream.capture_stream`, one capture at a
time): a pooled `torch.cuda.Stream` may be another thread's stream too, whose work would then
break the capture.

A capture that fails must leave the device as it found it. PyTorch marks the CUDA random number
generators "capturing" at ``capture_begin`` and unmarks them only in a ``capture_end`` that
succeeds: after a failed one, every later random draw on the device raised "Offset increment
outside graph capture encountered unexpectedly" (H100, thirty-fifth session). `capturing` ends a
failed capture with a tiny capture that succeeds, which unmarks them.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

import torch

from .own_stream import capture_stream

_captures_lock = threading.Lock()
_captures = 0


def captures_total() -> int:
    """CUDA graph captures this process has begun (every capture goes through `capturing`): a live
    server reports it, so captures while sessions run (a stall for them) are visible."""
    return _captures


@contextlib.contextmanager
def capturing(graph: torch.cuda.CUDAGraph, pool: object | None = None) -> Iterator[None]:
    """Capture what the block launches on the current stream into ``graph`` (thread-local mode);
    if the block or the capture fails, the error propagates and the device's random number
    generators are usable again (see the module doc)."""
    global _captures
    with _captures_lock:
        _captures += 1
    graph.capture_begin(pool=pool, capture_error_mode="thread_local")
    try:
        yield
    except BaseException:
        _end(graph)  # the block's own error says why (the capture, if invalidated, just ends)
        raise
    failed = _end(graph)
    if failed is not None:
        raise failed


def _end(graph: torch.cuda.CUDAGraph) -> RuntimeError | None:
    """End the capture; if that fails, release the generators and return the error."""
    try:
        graph.capture_end()
    except RuntimeError as exc:
        _release_generators()
        return exc
    return None


def _release_generators(attempts: int = 3) -> None:
    """One tiny capture that succeeds on the current stream: its ``capture_end`` unmarks the
    device's random number generators that a failed capture left marked."""
    buf = torch.zeros(1, device=torch.cuda.current_stream().device)
    for _ in range(attempts):
        probe = torch.cuda.CUDAGraph()
        probe.capture_begin(capture_error_mode="thread_local")
        buf.add_(1)
        try:
            probe.capture_end()
            return
        except RuntimeError:  # invalidated too (another thread's device-wide call): try again
            continue


def capture(fn: Callable[[], None], device: torch.device, pool: object | None = None) -> Callable[[], None]:
    """``fn`` (static buffers in, static buffers out) as a CUDA graph: its ``replay``. Graphs that
    share a ``pool`` (`torch.cuda.graph_pool_handle`) may share intermediates: replay them one at a
    time, in one stream order."""
    cur = torch.cuda.current_stream(device)
    side, lock = capture_stream(device)
    with lock:
        side.wait_stream(cur)
        with torch.cuda.stream(side):
            fn()
            graph = torch.cuda.CUDAGraph()
            with capturing(graph, pool):
                fn()
        cur.wait_stream(side)
    return graph.replay


def normal_tensor(make: Callable[[], torch.Tensor]) -> torch.Tensor:
    """A buffer made outside inference mode, so later calls in or out of it may refill it."""
    with torch.inference_mode(False):
        return make()
