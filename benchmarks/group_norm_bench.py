"""Per shape: GroupNorm + SiLU of channels-last activations, Inductor's own kernels vs the NHWC
statistics kernel (accel/group_norm_nhwc.py) with Inductor fusing the rest, vs the NHWC
statistics and apply (+ SiLU) kernels both, and vs the same with the "streaming" statistics
kernel; all compiled.

    python -m benchmarks.group_norm_bench [--batch 32] [--iters 20] [--quick] [--spade] [--json out.json]

``--spade``: Ditto's SPADE norms instead, ``leaky_relu(instance_norm(x) * (1 + gamma) + beta, 0.2)``
with gamma and beta the halves of one stacked conv output, Inductor's kernels vs `spade_norm_nhwc`
(statistics kernel, then one kernel for norm + modulation + activation), per shape and weighted by
how many norms of that shape the decoder has.

Shapes: the GroupNorms of MuseTalk's VAE decoder (32 groups of 128-512 channels at 32-256 pixels
square) and UNet (320-1280 channels at 4-32), and Ditto's SPADE InstanceNorms (a group per channel).
For each, the median CUDA-event time of one compiled ``silu(norm(x))`` call per implementation, the
bytes it must move at least (read x twice: statistics and normalisation; write y once) as GB/s, and
the largest difference from Inductor's output. ``benchmarks.levers`` times the whole networks.
"""
from __future__ import annotations

import argparse
from typing import Any

import torch
import torch.nn.functional as F

from .bucket_timing import time_call
from .common import machine, write_json

# (channels, side, groups, where)
SHAPES = (
    (512, 32, 32, "VAE mid / up_blocks.0"), (512, 64, 32, "VAE up_blocks.1"), (512, 128, 32, "VAE up_blocks.2 in"),
    (256, 128, 32, "VAE up_blocks.2"), (256, 256, 32, "VAE up_blocks.3 in"), (128, 256, 32, "VAE up_blocks.3"),
    (320, 32, 32, "UNet 32x32"), (640, 16, 32, "UNet 16x16"), (1280, 8, 32, "UNet 8x8"),
    (512, 64, 512, "Ditto SPADE 64x64"), (256, 128, 256, "Ditto SPADE 128x128"), (64, 256, 64, "Ditto SPADE 256x256"),
)
QUICK_SHAPES = ((64, 16, 32, "quick"), (40, 8, 4, "quick, 10 channels a group"))
# Ditto's SPADE norms: (channels, side, norms of this shape in the decoder, where)
SPADE_SHAPES = ((512, 64, 12, "G_middle_0-5"), (512, 128, 2, "up_0 norm_s + norm_0"), (256, 128, 1, "up_0 norm_1"),
                (256, 256, 2, "up_1 norm_s + norm_0"), (64, 256, 1, "up_1 norm_1"))
QUICK_SPADE_SHAPES = ((32, 16, 1, "quick"),)


def bench_spade_shape(c: int, side: int, batch: int, iters: int, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    from newsstudio.accel.group_norm_nhwc import spade_modulate, spade_norm_nhwc

    g = torch.Generator(device="cpu").manual_seed(c + side)
    cl = torch.channels_last
    x = (torch.randn(batch, c, side, side, generator=g) * 2 + 0.5).to(device, dtype).contiguous(memory_format=cl)
    gb = (torch.randn(batch, 2 * c, side, side, generator=g) * 0.3).to(device, dtype).contiguous(memory_format=cl)

    fns = {"inductor": torch.compile(lambda t, gb: spade_modulate(F.instance_norm(t), gb, 0.2), dynamic=False),
           "nhwc": torch.compile(lambda t, gb: spade_norm_nhwc(t, gb, slope=0.2, statistics="chunked"), dynamic=False),
           "streaming": torch.compile(lambda t, gb: spade_norm_nhwc(t, gb, slope=0.2, statistics="streaming"), dynamic=False)}
    row: dict[str, Any] = {"channels": c, "side": side, "batch": batch, "MB": x.numel() * x.element_size() / 1e6}
    with torch.inference_mode():
        outs = {name: fn(x, gb) for name, fn in fns.items()}
        row["max_abs_diff"] = max((outs["inductor"].float() - y.float()).abs().max().item()
                                  for name, y in outs.items() if name != "inductor")
    least_bytes = 5 * x.numel() * x.element_size()  # x twice, gamma, beta, y
    for name, fn in fns.items():
        ms, _ = time_call(lambda fn=fn: fn(x, gb), device, iters)
        row[f"{name}_ms"] = ms
        row[f"{name}_GBps"] = least_bytes / ms / 1e6
    return row


def spade_table(args, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    rows = []
    print("| where | C x side^2 | norms | MB | Inductor ms | GB/s | NHWC ms | GB/s | NHWC streaming ms | GB/s | max diff |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c, side, count, where in (QUICK_SPADE_SHAPES if args.quick else SPADE_SHAPES):
        r = bench_spade_shape(c, side, args.batch, args.iters, device, dtype)
        r.update(where=where, norms=count)
        rows.append(r)
        print(f"| {where} | {c} x {side}^2 | {count} | {r['MB']:.0f} | {r['inductor_ms']:.3f} | {r['inductor_GBps']:.0f} | "
              f"{r['nhwc_ms']:.3f} | {r['nhwc_GBps']:.0f} | {r['streaming_ms']:.3f} | {r['streaming_GBps']:.0f} | "
              f"{r['max_abs_diff']:.1e} |", flush=True)
    total = {k: sum(r[k] * r["norms"] for r in rows) for k in ("inductor_ms", "nhwc_ms", "streaming_ms")}
    print(f"the decoder's norms (each shape times its count): Inductor {total['inductor_ms']:.2f} ms, "
          f"NHWC {total['nhwc_ms']:.2f} ms, NHWC streaming {total['streaming_ms']:.2f} ms per batch of {args.batch}")
    return {"machine": machine(), "batch": args.batch, "dtype": str(dtype), "spade_rows": rows, "total": total}


def bench_shape(c: int, side: int, groups: int, batch: int, iters: int, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    from newsstudio.accel.group_norm_nhwc import STATISTICS_KERNELS, group_norm_nhwc

    g = torch.Generator(device="cpu").manual_seed(c + side)
    x = (torch.randn(batch, c, side, side, generator=g) * 2 + 0.5).to(device, dtype).contiguous(memory_format=torch.channels_last)
    weight = torch.randn(c, generator=g).to(device, dtype)
    bias = torch.randn(c, generator=g).to(device, dtype)
    inductor = torch.compile(lambda t: F.silu(F.group_norm(t, groups, weight, bias, 1e-6)), dynamic=False)
    ours = torch.compile(lambda t: F.silu(group_norm_nhwc(t, groups, weight, bias, 1e-6, statistics="chunked")), dynamic=False)
    fns = {"inductor": inductor, "nhwc": ours}
    for stats in STATISTICS_KERNELS:
        name = "nhwc_apply" if stats == "chunked" else f"{stats}_apply"
        fns[name] = torch.compile(lambda t, stats=stats: group_norm_nhwc(
            t, groups, weight, bias, 1e-6, silu=True, apply_kernel=True, statistics=stats), dynamic=False)
    row: dict[str, Any] = {"channels": c, "side": side, "groups": groups, "batch": batch, "MB": x.numel() * x.element_size() / 1e6}
    with torch.inference_mode():
        outs = {name: fn(x) for name, fn in fns.items()}
        row["max_abs_diff"] = {name: (outs["inductor"].float() - y.float()).abs().max().item() for name, y in outs.items() if name != "inductor"}
        row["out_channels_last"] = {name: y.is_contiguous(memory_format=torch.channels_last) for name, y in outs.items()}
    least_bytes = 3 * x.numel() * x.element_size()
    for name, fn in fns.items():
        ms, _ = time_call(lambda fn=fn: fn(x), device, iters)
        row[f"{name}_ms"] = ms
        row[f"{name}_GBps"] = least_bytes / ms / 1e6
    return row


def main() -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="two small shapes (a CPU run through Triton's interpreter)")
    ap.add_argument("--spade", action="store_true", help="Ditto's SPADE norms (modulation + LeakyReLU) instead")
    ap.add_argument("--json")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    if args.spade:
        out = spade_table(args, device, dtype)
        write_json(args.json, out)
        return out
    shapes = QUICK_SHAPES if args.quick else SHAPES
    rows = []
    print("| where | C x side^2 (groups) | MB | Inductor ms | GB/s | NHWC statistics ms | GB/s | + NHWC apply ms | GB/s "
          "| streaming statistics + apply ms | GB/s | max diff |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c, side, groups, where in shapes:
        r = bench_shape(c, side, groups, args.batch, args.iters, device, dtype)
        r["where"] = where
        rows.append(r)
        print(f"| {where} | {c} x {side}^2 ({groups}) | {r['MB']:.0f} | {r['inductor_ms']:.3f} | {r['inductor_GBps']:.0f} | "
              f"{r['nhwc_ms']:.3f} | {r['nhwc_GBps']:.0f} | {r['nhwc_apply_ms']:.3f} | {r['nhwc_apply_GBps']:.0f} | "
              f"{r['streaming_apply_ms']:.3f} | {r['streaming_apply_GBps']:.0f} | {max(r['max_abs_diff'].values()):.1e} |", flush=True)
    total = {k: sum(r[k] for r in rows) for k in ("inductor_ms", "nhwc_ms", "nhwc_apply_ms", "streaming_apply_ms")}
    print(f"total (one call per shape): Inductor {total['inductor_ms']:.2f} ms, NHWC statistics {total['nhwc_ms']:.2f} ms, "
          f"NHWC statistics + apply {total['nhwc_apply_ms']:.2f} ms, streaming statistics + apply {total['streaming_apply_ms']:.2f} ms")
    out = {"machine": machine(), "batch": args.batch, "dtype": str(dtype), "rows": rows, "total": total}
    write_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
