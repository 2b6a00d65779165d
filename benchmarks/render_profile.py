"""Where a MuseTalk render batch's GPU time goes, per engine variant: the kernels of ``engine.render``
(UNet + decode + resize into the boxes, as the dense path calls it) summed over a few batches.

    python -m benchmarks.render_profile [--variants compile+cudagraph,compile+cudagraph:rows104] [--batch 32]

Per variant (same avatar, same process): the median wall time of one render, then a profiler window
over ``--profiled`` renders: GPU busy share, device time per render, the top kernels by device time
(CUPTI reports the kernels inside CUDA-graph replays one by one). Two variants' kernel tables side by
side tell where a saving measured on a network alone went in the engine.
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from .common import avatar, machine, media, median, parse_variant, sync, timed, variant_list, write_json
from .gpu_timeline import summarize_trace


def profile_renders(engine, layer, prompts: torch.Tensor, idx: torch.Tensor, n: int, top: int) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    dev = engine.device
    sync(dev)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(n):
            engine.render(layer, prompts, idx)
        sync(dev)
        seconds = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    s = summarize_trace(trace, seconds, top=top)
    s["device_ms_per_render"] = round(s["device_ms_total"] / n, 3)
    for k in s["top_kernels"]:
        k["ms_per_render"] = round(k["ms"] / n, 3)
    return s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--variants", default="compile+cudagraph,compile+cudagraph:rows104")
    ap.add_argument("--size", default="1080x1920", help="avatar frame size WxH")
    ap.add_argument("--max-frames", type=int, default=100)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=20, help="timed renders per variant")
    ap.add_argument("--profiled", type=int, default=10, help="renders in the profiler window")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--tiny", action="store_true", help="the test-size architecture (a smoke run of the script)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from newsstudio.engines.musetalk.engine import TINY_UNET_CONFIG, TINY_VAE_CONFIG, MuseTalkEngine

    device = torch.device(args.device)
    w, h = (int(x) for x in args.size.split("x"))
    work = Path(tempfile.mkdtemp(prefix="render_profile_"))
    packet = avatar(media("yongen.mp4"), "yongen", (w, h), work / "avatars", max_frames=args.max_frames)
    tiny = {"unet_config": TINY_UNET_CONFIG, "vae_config": TINY_VAE_CONFIG} if args.tiny else {}
    result: dict[str, Any] = {"machine": machine(), "args": vars(args), "variants": {},
                              "command": "python -m benchmarks.render_profile " + " ".join(argv or sys.argv[1:])}
    for spec in variant_list(args.variants) or []:
        engine = MuseTalkEngine(device, weights="random", **parse_variant(spec, "musetalk"), **tiny)
        baked = engine.prebake(packet, progress=False)
        layer = engine.load_avatar(baked)
        engine.warm_up()
        idx = torch.arange(args.batch, device=device) % baked.n_frames
        prompts = engine.idle_driving(args.batch).contiguous()
        render_once = functools.partial(engine.render, layer, prompts, idx)
        ms = median(timed(render_once, device, repeat=args.repeat, warmup=3)) * 1e3
        prof = profile_renders(engine, layer, prompts, idx, args.profiled, args.top)
        result["variants"][spec] = {"render_ms": round(ms, 3), "render_fps": round(args.batch / ms * 1e3, 1), **prof}
        print(f"== {spec}: render {ms:.2f} ms per batch of {args.batch} ({args.batch / ms * 1e3:.1f} fps); "
              f"device {prof['device_ms_per_render']} ms per render, GPU busy {prof['gpu_busy_share']:.1%}", flush=True)
        for k in prof["top_kernels"]:
            print(f"  {k['ms_per_render']:8.3f} ms {k['count'] // args.profiled:5d}x  {k['name']}", flush=True)
        del engine, layer, render_once
        if device.type == "cuda":
            torch.cuda.empty_cache()
        write_json(args.json, result)  # after every variant: a run cut short by a time limit keeps what it measured
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
