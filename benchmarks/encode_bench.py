"""H.264 + AAC encode speed of `Mp4Writer` alone: what the "segment -> MP4" figure costs on the CPU.

    python -m benchmarks.encode_bench [--size 1080x1920] [--frames 165] [--source VIDEO]
                                      [--configs veryfast,superfast:8,ultrafast:8/16] [--json out.json]

Frames: the first --frames frames of ../shared/media/yongen.mp4 (or .carry/media; --source: any
video, e.g. an engine's own render), scaled to --size and converted to NV12 by FFmpeg once, held in
memory (real content: x264's speed depends on it; a seeded engine's noisy face costs it more).
Audio: the first frames/25 s of speech.wav. For each preset the whole file is written, timed from
the first write to the closed file on disk (median of --repeat), with its size, so the speed and
the bitrate cost of each configuration are read side by side. A configuration is
PRESET[:WORKERS[/SEGMENT_FRAMES]]: WORKERS > 1 = closed segments encoded in parallel by separate
x264 instances (`Mp4Writer(workers=..., segment_frames=...)`, default 32 frames). Frames are handed
over as the render paths do (``owned=True``: parallel segments keep them without a copy); runs
before the eleventh session copied each frame on the caller's thread first (3 MB per 1080p frame).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import av
import numpy as np

from .common import machine, media, median, mp4_options, write_json


def nv12_frames(source: Path, size: tuple[int, int], n: int) -> np.ndarray:
    """(n, H*3/2, W) uint8 NV12 frames of `source`, scaled (bilinear) to `size` = (W, H), looped if short."""
    w, h = size
    out = []
    with av.open(str(source)) as c:
        for frame in c.decode(video=0):
            out.append(frame.reformat(width=w, height=h, format="nv12").to_ndarray())
            if len(out) == n:
                break
    if not out:
        raise SystemExit(f"{source}: no video frames")
    return np.stack([out[i % len(out)] for i in range(n)])


def encode_once(frames: np.ndarray, size: tuple[int, int], fps: int, audio, options: dict[str, Any], dest: Path) -> float:
    from newsstudio.media.mp4_writer import Mp4Writer

    w, h = size
    t0 = time.perf_counter()
    with Mp4Writer(dest, w, h, fps, audio=audio, pixel_input="nv12", **options) as wr:
        for s in range(0, len(frames), 32):
            wr.write(frames[s:s + 32], owned=True)  # as the render paths hand over their chunks (no copy per frame)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from newsstudio.media.audio import Audio, load_audio

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1080x1920")
    ap.add_argument("--frames", type=int, default=165)
    ap.add_argument("--fps", type=int, default=25)
    ap.add_argument("--configs", default="veryfast,superfast,ultrafast,veryfast:8,superfast:8,ultrafast:8,superfast:16/16",
                    help="PRESET[:WORKERS[/SEGMENT_FRAMES]],...")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--source", type=Path, default=None,
                    help="video whose frames are encoded (default: yongen.mp4), e.g. a render with seeded weights")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    size = tuple(int(v) for v in args.size.split("x"))
    frames = nv12_frames(args.source or media("yongen.mp4"), size, args.frames)
    a = load_audio(media("speech.wav"))
    n = int(round(args.frames / args.fps * a.sample_rate))
    audio = Audio(np.ascontiguousarray(a.samples[:, :n]), a.sample_rate)
    work = Path(tempfile.mkdtemp(prefix="encode-bench-"))
    out: dict[str, Any] = {"machine": machine(), "args": vars(args), "configs": {}}
    print(f"| preset:workers/segment | seconds for {args.frames} frames {args.size} + audio | encode fps | file MB |")
    print("|---|---|---|---|")
    for spec in [p for p in args.configs.split(",") if p]:
        cfg = mp4_options(spec)
        dest = work / "out.mp4"
        encode_once(frames[:8], size, args.fps, None, cfg, dest)  # warm-up (codec set-up, page cache)
        ts = [encode_once(frames, size, args.fps, audio, cfg, dest) for _ in range(args.repeat)]
        mb = dest.stat().st_size / 1e6
        out["configs"][spec] = {"seconds": median(ts), "seconds_all": ts, "fps": args.frames / median(ts), "file_mb": mb}
        print(f"| {spec} | {median(ts):.3f} | {args.frames / median(ts):.0f} | {mb:.2f} |", flush=True)
    write_json(args.json, out)
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
