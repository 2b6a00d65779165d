"""Where the MuseTalk engine's compiled VAE decoder spends its time, by kernel kind, per conv backend.

    python -m benchmarks.decoder_kernels [--batch 32] [--convs off,half,mixed] [--json out.json]

The decoder exactly as the engine builds it (phase upsampling, channels-last, the NHWC norms taking
their SiLU, the chosen conv backend: ``triton_convs`` off = cuDNN, ``half``, ``mixed``), compiled as
the engine compiles it (Inductor max-autotune, static shapes), then: ms per batch replayed from a
CUDA graph (as the engine runs it) and without one, and one forward under the profiler with the
device time by kind (cuDNN / Triton convolutions, our norm kernels, Inductor's fused kernels,
layout copies) and the top kernels.

Why: per layer shape the Triton convolutions beat cuDNN by 15 % in total (twentieth session), yet
the whole compiled decoder with them ran 6 ms per batch of 32 slower (twenty-third session, 48.5
against 42.5 ms); this says which kernels take the difference. Seeded weights; ``--device cpu
--tiny`` is a smoke run of the script itself (CPUs keep cuDNN's place with PyTorch's convs).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from typing import Any

import torch

from .common import call_times_ms, cuda_graphed, kernel_choices, machine, write_json

KINDS = (
    ("triton conv", ("_conv_kernel",)),
    ("norm kernels", ("_partials_kernel", "_apply_kernel", "_modulate_kernel")),
    ("cudnn conv", ("xmma", "implicit_gemm", "cudnn", "conv2d", "convolution", "sm90_", "cutlass")),
    ("inductor fused", ("triton_",)),
    ("copies", ("elementwise_kernel", "copy", "Memcpy", "memcpy")),
)


def kernel_kind(name: str) -> str:
    """The kind a device kernel counts under (first match in `KINDS`, else "other")."""
    for kind, needles in KINDS:
        if any(n in name for n in needles):
            return kind
    return "other"


def build_decoder(device: str, convs: str, tiny: bool):
    """(decoder, its input) as `MuseTalkEngine` builds and feeds it: channels-last latents of the batch."""
    from newsstudio.engines.musetalk.engine import TINY_UNET_CONFIG, TINY_VAE_CONFIG, MuseTalkEngine

    kw: dict[str, Any] = dict(weights="random", accel="eager", channels_last=True, triton_convs=convs)
    if tiny:
        kw.update(unet_config=TINY_UNET_CONFIG, vae_config=TINY_VAE_CONFIG)
    if device == "cuda":
        kw["nhwc_norms"] = True
    eng = MuseTalkEngine(device, **kw)
    return eng, eng._vae_decoder


def profile_kinds(fn, x, device: str, top: int) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CUDA] if device == "cuda" else [ProfilerActivity.CPU]
    with profile(activities=acts) as prof:
        fn(x)
        if device == "cuda":
            torch.cuda.synchronize()
    by_kind: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    kernels = []
    for e in prof.key_averages():
        ms = (getattr(e, "self_device_time_total", 0) if device == "cuda" else e.self_cpu_time_total) / 1e3
        if ms <= 0:
            continue
        kind = kernel_kind(e.key)
        by_kind[kind] += ms
        count[kind] += e.count
        kernels.append({"name": e.key[:100], "kind": kind, "ms": round(ms, 3), "calls": e.count})
    kernels.sort(key=lambda k: -k["ms"])
    return {"ms_by_kind": {k: round(v, 2) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
            "calls_by_kind": dict(count), "top": kernels[:top]}


def measure(device: str, convs: str, batch: int, iters: int, top: int, tiny: bool,
            compile_mode: str = "max-autotune-no-cudagraphs") -> dict[str, Any]:
    eng, dec = build_decoder(device, convs, tiny)
    ch = dec.conv_in.in_channels
    g = torch.Generator(device).manual_seed(0)
    x = torch.randn((batch, ch, 32, 32), generator=g, device=device, dtype=eng.dtype)
    x = x.contiguous(memory_format=torch.channels_last)
    t0 = time.perf_counter()
    compiled = torch.compile(dec, mode=compile_mode if device == "cuda" else None, dynamic=False)
    with torch.inference_mode():
        ref = dec(x)
        got = compiled(x)
        compile_s = time.perf_counter() - t0
        rel = float((got.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-12))
        plain_ms = call_times_ms(compiled, (x,), iters, device)
        row: dict[str, Any] = {"convs": convs, "in_effect": eng.triton_convs, "batch": batch, "compile_s": round(compile_s, 1),
                               "ms_no_graph": round(statistics.median(plain_ms), 3), "rel_err_vs_eager": rel}
        if device == "cuda":
            replay = cuda_graphed(compiled, (x,))
            row["ms_graphed"] = round(statistics.median(call_times_ms(replay, (x,), iters, device)), 3)
        row.update(profile_kinds(compiled, x, device, top))
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--convs", default="off,half,mixed", help="triton_convs values, comma-separated (off = cuDNN)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--compile-mode", default="max-autotune-no-cudagraphs",
                    help="torch.compile mode (the engine's default; 'default' compiles faster)")
    ap.add_argument("--tiny", action="store_true", help="the test-size architecture (a smoke run of the script)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.device == "cuda":
        torch.backends.cudnn.benchmark = True
    rows = []
    for convs in args.convs.split(","):
        try:
            row = measure(args.device, convs.strip(), args.batch, args.iters, args.top, args.tiny, args.compile_mode)
        except Exception as e:  # one backend failing still reports the others
            row = {"convs": convs, "error": f"{type(e).__name__}: {e}"[:300]}
        rows.append(row)
        print(f"--- convs {convs}: " + ", ".join(f"{k} {v}" for k, v in row.items() if k not in ("top", "calls_by_kind")),
              flush=True)
        for k in row.get("top", []):
            print(f"    {k['ms']:8.3f} ms  {k['calls']:4d}x  [{k['kind']}] {k['name']}")
    kinds = sorted({k for r in rows for k in r.get("ms_by_kind", {})})
    print("\n| convs | ms graphed | ms no graph | " + " | ".join(kinds) + " | rel err |")
    print("|---|---:|---:|" + "---:|" * len(kinds) + "---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['convs']} | error: {r['error'][:80]} |")
            continue
        cells = " | ".join(str(r["ms_by_kind"].get(k, "-")) for k in kinds)
        print(f"| {r['convs']} | {r.get('ms_graphed', '-')} | {r['ms_no_graph']} | {cells} | {r['rel_err_vs_eager']:.2e} |")
    choices = kernel_choices()  # the per-shape timings behind the Triton rows' choice of kernel (in the log too)
    for shape, c in choices["by_shape"].items():
        print(f"choice {c['winner']:>12} for {shape}: " + ", ".join(f"{n} {ms:.3f} ms" for n, ms in c["ms"].items()))
    write_json(args.json, {"machine": machine(), "command": "python -m benchmarks.decoder_kernels " + " ".join(argv or sys.argv[1:]),
                           "args": vars(args), "rows": rows, "kernel_choices": choices})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
