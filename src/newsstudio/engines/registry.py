"""Engine names -> classes, and the choice of the default engine.

Neural engines are imported lazily so `classic` starts fast and works without their
dependencies' weights. The default is the first neural engine whose official weights are in
the models folder, else `classic`.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from ..accel.static import MODES, check_static_shapes
from .base import Engine

ENGINES = ("classic", "musetalk", "ditto")


def models_dir(path: str | os.PathLike[str] | None = None) -> Path:
    return Path(path or os.environ.get("NEWSSTUDIO_MODELS", "models"))


def create_engine(name: str, device: str | torch.device = "cpu", **kwargs: Any) -> Engine:
    """Build an engine by name; neural engines take `models=DIR`, `weights="official"|"random"`."""
    if name == "auto":
        name = default_engine(kwargs.get("models"))
    if name == "classic":
        from .classic.engine import ClassicEngine

        return ClassicEngine(device=device)
    if name == "musetalk":
        from .musetalk.engine import MuseTalkEngine

        return MuseTalkEngine(device=device, **kwargs)
    if name == "ditto":
        from .ditto.engine import DittoEngine

        return DittoEngine(device=device, **kwargs)
    raise ValueError(f"unknown engine {name!r}; choose one of {', '.join(ENGINES)} or 'auto'")


ACCEL_CHOICES = ("auto", *MODES)


def check_accel(accel: str) -> str:
    """`accel` if it is one of ACCEL_CHOICES, else a ValueError naming them."""
    if accel not in ACCEL_CHOICES:
        raise ValueError(f"accel must be one of {', '.join(ACCEL_CHOICES)}, got {accel!r}")
    return accel


def engine_options(name: str, weights: str, models: str | os.PathLike[str] | None, accel: str = "auto",
                   device: str | torch.device | None = None, long_running: bool = False,
                   front_end_tf32: bool | None = None, triton_convs: str = "off",
                   first_face_row: int | str | None = None, feature_step_ms: int | None = None,
                   static_shapes: str | None = None, stride: int = 1, stride_mode: str = "mask") -> dict[str, Any]:
    """Keyword arguments for `create_engine(name, ...)` from the CLI/server settings.

    accel ``"auto"``: the engine's own default (CUDA graphs on CUDA, eager on CPU), except for a
    long-running process (``long_running``: the server) on CUDA, which also compiles the networks
    (``compile+cudagraph``: ~2x the frame rate, ~1.5 min of compilation once at start-up, cached
    on disk for the next start). ``front_end_tf32``: Ditto's float32 front end (HuBERT, LMDM)
    graphed with TF32 matmuls or not (`DittoEngine`; None: its default, on); MuseTalk's front end
    runs in half precision already. ``triton_convs``: the neural engines' render convolutions on the
    Triton kernel (accel/igemm_conv.py): "off", "half" or "fp8". ``first_face_row``: the face rows MuseTalk's
    decoder makes (engines/musetalk/face_rows.py: "default"/None, "auto", 0 = the whole face, or a row).
    ``feature_step_ms``: how often a live MuseTalk stream re-encodes its speech (None: every 100 ms).
    ``static_shapes``: which of MuseTalk's render buckets compile at their own batch size
    (accel/static.py `static_buckets`: "default"/None, "none", "largest", "all"). ``stride``,
    ``stride_mode``: Ditto's stride mode (engines/ditto/stride.py: warp + decode every ``stride``-th
    frame, the frames between interpolated; 1: dense)."""
    from .ditto.stride import check_stride
    from .musetalk.face_rows import parse_first_face_row
    from .musetalk.frame_queues import feature_step_rows

    check_accel(accel)
    check_triton_convs(triton_convs)
    rows = parse_first_face_row(first_face_row)  # checked for every engine: a typo fails early
    if feature_step_ms is not None:
        feature_step_rows(feature_step_ms)
    static_shapes = check_static_shapes(static_shapes)  # checked for every engine, as above
    stride = check_stride(stride, stride_mode)
    if name == "classic":
        return {}
    kw: dict[str, Any] = {"weights": weights, "models": models}
    if accel == "auto" and long_running and device is not None and torch.device(device).type == "cuda":
        accel = "compile+cudagraph"
    if accel != "auto":
        kw["accel"] = accel
    if front_end_tf32 is not None and name == "ditto":
        kw["front_end_tf32"] = bool(front_end_tf32)
    if triton_convs != "off":
        kw["triton_convs"] = triton_convs
    if rows is not None and name == "musetalk":
        kw["first_face_row"] = rows
    if feature_step_ms is not None and name == "musetalk":
        kw["feature_step_ms"] = int(feature_step_ms)
    if static_shapes != "default" and name == "musetalk":
        kw["static_shapes"] = static_shapes
    if stride > 1 and name == "ditto":
        kw["stride"], kw["stride_mode"] = stride, stride_mode
    return kw


def check_triton_convs(mode: str) -> str:
    """A ``--triton-convs`` value an engine takes (fp8-static needs calibration inputs: benchmarks only)."""
    from ..accel.igemm_conv import TRITON_CONV_MODES

    if mode not in TRITON_CONV_MODES:
        raise ValueError(f"triton-convs must be one of {', '.join(TRITON_CONV_MODES)}, got {mode!r}")
    return mode


def default_engine(models: str | os.PathLike[str] | None = None) -> str:
    """`musetalk` or `ditto` when their official weights are present, else `classic`."""
    root = models_dir(models)
    if (root / "musetalkV15" / "unet.pth").is_file() and (root / "sd-vae").is_dir() and (root / "whisper").is_dir():
        return "musetalk"
    if (root / "ditto_pytorch" / "models" / "decoder.pth").is_file():
        return "ditto"
    return "classic"
