"""CUDA streams of our own, outside PyTorch's stream pool, for capturing graphs while a server runs.

Why: `torch.cuda.Stream()` hands out one of 32 pooled streams per priority, round robin, so two
unrelated callers can hold the same CUDA stream without knowing it. That only costs a false
ordering for plain work, but it is fatal for a graph captured while other threads keep launching:
work that another thread queues on "its" stream (the same CUDA stream) lands in the capture, or
makes it fail. Seen on an H100 (thirty-second session): a live session captured its compose graphs
on a pooled side stream that was also the Whisper batcher's own stream; the batcher's
``wait_event`` on it raised ``cudaErrorStreamCaptureIsolation`` and all 16 sessions failed.

`new_stream` makes a stream with ``cudaStreamCreateWithPriority`` (non-blocking, like PyTorch's
own) through the CUDA runtime PyTorch itself loaded, wrapped as a `torch.cuda.ExternalStream`, and
destroys it when the wrapper is collected. `thread_capture_stream` is one such stream per (thread,
device), for captures made mid-stream: a thread captures one graph at a time, so its graphs can
share it, and no other thread ever queues work on it.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import threading
import weakref

import torch

__all__ = ["new_stream", "thread_capture_stream"]

log = logging.getLogger(__name__)

_NON_BLOCKING = 0x01  # cudaStreamNonBlocking: no implicit ordering with the legacy default stream
_local = threading.local()


@functools.cache
def _cudart() -> ctypes.CDLL | None:
    """The CUDA runtime library this process's PyTorch loaded (found in the process's memory map),
    else one the loader finds; None where there is none."""
    paths: list[str] = []
    try:
        with open("/proc/self/maps") as maps:
            paths = [line.split()[-1] for line in maps if "libcudart.so" in line and "/" in line]
    except OSError:
        pass
    major = (torch.version.cuda or "").split(".")[0]
    names = [*dict.fromkeys(paths), f"libcudart.so.{major}" if major else None, ctypes.util.find_library("cudart")]
    for name in filter(None, names):
        try:
            lib = ctypes.CDLL(name)
            lib.cudaStreamCreateWithPriority  # noqa: B018  (the symbol must be there)
        except (OSError, AttributeError):
            continue
        return lib
    return None


def _check(err: int, what: str) -> None:
    if err != 0:
        raise RuntimeError(f"{what} failed with CUDA error {err}")


def new_stream(device: torch.device | str, high_priority: bool = False) -> torch.cuda.Stream:
    """A CUDA stream on ``device`` that no one else is handed (see the module doc); at the device's
    highest priority where asked. Falls back to a pooled `torch.cuda.Stream`, with a warning, where
    no CUDA runtime library can be found."""
    device = torch.device(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    lib = _cudart()
    if lib is None:
        log.warning("no CUDA runtime library found: graphs captured mid-stream use PyTorch's pooled streams, "
                    "which another thread may also be using")
        priority = torch.cuda.Stream.priority_range()[1] if high_priority else 0
        return torch.cuda.Stream(device=index, priority=priority)
    with torch.cuda.device(index):  # the runtime makes the stream on its current device
        least, greatest = ctypes.c_int(), ctypes.c_int()
        _check(lib.cudaDeviceGetStreamPriorityRange(ctypes.byref(least), ctypes.byref(greatest)),
               "cudaDeviceGetStreamPriorityRange")
        handle = ctypes.c_void_p()
        _check(lib.cudaStreamCreateWithPriority(ctypes.byref(handle), ctypes.c_uint(_NON_BLOCKING),
                                                greatest if high_priority else least),
               "cudaStreamCreateWithPriority")
    stream = torch.cuda.ExternalStream(handle.value, device=torch.device("cuda", index))
    # the runtime frees it once the work queued on it is done, even if that is still running now
    destroy = weakref.finalize(stream, lib.cudaStreamDestroy, ctypes.c_void_p(handle.value))
    destroy.atexit = False  # at exit the CUDA context may already be gone
    return stream


def thread_capture_stream(device: torch.device | str) -> torch.cuda.Stream:
    """This thread's own stream on ``device`` for capturing graphs (made on first use, kept)."""
    device = torch.device(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    streams: dict[int, torch.cuda.Stream] = _local.__dict__.setdefault("streams", {})
    if index not in streams:
        streams[index] = new_stream(torch.device("cuda", index))
    return streams[index]
