"""The fastest of several implementations of one operation, per input shape, timed once.

Why: the Triton convolution beats cuDNN on some layer shapes and not on others, and its two
loaders (pointer gathers, TMA boxes) differ by shape too (benchmarks/triton_conv_bench.py). Like
cuDNN's own autotuning, the first call with a new key times every candidate on the real inputs
(`triton.testing.do_bench`, which also runs each Triton candidate's own autotuning first) and
every later call runs the winner. A candidate that raises (a kernel this Triton cannot compile) is
dropped with a warning, so a model never fails for a faster path it could not use.

No timing happens where it cannot or must not: in Triton's CPU interpreter, or while a CUDA graph
is being captured (the first candidate runs, nothing is remembered). Engines warm up every batch
shape before capturing, so the choice is made then.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable

import torch

__all__ = ["BENCH_MS", "choices", "fastest", "forget_choices"]

log = logging.getLogger(__name__)
_CHOSEN: dict[Hashable, str] = {}
_TIMES: dict[Hashable, dict[str, float]] = {}
_LOCK = threading.Lock()
#: Short `do_bench` runs (ms of warm-up and of timing) for choices made at an engine's start-up,
#: which times ~12 layer shapes x its batch buckets (also the Triton autotuner's, triton_conv.py).
BENCH_MS = {"warmup": 5, "rep": 20}


def _do_bench(fn: Callable[[], object]) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, **BENCH_MS))


def fastest(key: Hashable, candidates: dict[str, Callable[[], object]], timing: bool = True,
            timer: Callable[[Callable[[], object]], float] | None = None) -> str:
    """The name of the fastest candidate for ``key`` (each a zero-argument call of the operation on
    the current inputs); ``timing=False`` or a capturing stream: the first, unremembered. ``timer``:
    median milliseconds of a call (default: Triton's ``do_bench`` on the current CUDA stream)."""
    if key in _CHOSEN:
        return _CHOSEN[key]
    names = list(candidates)
    if len(names) == 1 or not timing:
        return names[0]
    if timer is None:
        if not torch.cuda.is_available() or torch.cuda.is_current_stream_capturing():
            return names[0]
        timer = _do_bench
    with _LOCK:
        if key in _CHOSEN:
            return _CHOSEN[key]
        times: dict[str, float] = {}
        for name in names:
            try:
                times[name] = float(timer(candidates[name]))
            except Exception as exc:  # noqa: BLE001  (a kernel this Triton/GPU cannot run: drop it)
                log.warning("%s failed for %s, not used: %s", name, key, str(exc).splitlines()[0][:200] if str(exc) else exc)
        if not times:
            raise RuntimeError(f"no candidate ran for {key}: {names}")
        best = min(times, key=times.get)
        _CHOSEN[key], _TIMES[key] = best, times
        log.info("%s: %s (%s)", key, best, ", ".join(f"{n} {t:.3f} ms" for n, t in times.items()))
        return best


def choices() -> dict[Hashable, tuple[str, dict[str, float]]]:
    """Every key decided so far: (winner, {candidate: median ms})."""
    return {k: (v, dict(_TIMES.get(k, {}))) for k, v in _CHOSEN.items()}


def forget_choices() -> None:
    _CHOSEN.clear()
    _TIMES.clear()
