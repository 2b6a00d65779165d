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
  next to the renders;
- ``threads``: per host thread (named where this process knows the id), the share of the window
  it spent in CUDA runtime calls and its longest one (CUPTI sees every thread; torch's profiler
  records torch ops only on the thread that runs it, so host work shows here as what is left);
- ``stacks`` (`profile_window`): every thread's Python stack sampled every 5 ms over the window,
  per thread the innermost lines it was seen in most: where a render thread spends its host time
  (a blocking call, the GIL) against one that waits for requests.

Used by `load_test.py --profile-s`.
"""
from __future__ import annotations

import collections
import json
import sys
import tempfile
import threading
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


def summarize_trace(trace: dict[str, Any], seconds: float, top: int = 15,
                    thread_names: dict[int, str] | None = None) -> dict[str, Any]:
    """The summary above from a Chrome trace (``prof.export_chrome_trace``); ``thread_names``: OS
    thread id -> name, for the ``threads`` rows."""
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
        "threads": _threads(rt, wall_us, thread_names or {}, top),
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


def _threads(rt: list[dict], wall_us: float, names: dict[int, str], top: int) -> list[dict[str, Any]]:
    """Per host thread: the window's share in CUDA runtime calls, their number and the longest; busiest first."""
    by_tid: dict[Any, list[dict]] = collections.defaultdict(list)
    for e in rt:
        by_tid[e.get("tid")].append(e)
    rows = []
    for tid, calls in by_tid.items():
        longest = max(calls, key=lambda e: e["dur"])
        rows.append({
            "thread": names.get(tid, str(tid)) if isinstance(tid, int) else str(tid),
            "runtime_share": round(_union_us([(e["ts"], e["ts"] + e["dur"]) for e in calls]) / wall_us, 4) if wall_us else 0.0,
            "runtime_calls": len(calls),
            "longest_call": {"name": longest["name"], "ms": round(longest["dur"] / 1e3, 3)},
        })
    return sorted(rows, key=lambda r: -r["runtime_share"])[:top]


def sample_stacks(seconds: float, interval_s: float = 0.005, top: int = 6) -> dict[str, Any]:
    """Every other thread's innermost Python line, sampled every ``interval_s`` for ``seconds``: per
    thread, how many samples it was seen in and its ``top`` lines (``file:line function``) with their
    share of its samples. Sampling needs the GIL, so a thread that holds it for long is seen less often
    than it runs; the counts say where time goes, not exactly how much."""
    me = threading.get_ident()
    names = {t.ident: t.name for t in threading.enumerate()}
    seen: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    samples = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for ident, frame in sys._current_frames().items():
            if ident == me:
                continue
            code = frame.f_code
            where = f"{Path(code.co_filename).name}:{frame.f_lineno} {code.co_name}"
            seen[names.get(ident) or str(ident)][where] += 1
        samples += 1
        time.sleep(interval_s)
    return {"samples": samples, "threads": {
        name: {"seen": sum(c.values()), "top": [{"where": w, "share": round(n / sum(c.values()), 3)} for w, n in c.most_common(top)]}
        for name, c in sorted(seen.items(), key=lambda kv: -sum(kv[1].values()))}}


def profile_window(seconds: float, trace_path: str | Path | None = None) -> dict[str, Any]:
    """Profile this process for ``seconds`` (blocking the calling thread) and summarise it."""
    from torch.profiler import ProfilerActivity, profile

    stacks: dict[str, Any] = {}
    sampler = threading.Thread(target=lambda: stacks.update(sample_stacks(seconds)), name="stack-sampler", daemon=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        sampler.start()
        time.sleep(seconds)
        sampler.join()
    with tempfile.TemporaryDirectory() as d:
        path = Path(trace_path) if trace_path else Path(d) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    return {**summarize_trace(trace, seconds, thread_names=names), "stacks": stacks}


def print_summary(s: dict[str, Any], file: Any = None) -> None:
    print(f"GPU busy {s['gpu_busy_share']:.1%} of {s['window_s']} s ({s['device_ms_total']} ms of kernels and copies)", file=file)
    for k in s["top_kernels"]:
        print(f"  {k['ms']:9.2f} ms {k['count']:6d}x  {k['name']}", file=file)
    for st in s.get("streams", []):
        print(f"  stream {st['stream']}: {st['ms']:9.2f} ms in {st['count']} kernels and copies, busy {st['busy_share']:.1%}", file=file)
    for t in s.get("threads", []):
        longest = t["longest_call"]
        print(f"  thread {t['thread']}: in CUDA calls {t['runtime_share']:.1%} ({t['runtime_calls']}, longest "
              f"{longest['name']} {longest['ms']} ms)", file=file)
    for name, t in (s.get("stacks") or {}).get("threads", {}).items():
        print(f"  stacks of {name} ({t['seen']} samples): " + "; ".join(f"{w['share']:.0%} {w['where']}" for w in t["top"][:3]), file=file)
    print("CUDA runtime calls (all threads):", file=file)
    for c in s["runtime"]:
        print(f"  {c['ms']:9.2f} ms {c['count']:6d}x  max {c['max_ms']:8.3f} ms  {c['name']}", file=file)
