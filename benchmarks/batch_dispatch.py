"""How long the render thread takes to dispatch a MuseTalk batch, with and without its batch graphs,
while other Python threads keep taking the GIL (as a live server's sessions do).

Every torch call releases the GIL and takes it back; with ~20 busy threads each call waits its
turn, so a batch's dispatch time grows with its number of torch calls. This script renders
one-avatar batches through `MuseTalkEngine.render_many` both ways (engines/musetalk/batch_graphs.py
on, then off), first checking that each request gets the same bytes both ways, then timing:

* ``dispatch``: until `render_many` returns (the render thread's own time per batch);
* ``period``: batch after batch with a synchronise each (what one thread can feed the GPU);

alone and with ``--busy-threads`` threads each looping over a few small GPU ops (a stand-in for the
sessions' splice, copy and feature calls). Prints one row per (path, threads).

    python -m benchmarks.batch_dispatch --accel cudagraph --busy-threads 0,16
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
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


def time_paths(engine, layer, frames: list[int], batches: int, threads: int) -> list[dict]:
    dev = engine.device
    work = _batches(layer, frames, batches, 7)
    stop = threading.Event()
    pool = [threading.Thread(target=_busy, args=(stop, dev), daemon=True) for _ in range(threads)]
    for t in pool:
        t.start()
    rows = []
    try:
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
            rows.append({"path": "batch graphs" if on else "general", "busy_threads": threads, "frames": frames,
                         "dispatch_ms": round(statistics.median(dispatch) * 1e3, 2),
                         "dispatch_p90_ms": round(sorted(dispatch)[int(0.9 * len(dispatch))] * 1e3, 2),
                         "period_ms": round(statistics.median(period) * 1e3, 2)})
    finally:
        stop.set()
        for t in pool:
            t.join()
        engine.batch_graphs.enabled = True
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--accel", default="cudagraph", help="the engine's accel (cudagraph: no compile wait)")
    ap.add_argument("--size", type=int, default=1080, help="avatar size (square), as in the load test")
    ap.add_argument("--frames", default="14,14", help="the requests of a timed batch (frames each)")
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--busy-threads", default="0,16")
    ap.add_argument("--json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("batch_dispatch measures CUDA graph dispatch: it needs a GPU")
    from newsstudio.engines.musetalk.engine import MuseTalkEngine

    engine = MuseTalkEngine("cuda", weights="random", accel=args.accel, batch_graphs=True)
    t0 = time.perf_counter()
    engine.warm_up()
    print(f"engine warmed up in {time.perf_counter() - t0:.0f} s ({args.accel}, first face row {engine.first_face_row})", flush=True)
    with tempfile.TemporaryDirectory() as d:
        from PIL import Image
        from skimage import data

        src = Path(d) / "astronaut.png"  # the load test's avatar
        Image.fromarray(data.astronaut()).save(src)
        packet = avatar(src, "dispatch", (args.size, args.size), Path(d) / "avatars")
        layer = engine.load_avatar(engine.prebake(packet, progress=False))
    equal = check_equal(engine, layer, [[3, 2], [14, 14], [31], [4], [8, 8, 8, 8], [2]])
    for r in equal:
        print(f"frames {r['frames']}: {'same bytes' if r['equal'] else 'DIFFERENT'} (max |diff| {r['max_abs_diff']})", flush=True)
    frames = [int(x) for x in args.frames.split(",")]
    rows = []
    for threads in (int(x) for x in args.busy_threads.split(",")):
        rows += time_paths(engine, layer, frames, args.batches, threads)
        for r in rows[-4:]:
            print(f"{r['path']:>12} | {r['busy_threads']:>2} busy threads | dispatch {r['dispatch_ms']:7.2f} ms "
                  f"(p90 {r['dispatch_p90_ms']:7.2f}) | period {r['period_ms']:7.2f} ms", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"accel": args.accel, "equal": equal, "timing": rows}, indent=1))


if __name__ == "__main__":
    main()
