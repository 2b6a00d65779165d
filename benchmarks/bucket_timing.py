"""Render cost per batch size: what a live server's small shared batches pay next to the dense path's 32.

    python -m benchmarks.bucket_timing --engine ditto [--accel compile+cudagraph] [--sizes 4,8,12,16,24,32]
                                       [--iters 20] [--json out.json] [--quick]

The engine's own render runner on seeded weights and inputs of the real shapes, timed per batch
size: MuseTalk's UNet + VAE decode of 256x256 faces, Ditto's warp + decoder of 512x512 crops
(splice and copies excluded: the runner alone). Each size runs in the batch bucket it falls in
(sizes between buckets are padded, as live batches are). Reported per size: GPU time per call
(CUDA events; wall time on the CPU), wall time per call, and frames/s. A live server's render
batches are as large as what its sessions ask for at once (`load_test`'s ``batch_frames_mean``:
~9 frames for 8 MuseTalk sessions, ~12 for 10 Ditto ones on an H200), dense runs use 32.
``--quick``: tiny test architectures on the CPU (a smoke test of this script).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from .common import machine, sync, write_json


def _engine(name: str, device: torch.device, accel: str | None, quick: bool, decoder_folds: bool = True):
    if name == "musetalk":
        from newsstudio.engines.musetalk.engine import (
            TINY_UNET_CONFIG,
            TINY_VAE_CONFIG,
            MuseTalkEngine,
        )

        tiny = {"unet_config": TINY_UNET_CONFIG, "vae_config": TINY_VAE_CONFIG} if quick else {}
        return MuseTalkEngine(device, weights="random", accel=accel, **tiny)
    if name == "ditto":
        from newsstudio.engines.ditto.config import TINY_OPTIONS
        from newsstudio.engines.ditto.engine import DittoEngine

        tiny = {**TINY_OPTIONS, "steps": 2} if quick else {}
        return DittoEngine(device, weights="random", accel=accel, decoder_folds=decoder_folds, **tiny)
    raise SystemExit(f"--engine must be musetalk or ditto, got {name!r}")


def render_call(eng, n: int) -> tuple[Callable[[], Any], Any]:
    """(a call of the engine's render runner on n frames, the runner)."""
    dev = eng.device
    g = torch.Generator(device=dev).manual_seed(0)
    if eng.name == "musetalk":
        latents = torch.randn((n, 8, 32, 32), generator=g, device=dev).to(eng.dtype)
        prompts = eng.idle_prompt()[None].to(dev, eng.dtype).expand(n, -1, -1).contiguous()
        return (lambda: eng._face_runner(latents, prompts)), eng._face_runner
    f_s = torch.randn((n, *eng.models.feature_volume(eng.config.input_size)), generator=g, device=dev).to(eng.dtype)
    x_s = torch.randn((n, 21, 3), generator=g, device=dev) * 0.3
    x_d = x_s + torch.randn((n, 21, 3), generator=g, device=dev) * 0.02
    return (lambda: eng._crop_runner(f_s, x_s, x_d)), eng._crop_runner


def time_call(fn: Callable[[], Any], device: torch.device, iters: int) -> tuple[float, float]:
    """Median (GPU ms, wall ms) per call after warm-up calls; GPU = wall off CUDA."""
    with torch.inference_mode():
        for _ in range(3):
            fn()
        sync(device)
        gpu, wall = [], []
        for _ in range(iters):
            t0 = time.perf_counter()
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                gpu.append(start.elapsed_time(end))
            else:
                fn()
            wall.append((time.perf_counter() - t0) * 1e3)
    w = statistics.median(wall)
    return (statistics.median(gpu) if gpu else w), w


def main() -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", default="ditto", help="musetalk or ditto")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--accel", default=None, help="the engine's accel mode (default: its own; compile+cudagraph is the server's)")
    ap.add_argument("--sizes", default="4,8,9,12,16,24,32", help="batch sizes (frames) to time")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true", help="tiny architectures on the CPU (smoke test)")
    ap.add_argument("--kernels", type=int, default=0,
                    help="CUDA only: list this many top kernels of one call at the largest size, per engine")
    ap.add_argument("--decoder-folds", default="on",
                    help="Ditto: on, off or both ('off,on'), one engine each: the decoder's learned shortcuts with "
                         "SPADE's beta taken through their 1x1 convs and the alike middle phases of its 4x phase "
                         "upsampling computed once (DittoEngine(decoder_folds=)); off: the decoder before both")
    args = ap.parse_args()
    folds = [v.strip() for v in args.decoder_folds.split(",") if v.strip()]
    if not folds or any(v not in ("on", "off") for v in folds):
        raise SystemExit(f"--decoder-folds takes on, off or both comma-separated, got {args.decoder_folds!r}")
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        raise SystemExit(f"--sizes takes comma-separated frame counts, got {args.sizes!r}") from None
    if not sizes or min(sizes) < 1:
        raise SystemExit(f"--sizes takes frame counts >= 1, got {args.sizes!r}")
    device = torch.device(args.device)
    rows: list[dict[str, Any]] = []
    kernels: dict[str, dict[str, Any]] = {}
    for fold in folds if args.engine == "ditto" else ["-"]:
        t0 = time.perf_counter()
        eng = _engine(args.engine, device, args.accel, args.quick, decoder_folds=fold != "off")
        spent = eng.warm_up() if device.type == "cuda" else 0.0
        print(f"[{args.engine}] accel {eng.accel}, decoder folds {fold}, load {time.perf_counter() - t0:.1f} s "
              f"(warm-up {spent:.1f} s)", file=sys.stderr, flush=True)
        for n in sizes:
            fn, runner = render_call(eng, n)
            gpu_ms, wall_ms = time_call(fn, device, 2 if args.quick else args.iters)
            rows.append({"decoder_folds": fold, "frames": n, "bucket": runner.bucket_for(n), "gpu_ms": gpu_ms,
                         "wall_ms": wall_ms, "fps": n * 1e3 / max(wall_ms, 1e-9), "gpu_ms_per_frame": gpu_ms / n})
        if args.kernels and device.type == "cuda":
            from .decoder_kernels import profile_kinds  # one call's kernels by device time (CUPTI sees graph replays)

            call = render_call(eng, max(sizes))[0]
            try:
                with torch.inference_mode():
                    kernels[fold] = profile_kinds(lambda _: call(), None, "cuda", args.kernels)
            except Exception as exc:  # the profiler is a side view: the timings stand without it
                print(f"kernel profile failed: {exc!r}", file=sys.stderr)
            if fold in kernels:
                total = sum(kernels[fold]["ms_by_kind"].values()) or 1.0
                print(f"\ntop kernels of one call of {max(sizes)} frames, decoder folds {fold} (ms by kind: "
                      f"{kernels[fold]['ms_by_kind']}):")
                for k in kernels[fold]["top"]:
                    print(f"  {k['ms']:8.3f} ms {100 * k['ms'] / total:5.1f} % x{k['calls']:<3} {k['kind']:>14}  {k['name']}")
        del eng
    print(f"\n{args.engine} render runner ({args.accel or 'its default accel'}, {device}): per call")
    print("| decoder folds | frames | bucket | GPU ms | wall ms | frames/s | GPU ms per frame |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['decoder_folds']} | {r['frames']} | {r['bucket']} | {r['gpu_ms']:.2f} | {r['wall_ms']:.2f} | "
              f"{r['fps']:.1f} | {r['gpu_ms_per_frame']:.3f} |")
    out = {"machine": machine(), "engine": args.engine, "accel": args.accel, "device": str(device), "rows": rows, "kernels": kernels,
           "command": "python -m benchmarks.bucket_timing " + " ".join(sys.argv[1:])}
    write_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
