"""An utterance: one piece of speech placed on the session timeline, and its PCM buffer."""
from __future__ import annotations

import threading
import uuid
from typing import TYPE_CHECKING

import numpy as np
import soxr
import torch

from ..accel.host_copy import to_host
from ..audio.source import frames_for_samples
from ..audio.speech import MIN_SPEECH_S, speech_seconds
from .errors import SessionError

if TYPE_CHECKING:
    from .session import LiveSession


def has_speech(samples: np.ndarray, sample_rate: int, min_seconds: float = MIN_SPEECH_S) -> bool:
    return speech_seconds(samples, sample_rate) >= min_seconds


# --------------------------------------------------------------------------------------


class _Pcm:
    """A growing mono float32 buffer with absolute indices; old samples can be released."""

    def __init__(self) -> None:
        self._parts: list[np.ndarray] = []
        self.base = 0  # absolute index of the first kept sample
        self.count = 0  # absolute index one past the last sample

    def append(self, x: np.ndarray) -> None:
        if x.size:
            self._parts.append(np.asarray(x, np.float32).reshape(-1))
            self.count += x.size

    def _flat(self) -> np.ndarray:
        if len(self._parts) > 1:
            self._parts = [np.concatenate(self._parts)]
        return self._parts[0] if self._parts else np.zeros(0, np.float32)

    def read(self, a: int, b: int) -> np.ndarray:
        """Samples [a, b) (zeros outside what was appended or released)."""
        out = np.zeros(max(0, b - a), np.float32)
        lo, hi = max(a, self.base), min(b, self.count)
        if hi > lo:
            flat = self._flat()
            out[lo - a : hi - a] = flat[lo - self.base : hi - self.base]
        return out

    def release_before(self, s: int) -> None:
        cut = min(s, self.count) - self.base
        if cut <= 0:
            return
        flat = self._flat()
        self._parts = [flat[cut:].copy()] if flat.size > cut else []
        self.base += cut


class Utterance:
    """One piece of speech on the session timeline, with its own conditioner and driver.

    Input PCM (any rate, mono) is resampled twice as it arrives: to the engine's rate for the
    conditioner, and to the session's output rate for playback. It goes on air at media frame
    `start_frame` (F0); its local frame j and local output sample i then play at media frame
    F0 + j and sample frame_sample(F0) + i, shifted by the gaps before them.

    A gap is an underrun: the play position reached a frame whose driving the engine cannot
    give yet (the speaker is late). The gap is inserted at the play position, frame-aligned,
    for audio (silence) and video (the idle frame) alike, so the two stay aligned; nothing is
    pushed into the conditioner, so an engine with a long look-ahead is waited for, never fed
    made-up silence."""

    def __init__(self, session: "LiveSession", sample_rate: int, streamed: bool):
        eng = session.engine
        self.id = uuid.uuid4().hex[:12]
        self.clock = session.clock
        self.fps = session.fps
        self.src_rate = int(sample_rate)
        self.streamed = streamed
        self.conditioner = eng.conditioner(float(session.fps))
        self.driver = eng.driver(session.layer, float(session.fps))
        self._rows_on_host = eng.rows_on_host  # (to_host leaves CPU rows as they are)
        self._to_model = None if self.src_rate == eng.sample_rate else soxr.ResampleStream(self.src_rate, eng.sample_rate, 1, dtype="float32", quality="HQ")
        self._to_out = None if self.src_rate == session.out_rate else soxr.ResampleStream(self.src_rate, session.out_rate, 1, dtype="float32", quality="HQ")
        self.out = _Pcm()
        self.n_src = 0
        self.closed = False
        self.start_frame: int | None = None
        self.total_frames: int | None = None  # local frames, known once the input ended
        self.starving = False
        self.gaps: list[list[int]] = []  # [media frame, frames] of gaps not yet folded
        self._fold_frames = 0  # gap frames / samples of gaps folded away (all before the cursors)
        self._fold_samples = 0
        self.gap_frames = 0
        self._driving: list[torch.Tensor] = []
        self._driving_base = 0  # index of the first kept driving frame
        self._driving_count = 0
        self.input_ended = False  # no more input is taken (set under the session lock)
        # The engine's share of the input (resampler to the model rate, conditioner, driver) runs
        # under its own lock, outside the session lock: a Whisper/HuBERT/LMDM call on one thread
        # never holds up that session's rendering, playback or another session's network I/O.
        self._model_lock = threading.Lock()
        self._rows_lock = threading.Lock()  # the driving rows (appended by the feeder, read by renders)

    # -- input
    def feed(self, mono: np.ndarray) -> None:
        """Input PCM for both tracks, on the calling thread."""
        self.feed_model(self.feed_output(mono))

    def feed_output(self, mono: np.ndarray) -> np.ndarray:
        """The playback track's share of input PCM (cheap: called under the session lock).
        Returns the mono float32 samples for `feed_model`."""
        if self.input_ended:
            raise SessionError("this utterance's input already ended")
        mono = np.ascontiguousarray(np.asarray(mono, np.float32).reshape(-1))
        if mono.size:
            self.out.append(mono if self._to_out is None else self._to_out.resample_chunk(mono, last=False))
        return mono

    def feed_model(self, mono: np.ndarray) -> None:
        """The engine's share: model-rate resampling, conditioner and driver (the heavy part, run
        outside the session lock; pushes of one utterance must come from one producer in order)."""
        if not mono.size:
            return
        with self._model_lock:
            self.n_src += mono.size
            model = mono if self._to_model is None else self._to_model.resample_chunk(mono, last=False)
            if model.size:
                self.conditioner.push(np.asarray(model, np.float32))
            self._pump_locked()

    def end_input(self) -> None:
        """No more input (under the session lock): flush the playback resampler."""
        if self.input_ended:
            return
        self.input_ended = True
        if self._to_out is not None:
            self.out.append(self._to_out.resample_chunk(np.zeros(0, np.float32), last=True))

    def finish_model(self) -> None:
        """Flush the model resampler and the look-ahead of conditioner and driver (heavy: outside
        the session lock). Sets `total_frames`, then `closed`."""
        with self._model_lock:
            if self.closed:
                return
            if self._to_model is not None:
                tail = self._to_model.resample_chunk(np.zeros(0, np.float32), last=True)
                if tail.size:
                    self.conditioner.push(np.asarray(tail, np.float32))
            self.conditioner.close()
            self._pump_locked()
            self.driver.close()
            self._pump_locked()
            self.total_frames = max(1, frames_for_samples(self.n_src, self.src_rate, self.fps))
            self.closed = True

    def finish(self) -> None:
        """No more input: both tracks, on the calling thread."""
        self.end_input()
        self.finish_model()

    def _pump_locked(self) -> None:
        n = self.conditioner.ready
        if n:
            self.driver.push(self.conditioner.take(n))
        m = self.driver.ready
        if m:
            rows = self.driver.take(m)
            if self._rows_on_host:  # the renderer plans on the CPU (Engine.rows_on_host): here, not on the render thread
                rows = to_host(rows)
            with self._rows_lock:
                self._driving.append(rows)
                self._driving_count += m

    def _pump(self) -> None:
        """Move ready rows along unless the feeder is busy (its rows arrive when it is done)."""
        if self._model_lock.acquire(blocking=False):
            try:
                self._pump_locked()
            finally:
                self._model_lock.release()

    def ready_frames(self) -> int:
        """Local frames whose driving signal exists."""
        self._pump()
        return self._driving_count

    # -- timeline (media <-> local, through the gaps)
    def _gap_samples(self, g: list[int]) -> int:
        return self.clock.frame_sample(g[0] + g[1]) - self.clock.frame_sample(g[0])

    def local_frame(self, k: int) -> int | None:
        """Local frame shown at media frame k (None inside a gap or before the start)."""
        assert self.start_frame is not None
        j = k - self.start_frame - self._fold_frames
        for g0, gn in self.gaps:
            if k >= g0 + gn:
                j -= gn
            elif k >= g0:
                return None
        return j if j >= 0 else None

    def local_sample(self, s: int, kf: int) -> int | None:
        """Local output sample played at media sample s (of media frame kf); None in a gap."""
        assert self.start_frame is not None
        i = s - self.clock.frame_sample(self.start_frame) - self._fold_samples
        for g in self.gaps:
            if kf >= g[0] + g[1]:
                i -= self._gap_samples(g)
            elif kf >= g[0]:
                return None
        return i if i >= 0 else None

    def add_gap(self, k: int) -> None:
        """Frame k (the play position) shows no speech: an underrun gap."""
        if self.gaps and self.gaps[-1][0] + self.gaps[-1][1] == k:
            self.gaps[-1][1] += 1
        else:
            self.gaps.append([k, 1])
        self.gap_frames += 1

    def fold_gaps_before(self, k: int) -> None:
        """Forget gaps that both cursors have passed (keeping their totals)."""
        while self.gaps and self.gaps[0][0] + self.gaps[0][1] <= k:
            g = self.gaps.pop(0)
            self._fold_frames += g[1]
            self._fold_samples += self._gap_samples(g)

    def end_frame(self) -> int | None:
        """Media frame after the last one (once the input ended)."""
        if self.total_frames is None or self.start_frame is None:
            return None
        return self.start_frame + self.total_frames + self.gap_frames

    def end_sample(self) -> int | None:
        if self.total_frames is None or self.start_frame is None:
            return None
        return self.clock.frame_sample(self.start_frame) + self._fold_samples + sum(self._gap_samples(g) for g in self.gaps) + self.out.count

    def ended_by(self, j: int) -> bool:
        return self.total_frames is not None and j >= self.total_frames

    # -- output
    def driving(self, j: int, n: int, session: "LiveSession") -> torch.Tensor:
        """Driving frames [j, j+m), 1 <= m <= n, of what is ready (the caller checked j is)."""
        self._pump()
        with self._rows_lock:
            if self.total_frames is not None:
                n = min(n, self.total_frames - j)
            avail = self._driving_count - j
            if avail <= 0:  # input ended and the engine produced fewer frames than the audio spans
                return self._hold(n, session)
            n = min(n, avail)
            cat = self._joined()
            return cat[j - self._driving_base : j - self._driving_base + n]

    def _joined(self) -> torch.Tensor:
        """The kept driving rows as one tensor (under `_rows_lock`)."""
        cat = torch.cat(self._driving) if len(self._driving) > 1 else self._driving[0]
        self._driving = [cat]
        return cat

    def _hold(self, n: int, session: "LiveSession") -> torch.Tensor:
        if self._driving_count and self._driving:
            cat = self._joined()
            return cat[-1:].expand(n, *cat.shape[1:]).clone()
        idle = session.engine.idle_driving(n)
        if idle is None:
            raise SessionError("engine produced no driving frames for the audio")
        return idle

    def release_driving_before(self, j: int) -> None:
        with self._rows_lock:
            cut = min(j, self._driving_count) - self._driving_base
            if cut <= 0 or not self._driving:
                return
            rest = self._joined()[cut:]
            self._driving = [rest.clone()] if rest.shape[0] else []
            self._driving_base += cut
