"""Which convolutions of a network take the GPU time: per-conv CUDA-event timing of one forward.

    python -m benchmarks.conv_profile [--engine ditto|musetalk] [--batch 32] [--rows 16]

Seeded weights, fp16 (autocast for Ditto, as the engine runs), cuDNN autotuning on, eager, the
engine's conv rewrites, channels_last and NCHW in turn. Each conv (a Conv2d/Conv3d, or one of the
engine's exact conv rewrites as one) is timed between a pre- and a post-forward hook event (launch
gaps between convs are not counted); the table gives its time, the TFLOP/s its kernels reached
(executed FLOPs), and its shapes.
"""
from __future__ import annotations

import argparse
import time

import torch


def _network(engine: str, channels_last: bool, batch: int):
    """(modules to hook as {module: label}, a zero-argument forward) for an engine's render networks."""
    if engine == "ditto":
        from newsstudio.engines.ditto.engine import DittoEngine
        from newsstudio.engines.ditto.motion_stitch import NUM_KP

        eng = DittoEngine("cuda", weights="random", accel="eager", channels_last=channels_last)
        roots = {"warp": eng._warp, "dec": eng._decoder}
        f_s = torch.randn((batch, *eng.models.feature_volume(eng.config.input_size)), device="cuda", dtype=eng.dtype)
        kp = torch.randn((batch, NUM_KP, 3), device="cuda") * 0.1
        run = lambda: eng.warp_decode(f_s, kp, kp + 0.01)  # noqa: E731
    else:
        from newsstudio.engines.musetalk.engine import MuseTalkEngine

        eng = MuseTalkEngine("cuda", weights="random", accel="eager", channels_last=channels_last)
        roots = {"unet": eng._unet, "vae": eng._vae_decoder}
        lat = torch.randn((batch, 8, 32, 32), device="cuda", dtype=eng.dtype)
        prompts = eng.idle_prompt()[None].to(eng.dtype).expand(batch, -1, -1).contiguous()
        run = lambda: eng._faces(lat, prompts)  # noqa: E731
    mods = {m: f"{tag}.{name}" for tag, root in roots.items() for name, m in root.named_modules() if isinstance(m, _conv_types())}
    inner = {c for m in mods for c in list(m.modules())[1:]}  # a rewrite's own convs are timed as part of it
    return {m: n for m, n in mods.items() if m not in inner}, run


def _conv_types() -> tuple[type, ...]:
    """Plain convs and the engines' exact conv rewrites (timed as one conv each)."""
    from newsstudio.accel.depth_sliced_conv3d import DepthSlicedConv3d
    from newsstudio.accel.tap_sum_conv import TapSumConv2d
    from newsstudio.accel.upsample_conv import PhaseUpsampleConv

    return (torch.nn.Conv2d, torch.nn.Conv3d, DepthSlicedConv3d, TapSumConv2d, PhaseUpsampleConv)


def _executed_flops(m: torch.nn.Module, out: tuple[int, ...], calls: int) -> float:
    """Multiply-adds x 2 the module's kernels run: its weight over every output element (a phase
    conv's weight covers all ``scale**2`` output phases at once)."""
    from newsstudio.accel.upsample_conv import PhaseUpsampleConv

    w = getattr(m, "weight", None)
    if w is None and getattr(m, "slice_conv", None) is not None:
        m = m.slice_conv
        w = m.weight
    per_out = w[0].numel() * w.shape[0] / (m.scale ** 2 if isinstance(m, PhaseUpsampleConv) else 1)
    return 2 * per_out * out[0] * int(torch.tensor(out[2:]).prod()) * calls


def profile(engine: str, channels_last: bool, batch: int, rows: int) -> None:
    mods, run = _network(engine, channels_last, batch)
    rec: dict[torch.nn.Module, list] = {}

    def pre(m, inp):
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        rec.setdefault(m, []).append([e, None, tuple(inp[0].shape)])

    def post(m, inp, out):
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        rec[m][-1][1] = e
        rec[m][-1].append(tuple(out.shape))

    hooks = [m.register_forward_pre_hook(pre) for m in mods] + [m.register_forward_hook(post) for m in mods]
    with torch.inference_mode():
        for _ in range(3):  # autotuning on the first; the last is reported
            rec.clear()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            run()
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
    for h in hooks:
        h.remove()
    table = []
    for m, calls in rec.items():
        ms = sum(a.elapsed_time(b) for a, b, *_ in calls)
        out = calls[0][3]
        flops = _executed_flops(m, out, len(calls))
        w = getattr(m, "weight", None)
        table.append((ms, flops / (ms * 1e-3) / 1e12 if ms else 0.0, mods[m], calls[0][2], out, tuple(w.shape) if w is not None else ()))
    table.sort(key=lambda r: -r[0])
    print(f"{engine} channels_last={channels_last} batch {batch}: forward {wall * 1e3:.1f} ms, "
          f"convs {sum(r[0] for r in table):.1f} ms ({len(table)} convs)")
    for ms, tf, name, i, o, w in table[:rows]:
        print(f"  {ms:7.2f} ms {tf:6.1f} TF/s  {name:45s} in {i} out {o} w {w}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", default="ditto", choices=["ditto", "musetalk"])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rows", type=int, default=16)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("conv_profile needs a CUDA device")
    torch.backends.cudnn.benchmark = True
    for cl in (True, False):
        profile(args.engine, cl, args.batch, args.rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
