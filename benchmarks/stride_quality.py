"""Ditto stride mode's image cost where seeded weights cannot show it: a geometric stand-in, per stride.

Why: a seeded decoder paints a saturated pattern that does not move with the face (consecutive
dense frames of `ditto_bench --stride` are ~10-19 dB apart), so the PSNR of stride vs dense renders
on seeded weights says nothing about real ones, and the official weights are not here. A trained
decoder shows its warped features; so here each *dense frame* is a natural image (skimage's
astronaut, at the crop size) moved by the seeded warp network's own motion model: at z it shows the
point ``z + sum_k m_k(z) (kp_s_k - kp_d_k)``, with ``m`` that network's dense-motion mask for that
frame's keypoints (averaged over depth). The keypoints move like a talking head (head sway of a few
degrees, the lip keypoints opening and closing with a syllable-rate envelope). Stride k keeps the
frames ``t % k == 0`` (and the last) and makes the rest with `stride.interpolate` in each mode, as
the engine does; PSNR (dB, [0, 255]) of those frames vs the dense ones: over the in-betweens and
over all frames. The motion's own scale is the PSNR between consecutive dense frames.

    python -m benchmarks.stride_quality [--strides 2,3,4,6,8] [--frames 49] [--json out.json]
    python -m benchmarks.stride_quality --quick      # developer architecture, a few frames (CPU smoke test)

Runs on the CPU in a few minutes (the real warp network once per frame, for its mask).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

import torch
import torch.nn.functional as F

LIP_KEYPOINTS = (6, 12, 14, 17, 19, 20)  # LivePortrait's lip retargeting keypoints
FPS = 25.0


def talking_head_keypoints(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(kp_s (1, 21, 3), kp_d (n, 21, 3)): 21 keypoints spread over a face in [-0.5, 0.5]; the
    driving ones sway (yaw 3 degrees at 0.4 Hz, pitch 2 degrees at 0.27 Hz, a small nod of the
    whole head) and the lip keypoints open up to 0.03 with a 4 Hz syllable envelope."""
    g = torch.Generator().manual_seed(seed)
    kp_s = (torch.rand(1, 21, 3, generator=g) - 0.5) * torch.tensor([1.0, 1.0, 0.4])
    t = torch.arange(n, dtype=torch.float64) / FPS
    yaw = torch.deg2rad(3.0 * torch.sin(2 * math.pi * 0.4 * t))
    pitch = torch.deg2rad(2.0 * torch.sin(2 * math.pi * 0.27 * t + 1.0))
    cy, sy, cp, sp = torch.cos(yaw), torch.sin(yaw), torch.cos(pitch), torch.sin(pitch)
    zero, one = torch.zeros_like(t), torch.ones_like(t)
    r_yaw = torch.stack([torch.stack([cy, zero, sy], -1), torch.stack([zero, one, zero], -1),
                         torch.stack([-sy, zero, cy], -1)], -2)
    r_pitch = torch.stack([torch.stack([one, zero, zero], -1), torch.stack([zero, cp, -sp], -1),
                           torch.stack([zero, sp, cp], -1)], -2)
    kp_d = torch.einsum("nij,kj->nki", (r_pitch @ r_yaw).float(), kp_s[0])
    envelope = (0.5 - 0.5 * torch.cos(2 * math.pi * 4.0 * t)).float() * (0.6 + 0.4 * torch.sin(2 * math.pi * 0.7 * t)).float()
    kp_d[:, list(LIP_KEYPOINTS), 1] += 0.03 * envelope[:, None]
    return kp_s, kp_d


def network_masks(engine: Any, kp_s: torch.Tensor, kp_d: torch.Tensor, batch: int = 4) -> torch.Tensor:
    """The seeded warp network's dense-motion mask (n, 1 + K, h, w), averaged over depth, for each
    frame's keypoints on the built-in portrait's appearance features."""
    f_s = engine.calibration_batch(1)[0]
    out = []
    with torch.inference_mode():
        for s in range(0, kp_d.shape[0], batch):
            x_d = kp_d[s:s + batch]
            n = x_d.shape[0]
            _, mask = engine._warp_with_mask(f_s.expand(n, -1, -1, -1, -1), kp_s.expand(n, -1, -1), x_d)
            out.append(mask.float())
    return torch.cat(out)


def natural_image(size: int) -> torch.Tensor:
    from skimage import data

    img = torch.from_numpy(data.astronaut()).permute(2, 0, 1)[None].float()
    return F.interpolate(img, size=(size, size), mode="bilinear", antialias=True, align_corners=False)


def psnr_of(mse: float) -> float:
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def stride_table(frames: torch.Tensor, kp_d: torch.Tensor, masks: torch.Tensor, feat_n: int, strides: list[int],
                 modes: list[str]) -> list[dict[str, Any]]:
    """PSNR of each stride k's frames (keyframes as they are, in-betweens by each mode) vs ``frames``."""
    from newsstudio.engines.ditto import stride as S

    n = frames.shape[0]
    rows = []
    for k in strides:
        keys = sorted({*range(0, n, k), n - 1})
        inb = [t for t in range(n) if t not in keys]
        a = torch.tensor([max(x for x in keys if x < t) for t in inb])
        b = torch.tensor([min(x for x in keys if x > t) for t in inb])
        tt = torch.tensor(inb)
        w = (tt - a).float() / (b - a).float()
        for mode in modes:
            extra = {"mask_a": masks[a], "mask_b": masks[b]} if mode == "mask" else {}
            got = S.interpolate(frames[a], frames[b], kp_d[a], kp_d[b], kp_d[tt], w, feat_n,
                                mode="flow" if mode in ("mask", "heatmap") else mode, **extra).clamp(0, 255)
            se = ((got.double() - frames[tt].double()) ** 2).mean(dim=(1, 2, 3))
            rows.append({"stride": k, "mode": mode, "keyframes": len(keys), "frames": n,
                         "psnr_in_between": psnr_of(float(se.mean())),
                         "psnr_all": psnr_of(float(se.sum()) / n),
                         "psnr_in_between_worst": psnr_of(float(se.max()))})
    return rows


def run(strides: list[int], modes: list[str], n: int, quick: bool = False) -> dict[str, Any]:
    from newsstudio.engines.ditto import stride as S
    from newsstudio.engines.ditto.config import TINY_OPTIONS
    from newsstudio.engines.ditto.engine import DittoEngine

    t0 = time.perf_counter()
    engine = DittoEngine("cpu", weights="random", **(TINY_OPTIONS if quick else {}))
    kp_s, kp_d = talking_head_keypoints(n)
    masks = network_masks(engine, kp_s, kp_d)
    feat_n = int(masks.shape[-1])
    tex = natural_image(engine.config.crop_size)
    frames = torch.cat([S.warp_by_keypoints(tex, kp_d[t:t + 1], kp_s, feat_n, mask=masks[t:t + 1]) for t in range(n)]).clamp(0, 255)
    steps = ((frames[1:].double() - frames[:-1].double()) ** 2).mean(dim=(1, 2, 3))
    motion = (kp_d[1:, :, :2] - kp_d[:-1, :, :2]).norm(dim=-1).mean()
    return {"frames": n, "crop": int(frames.shape[-1]), "feature_grid": feat_n, "quick": quick,
            "consecutive_dense_psnr": psnr_of(float(steps.mean())),
            "keypoint_step_per_frame": float(motion),
            "mask_identity_share": float(masks[:, 0].mean()),
            "rows": stride_table(frames, kp_d, masks, feat_n, strides, modes),
            "seconds": time.perf_counter() - t0}


def print_table(out: dict[str, Any]) -> None:
    print(f"\nstand-in: {out['frames']} frames at {out['crop']}x{out['crop']}, consecutive dense frames "
          f"{out['consecutive_dense_psnr']:.1f} dB apart, keypoints move {out['keypoint_step_per_frame']:.4f} per frame, "
          f"the seeded mask's identity share {out['mask_identity_share']:.2f}")
    print("| stride | mode | in-between PSNR dB (worst frame) | all frames PSNR dB | frames through the networks |")
    print("|---|---|---|---|---|")
    for r in out["rows"]:
        print(f"| {r['stride']} | {r['mode']} | {r['psnr_in_between']:.1f} ({r['psnr_in_between_worst']:.1f}) | "
              f"{r['psnr_all']:.1f} | {r['keyframes']} of {r['frames']} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strides", default="2,3,4,6,8")
    ap.add_argument("--modes", default="mask,heatmap,blend,nearest")
    ap.add_argument("--frames", type=int, default=49, help="frames of the clip (49: the last is a keyframe of every default stride)")
    ap.add_argument("--quick", action="store_true", help="developer architecture and 9 frames (smoke test)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    strides = [int(v) for v in args.strides.split(",") if v.strip()]
    modes = [m for m in args.modes.split(",") if m.strip()]
    from newsstudio.engines.ditto.stride import MODES

    bad = [m for m in modes if m not in MODES] + [str(k) for k in strides if k < 2]
    if bad or not strides:
        ap.error(f"strides must be >= 2 and modes among {', '.join(MODES)}; got {bad or 'no strides'}")
    n = 9 if args.quick else args.frames
    if n < 3:
        ap.error("--frames must be at least 3")
    torch.manual_seed(0)
    out = run(strides, modes, n, quick=args.quick)
    print_table(out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    print(f"{out['seconds']:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
