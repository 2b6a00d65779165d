"""CUDA streams of our own, outside PyTorch's stream pool: for graphs captured while a server runs, and
for the server's long-lived streams, which such a capture must not share.

Why: `torch.cuda.Stream()` hands out one of 32 pooled streams per priority, round robin, so two
unrelated callers can hold the same CUDA stream without knowing it. That only costs a false
ordering for plain work, but it is fatal for a graph captured while other threads keep launching:
work that another thread queues on "its" stream (the same CUDA stream) lands in the capture, or
makes it fail. Seen on an H100 (thirty-second session): a live session captured its compose graphs
on a pooled side stream that was also the Whisper batcher's own stream; the batcher's
``wait_event`` on it raised ``cudaErrorStreamCaptureIsolation`` and all 16 sessions failed.

`new_stream` makes a stream with ``cudaStreamCreateWithPriority`` (non-blocking, like PyTorch's
own) through the CUDA runtime PyTorch itself loaded, wrapped as a `torch.cuda.ExternalStream`.
Streams are never destroyed: PyTorch's allocator and cuBLAS keep using a stream's handle after its
last Python reference is gone (events recorded for blocks used on it, per-stream workspaces), and a
server that destroyed one crashed in garbage collection (H100, thirty-second session; the cause
is inferred, not proven), so only long-lived holders take one: the shared batchers' own streams
and the live sessions' compose stream (engines/batching.py), while graph families and Inductor
capture on pooled ones (an engine loaded while sessions stream). `capture_stream` is one per
device, with a lock, for graphs captured mid-stream: one capture at a time, and no other thread
ever queues work on it.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import logging
import threading
from collections.abc import Iterator

import torch

__all__ = ["borrowed_stream", "capture_stream", "device_index", "new_stream"]

log = logging.getLogger(__name__)

_NON_BLOCKING = 0x01  # cudaStreamNonBlocking: no implicit ordering with the legacy default stream


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
    index = device_index(device)
    lib = _cudart()
    if lib is None:
        log.warning("no CUDA runtime library found: streams that must be no one else's come from PyTorch's pool, "
                    "where another thread may hold the same one")
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
    return torch.cuda.ExternalStream(handle.value, device=torch.device("cuda", index))  # never destroyed (module doc)


_capture: dict[int, tuple[torch.cuda.Stream, threading.Lock]] = {}
_lock = threading.Lock()


def device_index(device: torch.device | str) -> int:
    """The CUDA device index ``device`` names (the current device for a bare "cuda")."""
    device = torch.device(device)
    return device.index if device.index is not None else torch.cuda.current_device()


def capture_stream(device: torch.device | str) -> tuple[torch.cuda.Stream, threading.Lock]:
    """The stream for graphs captured mid-stream on ``device`` and the lock to hold while using it."""
    index = device_index(device)
    with _lock:
        if index not in _capture:
            _capture[index] = (new_stream(torch.device("cuda", index)), threading.Lock())
        return _capture[index]


_free: dict[int, list[torch.cuda.Stream]] = {}


@contextlib.contextmanager
def borrowed_stream(device: torch.device | str) -> Iterator["torch.cuda.Stream | None"]:
    """A stream of our own (`new_stream`) for the block, None on a device that is not CUDA: for work
    that needs a stream only while it runs (a stream's front end run ahead of its renders). Streams are
    never destroyed (module doc), so they go back to a free list: this process makes as many as were
    ever borrowed at once."""
    device = torch.device(device)
    if device.type != "cuda":
        yield None
        return
    index = device_index(device)
    with _lock:
        free = _free.setdefault(index, [])
        stream = free.pop() if free else None
    if stream is None:
        stream = new_stream(torch.device("cuda", index))
    try:
        yield stream
    finally:
        with _lock:
            _free[index].append(stream)
