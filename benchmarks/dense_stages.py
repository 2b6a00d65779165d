"""Where a dense render's wall time goes: the front end (audio features + motion) and the render
(networks + splice) timed apart, next to the whole stream with the front end run ahead of the
renders on its own thread and CUDA stream (`front_end_feed.py`, the CUDA default) and inline.

    python -m benchmarks.dense_stages --engine ditto [--size 1080x1920] [--seconds 6.6] [--chunk 32]
                                      [--repeat 3] [--json out.json]

Seeded weights, the yongen avatar, the first --seconds of speech.wav, NV12 kept on the device (the
dense figure's setting). Rows, each the median of --repeat warm runs:

- ``stream``: `stream_generator` as `benchmarks.run` times dense fps (on CUDA the front end runs ahead);
- ``stream inline``: the same with ``front_end_ahead=False`` (the front end between two renders);
- ``front end``: the same audio through the session's conditioner and driver alone (every driving
  row, no render);
- ``render``: those rows rendered and spliced in chunks of --chunk, nothing else;
- ``runner`` (Ditto): the warp + decoder graphs alone on the same chunks (``render`` less this is the
  motion stitching, crop sampling and splice);
- ``--profile``: one profiled run each of ``stream`` and ``render``: the GPU's busy share, top kernels
  and CUDA runtime calls.

``stream inline`` is about ``front end`` + ``render`` when the two run one after the other; ``stream``
less that is what running the front end ahead buys on this GPU.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch

from .common import avatar, fallback_count, machine, media, median, sync
from .run import segment_audio


def _session(engine, packet):
    from newsstudio.stream import StreamSession, background_for

    return StreamSession(engine, engine.load_avatar(packet), background_for(engine, packet), Fraction(25))


def _source(engine, audio):
    from newsstudio.audio.source import AudioSource

    return AudioSource(audio, engine.sample_rate, block_s=getattr(engine, "file_block_s", 0.5))


def run_stream(engine, packet, audio, chunk: int, front_end_ahead: bool | None = None) -> tuple[int, float]:
    from newsstudio.stream import stream_generator

    dev = engine.device
    sync(dev)
    t0 = time.perf_counter()
    n = sum(ch["num_frames"] for ch in stream_generator(engine, packet, audio, fps=25, chunk_frames=chunk, output="nv12",
                                                         keep_on_device=True, front_end_ahead=front_end_ahead))
    sync(dev)
    return n, time.perf_counter() - t0


def run_front_end(engine, packet, audio) -> tuple[int, float, torch.Tensor]:
    """Every driving row of ``audio``, made on this thread (the stream's feed, inline)."""
    from newsstudio.front_end_feed import FrontEndFeed

    session = _session(engine, packet)
    feed = FrontEndFeed(session, _source(engine, audio), Fraction(25), ahead=False)
    sync(engine.device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        n = feed.wait(1 << 62)  # returns once the input has ended
        rows = feed.take(n)
    sync(engine.device)
    return n, time.perf_counter() - t0, rows


def run_render(engine, packet, rows: torch.Tensor, chunk: int) -> tuple[int, float]:
    session = _session(engine, packet)
    sync(engine.device)
    t0 = time.perf_counter()
    for s in range(0, rows.shape[0], chunk):
        session.render_frames(s, rows[s:s + chunk], "nv12")
    sync(engine.device)
    return rows.shape[0], time.perf_counter() - t0


def runner_inputs(engine, packet, rows: torch.Tensor, chunk: int) -> list[tuple[torch.Tensor, ...]]:
    """Ditto: each chunk's warp + decoder inputs (f_s, x_s, x_d), made once, for the ``runner`` row."""
    from newsstudio.engines.base import pingpong_index

    layer = engine.load_avatar(packet)
    out = []
    with torch.inference_mode():
        for s in range(0, rows.shape[0], chunk):
            n = min(chunk, rows.shape[0] - s)
            idx = pingpong_index(torch.arange(s, s + n, device=engine.device), layer.n_frames)
            x_s, x_d = engine.keypoints(layer, rows[s:s + n].to(engine.device), idx)
            f_s = layer.data["f_s"].index_select(0, idx.to(layer.data["f_s"].device)).to(engine.device, engine.dtype)
            out.append((f_s, x_s, x_d))
    return out


def run_runner(engine, inputs: list[tuple[torch.Tensor, ...]]) -> tuple[int, float]:
    sync(engine.device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        for f_s, x_s, x_d in inputs:
            engine._crop_runner(f_s, x_s, x_d)
    sync(engine.device)
    return sum(int(i[0].shape[0]) for i in inputs), time.perf_counter() - t0


def gpu_profile(fn, top: int = 12) -> dict[str, Any]:
    """One run of ``fn`` under the profiler: the GPU's busy share of the run, its top kernels and the
    CUDA runtime calls (a long synchronize or copy is a thread waiting for the device)."""
    from torch.profiler import ProfilerActivity, profile

    from .gpu_timeline import summarize_trace

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        fn()
        wall = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "trace.json"
        prof.export_chrome_trace(str(path))
        s = summarize_trace(json.loads(path.read_text()), wall, top=top)
    s.pop("threads", None)
    return s


def main(argv: list[str] | None = None) -> int:
    from newsstudio.engines.registry import create_engine

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", default="ditto", choices=["musetalk", "ditto"])
    ap.add_argument("--accel", default=None, help="engine accel mode (default: the engine's)")
    ap.add_argument("--size", default="1080x1920")
    ap.add_argument("--seconds", type=float, default=6.6)
    ap.add_argument("--chunk", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="also one profiled run of the stream and render rows")
    ap.add_argument("--json", default=None)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    size = tuple(int(v) for v in args.size.split("x"))
    packet = avatar(media("yongen.mp4"), "yongen", size, Path(tempfile.mkdtemp(prefix="stages-")) / "avatars")
    kw: dict[str, Any] = {"weights": "random"}
    if args.accel:
        kw["accel"] = args.accel
    eng = create_engine(args.engine, device=dev, **kw)
    audio = segment_audio(args.seconds)
    eng.warm_up()
    warm: dict[str, Any] = {"fallbacks": fallback_count()}
    if dev.type == "cuda":
        warm["reserved_gb"] = round(torch.cuda.memory_reserved(dev) / 1e9, 2)
    print(f"after warm-up: {warm}", flush=True)

    def timed(name: str, fn) -> dict[str, Any]:
        fn()  # warm: caches, avatar upload, graphs of this shape
        runs = [fn() for _ in range(args.repeat)]
        frames, secs = runs[0][0], [r[1] for r in runs]
        row = {"row": name, "frames": frames, "ms": median(secs) * 1e3, "ms_all": [s * 1e3 for s in secs],
               "fps": frames / median(secs)}
        print(f"{name:16s} {frames:4d} frames  {row['ms']:8.1f} ms  {row['fps']:7.1f} fps   runs {[round(s * 1e3, 1) for s in secs]}",
              flush=True)
        return row

    rows_holder: dict[str, torch.Tensor] = {}

    def front():
        n, s, rows = run_front_end(eng, packet, audio)
        rows_holder["rows"] = rows
        return n, s

    out = [timed("stream", lambda: run_stream(eng, packet, audio, args.chunk)),
           timed("stream inline", lambda: run_stream(eng, packet, audio, args.chunk, front_end_ahead=False)),
           timed("front end", front)]
    out.append(timed("render", lambda: run_render(eng, packet, rows_holder["rows"], args.chunk)))
    if hasattr(eng, "_crop_runner"):  # Ditto: the warp + decoder graphs alone, same chunks
        inputs = runner_inputs(eng, packet, rows_holder["rows"], args.chunk)
        out.append(timed("runner", lambda: run_runner(eng, inputs)))
    profiles: dict[str, Any] = {}
    if args.profile and dev.type == "cuda":
        from .gpu_timeline import print_summary

        for name, fn in (("stream", lambda: run_stream(eng, packet, audio, args.chunk)),
                         ("render", lambda: run_render(eng, packet, rows_holder["rows"], args.chunk))):
            profiles[name] = gpu_profile(fn)
            print(f"== profiled {name}:")
            print_summary(profiles[name])
    by = {r["row"]: r for r in out}
    print(f"front end + render {by['front end']['ms'] + by['render']['ms']:.1f} ms; stream {by['stream']['ms']:.1f} ms "
          f"(front end ahead, the CUDA default), {by['stream inline']['ms']:.1f} ms with it inline")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine(), "args": vars(args), "rows": out, "profiles": profiles, "warm_up": warm}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
