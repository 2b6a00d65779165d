"""The idle loop's frames, rendered once per avatar and shared by its sessions."""
from __future__ import annotations

import threading

import torch

from ..accel.host_copy import to_host
from ..avatar.packet import Packet
from ..engines.base import Engine
from ..stream import StreamSession


class IdleFrames:
    """The idle loop (avatar frames, mouth closed), rendered once per loop frame and shared by
    every session of an engine on that avatar.

    Valid when the engine's idle driving is the same for every frame (a closed mouth), so an
    idle frame depends only on its loop index; kept only while the whole loop fits in
    `budget` bytes (a photo is one frame; a long HD loop is rendered on the fly instead)."""

    BUDGET = 96 << 20

    def __init__(self, packet: Packet, n_frames: int):
        self.n_frames = n_frames
        self.frames: dict[int, torch.Tensor] = {}
        self.lock = threading.Lock()
        self.manifest = packet.manifest

    @classmethod
    def for_session(cls, engine: Engine, packet: Packet, stream: StreamSession) -> "IdleFrames | None":
        w, h = packet.size
        if packet.n_frames * w * h * 3 // 2 > cls.BUDGET:
            return None
        probe = engine.idle_driving(2)
        if probe is not None and not torch.allclose(probe[1:], probe[:1], rtol=0, atol=0, equal_nan=True):
            return None  # idle motion changes over time: not cacheable by loop index
        from pathlib import Path

        cache: dict[str, IdleFrames] = engine.__dict__.setdefault("_idle_frames_cache", {})
        key = str(Path(packet.path).resolve())
        got = cache.get(key)
        if got is None or got.manifest is not packet.manifest and got.manifest != packet.manifest:
            got = cache[key] = cls(packet, packet.n_frames)
        return got

    def frame(self, k: int, stream: StreamSession) -> torch.Tensor:
        from ..engines.base import pingpong_index

        src = int(pingpong_index(k, self.n_frames))
        f = self.frames.get(src)
        if f is None:
            f = stream.idle_frames(src, 1, "nv12")[0]
            f = to_host(f)
            with self.lock:
                self.frames.setdefault(src, f)
        return f
