"""Audio -> per-frame mouth shape, from the signal alone (no weights).

Per video frame a 40 ms Hann window centred on the frame gives:
- speech-band level (300-3400 Hz) in dB, normalised by a slow automatic gain (a decaying
  peak tracker) and gated near the noise floor -> jaw opening in [0, 1]; silence gives 0;
- spectral centroid of the band -> lip spread (+1 wide, "ee") vs rounding (-1, "oo");
- the low-band share (voicing) widens the opening of vowels a little.
The opening is smoothed with a fast attack and a slower release (one-pole filters), which is
how jaws move: they open quickly at a syllable onset and settle more slowly.

Incremental: PCM chunks in, frames out as soon as the window of a frame (its centre + 20 ms
look-ahead) has fully arrived; `close()` zero-pads the tail.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ..base import QueuedStage, TensorFrameQueue

WINDOW_S = 0.040
BAND = (300.0, 3400.0)
LOW_BAND = (100.0, 900.0)
GATE_DBFS = -52.0  # below this nothing moves: room noise, breath
DYNAMIC_DB = 26.0  # from (peak - DYNAMIC_DB) to the peak the jaw goes from closed to open
PEAK_DECAY_DB_S = 2.0
ATTACK_S = 0.030
RELEASE_S = 0.080
SPREAD_S = 0.060  # lip spread/rounding changes a little more slowly than the jaw
N_PARAMS = 3  # opening, spread(+)/rounding(-), level (0..1)


class MouthConditioner(QueuedStage):
    """Stage 1 of the classic engine: PCM (mono float32 at `sample_rate`) -> (n, 3) params."""

    def __init__(self, fps: float, sample_rate: int = 16000):
        self.fps = float(fps)
        self.sr = sample_rate
        self.win = int(round(WINDOW_S * sample_rate)) // 2 * 2
        self.window = np.hanning(self.win + 2)[1:-1].astype(np.float32)
        freqs = np.fft.rfftfreq(self.win, 1.0 / sample_rate)
        self.band = (freqs >= BAND[0]) & (freqs <= BAND[1])
        self.low = (freqs >= LOW_BAND[0]) & (freqs <= LOW_BAND[1])
        self.freqs = freqs
        self.buf = np.zeros(self.win // 2, np.float32)  # left context of frame 0 is silence
        self.buf_start = -(self.win // 2)  # absolute sample index of buf[0]
        self.n_in = 0
        self.next_frame = 0
        self.closed = False
        self.peak_db = GATE_DBFS + DYNAMIC_DB
        self.open_state = 0.0
        self.spread_state = 0.0
        self.out = TensorFrameQueue()

    def _centre(self, i: int) -> int:
        return int(round((i + 0.5) * self.sr / self.fps))

    def push(self, pcm: np.ndarray) -> None:
        pcm = np.asarray(pcm, np.float32).reshape(-1)
        self.buf = np.concatenate([self.buf, pcm])
        self.n_in += pcm.size
        self._emit()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        total = math.ceil(self.n_in * self.fps / self.sr)
        self.buf = np.concatenate([self.buf, np.zeros(self.win, np.float32)])
        self._emit(limit=total)
        self.out.close()

    def _emit(self, limit: int | None = None) -> None:
        rows = []
        while limit is None or self.next_frame < limit:
            c = self._centre(self.next_frame)
            a = c - self.win // 2 - self.buf_start
            b = a + self.win
            if b > self.buf.size or (limit is None and c + self.win // 2 > self.n_in):
                break
            rows.append(self._frame(self.buf[a:b]))
            self.next_frame += 1
        if rows:
            self.out.push(torch.tensor(np.array(rows, np.float32)))
            keep_from = self._centre(self.next_frame) - self.win // 2 - self.buf_start
            if keep_from > 0:
                self.buf = self.buf[keep_from:]
                self.buf_start += keep_from

    def _frame(self, seg: np.ndarray) -> list[float]:
        spec = np.abs(np.fft.rfft(seg * self.window)) ** 2
        norm = float(np.sum(self.window**2)) * self.win / 2
        band_e = float(spec[self.band].sum()) / norm
        level_db = 10.0 * math.log10(band_e + 1e-12)
        dt = 1.0 / self.fps
        self.peak_db = max(level_db, self.peak_db - PEAK_DECAY_DB_S * dt, GATE_DBFS + DYNAMIC_DB * 0.5)
        if level_db < GATE_DBFS:
            target = 0.0
        else:
            target = min(1.0, max(0.0, (level_db - (self.peak_db - DYNAMIC_DB)) / DYNAMIC_DB))
        total = float(spec[self.band].sum()) + 1e-20
        voicing = float(spec[self.low].sum()) / (float(spec[self.band | self.low].sum()) + 1e-20)
        target = min(1.0, target * (0.85 + 0.3 * voicing))
        tau = ATTACK_S if target > self.open_state else RELEASE_S
        alpha = 1.0 - math.exp(-dt / tau)
        self.open_state += alpha * (target - self.open_state)
        centroid = float((spec[self.band] * self.freqs[self.band]).sum()) / total
        spread_target = max(-1.0, min(1.0, (centroid - 1500.0) / 1000.0)) if target > 0 else 0.0
        self.spread_state += (1.0 - math.exp(-dt / SPREAD_S)) * (spread_target - self.spread_state)
        spread = self.spread_state
        level = min(1.0, max(0.0, (level_db - GATE_DBFS) / 40.0))
        return [self.open_state if self.open_state > 1e-3 else 0.0, spread, level]

