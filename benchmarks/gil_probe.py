"""How long a thread of this process waits to get the GIL back: a probe for a live server's host side.

A thread that sleeps 2 ms and wakes needs the GIL to run its next line; how late it runs is (timer
slack aside, ~0.1 ms) the GIL's queue at that moment. Every torch call of the server's threads
releases and retakes the GIL, so this wait is what each such call pays on top of its own work:
the render thread's dispatch, the sessions' splices and copies, the event loop's sends. A median of
a fraction of a millisecond is an idle GIL; several milliseconds is a GIL that the threads queue for.

    with GilProbe() as probe:
        ...  # the load
    probe.summary()  # {"gil_wait_p50_ms": ..., "gil_wait_p95_ms": ..., "gil_wait_max_ms": ...}
"""
from __future__ import annotations

import threading
import time

import numpy as np


class GilProbe:
    """A daemon thread that measures its wake-up lateness while the ``with`` block runs."""

    def __init__(self, sleep_s: float = 0.002) -> None:
        self.sleep_s = sleep_s
        self.late_s: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gil-probe", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            time.sleep(self.sleep_s)
            self.late_s.append(time.perf_counter() - t0 - self.sleep_s)

    def __enter__(self) -> "GilProbe":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def summary(self) -> dict[str, float]:
        late = np.array(self.late_s or [0.0]) * 1e3
        return {"gil_wait_p50_ms": round(float(np.percentile(late, 50)), 3),
                "gil_wait_p95_ms": round(float(np.percentile(late, 95)), 3),
                "gil_wait_max_ms": round(float(late.max()), 3), "gil_wakes": len(self.late_s)}
