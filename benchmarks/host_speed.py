"""How fast this host runs the work a live server is bound by: pure Python and small-kernel launches.

Why: the GPU machines differ most where the GPU does not show it. One H100 host (thirty-fourth
session) ran a fixed Python loop ~1.9x slower than another machine and launched a small kernel in
13.5 us, and there 16 MuseTalk and 8 Ditto sessions missed their frames that other H100 hosts
held; the GPU itself measured 776 bf16 TFLOPS. Load-test rows and benchmark JSON carry these two
figures so results from different hosts can be told apart.

    python -m benchmarks.host_speed
"""
from __future__ import annotations

import json
import time


def python_loop_ms(iterations: int = 1_000_000, repeat: int = 3) -> float:
    """Best of ``repeat`` runs of a fixed integer loop, in ms (interpreter + single-core speed)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        total = 0
        for i in range(iterations):
            total += i * i
        best = min(best, time.perf_counter() - t0)
    return round(best * 1e3, 1)


def cuda_launch_us(launches: int = 5000) -> float | None:
    """Mean time of one tiny in-place add from Python to the queue, in us (None without CUDA):
    the per-call cost that every eager torch call on the server's threads pays."""
    import torch  # here: the load test's client processes import this module and must start without torch

    if not torch.cuda.is_available():
        return None
    x = torch.zeros(16, device="cuda")
    for _ in range(100):
        x.add_(1)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(launches):
        x.add_(1)
    torch.cuda.synchronize()
    return round((time.perf_counter() - t0) / launches * 1e6, 2)


def host_speed() -> dict[str, float | None]:
    return {"python_loop_1m_ms": python_loop_ms(), "cuda_launch_us": cuda_launch_us()}


if __name__ == "__main__":
    print(json.dumps(host_speed()))
