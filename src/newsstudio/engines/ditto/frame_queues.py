"""Ditto's per-stream queues: PCM -> HuBERT rows (conditioner), HuBERT rows -> driving rows (driver).

The engine builds one of each per stream (``DittoEngine.conditioner`` / ``.driver``); they hold only that
stream's state, the networks stay on the engine."""
from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ...accel.host_copy import tensor_on
from ..base import AvatarLayer, QueuedStage, TensorFrameQueue, pingpong_index
from .ddim import DDIMSampler
from .lmdm import MotionWindowStream
from .motion_stitch import blink_schedule
from .wav2feat import SAMPLES_PER_FRAME, StreamingWav2Feat

if TYPE_CHECKING:
    from .engine import DittoEngine


class DittoConditioner(QueuedStage):
    """16 kHz mono PCM in, HuBERT rows (n, 1024) float32 on the device out (online windowing)."""

    def __init__(self, encoder, device: torch.device, chunksize: tuple[int, int, int] = (3, 5, 2), batch_size: int = 8):
        self.w2f = StreamingWav2Feat(encoder, chunksize, batch_size)
        self.device = device
        self.out = TensorFrameQueue(1024, device)
        self._samples = 0
        self._emitted = 0
        self.closed = False

    def _emit(self, feats: torch.Tensor, limit: int | None = None) -> None:
        if feats.numel() == 0:
            return
        if limit is not None:
            feats = feats[: max(0, limit - self._emitted)]
        if feats.shape[0]:
            self.out.push(feats.to(self.device, torch.float32))
            self._emitted += int(feats.shape[0])

    def push(self, value: Any) -> None:
        if self.closed:
            raise RuntimeError("push() after close()")
        pcm = value.detach().to("cpu", torch.float32).reshape(-1) if isinstance(value, torch.Tensor) else torch.from_numpy(
            np.ascontiguousarray(np.asarray(value, np.float32).reshape(-1)))
        self._samples += int(pcm.shape[0])
        self._emit(self.w2f.push(pcm))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._emit(self.w2f.finish(), limit=math.ceil(self._samples / SAMPLES_PER_FRAME))
        self.out.close()



# ---------------------------------------------------------------------------------------- driver


MOTION_DIM = 265
DRIVING_DIM = 2 * MOTION_DIM + 1  # [motion row | d0 row | blink index]
REST_FLAG = -1.0  # blink index of idle rows: the frame's own source keypoints (x_d = x_s)


class DittoDriver(QueuedStage):
    """HuBERT rows in, per-frame driving rows ``(n, 531)`` out: [LMDM motion 265 | the stream's
    relative-driving reference d0 265 | blink index 1] (see the module doc).

    The motion stitching itself (source keypoints of the frame actually shown, relative driving,
    lip/eye rows, stitching MLP) happens in ``DittoEngine.render`` / ``keypoints``, because only the
    renderer knows which source frame each output frame lands on (a live session starts an
    utterance anywhere on the avatar's loop). Conditions use frames 0, 1, ... of the loop for the
    eye state, as the reference's condition handler does."""

    def __init__(self, engine: "DittoEngine", layer: AvatarLayer):
        cfg = engine.config
        self.cfg = cfg
        self.engine = engine
        self.layer = layer
        self.device = engine.device
        d = layer.data
        self.n_src = layer.n_frames
        gen = torch.Generator(device=self.device).manual_seed(int(cfg.seed))
        self.sampler = DDIMSampler(engine.models.lmdm, steps=int(cfg.steps), eta=1.0, generator=gen,
                                   batcher=engine.motion_batcher, accel=engine.front_end_accel, tf32=engine.front_end_tf32)
        self.stream = MotionWindowStream(self.sampler, d["kp_cond"], overlap=cfg.overlap_v2, smooth_k=cfg.smo_k_d,
                                         fix_kp_cond=cfg.fix_kp_cond, fix_kp_cond_dim=cfg.fix_kp_cond_dim)
        self.warmup = cfg.overlap_v2 if cfg.online_mode else 0
        self._cond_idx = -self.warmup
        self._started = False
        self._rows_in = 0  # motion rows received from the window stream (warm-up included)
        self._frames = 0  # driving frames emitted
        self._d0: torch.Tensor | None = None
        self._blink: list[int] | None = None
        if cfg.delta_eye_arr is not None:
            n_eye = int(np.asarray(cfg.delta_eye_arr).reshape(-1, 63).shape[0])
            self._blink = blink_schedule(3000, n_eye, cfg.delta_eye_open_n, random.Random(int(cfg.seed)))
        self.out = TensorFrameQueue(DRIVING_DIM, self.device)
        self.closed = False
        self.first_output_at_rows: int | None = None  # audio rows pushed when the first frame came out

    # -- conditions -----------------------------------------------------------------------------
    def conditions(self, feats: torch.Tensor) -> torch.Tensor:
        """Condition rows (n, 1103) for audio rows (n, 1024) at frames ``_cond_idx`` ... (negative =
        warm-up; clamped to 0 for the per-frame source lookups, as the reference)."""
        cfg, d, dev = self.cfg, self.layer.data, self.device
        n = feats.shape[0]
        idx = torch.arange(self._cond_idx, self._cond_idx + n, device=dev).clamp_min(0)
        parts = [feats.to(dev, torch.float32)]
        if cfg.use_emo:
            emo = d["emo"]
            parts.append(emo.expand(n, -1) if emo.shape[0] == 1 else emo[idx % emo.shape[0]])
        src = pingpong_index(idx, self.n_src)
        for key, use in (("eye_open", cfg.use_eye_open), ("eye_ball", cfg.use_eye_ball)):
            if use:
                arr = d[key]
                parts.append(arr[:1].expand(n, -1) if (arr.shape[0] == 1 or cfg.eye_f0_mode) else arr[src])
        if cfg.use_sc:
            parts.append(d["sc"].expand(n, -1))
        self._cond_idx += n
        return torch.cat(parts, dim=-1)

    # -- FrameQueue -----------------------------------------------------------------------------
    def push(self, value: torch.Tensor) -> None:
        if self.closed:
            raise RuntimeError("push() after close()")
        feats = value.to(self.device, torch.float32)
        if not self._started:
            self._started = True
            if self.warmup:
                feats = torch.cat([self.engine.silence_features(self.warmup), feats])
        if feats.shape[0] == 0:
            return
        self._consume(self.stream.push(self.conditions(feats)))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._started:
            self._consume(self.stream.finish())
        self.out.close()

    def _consume(self, rows: torch.Tensor) -> None:
        if rows.shape[0] == 0:
            return
        if self._d0 is None:
            self._d0 = rows[:1].to(torch.float32)  # the first generated row, as the online reference
        skip = max(0, self.warmup - self._rows_in)
        self._rows_in += int(rows.shape[0])
        rows = rows[skip:].to(torch.float32)
        n = int(rows.shape[0])
        if n == 0:
            return
        if self._blink is not None:
            b = [self._blink[(self._frames + i) % len(self._blink)] for i in range(n)]
            blink = tensor_on(b, self.device, torch.float32)[:, None]
        else:
            blink = torch.zeros((n, 1), device=self.device)
        self.out.push(torch.cat([rows, self._d0.expand(n, -1), blink], dim=1))
        if self.first_output_at_rows is None:
            self.first_output_at_rows = self._cond_idx
        self._frames += n
