"""Where can a network's convolutions run in FP8 and stay >= 35 dB from fp32? A fake-quantisation
study on any device (a CPU is enough): each eligible conv's input and weight rounded to e4m3 as
the Triton kernel does (weights one scale per output channel; inputs one scale per tensor, per
pixel or per channel), the product in fp32, for every conv or for one block's convs only.

    python -m benchmarks.fp8_conv_accuracy [--batch 2] [--json out.json]

Seeded MuseTalk VAE decoder (sd-vae), 32x32 latents -> 256x256. PSNR over the image range [-1, 1]
(peak 2), as the levers table reports for the VAE.
"""
from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from newsstudio.accel.fp8 import E4M3, E4M3_MAX
from newsstudio.accel.igemm_conv import eligible_conv
from newsstudio.engines.musetalk.engine import fp8_safe_decoder_conv
from newsstudio.engines.musetalk.weights import random_vae

INPUT_SCALES = {"tensor": None, "pixel": (1,), "channel": (0, 2, 3)}


def _fake_e4m3(t: torch.Tensor, dims: tuple[int, ...] | None) -> torch.Tensor:
    amax = t.abs().amax() if dims is None else t.abs().amax(dim=dims, keepdim=True)
    scale = (amax / E4M3_MAX).clamp_min(1e-12)
    return (t / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3).float() * scale


class _FakeFp8Conv(nn.Module):
    def __init__(self, conv: nn.Conv2d, input_scale: str) -> None:
        super().__init__()
        self.conv, self.dims = conv, INPUT_SCALES[input_scale]
        self.wq = _fake_e4m3(conv.weight.detach(), (1, 2, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.conv
        return F.conv2d(_fake_e4m3(x, self.dims), self.wq, c.bias, c.stride, c.padding)


def _with_fake_fp8(decoder: nn.Module, select: Callable[[str], bool], input_scale: str) -> tuple[nn.Module, int]:
    import copy

    out, n = copy.deepcopy(decoder), 0
    for name, m in list(out.named_modules()):
        if isinstance(m, nn.Conv2d) and eligible_conv(m) and select(name):
            parent, _, attr = name.rpartition(".")
            setattr(out.get_submodule(parent) if parent else out, attr, _FakeFp8Conv(m, input_scale))
            n += 1
    return out, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    decoder = random_vae(0, torch.device("cpu"), torch.float32).decoder.eval()
    z = torch.randn(args.batch, 4, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        ref = decoder(z)
        cases = [(f"every conv, input scale per {s}", lambda n: True, s) for s in INPUT_SCALES]
        cases += [(f"{blk} only, per tensor", lambda n, b=blk: n.startswith(b), "tensor")
                  for blk in ("up_blocks.0.", "up_blocks.1.", "up_blocks.2.", "up_blocks.3.")]
        cases += [("the engine's FP8-safe selection (mixed), per tensor", lambda n: fp8_safe_decoder_conv(n, None), "tensor")]
        rows = []
        for label, select, scale in cases:
            net, n = _with_fake_fp8(decoder, select, scale)
            y = net(z)
            mse = float(((y - ref) ** 2).mean())
            rows.append({"case": label, "convs": n, "rel_err": float((y - ref).norm() / ref.norm()),
                         "psnr_db": 10 * math.log10(4 / mse) if mse else math.inf})
            print(f"{label:55s} {n:3d} convs  rel {rows[-1]['rel_err']:.2e}  {rows[-1]['psnr_db']:.1f} dB", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"batch": args.batch, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
