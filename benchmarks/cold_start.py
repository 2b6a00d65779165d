"""Avatar cold start: the official MuseTalk realtime avatar layout vs our memory-mapped packet.

From ONE source video, this builds
  (a) the layout MuseTalk's `scripts/realtime_inference.py` keeps per avatar: `full_imgs/%08d.png`,
      `mask/%08d.png`, `coords.pkl`, `mask_coords.pkl` (pickled lists) and `latents.pt` (a torch.save'd
      list of [1, 8, 32, 32] tensors), loaded the way that script does (torch.load, pickle.load,
      cv2.imread of every frame and mask);
  (b) our packet (newsstudio prebake), opened until every array is addressable (manifest parse, size
      checks, memory maps).
and times both in the same run. Latent VALUES do not matter for load time, so (a) stores seeded
random latents of the official shape; masks are our feathered ROI masks at the official mask size.
Both are measured with the files in the page cache (warm OS cache, cold process state): what a
server sees when it switches anchors.

    python -m benchmarks.cold_start --source ../shared/media/yongen.mp4 [--size 1080x1920] [--repeat 20]
    python -m benchmarks.cold_start --packet PATH [--repeat 200]   # our open alone, on an existing packet
                                                                    # (e.g. one with musetalk and ditto arrays)
"""
from __future__ import annotations

import argparse
import glob
import json
import pickle
import statistics
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np
import torch

from newsstudio.avatar.packet import open_packet
from newsstudio.avatar.prebake import prebake
from newsstudio.compose.colour import nv12_to_rgb


def build_official_layout(packet, folder: Path) -> None:
    """Write the MuseTalk realtime avatar folder for the same frames as the packet."""
    full = folder / "full_imgs"
    masks = folder / "mask"
    full.mkdir(parents=True)
    masks.mkdir()
    n = packet.n_frames
    frames = packet.tensor("frames_nv12")
    coords, mask_coords, latents = [], [], []
    boxes = packet.array("face_boxes")
    g = torch.Generator().manual_seed(0)
    for i in range(n):
        rgb = nv12_to_rgb(frames[i : i + 1])[0].numpy()
        cv2.imwrite(str(full / f"{i:08d}.png"), rgb[..., ::-1])
        x1, y1, x2, y2 = (int(v) for v in boxes[i])
        coords.append((x1, y1, x2, y2))
        s = int(max(x2 - x1, y2 - y1) // 2 * 1.5)
        xc, yc = (x1 + x2) // 2, (y1 + y2) // 2
        mask_coords.append([xc - s, yc - s, xc + s, yc + s])
        m = np.zeros((2 * s, 2 * s), np.uint8)
        m[s:, :] = 255
        cv2.imwrite(str(masks / f"{i:08d}.png"), cv2.GaussianBlur(m, (2 * (s // 10) + 1, 2 * (s // 10) + 1), 0))
        latents.append(torch.randn(1, 8, 32, 32, generator=g))
    save_official_index(folder, coords, mask_coords, latents)


def save_official_index(folder: Path, coords: list, mask_coords: list, latents: list) -> None:
    """The pickles and `latents.pt` of the official avatar folder; the realtime script cycles
    every list ping-pong before saving."""
    cyc = lambda xs: xs + xs[::-1]  # noqa: E731
    with open(folder / "coords.pkl", "wb") as f:
        pickle.dump(cyc(coords), f)
    with open(folder / "mask_coords.pkl", "wb") as f:
        pickle.dump(cyc(mask_coords), f)
    torch.save(cyc(latents), folder / "latents.pt")


def load_official(folder: Path) -> tuple:
    """What `Avatar.__init__` (preparation=False) does before the first frame can be rendered."""
    latents = torch.load(folder / "latents.pt")
    with open(folder / "coords.pkl", "rb") as f:
        coords = pickle.load(f)
    frames = [cv2.imread(p) for p in sorted(glob.glob(str(folder / "full_imgs" / "*.[jpJP][pnPN]*[gG]")))]
    frames = frames + frames[::-1]
    with open(folder / "mask_coords.pkl", "rb") as f:
        mask_coords = pickle.load(f)
    masks = [cv2.imread(p) for p in sorted(glob.glob(str(folder / "mask" / "*.[jpJP][pnPN]*[gG]")))]
    masks = masks + masks[::-1]
    return latents, coords, frames, mask_coords, masks


def open_ours(path: Path):
    """Open the packet until every array's data is addressable (first byte of each touched)."""
    p = open_packet(path)
    arrays = {name: p.array(name) for name in p.names()}
    for a in arrays.values():
        if a.size:
            a.reshape(-1)[0]
    return p, arrays


def compare(packet_path: Path, load_official_fn, repeat: int, official_repeat: int) -> dict:
    """Median open time of our packet vs an official layout's loader, both with a warm page cache."""
    load_official_fn()
    open_ours(packet_path)
    ours = timeit(lambda: open_ours(packet_path), repeat)
    theirs = timeit(load_official_fn, official_repeat)
    res = {"ours_ms": statistics.median(ours) * 1e3, "official_ms": statistics.median(theirs) * 1e3}
    res["ratio"] = res["official_ms"] / res["ours_ms"]
    return res


def timeit(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        r = fn()
        out.append(time.perf_counter() - t)
        del r
    return out


def open_figures(path: Path, repeat: int, json_path: str | None) -> dict:
    """Median time to open an existing packet until every array is addressable (warm page cache)."""
    _, arrays = open_ours(path)  # warms the page cache; its arrays are what each timed open maps
    times = timeit(lambda: open_ours(path), repeat)
    res = {"packet": str(path), "arrays": len(arrays), "ours_median_ms": statistics.median(times) * 1e3,
           "ours_p10_ms": float(np.percentile(times, 10)) * 1e3, "ours_p90_ms": float(np.percentile(times, 90)) * 1e3}
    print(f"open {path} ({res['arrays']} arrays, warm page cache): median {res['ours_median_ms']:.3f} ms "
          f"(p10 {res['ours_p10_ms']:.3f}, p90 {res['ours_p90_ms']:.3f}) over {repeat}")
    if json_path:
        Path(json_path).write_text(json.dumps(res, indent=1))
    return res


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", default="../shared/media/yongen.mp4")
    ap.add_argument("--size", default=None, help="output WxH, e.g. 1080x1920 (default: source size)")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--official-repeat", type=int, default=3)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--packet", default=None, help="time opening this existing packet only (no official layout)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.packet:
        return open_figures(Path(args.packet), args.repeat, args.json)
    size = tuple(int(v) for v in args.size.split("x")) if args.size else None
    work = Path(args.workdir or tempfile.mkdtemp(prefix="coldstart-"))
    t = time.perf_counter()
    packet = prebake(args.source, "coldstart", root=work / "avatars", size=size, progress=False)
    t_prebake = time.perf_counter() - t
    official = work / "official" / "coldstart"
    if not official.exists():
        build_official_layout(packet, official)
    cmp = compare(packet.path, lambda: load_official(official), args.repeat, args.official_repeat)
    res = {
        "source": args.source,
        "frames": packet.n_frames,
        "size": list(packet.size),
        "packet_bytes": int(sum(s.nbytes for s in packet.specs.values())),
        "official_bytes": int(sum(f.stat().st_size for f in official.rglob("*") if f.is_file())),
        "ours_median_ms": cmp["ours_ms"],
        "official_median_ms": cmp["official_ms"],
        "ratio": cmp["ratio"],
        "prebake_s": t_prebake,
    }
    print(f"avatar cold start, {res['frames']} frames {res['size'][0]}x{res['size'][1]} (warm page cache)")
    print(f"  official MuseTalk layout (PNG + pickle + latents.pt): {res['official_median_ms']:10.2f} ms  ({res['official_bytes'] / 1e6:.0f} MB on disk)")
    print(f"  NewsStudio packet (mmap):                            {res['ours_median_ms']:10.3f} ms  ({res['packet_bytes'] / 1e6:.0f} MB on disk)")
    print(f"  ratio: {res['ratio']:.0f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
