"""Shared pieces of the benchmark scripts: media lookup, avatars from carried landmarks, timing."""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
CARRY = ROOT / ".carry"


def media(name: str) -> Path:
    """A real test file: ../shared/media when present, else the copy carried to a GPU machine."""
    for base in (ROOT.parent / "shared" / "media", CARRY / "media"):
        if (base / name).is_file():
            return base / name
    raise FileNotFoundError(f"{name} not found in ../shared/media or .carry/media (run benchmarks/prepare_carry.py)")


def avatar(source: Path, avatar_id: str, size: tuple[int, int] | None, root: Path, max_frames: int = 750):
    """Prebake `source`, using landmarks carried as .carry/<stem>.faces.npz when the machine has no detector."""
    from newsstudio.avatar.prebake import prebake

    faces_file = CARRY / f"{source.stem}.faces.npz"
    faces = None
    if faces_file.is_file():
        from newsstudio.avatar.landmarks_io import load_faces

        faces = load_faces(faces_file)[:max_frames]
    return prebake(source, avatar_id, root=root, size=size, progress=False, faces=faces, max_frames=max_frames)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device, repeat: int = 5, warmup: int = 1) -> list[float]:
    for _ in range(warmup):
        fn()
    sync(device)
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        sync(device)
        out.append(time.perf_counter() - t)
    return out


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__, "cpu_count": os.cpu_count()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    try:
        info["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip() or None
    except OSError:
        info["commit"] = None
    info["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return info


def write_json(path: str | os.PathLike[str] | None, data: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps(data, indent=1, default=str))


def parse_variant(spec: str) -> tuple[str, bool | None]:
    """`ACCEL[:nchw]` -> (accel mode, channels_last: False for ':nchw', None = the engine's default)."""
    from newsstudio.accel import MODES

    accel, _, layout = spec.partition(":")
    if accel not in MODES or layout not in ("", "nchw"):
        raise SystemExit(f"--variants: {spec!r} is not ACCEL[:nchw] with ACCEL one of {MODES}")
    return accel, (False if layout else None)


def check_variant_order(specs: list[tuple[str, bool | None]]) -> list[tuple[str, bool | None]]:
    """Engines of one process share their networks and channels_last converts them in place, so
    the ':nchw' variants must be timed first."""
    if [cl for _, cl in specs] != sorted((cl for _, cl in specs), key=lambda cl: cl is None):
        raise SystemExit("--variants: list the ':nchw' variants first (channels_last converts the shared weights in place)")
    return specs


def weights_channels_last(module: torch.nn.Module) -> bool:
    """Whether the module's first 4-D weight is stored channels_last (what actually ran)."""
    w = next(p for p in module.parameters() if p.dim() == 4)
    return bool(w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous())


def mp4_options(spec: str) -> dict[str, Any]:
    """`PRESET[:WORKERS[/SEGMENT_FRAMES]]` -> Mp4Writer keywords (workers > 1: parallel x264 segments)."""
    preset, _, rest = spec.partition(":")
    workers, _, seg = (rest or "1").partition("/")
    return {"preset": preset or "veryfast", "workers": int(workers), "segment_frames": int(seg or 32)}
