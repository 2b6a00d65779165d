"""Where a stream's time goes: one warm `stream_generator` run of an engine under torch.profiler.

    python -m benchmarks.profile_stream --engine ditto [--stride 4] [--accel cudagraph] [--to-cpu]
                                        [--size 1080x1920] [--seconds 6.6] [--rows 20] [--trace out.json]

Seeded weights, the yongen avatar, the first --seconds of speech.wav, chunks of 32 frames. Prints
the wall time of a plain warm run, then the operators with the most self time on the device and
on the CPU during a profiled run (the profiler itself adds some CPU time). --to-cpu copies the
NV12 frames to the CPU like the MP4 path does; default keeps them on the device.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import Future
from pathlib import Path

import torch

from .common import avatar, media, sync
from .run import segment_audio


class _Inline:
    """An executor that runs the submitted call at once, on the calling thread."""

    def submit(self, fn, *args):
        fut: Future = Future()
        try:
            fut.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
            fut.set_exception(exc)
        return fut


def main(argv: list[str] | None = None) -> int:
    from newsstudio.engines.registry import create_engine
    from newsstudio.stream import stream_generator

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", default="ditto", choices=["classic", "musetalk", "ditto"])
    ap.add_argument("--stride", type=int, default=1, help="Ditto stride mode (1 = dense)")
    ap.add_argument("--accel", default=None, help="engine accel mode (default: the engine's)")
    ap.add_argument("--to-cpu", action="store_true")
    ap.add_argument("--size", default="1080x1920")
    ap.add_argument("--seconds", type=float, default=6.6)
    ap.add_argument("--chunk", type=int, default=32)
    ap.add_argument("--rows", type=int, default=20)
    ap.add_argument("--trace", default=None, help="also write a Chrome trace here")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    size = tuple(int(v) for v in args.size.split("x"))
    packet = avatar(media("yongen.mp4"), "yongen", size, Path(tempfile.mkdtemp(prefix="profile-")) / "avatars")
    kw: dict = {} if args.engine == "classic" else {"weights": "random"}
    if args.accel:
        kw["accel"] = args.accel
    if args.engine == "ditto" and args.stride > 1:
        kw["stride"] = args.stride
    eng = create_engine(args.engine, device=dev, **kw)
    audio = segment_audio(args.seconds)

    def run(prefetch: int = 2) -> tuple[int, float]:
        sync(dev)
        t0 = time.perf_counter()
        n = sum(ch["num_frames"] for ch in stream_generator(eng, packet, audio, fps=25, chunk_frames=args.chunk, output="nv12",
                                                             keep_on_device=not args.to_cpu, prefetch=prefetch))
        sync(dev)
        return n, time.perf_counter() - t0

    run()
    n, wall = run()
    print(f"{args.engine} stride {args.stride} accel {getattr(eng, 'accel', '-')} to_cpu {args.to_cpu}: "
          f"{n} frames in {wall:.3f} s = {n / wall:.1f} fps (warm, unprofiled)")
    # The runner renders in a pooled worker thread, which the profiler does not see: for the
    # profiled run the worker runs inline (all chunks queued, then consumed).
    import newsstudio.stream as stream_mod

    pool, stream_mod._RENDER_POOL = stream_mod._RENDER_POOL, _Inline()
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    try:
        with torch.profiler.profile(activities=acts) as prof:
            run(prefetch=1 << 20)
    finally:
        stream_mod._RENDER_POOL = pool
    if args.trace:
        prof.export_chrome_trace(args.trace)
    ka = prof.key_averages()
    if dev.type == "cuda":
        print(ka.table(sort_by="self_cuda_time_total", row_limit=args.rows, max_name_column_width=60))
    print(ka.table(sort_by="self_cpu_time_total", row_limit=args.rows, max_name_column_width=60))
    return 0


if __name__ == "__main__":
    sys.exit(main())
