"""What the GPU and the CUDA runtime did during a window of a running server: a profiler window
summarised, to tell a GPU-bound live server from one whose threads block or starve the GPU.

`profile_window(seconds)` records every kernel and copy on the device and every CUDA runtime
call from every thread of this process (CUPTI sees all of them) and returns:

- ``gpu_busy_share``: the union of kernel/copy intervals over the window (1.0 = never idle);
- ``top_kernels``: the device time by kernel name;
- ``runtime``: host-side CUDA calls by name (total, count, longest): a launch or copy that
  takes milliseconds is a thread blocked on the device or on the driver;
- ``streams``: device time and busy share per CUDA stream: with the front ends on streams of their
  own (``--front-end-streams on``), what the shared Whisper / HuBERT / LMDM calls take of the GPU
  next to the renders.

Used by `load_test.py --profile-s`.
"""
from __future__ import annotations

import collections
import json
import tempfile
import time
from pathlib import Path
from typing import Any

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def summarize_trace(trace: dict[str, Any], seconds: float, top: int = 15) -> dict[str, Any]:
    """The summary above from a Chrome trace (``prof.export_chrome_trace``)."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    dev = [e for e in events if e.get("cat") in DEVICE_CATS]
    rt = [e for e in events if e.get("cat") in RUNTIME_CATS]
    by_kernel: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for e in dev:
        k = by_kernel[e["name"][:90]]
        k[0] += e["dur"]
        k[1] += 1
    by_call: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0, 0.0])
    for e in rt:
        c = by_call[e["name"]]
        c[0] += e["dur"]
        c[1] += 1
        c[2] = max(c[2], e["dur"])
    wall_us = seconds * 1e6
    if dev:
        lo = min(e["ts"] for e in dev)
        hi = max(e["ts"] + e["dur"] for e in dev)
        wall_us = max(wall_us, hi - lo)
    busy = _union_us([(e["ts"], e["ts"] + e["dur"]) for e in dev])
    by_stream: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    for e in dev:
        by_stream[str((e.get("args") or {}).get("stream", "?"))].append((e["ts"], e["ts"] + e["dur"]))
    return {
        "window_s": round(wall_us / 1e6, 3),
        "gpu_busy_share": round(busy / wall_us, 4) if wall_us else 0.0,
        "device_ms_total": round(sum(e["dur"] for e in dev) / 1e3, 2),
        "top_kernels": [{"name": n, "ms": round(v[0] / 1e3, 2), "count": v[1]}
                        for n, v in sorted(by_kernel.items(), key=lambda kv: -kv[1][0])[:top]],
        "runtime": [{"name": n, "ms": round(v[0] / 1e3, 2), "count": v[1], "max_ms": round(v[2] / 1e3, 3)}
                    for n, v in sorted(by_call.items(), key=lambda kv: -kv[1][0])[:top]],
        "streams": [{"stream": n, "ms": round(sum(b - a for a, b in iv) / 1e3, 2), "count": len(iv),
                     "busy_share": round(_union_us(iv) / wall_us, 4) if wall_us else 0.0}
                    for n, iv in sorted(by_stream.items(), key=lambda kv: -sum(b - a for a, b in kv[1]))],
    }


def profile_window(seconds: float, trace_path: str | Path | None = None) -> dict[str, Any]:
    """Profile this process for ``seconds`` (blocking the calling thread) and summarise it."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        time.sleep(seconds)
    with tempfile.TemporaryDirectory() as d:
        path = Path(trace_path) if trace_path else Path(d) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    return summarize_trace(trace, seconds)


def print_summary(s: dict[str, Any], file: Any = None) -> None:
    print(f"GPU busy {s['gpu_busy_share']:.1%} of {s['window_s']} s ({s['device_ms_total']} ms of kernels and copies)", file=file)
    for k in s["top_kernels"]:
        print(f"  {k['ms']:9.2f} ms {k['count']:6d}x  {k['name']}", file=file)
    for st in s.get("streams", []):
        print(f"  stream {st['stream']}: {st['ms']:9.2f} ms in {st['count']} kernels and copies, busy {st['busy_share']:.1%}", file=file)
    print("CUDA runtime calls (all threads):", file=file)
    for c in s["runtime"]:
        print(f"  {c['ms']:9.2f} ms {c['count']:6d}x  max {c['max_ms']:8.3f} ms  {c['name']}", file=file)
