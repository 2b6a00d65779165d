"""Capture a small function over static buffers as a CUDA graph while a live server keeps running.

`torch.cuda.graph` synchronises the device, collects garbage and empties the allocator's cache on
entry: fine at start-up, a stall of every session when an avatar's or a session's graphs are made
mid-stream. `capture` runs the function once eagerly (lazy kernel set-up), then captures it in
thread-local mode (other threads keep launching meanwhile) into ``pool``, and returns the graph's
replay. Both run on the process's capture stream (`own_stream.capture_stream`, one capture at a
time): a pooled `torch.cuda.Stream` may be another thread's stream too, whose work would then
break the capture.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from .own_stream import capture_stream


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
            graph.capture_begin(pool=pool, capture_error_mode="thread_local")
            try:
                fn()
            finally:
                graph.capture_end()
        cur.wait_stream(side)
    return graph.replay


def normal_tensor(make: Callable[[], torch.Tensor]) -> torch.Tensor:
    """A buffer made outside inference mode, so later calls in or out of it may refill it."""
    with torch.inference_mode(False):
        return make()
