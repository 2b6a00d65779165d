"""Per-layer: cuDNN vs the Triton implicit-GEMM kernel (half precision and FP8) on an engine's 2-D
convolutions as it runs them (MuseTalk: UNet + VAE decoder with phase upsampling; Ditto: warp +
SPADE decoder, regrouped; fp16, channels_last; shapes from benchmarks/conv_profile.py's network).

    python -m benchmarks.triton_conv_bench [--engine musetalk|ditto] [--batch 32] [--iters 20] [--json out.json]

For every distinct convolution shape of one decoder forward (how many times it occurs, its input
and weight): the median CUDA-event time of cuDNN (autotuned), the Triton kernel (autotuned) in
fp16, and in FP8 — the kernel alone on pre-quantised input, and with the per-call input
quantisation (amax + cast) that `TritonConv2d(mode="fp8")` adds — with TFLOP/s and the error of each
against the float32 convolution of the same input and weight. The totals say what each choice
would save over a whole decoder forward; `benchmarks.levers --only vae` measures the swapped
decoder end to end (compiled, graphed, PSNR vs float32), `benchmarks.run --variants
compile+cudagraph:triton` the engine.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from .common import machine


def conv_shapes(mods: dict[torch.nn.Module, str], run: Callable[[], Any]) -> list[dict[str, Any]]:
    """The 2-D convolutions among ``mods`` ({module: label}, conv_profile's) as one forward ``run``
    calls them: one entry per distinct (input shape, weight shape, padding) with how often it runs
    and one module's weight and bias (a phase conv's 2x2 weights)."""
    from newsstudio.accel.upsample_conv import PhaseUpsampleConv

    seen: dict[tuple, dict[str, Any]] = {}

    def hook(name: str):
        def pre(m, inp):
            pad = (1, 1) if isinstance(m, PhaseUpsampleConv) else tuple(m.padding)
            key = (tuple(inp[0].shape), tuple(m.weight.shape), pad)
            seen.setdefault(key, {"names": [], "weight": m.weight, "bias": m.bias, "x_shape": key[0],
                                  "padding": pad})["names"].append(name)
        return pre

    hooks = [m.register_forward_pre_hook(hook(name)) for m, name in mods.items()
             if type(m) is torch.nn.Conv2d or isinstance(m, PhaseUpsampleConv)]
    with torch.inference_mode():
        run()
    for h in hooks:
        h.remove()
    return list(seen.values())


def _time(fn: Callable[[], Any], iters: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref).norm() / ref.norm())


def measure(entry: dict[str, Any], iters: int, device: torch.device) -> dict[str, Any]:
    from newsstudio.accel.fp8 import fp8_supported
    from newsstudio.accel.igemm_conv import TritonConv2d, eligible_conv
    from newsstudio.accel.triton_conv import K_ALIGN

    w, b, pad = entry["weight"], entry["bias"], entry["padding"]
    o, i, kh, kw = w.shape
    x = torch.randn(entry["x_shape"], device=device, dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    ref = F.conv2d(x.float(), w.float(), None if b is None else b.float(), padding=pad)
    flops = 2.0 * ref.numel() * i * kh * kw
    row: dict[str, Any] = {"layers": entry["names"], "count": len(entry["names"]), "x": list(entry["x_shape"]),
                           "w": [o, i, kh, kw], "padding": list(pad), "gflop": flops / 1e9}
    with torch.inference_mode():
        out = F.conv2d(x, w, b, padding=pad)
        row["cudnn_ms"] = _time(lambda: F.conv2d(x, w, b, padding=pad), iters)
        row["cudnn_err"] = _rel(out, ref)
        conv = torch.nn.Conv2d(i, o, (kh, kw), padding=pad, bias=b is not None, device=device, dtype=w.dtype)
        conv.weight.copy_(w)
        if b is not None:
            conv.bias.copy_(b)
        if i % K_ALIGN or not eligible_conv(conv):
            row["triton"] = "not eligible (C_in % 16, an RGB head, or not stride-1)"
        else:
            for mode in ("half", "fp8"):
                if mode == "fp8" and not fp8_supported(device):
                    row["fp8_ms"] = None
                    continue
                t0 = time.perf_counter()
                m = TritonConv2d.from_conv(conv, mode)
                out = m(x)
                torch.cuda.synchronize()
                row[f"{mode}_first_call_s"] = time.perf_counter() - t0  # compile + autotune
                row[f"{mode}_ms"] = _time(lambda: m(x), iters)
                row[f"{mode}_err"] = _rel(out, ref)
                if mode == "fp8":  # the kernel alone on input quantised beforehand
                    from newsstudio.accel.fp8 import E4M3, E4M3_MAX
                    from newsstudio.accel.triton_conv import conv2d_nhwc

                    xs = (x.abs().amax().float() / E4M3_MAX).reshape(1)
                    xq = (x.float() / xs).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
                    row["fp8_kernel_ms"] = _time(lambda: conv2d_nhwc(xq, m.packed, (kh, kw), pad, bias=m.bias, x_scale=xs,
                                                                      w_scale=m.w_scale, out_dtype=x.dtype), iters)
    for k in ("cudnn", "half", "fp8", "fp8_kernel"):
        if row.get(f"{k}_ms"):
            row[f"{k}_tflops"] = flops / (row[f"{k}_ms"] * 1e-3) / 1e12
    return row


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| layers | input | weight | GFLOP | cuDNN ms (TF/s) | Triton fp16 ms (TF/s) | Triton FP8 ms (TF/s) | FP8 kernel alone | "
             "err fp16 cuDNN / Triton / FP8 |", "|---|---|---|---|---|---|---|---|---|"]

    def cell(r, k):
        return f"{r[k + '_ms']:.3f} ({r[k + '_tflops']:.0f})" if r.get(k + "_ms") else "—"

    for r in rows:
        errs = " / ".join(f"{r[k]:.1e}" if r.get(k) is not None else "—" for k in ("cudnn_err", "half_err", "fp8_err"))
        lines.append(f"| {r['count']}x {r['layers'][0]} | {'x'.join(map(str, r['x']))} | {'x'.join(map(str, r['w']))} | "
                     f"{r['gflop']:.1f} | {cell(r, 'cudnn')} | {cell(r, 'half')} | {cell(r, 'fp8')} | {cell(r, 'fp8_kernel')} | {errs} |")
    return "\n".join(lines)


def totals(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Decoder-forward sums (each shape times its count): cuDNN everywhere, Triton fp16 / FP8 where
    eligible (cuDNN elsewhere), and the faster of cuDNN and each Triton mode per layer."""
    out: dict[str, float] = {}
    for mode in ("cudnn", "half", "fp8"):
        out[f"{mode}_ms"] = sum(r["count"] * (r.get(f"{mode}_ms") or r["cudnn_ms"]) for r in rows)
    for mode in ("half", "fp8"):
        out[f"best_of_cudnn_and_{mode}_ms"] = sum(r["count"] * min(r["cudnn_ms"], r.get(f"{mode}_ms") or r["cudnn_ms"]) for r in rows)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", default="musetalk", choices=["musetalk", "ditto"])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("triton_conv_bench needs a CUDA device (the kernel's CPU form is Triton's interpreter, for tests)")
    from newsstudio.accel.cache import configure_compile_cache

    configure_compile_cache()  # the Triton cache folder: a second run does not recompile the kernels
    torch.backends.cudnn.benchmark = True
    device = torch.device("cuda")
    from .conv_profile import _network

    rows = []
    for entry in conv_shapes(*_network(args.engine, True, args.batch)):
        rows.append(measure(entry, args.iters, device))
        r = rows[-1]
        print(f"{r['count']}x {r['layers'][0]} {r['x']} w{r['w']}: cuDNN {r['cudnn_ms']:.3f} ms"
              + "".join(f", {k} {r[k + '_ms']:.3f} ms ({r[k + '_err']:.1e})" for k in ("half", "fp8") if r.get(k + "_ms")),
              flush=True)
    result = {"machine": machine(), "engine": args.engine, "batch": args.batch, "rows": rows, "totals": totals(rows)}
    print(table(rows))
    print("decoder-forward totals (ms, batch %d): " % args.batch + ", ".join(f"{k} {v:.2f}" for k, v in result["totals"].items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
