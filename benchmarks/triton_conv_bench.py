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
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from .bucket_timing import time_call
from .common import machine


def conv_shapes(mods: dict[torch.nn.Module, str], run: Callable[[], Any]) -> list[dict[str, Any]]:
    """The 2-D convolutions among ``mods`` ({module: label}, conv_profile's) as one forward ``run``
    calls them: one entry per distinct (input shape, weight shape, padding) with how often it runs
    and one module's weight and bias. Our exact rewrites count as the 2-D convolution they hold: a
    phase conv's 2x2 weights; a depth-sliced 3-D conv's slice conv over [B*D, C, H, W] slices (its
    bias comes after the depth sum), or its phase conv when it upsamples."""
    from newsstudio.accel.depth_sliced_conv3d import DepthSlicedConv3d
    from newsstudio.accel.igemm_conv import slot_padding

    seen: dict[tuple, dict[str, Any]] = {}

    def hook(name: str):
        def pre(m, inp):
            pad = slot_padding(m) or tuple(m.padding)
            shape, bias = tuple(inp[0].shape), m.bias
            if isinstance(m, DepthSlicedConv3d):
                b, _, d, h, w = shape
                shape, bias = (b * d, m.i_pad, h, w), None
            key = (shape, tuple(m.weight.shape), pad)
            seen.setdefault(key, {"names": [], "weight": m.weight, "bias": bias, "x_shape": shape,
                                  "padding": pad})["names"].append(name)
        return pre

    targets = {}
    for m, name in mods.items():
        if isinstance(m, DepthSlicedConv3d) and m.slice_conv is not None:
            m, name = m.slice_conv, f"{name}.slice_conv"
        if type(m) is torch.nn.Conv2d or slot_padding(m) is not None:
            targets[m] = name
    hooks = [m.register_forward_pre_hook(hook(name)) for m, name in targets.items()]
    with torch.inference_mode():
        run()
    for h in hooks:
        h.remove()
    return list(seen.values())


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref).norm() / ref.norm())


VARIANTS = ("cudnn", "fp16 pointer", "fp16 tma", "fp8 pointer", "fp8 tma", "fp8 pointer kernel", "fp8 tma kernel")


def measure(entry: dict[str, Any], iters: int, device: torch.device) -> dict[str, Any]:
    """One layer shape: each variant's median ms, TFLOP/s, error vs float32 and first-call seconds
    (Triton compile + autotune). 'fp8 X' includes the per-call input quantisation; 'fp8 X kernel'
    is the kernel alone on input quantised beforehand (what a fused static-scale quantisation
    would approach)."""
    from newsstudio.accel.fp8 import fp8_supported, quantize_e4m3
    from newsstudio.accel.igemm_conv import TritonConv2d, eligible_conv
    from newsstudio.accel.triton_conv import conv2d_nhwc, tma_available, tma_width

    w, b, pad = entry["weight"], entry["bias"], entry["padding"]
    o, i, kh, kw = w.shape
    x = torch.randn(entry["x_shape"], device=device, dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    ref = F.conv2d(x.float(), w.float(), None if b is None else b.float(), padding=pad)
    flops = 2.0 * ref.numel() * i * kh * kw
    row: dict[str, Any] = {"layers": entry["names"], "count": len(entry["names"]), "x": list(entry["x_shape"]),
                           "w": [o, i, kh, kw], "padding": list(pad), "gflop": flops / 1e9, "ms": {}, "err": {},
                           "first_call_s": {}, "failed": {}}
    calls: dict[str, Any] = {"cudnn": lambda: F.conv2d(x, w, b, padding=pad)}
    conv = torch.nn.Conv2d(i, o, (kh, kw), padding=pad, bias=b is not None, device=device, dtype=w.dtype)
    with torch.no_grad():
        conv.weight.copy_(w)
        if b is not None:
            conv.bias.copy_(b)
    if not eligible_conv(conv):
        row["note"] = "not for the Triton kernel (C_in % 16, an RGB head, or not stride-1)"
    else:
        kernels = ["pointer"] + (["tma"] if tma_width(ref.shape[3]) and tma_available(device) else [])
        modes = ["half"] + (["fp8"] if fp8_supported(device) else [])
        xq, xs = quantize_e4m3(x, "tensor")
        xs = xs.reshape(1)
        for mode in modes:
            for k in kernels:
                m = TritonConv2d.from_conv(conv, mode, kernel=k)
                calls[f"{'fp16' if mode == 'half' else 'fp8'} {k}"] = m
                if mode == "fp8":
                    calls[f"fp8 {k} kernel"] = (lambda m=m, k=k: conv2d_nhwc(xq, m.packed, (kh, kw), pad, bias=m.bias, x_scale=xs,
                                                                          w_scale=m.w_scale, out_dtype=x.dtype, kernel=k))
    with torch.inference_mode():
        for name, call in calls.items():
            fn = (lambda call=call: call(x)) if isinstance(call, torch.nn.Module) else call
            try:
                t0 = time.perf_counter()
                out = fn()
                torch.cuda.synchronize()
                row["first_call_s"][name] = time.perf_counter() - t0
                row["err"][name] = _rel(out, ref)
                row["ms"][name] = time_call(fn, device, iters)[0]
            except Exception as exc:  # noqa: BLE001  (one variant failing must not lose the others)
                row["failed"][name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    row["tflops"] = {n: flops / (ms * 1e-3) / 1e12 for n, ms in row["ms"].items()}
    return row


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: per layer shape, each variant's ms (TFLOP/s) and error vs float32."""
    cols = [v for v in VARIANTS if any(v in r["ms"] or v in r["failed"] for r in rows)]
    lines = ["| layers | input | weight | GFLOP | " + " | ".join(f"{c} ms (TF/s)" for c in cols) + " | error vs fp32 |",
             "|---|---|---|---|" + "---|" * len(cols) + "---|"]

    def cell(r, c):
        if c in r["ms"]:
            return f"{r['ms'][c]:.3f} ({r['tflops'][c]:.0f})"
        return "failed" if c in r["failed"] else "—"

    for r in rows:
        errs = ", ".join(f"{c} {r['err'][c]:.1e}" for c in cols if c in r["err"] and not c.endswith("kernel"))
        lines.append(f"| {r['count']}x {r['layers'][0]} | {'x'.join(map(str, r['x']))} | {'x'.join(map(str, r['w']))} | "
                     f"{r['gflop']:.1f} | " + " | ".join(cell(r, c) for c in cols) + f" | {errs} |")
    return "\n".join(lines)


def totals(rows: list[dict[str, Any]]) -> dict[str, float]:
    """One forward's convolution time (each shape times its count) with each variant where it ran
    (cuDNN elsewhere), and with the per-shape choice `TritonConv2d(kernel="auto")` makes: the fastest
    of cuDNN and the fp16 kernels; the fastest FP8 kernel (quantisation included)."""
    out: dict[str, float] = {}
    for v in VARIANTS:
        if any(v in r["ms"] for r in rows):
            out[v] = sum(r["count"] * r["ms"].get(v, r["ms"]["cudnn"]) for r in rows)
    for label, pool in (("auto fp16", ("cudnn", "fp16 pointer", "fp16 tma")), ("auto fp8", ("fp8 pointer", "fp8 tma"))):
        out[label] = sum(r["count"] * min([r["ms"][v] for v in pool if v in r["ms"]] or [r["ms"]["cudnn"]]) for r in rows)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", default="musetalk", choices=["musetalk", "ditto"])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--nets", default=None,
                    help="networks whose convs to time, comma-separated labels (musetalk: unet,vae; ditto: warp,dec); "
                         "default: musetalk's vae (where the time is; every shape compiles ~20 Triton kernels), all of ditto's")
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

    nets = (args.nets or ("vae" if args.engine == "musetalk" else "warp,dec")).split(",")
    mods, run = _network(args.engine, True, args.batch)
    mods = {m: label for m, label in mods.items() if label.split(".")[0] in nets}
    if not mods:
        raise SystemExit(f"--nets {args.nets!r}: no convolution of {args.engine} is labelled so")
    rows = []
    for entry in conv_shapes(mods, run):
        rows.append(measure(entry, args.iters, device))
        r = rows[-1]
        print(f"{r['count']}x {r['layers'][0]} {r['x']} w{r['w']}: " + ", ".join(f"{n} {ms:.3f} ms" for n, ms in r["ms"].items())
              + "".join(f"; {n} FAILED {e}" for n, e in r["failed"].items()), flush=True)
    from newsstudio.accel.triton_conv import tuned_tiles

    result = {"machine": machine(), "engine": args.engine, "batch": args.batch, "rows": rows, "totals": totals(rows),
              "tuned_tiles": tuned_tiles()}
    print(table(rows))
    print(f"one forward's convolutions (ms, batch {args.batch}): " + ", ".join(f"{k} {v:.2f}" for k, v in result["totals"].items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
