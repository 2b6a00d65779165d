"""MuseTalk's per-stream conditioner: PCM -> Whisper rows -> one audio prompt per output frame.

The engine builds one per stream (``MuseTalkEngine.conditioner``); the Whisper encoder stays on the engine."""
from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from ...audio.source import as_fraction, frames_for_samples
from ..base import QueuedStage, TensorFrameQueue
from .audio_features import SAMPLE_RATE, StatesFn, StreamingAudioFeatures

PROMPT_ROWS = 10  # 20 ms encoder rows per frame window (+-2 frames at 25 fps)

LIVE_UPDATE_ROWS = 5  # 20 ms Whisper rows per live feature update (the default step: 100 ms)
ROW_MS = 20  # one Whisper encoder row


def feature_step_rows(step_ms: int) -> int:
    """A live feature step in milliseconds as Whisper rows: a multiple of 20 ms from 20 to 1000."""
    if step_ms % ROW_MS or not ROW_MS <= step_ms <= 1000:
        raise ValueError(f"musetalk-feature-step-ms must be a multiple of {ROW_MS} from {ROW_MS} to 1000, got {step_ms}")
    return step_ms // ROW_MS


class MuseTalkConditioner(QueuedStage):
    """PCM chunks (16 kHz mono float32) in, per-frame prompts ``(50, 384)`` out.

    The streaming extractor is run on the 20 ms row grid (one "frame" per encoder row, windows of
    10 rows starting ``2*ceil(50/fps)`` rows early), and output frame ``i`` takes row window
    ``floor(i * 50 / fps)``: for integer fps exactly the official window (same float arithmetic),
    for 29.97 etc. the exact frame time instead of the official ``int(fps)`` (which would drift by
    3 %). The frame count is the runner's ``ceil(duration * fps)``: frames past the reference's
    ``floor`` get the window continued with zero rows, as the reference pads.
    """

    def __init__(self, encoder: torch.nn.Module, fps: float | Fraction, sample_rate: int = SAMPLE_RATE,
                 states_fn: StatesFn | None = None, update_rows: int | None = None):
        if sample_rate != SAMPLE_RATE:
            raise ValueError(f"MuseTalk's Whisper features need {SAMPLE_RATE} Hz audio, got {sample_rate}")
        self.fps = as_fraction(fps)
        if self.fps.denominator == 1:
            self._m: float | Fraction = 50 / int(self.fps)  # Python float, as the reference
        else:
            self._m = Fraction(50) / self.fps
        pad_left = 2 * math.ceil(self._m)
        # Each update re-encodes the partial 30 s piece (~6 ms on an H200): batch live updates to
        # ``update_rows`` rows (LIVE_UPDATE_ROWS: 100 ms) so a live stream costs ~10 encoder runs/s, not 50.
        self.update_rows = LIVE_UPDATE_ROWS if update_rows is None else int(update_rows)
        self.extractor = StreamingAudioFeatures(encoder, 50, left=pad_left, right=PROMPT_ROWS // 2 - 1 - pad_left,
                                                min_frames_per_update=self.update_rows, states_fn=states_fn)
        if self.extractor.windowing.length != PROMPT_ROWS or self.extractor.windowing.pad_left != pad_left:
            raise RuntimeError("unexpected window geometry from StreamingAudioFeatures")
        p = next(encoder.parameters())
        self._hidden = int(encoder.config.d_model)
        self._device, self._dtype = p.device, p.dtype
        self._buf: torch.Tensor | None = None  # row windows j = _lo ... _lo + len - 1
        self._lo = 0
        self._rows_emitted = 0  # row windows the extractor has produced so far
        self._next = 0  # next output frame
        self._samples = 0
        self.out = TensorFrameQueue()
        self.closed = False

    def row_of(self, i: int) -> int:
        return math.floor(i * self._m)

    def _append(self, windows: torch.Tensor) -> None:
        if windows.shape[0] == 0:
            return
        self._buf = windows if self._buf is None or self._buf.shape[0] == 0 else torch.cat([self._buf, windows])
        self._rows_emitted += int(windows.shape[0])

    def _window(self, j: int) -> torch.Tensor:
        """Row window j; past the last row the previous window shifted with zero rows (exact)."""
        last = self._rows_emitted - 1
        if j <= last:
            return self._buf[j - self._lo]
        per_row = self._buf.shape[1] // PROMPT_ROWS if self._buf is not None and self._buf.shape[0] else 5
        out = torch.zeros((PROMPT_ROWS * per_row, self._hidden), device=self._device, dtype=self._dtype)
        shift = j - last
        if last >= 0 and shift < PROMPT_ROWS:
            out[: (PROMPT_ROWS - shift) * per_row] = self._buf[last - self._lo][shift * per_row:]
        return out

    def _drain(self, final: bool) -> None:
        total = frames_for_samples(self._samples, SAMPLE_RATE, self.fps) if final else None
        picked: list[torch.Tensor] = []
        while True:
            i = self._next
            if total is not None and i >= total:
                break
            j = self.row_of(i)
            if j >= self._rows_emitted and not final:
                break
            picked.append(self._window(j))
            self._next += 1
        if picked:
            self.out.push(torch.stack(picked))
        keep_from = self.row_of(self._next)
        if self._buf is not None and not final and keep_from > self._lo:
            k = min(keep_from - self._lo, self._buf.shape[0] - 1)  # keep the last window for zero continuation
            if k > 0:
                self._buf = self._buf[k:]
                self._lo += k

    def push(self, value: Any) -> None:
        if self.closed:
            raise RuntimeError("push() after close()")
        pcm = np.asarray(value.detach().cpu() if isinstance(value, torch.Tensor) else value, np.float32).reshape(-1)
        self._samples += int(pcm.shape[0])
        self._append(self.extractor.push(pcm))
        self._drain(final=False)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._append(self.extractor.finish())
        self._drain(final=True)
        self.out.close()

