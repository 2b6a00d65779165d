"""Host <-> device copies that do not stall the server's other threads.

Why: a plain copy between pageable host memory and a CUDA device (``t.to("cpu")``, ``.tolist()``,
``t.to("cuda")`` of a numpy-backed tensor, ``torch.tensor(values, device="cuda")``) synchronises
the stream and, through pageable memory, goes through the driver's staging path, during which
other threads' kernel launches wait. Measured on an H200 live server with 8 MuseTalk sessions
(load_test --profile-s, 3 s window): threads spent 10.4 s in ``cudaLaunchKernel`` (one call took
46 ms) and 2.1 s in ``cudaStreamSynchronize``, and the GPU was idle 41 % of the time while the
sessions fell behind. Pinned (page-locked) staging turns each copy into an asynchronous DMA;
a thread that needs the bytes on the host waits on an event for its own copy, and nobody else
waits with it.

On the CPU, or for tensors already where they are asked to be, these are plain ``.to`` calls.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["to_device", "tensor_on", "to_host", "to_host_async"]


def to_device(x: torch.Tensor, device: torch.device | str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``x.to(device, dtype)``; a CPU tensor bound for CUDA is staged in pinned memory and copied
    asynchronously (the caching host allocator keeps the staging block until the copy is done)."""
    device = torch.device(device)
    if device.type != "cuda" or x.device.type != "cpu":
        return x.to(device=device, dtype=dtype)
    if dtype is not None and x.dtype != dtype:
        x = x.to(dtype)
    staged = x if x.is_pinned() else x.pin_memory()
    return staged.to(device, non_blocking=True)


def tensor_on(values: Sequence[float] | Sequence[int] | Sequence[bool], device: torch.device | str,
              dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.tensor(values, dtype=dtype, device=device)`` without a synchronising upload."""
    return to_device(torch.tensor(values, dtype=dtype), device)


def to_host_async(x: torch.Tensor) -> tuple[torch.Tensor, "torch.cuda.Event | None"]:
    """``(host, done)``: a CUDA tensor's copy into pinned memory, queued on the current stream, and
    the event recorded after it; ``host`` holds the bytes once ``done.synchronize()`` returns (any
    thread may wait on it). A CPU tensor comes back as is, with ``done`` None."""
    if x.device.type != "cuda":
        return x, None
    out = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
    out.copy_(x, non_blocking=True)
    done = torch.cuda.Event(blocking=True)  # sleep, do not spin: many session threads wait at once
    done.record(torch.cuda.current_stream(x.device))
    return out, done


def to_host(x: torch.Tensor) -> torch.Tensor:
    """``x`` on the CPU: a CUDA tensor is copied into pinned memory and this thread sleeps on an
    event until that copy (and the work before it on the stream) is done."""
    out, done = to_host_async(x)
    if done is not None:
        done.synchronize()
    return out
