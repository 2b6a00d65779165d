"""CPU time of a process's threads and of its child processes, sampled from /proc (Linux).

Why: a live server that falls behind with its GPU far from busy is limited by some thread's CPU
(or by the GIL): this shows which OS threads burn CPU, second by second, and whether the load
test's client processes (children of the server's process) saturate their cores. Thread ids match
`py-spy dump`'s "Thread <tid>" lines, which give their Python names.

    python -m benchmarks.thread_cpu PID --seconds 300 --out cpu.jsonl
    python -m benchmarks.thread_cpu --summary cpu.jsonl --names dump.txt
"""
from __future__ import annotations

import argparse
import json
import os
import re
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_ticks(stat_path: Path) -> int | None:
    try:
        fields = stat_path.read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[11]) + int(fields[12])  # utime + stime (fields 14, 15 of stat)


def thread_cpu_s(pid: int, tid: int) -> float:
    """CPU seconds (user + system) one thread of a process has used so far (tid = pid: its main thread)."""
    ticks = _cpu_ticks(Path(f"/proc/{pid}/task/{tid}/stat"))
    if ticks is None:
        raise ProcessLookupError(f"no /proc/{pid}/task/{tid}/stat")
    return ticks / TICK


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def sample(pid: int) -> dict:
    """Cumulative CPU ticks of each thread of `pid` and of each descendant process."""
    threads = {int(t.name): _cpu_ticks(t / "stat") for t in Path(f"/proc/{pid}/task").glob("*")}
    procs, todo = {}, _children(pid)
    while todo:
        c = todo.pop()
        procs[c] = _cpu_ticks(Path(f"/proc/{c}/stat"))
        todo += _children(c)
    return {"t": time.time(), "threads": {k: v for k, v in threads.items() if v is not None},
            "children": {k: v for k, v in procs.items() if v is not None}}


def watch(pid: int, seconds: float, interval: float, out: Path) -> None:
    """Write one line per interval: CPU share (1.0 = one core) of each busy thread and child."""
    prev = sample(pid)
    end = time.time() + seconds
    with out.open("w") as f:
        while time.time() < end and Path(f"/proc/{pid}").exists():
            time.sleep(interval)
            try:
                cur = sample(pid)
            except OSError:
                break
            dt = cur["t"] - prev["t"]
            share = lambda a, b: {k: round((v - b.get(k, v)) / TICK / dt, 3) for k, v in a.items() if v - b.get(k, v) > 0}  # noqa: E731
            threads = share(cur["threads"], prev["threads"])
            f.write(json.dumps({"t": round(cur["t"], 3), "process": round(sum(threads.values()), 3), "threads": threads,
                                "children": share(cur["children"], prev["children"])}) + "\n")
            f.flush()
            prev = cur


def own_threads_cpu() -> dict[str, float]:
    """CPU seconds so far of this process's threads, summed by Python thread name with its number
    dropped ("newsstudio-live_3" -> "newsstudio-live"); threads Python did not start (CUDA's, torch's
    own pools) count as "other native". Where a live server in this process spends its CPU, for a
    load test to take differences over a level."""
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for task in Path("/proc/self/task").glob("*"):
        ticks = _cpu_ticks(task / "stat")
        if ticks is None:
            continue
        name = names.get(int(task.name))
        group = re.sub(r"_\d+$|-\d+$", "", name) if name else "other native"
        out[group] = out.get(group, 0.0) + ticks / TICK
    return out


def thread_names(dump: Path) -> dict[str, str]:
    """tid -> Python thread name from `py-spy dump` output."""
    return {m.group(1): m.group(2) for m in re.finditer(r'^Thread (\d+) \([^)]*\): "([^"]*)"', dump.read_text(), re.M)}


def summarize(path: Path, names: dict[str, str], t0: float, t1: float, top: int = 12) -> dict:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if t0 <= r["t"] <= t1]
    if not rows:
        return {}
    tot: dict[str, float] = {}
    for r in rows:
        for k, v in r["threads"].items():
            tot[k] = tot.get(k, 0.0) + v
    kids: dict[str, float] = {}
    for r in rows:
        for k, v in r["children"].items():
            kids[k] = kids.get(k, 0.0) + v
    n = len(rows)
    return {"samples": n, "process_cores": round(sum(r["process"] for r in rows) / n, 2),
            "threads": [(names.get(k, k), round(v / n, 3)) for k, v in sorted(tot.items(), key=lambda kv: -kv[1])[:top]],
            "children_cores": {k: round(v / n, 2) for k, v in kids.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pid", type=int, nargs="?")
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--summary", type=Path, help="summarise a file written by a watch")
    ap.add_argument("--names", type=Path, help="a py-spy dump of the process, for thread names")
    ap.add_argument("--window", default=None, help="t0,t1 (unix seconds) to summarise")
    args = ap.parse_args()
    if args.summary:
        t0, t1 = (float(x) for x in args.window.split(",")) if args.window else (0.0, float("inf"))
        print(json.dumps(summarize(args.summary, thread_names(args.names) if args.names else {}, t0, t1), indent=1))
        return
    if args.pid is None or args.out is None:
        ap.error("a pid and --out are needed to watch")
    watch(args.pid, args.seconds, args.interval, args.out)


if __name__ == "__main__":
    main()
