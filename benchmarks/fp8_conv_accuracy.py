"""Where can an engine's render convolutions run in FP8 and stay >= 35 dB from fp32? A
fake-quantisation study on any device (a CPU is enough): each eligible conv's input and weight
rounded to e4m3 as the Triton kernel does (weights one scale per output channel; inputs one scale
per tensor, per pixel or per channel), the product in fp32; for every conv, or one block's only.

    python -m benchmarks.fp8_conv_accuracy [--engine musetalk|ditto] [--batch 2] [--json out.json]

Seeded weights, fp32. MuseTalk: the VAE decoder, 32x32 latents -> 256x256 (image range [-1, 1]).
Ditto: warp + SPADE decoder, 16x64x64 source features and small keypoint motions -> 512x512
(range [0, 1]). PSNR over the image range, as the levers table reports.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
from collections.abc import Callable

import torch
from torch import nn

from newsstudio.accel.fp8 import E4M3, E4M3_MAX
from newsstudio.accel.igemm_conv import channels_fit

INPUT_SCALES = {"tensor": None, "pixel": (1,), "channel": None}  # "channel": every dim but 1, set per rank


def _fake_e4m3(t: torch.Tensor, dims: tuple[int, ...] | None) -> torch.Tensor:
    amax = t.abs().amax() if dims is None else t.abs().amax(dim=dims, keepdim=True)
    scale = (amax / E4M3_MAX).clamp_min(1e-12)
    return (t / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3).float() * scale


def _fits(m: nn.Module) -> bool:
    """A conv the Triton kernel would take (2-D, or 3-D through its depth slices): stride 1,
    ungrouped, the channel counts it tiles. A 3-D conv runs as one 2-D conv with every depth tap's
    outputs stacked and its inputs padded to a multiple of 8 (`DepthSlicedConv3d`): Ditto's mask conv,
    22 outputs x 7 taps, fits that way."""
    if not (isinstance(m, (nn.Conv2d, nn.Conv3d)) and all(s == 1 for s in m.stride) and m.groups == 1):
        return False
    if isinstance(m, nn.Conv3d):
        return channels_fit(-(-m.in_channels // 8) * 8, m.out_channels * m.kernel_size[0])
    return channels_fit(m.in_channels, m.out_channels)


def _fake_fp16(t: torch.Tensor, dims: tuple[int, ...] | None) -> torch.Tensor:
    return t.half().float()


def with_fake_rounding(net: nn.Module, select: Callable[[str], bool], input_scale: str,
                  rounding: Callable[[torch.Tensor, tuple[int, ...] | None], torch.Tensor] = _fake_e4m3) -> tuple[nn.Module, int]:
    """A copy of ``net`` whose selected convs compute on e4m3-rounded inputs and weights (or another
    ``rounding``: `_fake_fp16`, half precision's conv inputs, for scale)."""
    out, n = copy.deepcopy(net), 0
    for name, m in out.named_modules():
        if not (_fits(m) and select(name)):
            continue
        rank = m.weight.dim()
        m.weight.data = rounding(m.weight.data, tuple(range(1, rank)))
        dims = tuple(d for d in range(rank) if d != 1) if input_scale == "channel" else INPUT_SCALES[input_scale]
        m.register_forward_pre_hook(lambda _m, args, d=dims: (rounding(args[0], d), *args[1:]))
        n += 1
    return out, n


def _musetalk(batch: int):
    from newsstudio.engines.musetalk.engine import fp8_safe_decoder_conv
    from newsstudio.engines.musetalk.weights import random_vae

    decoder = random_vae(0, torch.device("cpu"), torch.float32).decoder.eval()
    z = torch.randn(batch, 4, 32, 32, generator=torch.Generator().manual_seed(1))
    groups = [(f"{b} only", lambda n, b=b: n.startswith(b)) for b in ("up_blocks.0.", "up_blocks.1.", "up_blocks.2.", "up_blocks.3.")]
    groups.append(("the engine's FP8-safe selection (mixed)", lambda n: fp8_safe_decoder_conv(n, None)))
    return decoder, (lambda net: net(z)), 2.0, groups


def _ditto(batch: int):
    from newsstudio.engines.ditto.engine import DittoEngine
    from newsstudio.engines.ditto.motion_stitch import NUM_KP

    eng = DittoEngine("cpu", weights="random", accel="eager", conv_rewrites=False)
    nets = nn.ModuleDict({"warp": eng._warp, "decoder": eng._decoder}).float().eval()
    g = torch.Generator().manual_seed(1)
    f_s = torch.randn((batch, 32, 16, 64, 64), generator=g)
    kp = torch.randn((batch, NUM_KP, 3), generator=g) * 0.1
    kp_d = kp + 0.02 * torch.randn(kp.shape, generator=g)
    # the warp's two largest convs alone too (thirty-eighth session: the mask conv 14.3 ms of a batch of 32 in fp16,
    # 9.7 ms as an FP8 GEMM with a fixed scale; the hourglass's last decoder conv 5.5 -> 4.5 ms)
    blocks = ["warp.", "warp.dense_motion_network.mask", "warp.dense_motion_network.hourglass.decoder.", "decoder.",
              "decoder.fc", *[f"decoder.G_middle_{i}." for i in range(6)], "decoder.up_0.", "decoder.up_1."]
    groups = [(f"{b.rstrip('.')} only", lambda n, b=b: n.startswith(b)) for b in blocks]
    return nets, (lambda net: net["decoder"](net["warp"](f_s, kp, kp_d))), 1.0, groups


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", default="musetalk", choices=["musetalk", "ditto"])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    net, run, peak, groups = (_musetalk if args.engine == "musetalk" else _ditto)(args.batch)
    cases = [(f"every conv, input scale per {s}", lambda n: True, s, _fake_e4m3) for s in INPUT_SCALES]
    cases += [(f"{label}, per tensor", select, "tensor", _fake_e4m3) for label, select in groups]
    cases.append(("for scale: every conv's inputs and weights in fp16, no FP8", lambda n: True, "tensor", _fake_fp16))
    rows = []
    with torch.inference_mode():
        ref = run(net)
        for label, select, scale, rounding in cases:
            fake, n = with_fake_rounding(net, select, scale, rounding)
            y = run(fake)
            mse = float(((y - ref) ** 2).mean())
            rows.append({"case": label, "convs": n, "rel_err": float((y - ref).norm() / ref.norm()),
                         "psnr_db": 10 * math.log10(peak ** 2 / mse) if mse else math.inf})
            print(f"{label:55s} {n:3d} convs  rel {rows[-1]['rel_err']:.2e}  {rows[-1]['psnr_db']:.1f} dB", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"engine": args.engine, "batch": args.batch, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
