"""Summarise `py-spy record --threads -f raw` files: samples per thread and where each thread was.

Why: the load test's profiler (`--profile-s`) shows what the GPU and the CUDA runtime did; this shows
what the server's Python threads did in the same kind of window -- with `--gil`, who held the GIL
(its total against the samples possible is how close the GIL is to saturated), without it, which
threads were on a CPU, with `--idle`, where each thread waited.

    python -m benchmarks.pyspy_summary gil.txt active.txt idle.txt --rate 100 --seconds 6 --threads render-batcher
"""
from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path

THREAD = re.compile(r"^thread \((\w+)\):? ?(.*)$")


def parse(path: Path) -> dict[str, collections.Counter]:
    """{thread name: Counter(stack tuple -> samples)}."""
    out: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = stack.split(";")
        name = "?"
        if frames and frames[0].startswith("process "):
            frames = frames[1:]
        m = THREAD.match(frames[0]) if frames else None
        if m:  # "thread (tid): name"
            name = m.group(2) or m.group(1)
            frames = frames[1:]
        out[name][tuple(frames)] += int(count)
    return out


def _where(frames: tuple[str, ...], depth: int) -> str:
    """The innermost frame of our own code and what it called (`depth` frames from there)."""
    own = [i for i, f in enumerate(frames) if "newsstudio" in f or "benchmarks" in f]
    at = own[-1] if own else max(0, len(frames) - depth)
    return " > ".join(f.split(" (")[0] + (f" ({f.split('(')[-1].rstrip(')').split('/')[-1]})" if "(" in f else "")
                      for f in frames[at:at + depth])


def summarize(path: Path, rate: float, seconds: float, only: list[str], depth: int = 3, top: int = 8) -> str:
    threads = parse(path)
    possible = rate * seconds
    total = sum(sum(c.values()) for c in threads.values())
    lines = [f"{path.name}: {total} samples ({total / possible:.2f} of one thread's {possible:.0f} possible)"]
    groups: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for name, c in threads.items():  # threads of one pool as one row
        groups[re.sub(r"_\d+$|-\d+$| \(\w+\)$", "", name)].update(c)
    for name, c in sorted(groups.items(), key=lambda kv: -sum(kv[1].values())):
        n = sum(c.values())
        lines.append(f"  {n:6d} ({n / possible:5.2f})  {name}")
        if only and not any(o in name for o in only):
            continue
        where: collections.Counter = collections.Counter()
        for frames, k in c.items():
            where[_where(frames, depth)] += k
        for w, k in where.most_common(top):
            lines.append(f"           {k:6d}  {w}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--threads", default="render-batcher", help="comma-separated name parts to break down by location")
    ap.add_argument("--depth", type=int, default=3)
    args = ap.parse_args()
    for f in args.files:
        print(summarize(f, args.rate, args.seconds, [t for t in args.threads.split(",") if t], args.depth))


if __name__ == "__main__":
    main()
