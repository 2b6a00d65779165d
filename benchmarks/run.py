"""One benchmark command: every engine and its reference-style pipeline, in one process on one device.

    python -m benchmarks.run [--engines classic,musetalk,ditto] [--size 1080x1920] [--variants compile+cudagraph]
                             [--mp4 ultrafast:8] [--stride 4] [--json out.json] [--quick]

Sections (each prints a table row group and lands in the JSON):
- cold start: official MuseTalk avatar layout vs our packet (benchmarks/cold_start.py);
- per engine: dense fps to 1080x1920 NV12 (audio features + render + splice, warm), time to first
  frame (audio available), a 6.6 s segment -> MP4 with audio on disk (warm);
- MuseTalk / Ditto reference-style pipelines come from benchmarks/musetalk_bench.py and
  benchmarks/ditto_bench.py when those engines are selected; ``--stride K`` adds Ditto's stride mode
  (its fps next to dense, and its PSNR vs dense on the same seeded weights);
- concurrency (``--load musetalk=8,12,16;ditto=4,6,8``): for each engine, benchmarks/load_test.py
  in a child process (a server on loopback, live WebSocket sessions streaming speech in real time,
  each level ``--load-duration`` seconds): how many sessions were all on time, and the server's
  GPU memory per session at the highest level (peak minus before, / sessions). The server runs with
  its defaults unless ``--load-args ENGINE=FLAGS`` passes that engine's load test more flags, e.g.
  the many-streams settings ``musetalk=--render-aheads 16 --render-leads 0.5 --chunk-frames 4``.
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

    engine.warm_up()  # every batch bucket, as a server does: no capture inside a timed run
    dense()  # warm-up (caches, avatar upload)
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


LOAD_ENGINES = ("musetalk", "ditto", "classic")


def parse_load(spec: str | None) -> dict[str, list[int]]:
    """``"musetalk=8,12;ditto=4,8"`` -> {"musetalk": [8, 12], "ditto": [4, 8]}."""
    out: dict[str, list[int]] = {}
    for part in (spec or "").split(";"):
        if not part.strip():
            continue
        name, _, levels = part.partition("=")
        try:
            out[name.strip()] = [int(v) for v in levels.split(",") if v.strip()]
        except ValueError:
            raise SystemExit(f"--load: {part!r} is not ENGINE=N,N,...") from None
        if not out[name.strip()] or name.strip() not in LOAD_ENGINES:
            raise SystemExit(f"--load: {part!r} is not ENGINE=N,N,... with ENGINE one of {sorted(LOAD_ENGINES)}")
    return out


def parse_load_args(specs: list[str] | None) -> dict[str, list[str]]:
    """``--load-args ENGINE=FLAGS`` (repeatable) -> {engine: [flag, ...]} (shell-style split)."""
    import shlex

    out: dict[str, list[str]] = {}
    for spec in specs or []:
        name, sep, flags = spec.partition("=")
        if not sep or name.strip() not in LOAD_ENGINES:
            raise SystemExit(f"--load-args: {spec!r} is not ENGINE=FLAGS with ENGINE one of {sorted(LOAD_ENGINES)}")
        out.setdefault(name.strip(), []).extend(shlex.split(flags))
    return out


def load_figures(engine: str, levels: list[int], duration: float, size: int, accel: str, out_dir: Path,
                 timeout_s: float | None = None, fps: float = 30.0, extra: list[str] | None = None) -> dict[str, Any]:
    """benchmarks/load_test.py for one engine in a child process (its own server and CUDA context):
    every level's row, the most sessions that were all sustained, GPU memory per session."""
    import json
    import subprocess

    path = out_dir / f"load_{engine}.json"
    path.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "benchmarks.load_test", "--engine", engine, "--weights", "random" if engine != "classic" else "official",
           "--fps", f"{fps:g}", "--size", str(size), "--sessions", ",".join(map(str, levels)), "--duration", str(duration),
           "--accel", accel, "--client-processes", "4", "--json", str(path), *(extra or [])]
    print(f"[load] {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    try:
        subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1], timeout=timeout_s, check=False)
        status = "ok"
    except subprocess.TimeoutExpired:
        status = f"stopped after {timeout_s:.0f} s"
    rows = json.loads(path.read_text()) if path.is_file() else []
    ok = [r["sessions"] for r in rows if r["sustained"] == r["sessions"] and not r["errors"]]
    top = max(rows, key=lambda r: r["sessions"]) if rows else None
    return {"command": " ".join(cmd[1:]), "status": status, "fps": fps, "rows": rows,
            "max_sustained_sessions": max(ok) if ok else 0,
            "gpu_mb_per_session": (top["gpu_peak_mb"] - top["gpu_before_mb"]) / top["sessions"] if top and top["gpu_peak_mb"] else None}


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
    ap.add_argument("--load", default=None, help="concurrency levels per engine, e.g. 'musetalk=8,12,16;ditto=4,6,8' (load_test)")
    ap.add_argument("--load-duration", type=float, default=30.0, help="seconds per concurrency level (the goal: on time for 30 s)")
    ap.add_argument("--load-fps", type=float, default=30.0,
                    help="frame rate of every live session (the goal's 30; Ditto's native rate is 25, others resample its motion)")
    ap.add_argument("--load-size", type=int, default=1080, help="square avatar size of the load test")
    ap.add_argument("--load-timeout", type=float, default=None, help="stop each engine's load test after this many seconds")
    ap.add_argument("--load-args", action="append", default=None, metavar="ENGINE=FLAGS",
                    help="more load_test flags for one engine's levels (repeatable), e.g. "
                    "'musetalk=--render-aheads 16 --render-leads 0.5 --chunk-frames 4'")
    ap.add_argument("--stride", type=int, default=1,
                    help="Ditto: also time stride mode (warp + decode every K-th frame) with its PSNR vs dense")
    ap.add_argument("--stride-mode", default="mask", help="Ditto stride mode's interpolation (mask, heatmap, blend, nearest)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true", help="tiny sizes (CPU smoke test)")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    load = parse_load(args.load)  # both checked before anything is measured
    load_args = parse_load_args(args.load_args)
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
            extra = ({"stride": args.stride, "stride_mode": args.stride_mode, "stride_psnr_modes": [args.stride_mode]}
                     if name == "ditto" and args.stride > 1 else {})
            section = mod.run_section(packet=packet, device=dev, seconds=args.seconds, chunk=args.chunk, repeat=args.repeat,
                                      workdir=work, quick=args.quick, variants=variants, mp4=args.mp4, **extra)
        out["engines"][name] = section
        if name == "classic":
            print(f"[classic] {section}", flush=True)
        else:
            mod.print_table(section)
        write_json(args.json, out)  # after each engine: a later failure keeps what was measured

    if load:
        if dev.type == "cuda":
            torch.cuda.empty_cache()  # the child server gets the memory this process no longer uses
        accel = (variant_list(args.variants) or ["auto"])[0].split(":")[0]
        out["concurrency"] = {}
        for name, levels in load.items():
            out["concurrency"][name] = load_figures(name, levels, args.load_duration, args.load_size, accel, work, args.load_timeout,
                                                      args.load_fps, load_args.get(name))
            write_json(args.json, out)

    print("\n| engine | path | dense fps | TTFF ms | live TTFF ms (speech needed / after it) | 6.6 s -> MP4 s "
          "| x264 + AAC alone on these frames, s (MB) | these chunks rendered alone, s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, sec in out["engines"].items():
        for path in ("ours", "reference"):
            r = sec.get(path)
            if r:
                lv = r.get("live_ttff")
                live = f"{lv['ms']:.0f} ({lv['audio_ms']:.0f} / {lv['compute_ms']:.1f})" if lv else "-"
                cfg = r.get("segment_mp4_config")
                alone, size = (r.get(k, {}).get(cfg) for k in ("segment_encode_alone_s_by_config", "segment_mp4_bytes_by_config"))
                enc = f"{alone:.2f} ({size / 1e6:.1f})" if alone is not None else "-"
                rendered = r.get("segment_render_alone_s_by_config", {}).get(cfg)
                print(f"| {name} | {path} | {r.get('dense_fps', float('nan')):.1f} | {r.get('ttff_ms', float('nan')):.1f} | {live} "
                      f"| {r.get('segment_mp4_s', float('nan')):.2f} | {enc} | {'-' if rendered is None else f'{rendered:.2f}'} |")
    if out.get("concurrency"):
        print("\n| engine | live sessions all on time (most) | levels: sessions -> sustained, server fps | GPU MB / session |")
        print("|---|---|---|---|")
        for name, c in out["concurrency"].items():
            lv = ", ".join(f"{r['sessions']} -> {r['sustained']} ({r['server_fps']:.0f} fps)" for r in c["rows"]) or c["status"]
            mb = f"{c['gpu_mb_per_session']:.0f}" if c["gpu_mb_per_session"] is not None else "-"
            print(f"| {name} @ {c['fps']} fps | {c['max_sustained_sessions']} | {lv} | {mb} |")
    write_json(args.json, out)
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
