"""What splicing a batch of ROIs into NV12 frames costs, and what its RGB -> YUV step costs in the
two forms it has had: as (N, 3) x (3,) matmuls (cuBLAS runs them as GEMV kernels, ~1 ms per 32
Ditto ROIs in an H100 profile) and as scaled elementwise adds (`compose/colour.py` now).

    python -m benchmarks.splice_cost [--batch 32] [--roi 704x704] [--frame 1080x1920] [--repeat 50]

Random frames, ROIs and masks on the default device (CUDA when present); each row is the median of
--repeat calls after a warm-up, synchronised. ``splice`` is the whole `splice_nv12` as a render
calls it; the ``yuv`` rows are the luma + block-chroma step alone on the ROIs.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from .common import median, timed


def yuv_by_matmul(x: torch.Tensor, fwd: torch.Tensor, off: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The former form: Y = x @ fwd[0] + off[0]; UV from the 2x2 block means @ fwd[1:].T."""
    h, w = x.shape[-3], x.shape[-2]
    blocks = x.reshape(*x.shape[:-3], h // 2, 2, w // 2, 2, 3).mean(dim=(-4, -2))
    return x @ fwd[0] + off[0], blocks @ fwd[1:].T + off[1:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--roi", default="704x704", help="ROI WxH (even)")
    ap.add_argument("--frame", default="1080x1920", help="frame WxH")
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from newsstudio.compose.colour import rgb_to_uv, rgb_to_y, yuv_coefficients
    from newsstudio.compose.splice import splice_nv12

    dev = torch.device(args.device)
    (wr, hr), (w, h) = ((int(v) for v in s.split("x")) for s in (args.roi, args.frame))
    b = args.batch
    g = torch.Generator(device=dev).manual_seed(0)
    frames = torch.randint(0, 256, (b, h * 3 // 2, w), dtype=torch.uint8, device=dev, generator=g)
    roi = torch.rand((b, hr, wr, 3), device=dev, generator=g) * 255
    mask = torch.rand((b, hr, wr), device=dev, generator=g)
    origins = torch.tensor([[(w - wr) // 2 // 2 * 2, (h - hr) // 2 // 2 * 2]] * b, device=dev)
    fwd, off, _, _ = yuv_coefficients().tensors(dev)
    out = torch.empty_like(frames)
    calls = {
        "splice (splice_nv12)": lambda: splice_nv12(frames, roi, mask, origins, out=out),
        "yuv, scaled adds (now)": lambda: (rgb_to_y(roi, in_255=True), rgb_to_uv(roi, in_255=True)),
        "yuv, matmuls (before)": lambda: yuv_by_matmul(roi, fwd, off),
    }
    rows = {k: median(timed(fn, dev, args.repeat)) * 1e3 for k, fn in calls.items()}
    y_new, uv_new = rgb_to_y(roi, in_255=True), rgb_to_uv(roi, in_255=True)
    y_old, uv_old = yuv_by_matmul(roi, fwd, off)
    diff = max(float((y_new - y_old).abs().max()), float((uv_new - uv_old).abs().max()))
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    print(f"{b} ROIs {wr}x{hr} into {w}x{h} NV12 on {name}; largest difference of the two YUV forms {diff:.2e} code values")
    print("| step | ms (median of %d) |" % args.repeat)
    print("|---|---|")
    for k, v in rows.items():
        print(f"| {k} | {v:.3f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "device": name, "ms": rows, "max_abs_diff": diff}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
