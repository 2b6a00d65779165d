"""The server process's garbage-collector pauses, and freezing what the engines' warm-up left alive.

Why: CPython's full (generation 2) collection walks every tracked object while holding the GIL, so
every live session's threads stop meanwhile. A warm server holds many: 0.3 M objects after
importing torch and 0.5 M with an eager MuseTalk engine and the server's libraries, a full
collection taking 0.19-0.31 s on the dev machine's CPU (`torch.compile`'s graphs and guards add
more). Live levels that missed on an H100 had single stalls of 0.5-1.2 s (`late_max_ms`) while
their render thread was mostly idle. `gc.freeze()` after warm-up moves every object alive then
into a permanent generation that no later collection visits: objects made afterwards (per-request
tensors, messages) are collected as before, long-lived ones are no longer walked again and again.

`GC_PAUSES` times every collection of the process (one recorder: the collector is per process);
`/metrics` reports it and the load test takes its differences per level. The frozen count it
reports is the one taken when freezing: `gc.get_freeze_count()` walks the whole permanent
generation with the GIL held (16 ms for 0.17 M objects on the dev CPU; a third of the event loop's
time under 8 live sessions polled once a second, thirty-fourth session), so `/metrics` never calls it.
"""
from __future__ import annotations

import atexit
import gc
import threading
import time
from typing import Any

LONG_PAUSE_MS = 10.0  # collections at least this long are listed one by one


class GcPauses:
    """Counts and times the collector's runs per generation; lists the long ones (numbered, so a
    reader can take those after its last look)."""

    def __init__(self, long_ms: float = LONG_PAUSE_MS, keep: int = 256) -> None:
        self.long_ms = long_ms
        self.collections = [0, 0, 0]
        self.pause_s = [0.0, 0.0, 0.0]
        # (number, ms, generation) of the latest `keep`; a tuple replaced, never changed in place: a
        # collection (and so `_on_gc`) may start inside any allocation, `snapshot`'s own included, and
        # a deque changed under its reader failed `/metrics` ("deque mutated during iteration")
        self.keep = max(1, keep)
        self.long: tuple[tuple[int, float, int], ...] = ()
        self.long_total = 0
        self.frozen = 0  # objects moved to the permanent generation by the last freeze (0 once unfrozen)
        self._started: float | None = None
        self._installed = False
        self._lock = threading.Lock()

    def install(self) -> "GcPauses":
        """Start timing (idempotent)."""
        with self._lock:
            if not self._installed:
                gc.callbacks.append(self._on_gc)
                self._installed = True
        return self

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        # called by the collecting thread with the GIL held; collections never overlap
        if phase == "start":
            self._started = time.perf_counter()
            return
        if self._started is None:
            return
        took = time.perf_counter() - self._started
        self._started = None
        g = int(info.get("generation", 2))
        self.collections[g] += 1
        self.pause_s[g] += took
        if took * 1000 >= self.long_ms:
            self.long_total += 1
            kept = self.long[max(0, len(self.long) - self.keep + 1):]
            self.long = (*kept, (self.long_total, round(took * 1000, 2), g))

    def snapshot(self) -> dict[str, Any]:
        return {"collections": list(self.collections), "pause_ms_total": [round(s * 1000, 2) for s in self.pause_s],
                "long_pauses": [list(p) for p in self.long], "frozen_objects": self.frozen}


GC_PAUSES = GcPauses()
_UNFREEZE_AT_EXIT = False


def freeze_warm_objects() -> int:
    """Collect once, then move every object alive into the permanent generation (`gc.freeze`):
    call it after engines warm up. Returns how many objects are frozen. They are unfrozen when the
    interpreter exits, so its last collection sees them (else extension modules such as Triton's
    report them as leaked)."""
    global _UNFREEZE_AT_EXIT
    gc.collect()
    gc.freeze()
    if not _UNFREEZE_AT_EXIT:
        atexit.register(gc.unfreeze)
        _UNFREEZE_AT_EXIT = True
    GC_PAUSES.frozen = gc.get_freeze_count()  # the one walk of the permanent generation (module doc)
    return GC_PAUSES.frozen


def unfreeze() -> None:
    """Undo `freeze_warm_objects` (benchmarks compare the two): frozen objects join the oldest
    generation again."""
    gc.unfreeze()
    GC_PAUSES.frozen = 0
