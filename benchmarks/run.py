"""One benchmark command: every engine and its reference-style pipeline, in one process on one device.

    python -m benchmarks.run [--engines classic,musetalk,ditto] [--size 1080x1920] [--variants compile+cudagraph]
                             [--mp4 ultrafast:8] [--json out.json] [--quick]

Sections (each prints a table row group and lands in the JSON):
- cold start: official MuseTalk avatar layout vs our packet (benchmarks/cold_start.py);
- per engine: dense fps to 1080x1920 NV12 (audio features + render + splice, warm), time to first
  frame (audio available), a 6.6 s segment -> MP4 with audio on disk (warm);
- MuseTalk / Ditto reference-style pipelines come from benchmarks/musetalk_bench.py and
  benchmarks/ditto_bench.py when those engines are selected.
Seeded random weights for the neural engines (speed does not depend on weight values).
"""
from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .common import (add_engine_config_args, avatar, live_ttff, machine, media, median, segment_mp4_figures, sync,
                     variant_list, write_json)


def segment_audio(seconds: float):
    from newsstudio.media.audio import Audio, load_audio

    a = load_audio(media("speech.wav"))
    n = int(seconds * a.sample_rate)
    return Audio(np.ascontiguousarray(a.samples[:, :n]), a.sample_rate)


def engine_figures(engine, packet, seconds: float, chunk: int, repeat: int, out_dir: Path, mp4: str = "veryfast") -> dict[str, Any]:
    """Dense fps, time to first frame and segment->MP4 time for an engine on a packet."""
    from newsstudio.stream import stream_generator

    dev = engine.device
    audio = segment_audio(seconds)

    def dense() -> tuple[int, float]:
        n = 0
        t0 = time.perf_counter()
        first = None
        for ch in stream_generator(engine, packet, audio, fps=25, chunk_frames=chunk, output="nv12", keep_on_device=True):
            if first is None:
                sync(dev)
                first = time.perf_counter() - t0
            n += ch["num_frames"]
        sync(dev)
        return n, first or 0.0, time.perf_counter() - t0

    dense()  # warm-up (compile, caches, avatar upload)
    runs = [dense() for _ in range(repeat)]
    n = runs[0][0]
    fps = [r[0] / r[2] for r in runs]

    def ttff() -> float:
        sync(dev)
        t0 = time.perf_counter()
        gen = stream_generator(engine, packet, audio, fps=25, chunk_frames=min(chunk, 4), output="nv12")
        first = next(gen)
        del first
        dt = time.perf_counter() - t0
        gen.close()
        return dt

    ttff()
    tt = [ttff() for _ in range(repeat)]
    return {"frames": n, "dense_fps": median(fps), "dense_fps_all": fps, "ttff_ms": median(tt) * 1e3, "segment_s": seconds,
            **segment_mp4_figures(engine, packet, audio, 25, chunk, out_dir / f"{engine.name}_segment.mp4", mp4, repeat // 2),
            "live_ttff": live_ttff(engine, packet, audio, 25, min(chunk, 4))}


def main() -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", default="classic")
    ap.add_argument("--size", default="1080x1920")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seconds", type=float, default=6.6)
    ap.add_argument("--chunk", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--max-frames", type=int, default=750)
    add_engine_config_args(ap)
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true", help="tiny sizes (CPU smoke test)")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    if args.quick:
        args.size, args.seconds, args.repeat, args.max_frames = "256x448", 1.0, 1, 20
    size = tuple(int(v) for v in args.size.split("x"))
    work = Path(args.workdir or tempfile.mkdtemp(prefix="nsbench-"))
    out: dict[str, Any] = {"machine": machine(), "args": vars(args), "engines": {}}
    dev = torch.device(args.device)

    t = time.perf_counter()
    packet = avatar(media("yongen.mp4"), "yongen", size, work / "avatars", max_frames=args.max_frames)
    out["prebake_s"] = time.perf_counter() - t

    from newsstudio.engines.registry import create_engine

    for name in [e for e in args.engines.split(",") if e]:
        section: dict[str, Any] = {}
        if name == "classic":
            eng = create_engine("classic", device=dev)
            section["ours"] = engine_figures(eng, packet, args.seconds, args.chunk, args.repeat, work, mp4=args.mp4)
        else:
            mod = importlib.import_module(f"benchmarks.{name}_bench")
            variants = variant_list(args.variants)
            section = mod.run_section(packet=packet, device=dev, seconds=args.seconds, chunk=args.chunk, repeat=args.repeat,
                                      workdir=work, quick=args.quick, variants=variants, mp4=args.mp4)
        out["engines"][name] = section
        if name == "classic":
            print(f"[classic] {section}", flush=True)
        else:
            mod.print_table(section)
        write_json(args.json, out)  # after each engine: a later failure keeps what was measured

    print("\n| engine | path | dense fps | TTFF ms | live TTFF ms (speech needed / after it) | 6.6 s -> MP4 s |")
    print("|---|---|---|---|---|---|")
    for name, sec in out["engines"].items():
        for path in ("ours", "reference"):
            r = sec.get(path)
            if r:
                lv = r.get("live_ttff")
                live = f"{lv['ms']:.0f} ({lv['audio_ms']:.0f} / {lv['compute_ms']:.1f})" if lv else "-"
                print(f"| {name} | {path} | {r.get('dense_fps', float('nan')):.1f} | {r.get('ttff_ms', float('nan')):.1f} | {live} "
                      f"| {r.get('segment_mp4_s', float('nan')):.2f} |")
    write_json(args.json, out)
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
