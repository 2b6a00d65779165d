"""How long the render thread takes to dispatch a MuseTalk batch, with and without its batch graphs,
while other Python threads keep taking the GIL (as a live server's sessions do).

Every torch call releases the GIL and takes it back; with ~20 busy threads each call waits its
turn, so a batch's dispatch time grows with its number of torch calls. This script renders
one-avatar batches through `MuseTalkEngine.render_many` both ways (engines/musetalk/batch_graphs.py
on, then off), first checking that each request gets the same bytes both ways, then timing:

* ``dispatch``: until `render_many` returns (the render thread's own time per batch);
* ``period``: batch after batch with a synchronise each (what one thread can feed the GPU);

alone and with ``--busy-threads`` threads each looping over a few small GPU ops (a stand-in for the
sessions' splice, copy and feature calls). The same for a live session's compose (splice + copy to
the host) through its graphs (compose/session_graphs.py) or directly: bytes, then launch time per
request. Prints one row per (path, threads).

    python -m benchmarks.batch_dispatch --accel cudagraph --busy-threads 0,16
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from .common import avatar


def _busy(stop: threading.Event, device: torch.device) -> None:
    """A thread that keeps calling small torch ops (each a GIL release and re-take)."""
    x = torch.zeros(64, device=device)
    while not stop.is_set():
        for _ in range(8):
            x.add_(1.0).mul_(0.5)
        time.sleep(0.0005)


@contextlib.contextmanager
def busy_threads(n: int, device: torch.device) -> Iterator[None]:
    """``n`` `_busy` threads running while the block runs."""
    stop = threading.Event()
    pool = [threading.Thread(target=_busy, args=(stop, device), daemon=True) for _ in range(n)]
    for t in pool:
        t.start()
    try:
        yield
    finally:
        stop.set()
        for t in pool:
            t.join()


def _ms(seconds: list[float]) -> tuple[float, float]:
    """(median, 90th percentile) in ms."""
    return round(statistics.median(seconds) * 1e3, 2), round(sorted(seconds)[int(0.9 * len(seconds))] * 1e3, 2)


def _batches(layer, frames: list[int], count: int, seed: int) -> list[list[tuple]]:
    g = torch.Generator().manual_seed(seed)
    dev = layer.device
    out = []
    for _ in range(count):
        out.append([(layer, torch.randn(k, 50, 384, generator=g).to(dev, torch.float16),
                     torch.randint(0, layer.n_frames, (k,), generator=g).to(dev)) for k in frames])
    return out


def check_equal(engine, layer, shapes: list[list[int]]) -> list[dict]:
    """For each batch shape: do both paths give every request the same bytes?"""
    rows = []
    for i, frames in enumerate(shapes):
        items = _batches(layer, frames, 1, 100 + i)[0]
        engine.batch_graphs.enabled = True
        before = engine.batch_graphs.batches
        fast = engine.render_many(items)
        if engine.batch_graphs.batches != before + 1:
            raise SystemExit(f"frames {frames}: the batch did not take the batch-graph path")
        engine.batch_graphs.enabled = False
        general = engine.render_many(items)
        engine.batch_graphs.enabled = True
        same = all(torch.equal(a, b) for a, b in zip(fast, general))
        worst = max(float((a - b).abs().max()) for a, b in zip(fast, general))
        rows.append({"frames": frames, "equal": same, "max_abs_diff": worst})
    return rows


def check_compose(session, engine, layer, sizes: list[int]) -> list[dict]:
    """For each request size: does a session's compose through its graphs (compose/session_graphs.py)
    give the bytes of its direct compose? Each check fails unless the request took the graph path."""
    from newsstudio.compose.session_graphs import ComposeGraphs

    graphs = ComposeGraphs(engine.device)
    rows = []
    for i, n in enumerate(sizes):
        (layer_, driving, idx), = _batches(layer, [n], 1, 300 + i)[0]
        rois = engine.render(layer_, driving, idx)
        before = graphs.replays
        got = graphs.to_host(session._compose, rois, idx, "nv12")
        if got is None or graphs.replays != before + 1:
            raise SystemExit(f"compose of {n} frames did not take the graph path")
        want = session._compose_to_host(idx, "nv12", rois)
        for _, done in (got, want):
            if done is not None:
                done.synchronize()
        rows.append({"frames": n, "equal": torch.equal(got[0], want[0]),
                     "max_abs_diff": int((got[0].int() - want[0].int()).abs().max())})
    return rows


def time_compose(session, engine, layer, n: int, requests: int, threads: int) -> list[dict]:
    """Per request: time to launch a session's compose and copy-out, through its graphs or directly."""
    from newsstudio.compose.session_graphs import ComposeGraphs

    dev = engine.device
    graphs = ComposeGraphs(dev)
    work = [(engine.render(lay, d, i), i) for lay, d, i in (b[0] for b in _batches(layer, [n], requests, 11))]
    rows = []
    with busy_threads(threads, dev):
        for graphed in (True, False, True, False):
            launch = []
            for rois, idx in work:
                torch.cuda.synchronize(dev)
                t0 = time.perf_counter()
                if graphed:
                    graphs.to_host(session._compose, rois, idx, "nv12")
                else:
                    session._compose_to_host(idx, "nv12", rois)
                launch.append(time.perf_counter() - t0)
            median, p90 = _ms(launch)
            rows.append({"compose": "graphs" if graphed else "direct", "busy_threads": threads, "frames": n,
                         "launch_ms": median, "launch_p90_ms": p90})
    return rows


def time_paths(engine, layer, frames: list[int], batches: int, threads: int) -> list[dict]:
    dev = engine.device
    work = _batches(layer, frames, batches, 7)
    rows = []
    try:
        with busy_threads(threads, dev):
            for on in (True, False, True, False):  # alternated: drift in the machine shows as a difference between repeats
                engine.batch_graphs.enabled = on
                for items in work[:3]:
                    engine.render_many(items)
                torch.cuda.synchronize(dev)
                dispatch, period = [], []
                for items in work:
                    t0 = time.perf_counter()
                    engine.render_many(items)
                    t1 = time.perf_counter()
                    torch.cuda.synchronize(dev)
                    dispatch.append(t1 - t0)
                    period.append(time.perf_counter() - t0)
                median, p90 = _ms(dispatch)
                rows.append({"path": "batch graphs" if on else "general", "busy_threads": threads, "frames": frames,
                             "dispatch_ms": median, "dispatch_p90_ms": p90, "period_ms": _ms(period)[0]})
    finally:
        engine.batch_graphs.enabled = True
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--accel", default="cudagraph", help="the engine's accel (cudagraph: no compile wait)")
    ap.add_argument("--size", type=int, default=1080, help="avatar size (square), as in the load test")
    ap.add_argument("--first-face-row", default="auto",
                    help="the face rows decoded: auto (the lower-face decoder, as a compiled server runs; its batches "
                         "gather the avatar's upper-row statistics too) or 0 (the whole face)")
    ap.add_argument("--frames", default="14,14", help="the requests of a timed batch (frames each)")
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--busy-threads", default="0,16")
    ap.add_argument("--json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("batch_dispatch measures CUDA graph dispatch: it needs a GPU")
    from newsstudio.engines.musetalk.engine import MuseTalkEngine

    from newsstudio.engines.musetalk.face_rows import parse_first_face_row

    engine = MuseTalkEngine("cuda", weights="random", accel=args.accel, batch_graphs=True,
                            first_face_row=parse_first_face_row(args.first_face_row))
    t0 = time.perf_counter()
    engine.warm_up()
    print(f"engine warmed up in {time.perf_counter() - t0:.0f} s ({args.accel}, first face row {engine.first_face_row})", flush=True)
    from fractions import Fraction

    from newsstudio.stream import StreamSession, background_for

    with tempfile.TemporaryDirectory() as d:
        from PIL import Image
        from skimage import data

        src = Path(d) / "astronaut.png"  # the load test's avatar
        Image.fromarray(data.astronaut()).save(src)
        packet = avatar(src, "dispatch", (args.size, args.size), Path(d) / "avatars")
        layer = engine.load_avatar(engine.prebake(packet, progress=False))
        session = StreamSession(engine, layer, background_for(engine, layer.packet), Fraction(30))
    print(f"avatar {args.size}x{args.size}: its batches run "
          f"{'the lower-face decoder' if 'upper_stats' in layer.data else 'the whole face'}", flush=True)
    equal = check_equal(engine, layer, [[3, 2], [14, 14], [31], [4], [8, 8, 8, 8], [2]])
    for r in equal:
        print(f"frames {r['frames']}: {'same bytes' if r['equal'] else 'DIFFERENT'} (max |diff| {r['max_abs_diff']})", flush=True)
    composed = check_compose(session, engine, layer, [16, 16, 8, 16])
    for r in composed:
        print(f"compose of {r['frames']} frames through graphs: {'same bytes' if r['equal'] else 'DIFFERENT'} "
              f"(max |diff| {r['max_abs_diff']})", flush=True)
    frames = [int(x) for x in args.frames.split(",")]
    rows, compose_rows = [], []
    for threads in (int(x) for x in args.busy_threads.split(",")):
        rows += time_paths(engine, layer, frames, args.batches, threads)
        for r in rows[-4:]:
            print(f"{r['path']:>12} | {r['busy_threads']:>2} busy threads | dispatch {r['dispatch_ms']:7.2f} ms "
                  f"(p90 {r['dispatch_p90_ms']:7.2f}) | period {r['period_ms']:7.2f} ms", flush=True)
        compose_rows += time_compose(session, engine, layer, 16, args.batches, threads)
        for r in compose_rows[-4:]:
            print(f"compose {r['compose']:>6} | {r['busy_threads']:>2} busy threads | launch {r['launch_ms']:7.2f} ms "
                  f"(p90 {r['launch_p90_ms']:7.2f})", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"accel": args.accel, "equal": equal, "compose_equal": composed,
                                               "timing": rows, "compose_timing": compose_rows}, indent=1))


if __name__ == "__main__":
    main()
