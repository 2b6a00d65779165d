"""The one protocol every engine implements, and the pieces engines share.

An engine is four stages (BRIEF §3), and the runner in `newsstudio.stream` drives them the
same way for every engine:

1. `conditioner(fps)`  audio -> per-frame conditioning, incremental (PCM chunks in, frames out
   as soon as the look-ahead they need has arrived);
2. `driver(layer)`     conditioning -> driving signal (identity for MuseTalk/classic, LMDM
   motion windows for Ditto); also incremental;
3. `render(layer, driving, frame_idx)` a batch of face ROIs on the device;
4. splicing into full frames is done by the runner with the layer's geometry.

Incremental stages share one small interface (`FrameQueue`): `push`, `close`, `ready`, `take`.
"""
from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..avatar.packet import Packet, PacketError, open_packet


class FrameQueue(ABC):
    """An incremental stage: values pushed in, per-frame values taken out once final."""

    @abstractmethod
    def push(self, value: Any) -> None:
        """Feed more input (PCM samples for a conditioner, a conditioning batch for a driver)."""

    @abstractmethod
    def close(self) -> None:
        """No more input: flush whatever was held back for look-ahead."""

    @property
    @abstractmethod
    def ready(self) -> int:
        """Frames that can be taken now."""

    @abstractmethod
    def take(self, n: int) -> torch.Tensor:
        """Remove and return the next `n` (<= ready) frames, stacked on axis 0."""


class TensorFrameQueue(FrameQueue):
    """A FIFO of per-frame tensors; the building block of simple stages. Given the rows' ``width``
    (and ``device``), ``take(0)`` returns an empty ``(0, width)`` tensor even before anything came."""

    def __init__(self, width: int | None = None, device: torch.device | str | None = None) -> None:
        self._parts: list[torch.Tensor] = []
        self._count = 0
        self.closed = False
        self.width, self.device = width, device

    def push(self, value: torch.Tensor) -> None:
        if value.shape[0]:
            self._parts.append(value)
            self._count += int(value.shape[0])

    def close(self) -> None:
        self.closed = True

    @property
    def ready(self) -> int:
        return self._count

    def take(self, n: int) -> torch.Tensor:
        if n == 0 and self.width is not None:
            return torch.zeros((0, self.width), device=self.device)
        if n > self._count:
            raise ValueError(f"asked for {n} frames, {self._count} ready")
        if not self._parts:
            raise ValueError("queue is empty")
        cat = torch.cat(self._parts) if len(self._parts) > 1 else self._parts[0]
        head, tail = cat[:n], cat[n:]
        self._parts = [tail] if tail.shape[0] else []
        self._count -= n
        return head


class QueuedStage(FrameQueue):
    """A stage whose finished frames wait in a `TensorFrameQueue` (``self.out``) until taken."""

    out: TensorFrameQueue

    @property
    def ready(self) -> int:
        return self.out.ready

    def take(self, n: int) -> torch.Tensor:
        return self.out.take(n)


class PassThroughDriver(TensorFrameQueue):
    """Stage 2 for engines whose conditioning is already the driving signal."""


@dataclass
class AvatarLayer:
    """An engine's view of one avatar, resident on the render device.

    `origins` (N, 2) even ROI origins and `masks` (N, Hr, Wr) feathering masks in [0, 1] say
    where and how the rendered ROIs land in the output frames; `data` holds the engine's own
    per-avatar tensors (latents, feature volumes, ...). Index tensors by source frame.
    """

    engine: str
    packet: Packet
    device: torch.device
    roi_hw: tuple[int, int]
    origins: torch.Tensor
    masks: torch.Tensor
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def n_frames(self) -> int:
        return self.packet.n_frames


def neural_defaults(device: str | torch.device, dtype: torch.dtype | None, weights: str) -> tuple[torch.device, torch.dtype]:
    """(device, dtype) of a neural engine: float16 on CUDA, float32 elsewhere unless given;
    ``weights`` must be ``"official"`` or ``"random"``."""
    if weights not in ("official", "random"):
        raise ValueError(f"weights must be 'official' or 'random', got {weights!r}")
    device = torch.device(device)
    return device, dtype or (torch.float16 if device.type == "cuda" else torch.float32)


def warn_random_weights(engine: str, salt: int | None) -> None:
    """The stderr line every engine built with seeded random weights prints (its frames carry a banner)."""
    print(f"WARNING: {engine} is using SEEDED RANDOM WEIGHTS (salt {salt}); its output is marked and is not a real "
          "model's output (benchmarks/tests only).", file=sys.stderr)


class Engine(ABC):
    """A talking-head engine. Subclasses are stateless across sessions: per-stream state lives
    in the conditioner/driver objects they return, so one loaded engine serves many streams."""

    name: str = "engine"
    #: sample rate the conditioner expects (mono float32)
    sample_rate: int = 16000
    #: True when the weights are seeded random (benchmarks): outputs are marked as such
    random_weights: bool = False
    #: True when `render` reads its driving rows' bookkeeping and its frame indices on the CPU
    #: (Ditto's stride mode): a runner that can hand them over on the host (`FrontEndFeed` from its
    #: own CUDA stream, `StreamSession` from a host copy of its loop table) spares the render
    #: thread a device sync per call, which would wait for the previous chunk's render to finish
    rows_on_host: bool = False

    def __init__(self, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
        self.device = torch.device(device)
        self.dtype = dtype

    @abstractmethod
    def load_avatar(self, packet: Packet) -> AvatarLayer:
        """Bring the packet's arrays this engine needs onto the device (prebaking if needed)."""

    @abstractmethod
    def conditioner(self, fps: float) -> FrameQueue:
        """A fresh stage-1 object: PCM at `sample_rate` in, per-frame conditioning out."""

    def driver(self, layer: AvatarLayer, fps: float | None = None) -> FrameQueue:
        """A fresh stage-2 object; identity unless the engine synthesises motion. ``fps``: the
        output rate the stream's conditioner was made for (None: the engine's own)."""
        return PassThroughDriver()

    @abstractmethod
    def render(self, layer: AvatarLayer, driving: torch.Tensor, frame_idx: torch.Tensor) -> torch.Tensor:
        """ROIs for a batch: (B, Hr, Wr, 3) float RGB in [0, 255] on the device.

        frame_idx: (B,) source-frame index of each output frame (ping-pong already applied).
        """

    def render_buckets(self) -> tuple[int, ...] | None:
        """The batch sizes `render_many` runs as, a batch padded up to the smallest that holds it (a
        compiled engine's CUDA-graph buckets); None where a batch runs at its own size. A server's
        render batcher fills its batches up to them under load (`batching` module doc)."""
        return None

    def render_many(self, items: list[tuple[AvatarLayer, torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
        """`render` for several (layer, driving, frame_idx) requests at once (batching.RenderBatcher):
        one output per item, in order. This default makes one `render` call per layer with that
        layer's items concatenated; engines whose networks batch across avatars override it."""
        groups: dict[int, list[int]] = {}
        for k, (layer, _, _) in enumerate(items):
            groups.setdefault(id(layer), []).append(k)
        outs: list[torch.Tensor | None] = [None] * len(items)
        for ks in groups.values():
            if len(ks) == 1:
                outs[ks[0]] = self.render(*items[ks[0]])
                continue
            merged = self.render(items[ks[0]][0], torch.cat([items[k][1] for k in ks]), torch.cat([items[k][2] for k in ks]))
            for k, part in zip(ks, torch.split(merged, [int(items[k][2].shape[0]) for k in ks])):
                outs[k] = part
        return outs  # type: ignore[return-value]

    def prebake(self, packet: Packet, progress: bool = True) -> Packet:
        """Add this engine's precomputed tensors to the packet (no-op when present)."""
        return packet

    def usable_packet(self, packet: Packet, mismatch: Callable[[Packet], str | None], reprebake: bool = True) -> Packet:
        """The packet with this engine's arrays usable by these weights/options.

        `mismatch(packet)` says why the stored arrays cannot be used (None = they can). The
        caller's view may be stale, so the packet on disk is looked at first; arrays made for
        other weights are recomputed when `reprebake`, else refused with a clear error."""
        why = mismatch(packet)
        if why is None:
            return packet
        fresh = open_packet(packet.path)
        if mismatch(fresh) is None:
            return fresh
        had = packet.engine_meta(self.name) is not None
        if had and not reprebake:
            raise PacketError(f"avatar {packet.id!r} ({packet.path}): {why}. Prebake it again for this engine "
                              f"(`newsstudio prebake SOURCE --engines {self.name}`) or allow re-prebaking.")
        if had:
            print(f"{self.name}: re-prebaking avatar {packet.id!r}: {why}", file=sys.stderr)
        return self.prebake(packet, progress=True, force=True)  # type: ignore[call-arg]

    def idle_driving(self, n: int) -> torch.Tensor | None:
        """Driving signal for `n` silent frames, or None to show the avatar frames unchanged."""
        return None

    def warm_up(self) -> float:
        """Compile / capture the render path for every batch size it will see, now, so the first
        stream does not wait for it (a server calls this at start). Returns the seconds spent."""
        return 0.0

    def release_graphs(self) -> None:
        """Drop the compiled code and captured graphs of this engine's batch runners (their GPU
        memory); a later call prepares again. Benchmarks call it between engine configurations."""
        from ..accel.static import BucketedRunner

        for runner in vars(self).values():
            if isinstance(runner, BucketedRunner):
                runner.release()

    def use_stream_batchers(self, own_streams: bool = False) -> dict[str, Any]:
        """Shared `engines.batching.Batcher`s for the per-stream stages that many live streams can
        run together (audio encoders, motion sampling), by stage name; streams created afterwards
        use them. A server calls this once per engine (and reports and closes what it gets).
        ``own_streams``: each runs on a CUDA stream of its own (batching.py's module doc)."""
        return {}


def pingpong_index(i: np.ndarray | torch.Tensor | int, n_frames: int):
    """Source frame of output frame i for a loop played forwards then backwards (length 2N).

    Both ends appear twice in a row, as in MuseTalk's avatar cycle, so any audio length works
    and the loop never jumps.
    """
    if n_frames <= 1:
        return i * 0
    p = i % (2 * n_frames)
    if isinstance(p, int):
        return p if p < n_frames else 2 * n_frames - 1 - p
    return torch.where(p < n_frames, p, 2 * n_frames - 1 - p) if isinstance(p, torch.Tensor) else np.where(p < n_frames, p, 2 * n_frames - 1 - p)


def same_layer_runs(items: list[tuple[AvatarLayer, torch.Tensor, torch.Tensor]]) -> list[list[int]]:
    """Positions of ``items`` (render requests) grouped into runs of consecutive items on the same
    avatar layer: a shared batch is mostly many sessions of one presenter, and an engine can
    gather, stitch and resize such a run in one go instead of once per session."""
    runs: list[list[int]] = []
    for k, (layer, _, _) in enumerate(items):
        if runs and items[runs[-1][0]][0] is layer:
            runs[-1].append(k)
        else:
            runs.append([k])
    return runs
