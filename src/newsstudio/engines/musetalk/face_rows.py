"""Which face rows MuseTalk's VAE decoder makes, and where the skipped rows' statistics live.

The blend shows only the lower face, so the decoder may start at a face row ``R``
(lower_face_decoder.py): on an H100 the render of 32 frames took 49.2 instead of 60.3 ms and dense
1080x1920 ran 596.6 instead of 475.9 frames/s (benchmarks/RESULTS.md, twenty-ninth session), at
36.9 dB over the blended pixels with seeded weights. The choice, ``first_face_row``:

* ``None`` (the default): ``"auto"`` where that was measured to pay (CUDA, compiled), else 0;
* ``"auto"``: ``AUTO_FIRST_FACE_ROW``, and the whole face for an avatar whose blend reaches higher;
* ``0``: the whole face; ``R``: rows ``R``-255 only, and an avatar that needs more is refused.

The skipped rows' GroupNorm statistics per avatar frame are made at prebake time and stored in the
packet (``musetalk/upper_stats``, keyed by the row and the weights); a packet without them (baked
elsewhere, or before) gets them computed when the avatar is loaded.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...accel.static import compiled_on_cuda
from ...avatar.packet import Packet

AUTO_FIRST_FACE_ROW = 104  # 8-aligned, above every test avatar's first blended row (110-123)
UPPER_STATS_ARRAY = "musetalk/upper_stats"
UPPER_STATS_META = "upper_stats"  # key of the stats' provenance in the packet's MuseTalk meta


@dataclass(frozen=True)
class FaceRows:
    """The decoder's first face row (0: the whole face) and whether an avatar needing more is refused."""

    first_row: int
    strict: bool

    def __post_init__(self) -> None:
        if not 0 <= self.first_row < 256:
            raise ValueError(f"first_face_row must be in 0..255, got {self.first_row}")


def parse_first_face_row(value: int | str | None) -> int | str | None:
    """A CLI/server value: ``None``/``"default"``, ``"auto"`` or a row number (as int or text)."""
    if value is None or value == "default":
        return None
    if value == "auto":
        return "auto"
    try:
        row = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"first_face_row must be 'default', 'auto' or a row 0-255, got {value!r}") from None
    if not 0 <= row < 256 or (isinstance(value, float) and value != row):
        raise ValueError(f"first_face_row must be 'default', 'auto' or a row 0-255, got {value!r}")
    return row


def resolve_face_rows(value: int | str | None, device_type: str, accel: str) -> FaceRows:
    """`FaceRows` of an engine's ``first_face_row`` option on this device and accel mode."""
    value = parse_first_face_row(value)
    if value is None:
        value = "auto" if compiled_on_cuda(device_type, accel) else 0
    if value == "auto":
        return FaceRows(AUTO_FIRST_FACE_ROW, strict=False)
    return FaceRows(int(value), strict=True)


def stored_upper_stats(packet: Packet, key: dict[str, Any], shape: tuple[int, ...]) -> np.ndarray | None:
    """The packet's upper-row statistics if they were made with ``key`` and have ``shape``, else None."""
    meta = packet.engine_meta("musetalk") or {}
    if meta.get(UPPER_STATS_META) != key or UPPER_STATS_ARRAY not in packet:
        return None
    if tuple(packet.specs[UPPER_STATS_ARRAY].shape) != tuple(shape):
        return None
    stats = packet.array(UPPER_STATS_ARRAY)
    return stats if stats.dtype == np.float32 and np.isfinite(stats).all() else None


def store_upper_stats(packet: Packet, stats: np.ndarray, key: dict[str, Any]) -> Packet:
    """The packet with ``stats`` (N, K, G, 2) float32 and their provenance added."""
    meta = dict(packet.engine_meta("musetalk") or {})
    meta[UPPER_STATS_META] = key
    return packet.add_arrays({UPPER_STATS_ARRAY: np.ascontiguousarray(stats, dtype=np.float32)},
                             engine="musetalk", engine_meta=meta)
