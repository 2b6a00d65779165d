"""Do the engines' exact conv rewrites give the plain networks' outputs on this device?

    python -m benchmarks.rewrite_check [--device cuda] [--batch 32]

Checks, per dtype (fp32 with TF32 off, fp16, bf16 on CUDA; fp32 on CPU), the relative L2 error
of: the phase convolution against nearest-2x + 3x3 conv at the SD VAE decoder's three shapes;
the 2x2 phase convolution with padding 1 against the same with explicit zero padding and with
cuDNN off (a cuDNN algorithm that mishandled even kernels would show here); the whole VAE decoder
rewritten vs plain; Ditto's DepthSlicedConv3d against its Conv3d (the mask conv shape, and the
upsampling form); Ditto's regrouped warp + decoder against the plain ones; the GroupNorm /
InstanceNorm statistics kernel (accel/group_norm_nhwc.py) in both decoders, channels-last, against
PyTorch's norms. Seeded random weights.
Prints one line per check; a rewrite is correct when its error is at the dtype's rounding level
(fp32 ~1e-6, fp16 ~1e-3, bf16 ~1e-2).
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn

from newsstudio.accel.depth_sliced_conv3d import DepthSlicedConv3d
from newsstudio.accel.group_norm_nhwc import with_nhwc_group_norms
from newsstudio.accel.upsample_conv import PhaseUpsampleConv, with_phase_upsampling


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@torch.no_grad()
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dtypes = (torch.float32, torch.float16, torch.bfloat16) if dev.type == "cuda" else (torch.float32,)
    b = args.batch
    g = torch.Generator(dev).manual_seed(0)

    for cin, hw in [(512, 32), (512, 64), (256, 128)]:  # the SD VAE decoder's upsampling convs
        conv = nn.Conv2d(cin, cin, 3, padding=1).to(dev)
        pc = PhaseUpsampleConv(conv)
        x32 = torch.randn(b, cin, hw, hw, device=dev, generator=g)
        for dt in dtypes:
            x, c, p = x32.to(dt), conv.to(dt), pc.to(dt)
            ref = c(F.interpolate(x, scale_factor=2, mode="nearest"))
            y_pad1 = F.conv2d(x, p.weight, p.bias, padding=1)
            y_explicit = F.conv2d(F.pad(x, (1, 1, 1, 1)), p.weight, p.bias)
            with torch.backends.cudnn.flags(enabled=False):
                y_plain = F.conv2d(x, p.weight, p.bias, padding=1)
            print(f"phase conv {cin}ch {hw}->{2 * hw} batch {b} {str(dt)[6:]}: vs upsample+conv {rel(p(x), ref):.2e}; "
                  f"padding=1 vs explicit pad {rel(y_pad1, y_explicit):.2e}; vs cuDNN off {rel(y_pad1, y_plain):.2e}", flush=True)
        conv.float(), pc.float()

    from newsstudio.engines.musetalk.weights import random_vae

    vae = random_vae(0, device=dev)
    fast = with_phase_upsampling(vae.decoder)[0]
    z = torch.randn(b, 4, 32, 32, device=dev, generator=g)
    for dt in dtypes:
        nn.Module.to(vae, dt), fast.to(dt)  # (diffusers' own .to warns about float32 modules)
        zz = vae.post_quant_conv(z.to(dt))
        print(f"VAE decoder batch {b} {str(dt)[6:]}: rewritten vs plain {rel(fast(zz), vae.decoder(zz)):.2e}", flush=True)
    fast = fast.to(memory_format=torch.channels_last)  # the NHWC norm kernel reads channels-last activations
    norms = with_nhwc_group_norms(fast)[0]
    for dt in dtypes:
        nn.Module.to(vae, dt), fast.to(dt)
        zz = vae.post_quant_conv(z.to(dt)).contiguous(memory_format=torch.channels_last)
        print(f"VAE decoder channels_last batch {b} {str(dt)[6:]}: NHWC norm statistics vs PyTorch's {rel(norms(zz), fast(zz)):.2e}",
              flush=True)
    del vae, fast, norms

    mask = nn.Conv3d(142, 22, 7, padding=3).to(dev)
    x3 = torch.randn(2, 142, 16, 64, 64, device=dev, generator=g)
    up = nn.Conv3d(64, 32, 3, padding=1).to(dev)
    xu = torch.randn(2, 64, 16, 32, 32, device=dev, generator=g)
    for dt in dtypes:
        m, u = mask.to(dt), up.to(dt)
        print(f"DepthSlicedConv3d 142->22 7x7x7 {str(dt)[6:]}: {rel(DepthSlicedConv3d(m)(x3.to(dt)), m(x3.to(dt))):.2e}; "
              f"upsampling form 64->32: {rel(DepthSlicedConv3d(u, upsample_hw=2)(xu.to(dt)), u(F.interpolate(xu.to(dt), scale_factor=(1.0, 2.0, 2.0), mode='nearest'))):.2e}",
              flush=True)

    from newsstudio.engines.ditto.models import SPADEDecoder, WarpingNetwork
    from newsstudio.engines.ditto.models.regrouped import RegroupedSPADEDecoder, regrouped_warp
    from newsstudio.weights.seeded import fill_seeded_

    warp = fill_seeded_(WarpingNetwork(), 0).to(dev).eval()
    dec = fill_seeded_(SPADEDecoder(), 0).to(dev).eval().fold_spectral_norm_()
    rwarp, rdec = regrouped_warp(warp), RegroupedSPADEDecoder(dec)
    feat = torch.randn(4, 32, 16, 64, 64, device=dev, generator=g)
    kp_s = torch.randn(4, 21, 3, device=dev, generator=g) * 0.3
    kp_d = kp_s + torch.randn(4, 21, 3, device=dev, generator=g) * 0.05
    w_ref = warp(feat, kp_s, kp_d)
    print(f"Ditto regrouped warp fp32: {rel(rwarp(feat, kp_s, kp_d), w_ref):.2e}; regrouped decoder logits fp32: "
          f"{rel(rdec.forward_logits(w_ref), dec.forward_logits(w_ref)):.2e}", flush=True)
    cl = w_ref.contiguous(memory_format=torch.channels_last)
    rdec_cl = rdec.to(memory_format=torch.channels_last)
    print(f"Ditto regrouped decoder channels_last fp32: NHWC instance-norm statistics vs PyTorch's "
          f"{rel(with_nhwc_group_norms(rdec_cl)[0].forward_logits(cl), rdec_cl.forward_logits(cl)):.2e}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
