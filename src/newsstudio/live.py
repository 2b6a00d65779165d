"""Live sessions: an avatar that idles, speaks as speech arrives, and can be cut off at once.

Independent of HTTP, so it is testable alone; the server (`newsstudio.server`) only moves its
frames and samples over WebSocket/WebRTC.

Why the design looks like this:

* **One media clock.** Video frame k is shown at k/fps and output-audio sample s at s/sr,
  both measured from the same origin (`MediaClock`). Every position is an integer counter
  (frames, samples) and times are derived from counters, never accumulated from sleeps, so
  nothing drifts however long a session runs. The clock reads an injectable time source, so
  a test can run an hour of media without waiting an hour.
* **Pull, not push.** Consumers (a WebRTC video track, an audio track, a WebSocket pump) ask
  for "frame k" or "samples [s, s+n)"; the session renders what that media position holds:
  the idle loop (avatar frames, mouth closed) or the current utterance. Frames nobody pulls
  are never rendered, and a consumer that falls behind simply asks for a later position.
* **Utterances are placed on the timeline at a frame boundary F0**: video frame F0 + j shows
  the utterance's driving frame j, and its audio starts at sample frame_sample(F0) of the
  output stream. Audio and video of an utterance are therefore aligned by construction.
  Streamed speech that arrives late (underrun) is padded with silence *inside* the utterance,
  for both audio and mouth, so they stay aligned.
* **Barge-in.** New speech or `interrupt()` ends the current utterance at the consumers'
  current positions (the next frame / 20 ms audio block not yet handed out), drops frames
  rendered ahead, and the new utterance gets a fresh conditioner + driver.
* A session holds only per-stream state (conditioner, driver, a few rendered frames, PCM not
  yet played); the engine and the avatar's device tensors are shared and stay warm. `close()`
  drops everything the session holds.
"""
from __future__ import annotations

import asyncio
import math
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

import numpy as np
import soxr
import torch

from .accel.host_copy import to_host
from .audio.source import as_fraction, frame_sample, frames_for_samples
from .audio.speech import MIN_SPEECH_S, speech_seconds
from .avatar.packet import Packet
from .compose.colour import nv12_to_rgb
from .engines.base import AvatarLayer, Engine
from .frame_rate import check_frame_rate
from .media.audio import Audio, audio_from_array, load_audio
from .render_budget import RenderBudget
from .stream import StreamSession, background_for

OUT_RATE = 48000
"""Output audio rate of a session (WebRTC/Opus native rate)."""

TimeSource = Callable[[], float]
State = Literal["idle", "buffering", "speaking", "closed"]


class SessionError(RuntimeError):
    """Base class of live-session errors."""


class SessionLimitError(SessionError):
    """The configured maximum number of live sessions is reached."""


class SessionClosedError(SessionError):
    """The session was closed."""


# --------------------------------------------------------------------------------------
# time


class ScaledTime:
    """A time source that runs `rate` times faster than the monotonic clock and can jump.

    `jump(seconds)` moves it forward at once (a test's "an hour passes"); `set(t)` pins it
    (fully simulated time: `advance(dt)` then moves it by hand)."""

    def __init__(self, rate: float = 1.0, start: float = 0.0):
        self.rate = float(rate)
        self._m0 = time.monotonic()
        self._offset = float(start)
        self._pinned: float | None = None
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            if self._pinned is not None:
                return self._pinned
            return self._offset + (time.monotonic() - self._m0) * self.rate

    def jump(self, seconds: float) -> None:
        with self._lock:
            if self._pinned is not None:
                self._pinned += seconds
            else:
                self._offset += seconds

    def set(self, t: float) -> None:
        with self._lock:
            self._pinned = float(t)

    def advance(self, dt: float) -> None:
        self.jump(dt)


class MediaClock:
    """The one clock audio and video share: media time 0 is the session's start.

    Positions are counters; `video_time(k) = k / fps` and `audio_time(s) = s / sr` are exact
    fractions, so a frame and the samples that play with it are due at the same instant."""

    def __init__(self, fps: Fraction, time_source: TimeSource | None = None, out_rate: int = OUT_RATE):
        self.fps = as_fraction(fps)
        self.out_rate = int(out_rate)
        self.time_source = time_source or time.monotonic
        self.origin = float(self.time_source())

    def now(self) -> float:
        """Media seconds since the session started."""
        return float(self.time_source()) - self.origin

    def video_time(self, k: int) -> float:
        return float(Fraction(k) / self.fps)

    def audio_time(self, s: int) -> float:
        return s / self.out_rate

    def frame_at(self, t: float) -> int:
        """Index of the frame on screen at media time t."""
        return int(math.floor(Fraction(t) * self.fps + Fraction(1, 10**9)))

    def next_frame(self, t: float) -> int:
        """First frame due at or after media time t."""
        return int(math.ceil(Fraction(t) * self.fps - Fraction(1, 10**9)))

    def frame_sample(self, k: int) -> int:
        """First output-audio sample of frame k (exact rational rounding, see audio.source)."""
        return frame_sample(k, self.out_rate, self.fps)

    def frame_of_sample(self, s: int) -> int:
        """First frame boundary at or after output sample s."""
        k = int(math.floor(Fraction(s) * self.fps / self.out_rate))
        while self.frame_sample(k) < s:
            k += 1
        return k

    def video_pts(self, k: int, clock_rate: int = 90000) -> int:
        """RTP-style pts of frame k at `clock_rate` (exact for 25, 30, 29.97, 24, 50 fps)."""
        return int(Fraction(k * clock_rate) / self.fps)

    async def sleep_until(self, t: float) -> None:
        """Sleep until media time t (re-reads the clock, so a jump or a scaled rate is honoured)."""
        rate = float(getattr(self.time_source, "rate", 1.0)) or 1.0
        while True:
            dt = t - self.now()
            if dt <= 0:
                return
            await asyncio.sleep(min(dt / rate, 0.25))


# --------------------------------------------------------------------------------------
# speech analysis


def has_speech(samples: np.ndarray, sample_rate: int, min_seconds: float = MIN_SPEECH_S) -> bool:
    return speech_seconds(samples, sample_rate) >= min_seconds


# --------------------------------------------------------------------------------------
# utterances


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


# --------------------------------------------------------------------------------------
# the session


@dataclass
class SessionStats:
    frames_out: int = 0
    frames_rendered: int = 0
    speech_frames: int = 0
    audio_samples_out: int = 0
    utterances: int = 0
    interrupts: int = 0
    barge_ins: int = 0
    dropped_frames: int = 0
    skipped_frames: int = 0
    last_cut_ms: float | None = None
    last_start_ms: float | None = None
    renders: int = 0  # render calls (speech or idle frames not served from the shared idle cache)
    render_call_s: float = 0.0  # inside them until the frames' GPU work was queued (the shared batch included)
    copy_out_s: float = 0.0  # then until the frames were in host memory (the GPU queue ahead of them)
    speech_renders: int = 0  # renders of speech frames
    short_renders: int = 0  # of them, cut short because the driving of the frames asked for was not ready yet
    ahead_frames: int = 0  # summed over speech renders: frames of driving ready from the render's first frame on


class LiveSession:
    """A live talking head: idle loop when silent, speech as it arrives, instant barge-in.

    Thread-safe: outputs are pulled from render threads while speech and interrupts come from
    request handlers. Heavy work happens in the caller's thread: rendering in the puller's, the
    engine's work on speech (features, motion) in the pusher's, outside the session lock."""

    def __init__(
        self,
        engine: Engine,
        packet: Packet,
        *,
        fps: float | Fraction = 25,
        out_rate: int = OUT_RATE,
        time_source: TimeSource | None = None,
        render_ahead: int = 4,
        prebuffer_s: float = 0.12,
        session_id: str | None = None,
        engine_name: str | None = None,
        on_close: Callable[["LiveSession"], None] | None = None,
        renderer: Callable[[AvatarLayer, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    ):
        self.id = session_id or uuid.uuid4().hex[:16]
        self.transport: str | None = None  # set by the server: "webrtc", "ws", ...
        self.engine = engine
        self.engine_name = engine_name or engine.name
        self.packet = packet
        self.avatar_id = packet.id
        self.fps = check_frame_rate(fps)  # the rule of every entry point (frame_rate.py)
        self.out_rate = int(out_rate)
        self.render_ahead = max(1, int(render_ahead))
        self.prebuffer_s = float(prebuffer_s)
        self.prebuffer_frames = max(1, math.ceil(self.prebuffer_s * float(self.fps)))
        self.clock = MediaClock(self.fps, time_source, self.out_rate)
        self.layer = engine.load_avatar(packet)
        self.stream = StreamSession(engine, self.layer, background_for(engine, packet), self.fps, renderer=renderer)
        self._idle = IdleFrames.for_session(engine, packet, self.stream)
        self.width, self.height = packet.size
        self.stats = SessionStats()
        self.created = time.time()
        self._lock = threading.RLock()
        self._on_close = on_close
        self._closed = False
        self._current: Utterance | None = None  # on air (start_frame set) or buffering
        self._ahead: dict[int, torch.Tensor] = {}  # frames rendered ahead, by index
        self._vk = 0  # next video frame a consumer will get
        self._as = 0  # next output-audio sample a consumer will get
        self._underrun_past = 0.0
        self._gen = 0  # bumped by every cut: renders planned before it are not kept ahead
        self.last_frame_at = time.monotonic()
        self.render_phase: float | None = None  # see `_phased`; set by a server spreading its sessions

    # ---------------------------------------------------------------- properties
    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def state(self) -> State:
        with self._lock:
            if self._closed:
                return "closed"
            self._retire()
            u = self._current
            if u is None:
                return "idle"
            if u.start_frame is None:
                return "buffering"
            return "speaking"

    @property
    def video_cursor(self) -> int:
        return self._vk

    @property
    def audio_cursor(self) -> int:
        return self._as

    @property
    def underrun_s(self) -> float:
        """Seconds of gap inserted because streamed speech arrived late."""
        u = self._current
        return self._underrun_past + (u.gap_frames / float(self.fps) if u is not None else 0.0)

    def info(self) -> dict[str, Any]:
        s = self.stats
        return {
            "id": self.id,
            "avatar": self.avatar_id,
            "engine": self.engine_name,
            "state": self.state,
            "transport": self.transport,
            "fps": float(self.fps),
            "width": self.width,
            "height": self.height,
            "sample_rate": self.out_rate,
            "media_time": round(self.clock.now(), 4),
            "video_frame": self._vk,
            "audio_sample": self._as,
            "av_offset_ms": round((self._as / self.out_rate - self._vk / float(self.fps)) * 1000, 2),
            "frames_out": s.frames_out,
            "frames_rendered": s.frames_rendered,
            "speech_frames": s.speech_frames,
            "utterances": s.utterances,
            "interrupts": s.interrupts,
            "barge_ins": s.barge_ins,
            "dropped_frames": s.dropped_frames,
            "underrun_ms": round(self.underrun_s * 1000, 1),
            "skipped_frames": s.skipped_frames,
            "last_cut_ms": s.last_cut_ms,
            "last_start_ms": s.last_start_ms,
            "renders": s.renders,
            "render_call_ms_mean": round(s.render_call_s / s.renders * 1000, 3) if s.renders else 0.0,
            "copy_out_ms_mean": round(s.copy_out_s / s.renders * 1000, 3) if s.renders else 0.0,
            "render_wait_ms_mean": round(self.stream.render_wait_s / s.renders * 1000, 3) if s.renders else 0.0,
            "speech_renders": s.speech_renders,
            "short_renders": s.short_renders,
            "driving_ahead_frames_mean": round(s.ahead_frames / s.speech_renders, 2) if s.speech_renders else 0.0,
            "render_ahead": self.render_ahead,
            "prebuffer_ms": round(self.prebuffer_frames / float(self.fps) * 1000, 2),
        }

    def _check_open(self) -> None:
        if self._closed:
            raise SessionClosedError(f"session {self.id} is closed")

    # ---------------------------------------------------------------- speech input
    def speak(self, audio: Audio | str | Any, sample_rate: int | None = None) -> dict[str, Any]:
        """Say a whole piece of audio now (barge-in over whatever is playing).

        audio: an `Audio`, a path/bytes decodable by `load_audio`, or an array with
        `sample_rate`. Returns where it starts on the timeline."""
        a = _as_audio(audio, sample_rate)
        utt = Utterance(self, a.sample_rate, streamed=False)
        utt.feed(a.samples.mean(axis=0) if a.channels > 1 else a.samples[0])
        utt.finish()  # the conditioner works through the whole input here, outside the lock
        with self._lock:
            self._check_open()
            return self._replace(utt)

    def begin_speech(self, sample_rate: int) -> str:
        """Start a streamed utterance (barge-in); feed it with `push_speech`, end with `end_speech`."""
        utt = Utterance(self, sample_rate, streamed=True)
        with self._lock:
            self._check_open()
            self._replace(utt)
            return utt.id

    def push_speech(self, pcm: np.ndarray, sample_rate: int | None = None) -> None:
        """Append streamed PCM (mono, or (channels, n)); starts an utterance if none is open.

        The engine's work on it (features, motion) runs on the calling thread but outside the
        session lock, so frames keep flowing meanwhile; a server calls this off its event loop.
        Pushes of one stream must come from one producer, in order."""
        arr = np.asarray(pcm)
        if arr.size == 0:
            return
        a = audio_from_array(arr, int(sample_rate or (self._current.src_rate if self._current else OUT_RATE)))
        mono = a.samples.mean(axis=0) if a.channels > 1 else a.samples[0]
        with self._lock:
            self._check_open()
            u = self._current
            if u is None or not u.streamed or u.input_ended or u.src_rate != a.sample_rate:
                u = Utterance(self, a.sample_rate, streamed=True)
                self._replace(u)
            mono = u.feed_output(mono)
        u.feed_model(mono)
        with self._lock:
            if not self._closed:
                self._maybe_start(u)

    def end_speech(self) -> None:
        """The streamed utterance's input ended: play out what arrived, then idle."""
        with self._lock:
            u = self._current
            if u is None or not u.streamed or u.input_ended:
                return
            u.end_input()
        u.finish_model()  # the engine's look-ahead, outside the session lock
        with self._lock:
            if not self._closed:
                self._maybe_start(u)

    def interrupt(self) -> dict[str, Any]:
        """Cut the current utterance now; the avatar goes back to the idle loop."""
        with self._lock:
            self._check_open()
            was = self._current is not None
            info = self._cut()
            if was:
                self.stats.interrupts += 1
            info["interrupted"] = was
            return info

    # ---------------------------------------------------------------- timeline
    def _cut(self) -> dict[str, Any]:
        """End the current utterance at the consumers' positions and drop frames rendered ahead."""
        now = self.clock.now()
        u = self._current
        dropped = 0
        if u is not None:
            dropped = sum(1 for k in self._ahead if self._is_speech_frame(u, k))
            self._underrun_past += u.gap_frames / float(self.fps)
        self._ahead = {}  # everything rendered ahead is >= the video cursor: re-rendered as needed
        self.stats.dropped_frames += dropped
        self._current = None
        self._gen += 1
        # media-time latency of the cut: when the first frame / audio block not yet handed
        # out (so no longer carrying the old speech) is due, relative to now
        cut_t = max(self.clock.video_time(self._vk), self.clock.audio_time(self._as))
        latency = max(0.0, cut_t - now) * 1000
        if u is not None:
            self.stats.last_cut_ms = round(latency, 2)
        return {"cut_frame": self._vk, "cut_sample": self._as, "media_time": round(now, 6), "cut_latency_ms": round(latency, 2), "dropped_frames": dropped}

    @staticmethod
    def _is_speech_frame(u: Utterance, k: int) -> bool:
        if u.start_frame is None or k < u.start_frame:
            return False
        j = u.local_frame(k)
        return j is not None and not u.ended_by(j)

    def _finished(self, u: Utterance) -> bool:
        """Both tracks are past the utterance's end (or the clock is well past it, for a
        consumer that pulls only one track)."""
        end_frame, end_sample = u.end_frame(), u.end_sample()
        if end_frame is None or end_sample is None:
            return False
        if self._vk >= end_frame and self._as >= end_sample:
            return True
        return self.clock.now() > max(self.clock.video_time(end_frame), self.clock.audio_time(end_sample)) + 0.5

    def _retire(self) -> None:
        u = self._current
        if u is not None and self._finished(u):
            self._underrun_past += u.gap_frames / float(self.fps)
            self._current = None

    def _replace(self, utt: Utterance) -> dict[str, Any]:
        if self._current is not None:
            self.stats.barge_ins += 1
        cut = self._cut()
        self._current = utt
        self.stats.utterances += 1
        self._maybe_start(utt)
        return {"utterance": utt.id, "start_frame": utt.start_frame, "cut": cut}

    def _maybe_start(self, u: Utterance) -> None:
        """Put a waiting utterance on air once the engine has `prebuffer` of driving ready
        (its own look-ahead included) or the input ended."""
        if u.start_frame is not None or u is not self._current:
            return
        if not (u.closed or u.ready_frames() >= self.prebuffer_frames):
            return
        now = self.clock.now()
        f0 = max(self._vk, self.clock.frame_of_sample(self._as), self.clock.next_frame(now))
        u.start_frame = f0
        self._ahead = {k: v for k, v in self._ahead.items() if k < f0}
        self._gen += 1
        self.stats.last_start_ms = round(max(0.0, self.clock.video_time(f0) - now) * 1000, 2)

    def _segment(self, k: int) -> tuple[Utterance | None, int]:
        """What frame k shows: (utterance, frames of it from k) or (None, idle frames from k)."""
        self._retire()
        u = self._current
        if u is not None and u.start_frame is None:
            self._maybe_start(u)
        if u is None or u.start_frame is None:
            return None, 1 << 30
        if k < u.start_frame:
            return None, u.start_frame - k
        j = u.local_frame(k)
        if j is None:
            return None, 1  # inside a gap
        if u.ended_by(j):
            return None, 1 << 30
        return u, (u.total_frames - j) if u.total_frames is not None else 1 << 30

    # ---------------------------------------------------------------- video output
    def has_frames(self, k: int, n: int) -> bool:
        """Whether frames [k, k+n) are rendered already (ahead of the play position), so asking for
        them costs no render: a consumer that is late sends these rather than skip past work done."""
        with self._lock:
            return all(j in self._ahead for j in range(k, k + n))

    def video_frame(self, k: int) -> torch.Tensor:
        """NV12 frame k, (H*3//2, W) uint8 on the CPU. Consumers ask in increasing order.

        Frames of the idle loop may be shared: treat the result as read-only."""
        return self.video_frames(k, 1, stack=False)[0]

    def video_frames(self, k: int, n: int, output: str = "nv12", stack: bool = True) -> torch.Tensor | list[torch.Tensor]:
        """Frames [k, k+n) as (n, H*3//2, W) NV12 (or (n, H, W, 3) RGB) uint8 on the CPU.

        Rendering runs outside the session lock, so speech input, interrupts and the audio
        track never wait for the renderer; a cut that lands during a render discards what
        that render produced ahead (only the frame being asked for can be one frame stale)."""
        out: list[torch.Tensor] = []
        i = k
        while i < k + n:
            with self._lock:
                self._check_open()
                f = self._ahead.pop(i, None)
                plan = None if f is not None else self._plan(i, max(self.render_ahead, k + n - i))
            if plan is not None:
                frames = self._execute(plan)
                with self._lock:
                    self._check_open()
                    f = frames[0]
                    if plan[0] == self._gen:
                        for j in range(1, len(frames)):
                            self._ahead[i + j] = frames[j]
            out.append(f)
            i += 1
        with self._lock:
            self._check_open()
            if k > self._vk and self.stats.frames_out:
                self.stats.skipped_frames += k - self._vk
            self._ahead = {j: v for j, v in self._ahead.items() if j >= k + n}
            self._vk = max(self._vk, k + n)
            u = self._current
            if u is not None and u.start_frame is not None and self._vk >= u.start_frame:
                j = u.local_frame(self._vk)
                if j is not None:
                    u.release_driving_before(j)
                u.fold_gaps_before(min(self._vk, self.clock.frame_of_sample(self._as) - 1))
            self.stats.frames_out += n
            self._retire()
        self.last_frame_at = time.monotonic()
        if not stack and output == "nv12":
            return out
        frames = torch.stack(out)
        if output == "rgb":
            frames = nv12_to_rgb(frames)
        return frames

    @property
    def request_period_s(self) -> float:
        """Seconds of video one full render request covers (render_ahead / fps): how often a session
        asks for frames, the period its render phase lives in."""
        return float(Fraction(self.render_ahead) / self.fps)

    def _phased(self, k: int, n: int) -> int:
        """How many of a full request's ``n`` frames to render from frame k so the next request falls
        on this session's render phase.

        Why: a session asks for its next ``render_ahead`` frames once per period P = render_ahead /
        fps, at a phase set by when it started (and re-set by utterance boundaries and skips).
        Sessions that start together ask together: on an H200, 12 MuseTalk sessions started at once
        were late in 3 of 8 levels, and on time in 3 of 3 with their starts spread over P (runs ZW-ZY,
        seventeenth session). With ``render_phase`` set (seconds in [0, P) of the shared monotonic
        clock; the server spreads them), a request that would end off the phase is cut short once,
        and the full requests after it keep the phase."""
        if self.render_phase is None or n != self.render_ahead:
            return n
        period = self.request_period_s
        off = (self.render_phase - (self.clock.origin + self.clock.video_time(k))) % period
        m = round(off * float(self.fps))
        return m if 0 < m < n else n

    def _plan(self, k: int, n: int) -> tuple:
        """Under the lock: what to render from frame k (idle or speech, how many, driving)."""
        u, span = self._segment(k)
        m = max(1, min(self._phased(k, n), span))
        if u is not None:
            assert u.start_frame is not None
            j = u.local_frame(k)
            assert j is not None
            ready = u.ready_frames()
            if not u.closed and (ready <= j or (u.starving and ready - j < self.prebuffer_frames)):
                # underrun: the speaker is late. A gap goes in here (idle frame, silence) and
                # grows until a prebuffer's worth is ready again, like a jitter buffer refilling.
                u.starving = True
                u.add_gap(k)
                u = None
                m = 1
            else:
                u.starving = False
        if u is None:
            return (self._gen, "idle", k, m, None, self.stream, self._idle)
        driving = u.driving(j, m, self)
        got = int(driving.shape[0])
        st = self.stats
        st.speech_renders += 1
        st.ahead_frames += ready - j
        if got < m and (u.total_frames is None or j + got < u.total_frames):  # not the utterance's end: late driving
            st.short_renders += 1
        m = got
        st.speech_frames += m
        return (self._gen, "speech", k, m, driving, self.stream, None)

    def _execute(self, plan: tuple) -> list[torch.Tensor]:
        _, kind, k, m, driving, stream, idle = plan
        if kind == "idle" and idle is not None:
            return [idle.frame(i, stream) for i in range(k, k + m)]
        t0 = time.perf_counter()
        # to pinned memory, waited on through an event: a pageable copy would stall every thread's launches
        frames, done = stream.idle_frames_host(k, m, "nv12") if kind == "idle" else stream.render_frames_host(k, driving, "nv12")
        t1 = time.perf_counter()
        if done is not None:
            done.synchronize()
        s = self.stats
        s.renders += 1
        s.render_call_s += t1 - t0
        s.copy_out_s += time.perf_counter() - t1
        s.frames_rendered += m
        return list(frames.unbind(0))

    # ---------------------------------------------------------------- audio output
    def audio_samples(self, s: int, n: int) -> np.ndarray:
        """Output samples [s, s+n) (mono float32 at `out_rate`): speech or silence."""
        with self._lock:
            self._check_open()
            out = np.zeros(n, np.float32)
            u = self._current
            if u is not None and u.start_frame is None:
                self._maybe_start(u)
            if u is not None and u.start_frame is not None:
                c = self.clock
                kf = c.frame_of_sample(s + 1) - 1  # the frame holding sample s
                pos, stop = s, s + n
                last_local = None
                while pos < stop:
                    seg_end = min(stop, c.frame_sample(kf + 1))
                    if kf >= u.start_frame:
                        i = u.local_sample(pos, kf)
                        if i is not None:
                            out[pos - s : seg_end - s] = u.out.read(i, i + seg_end - pos)
                            last_local = i + seg_end - pos
                    pos, kf = seg_end, kf + 1
                if last_local is not None:
                    u.out.release_before(last_local)
            self._as = max(self._as, s + n)
            self.stats.audio_samples_out += n
            self._retire()
            return out

    # ---------------------------------------------------------------- closing
    def close(self) -> None:
        """Free everything this session holds (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._current = None
            self._ahead = {}
            self._idle = None
            self.stream = None  # type: ignore[assignment]
            self.layer = None  # type: ignore[assignment]
            cb, self._on_close = self._on_close, None
        if cb is not None:
            cb(self)


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
        from .engines.base import pingpong_index

        src = int(pingpong_index(k, self.n_frames))
        f = self.frames.get(src)
        if f is None:
            f = stream.idle_frames(src, 1, "nv12")[0]
            f = to_host(f)
            with self.lock:
                self.frames.setdefault(src, f)
        return f


def _as_audio(audio: Any, sample_rate: int | None) -> Audio:
    if isinstance(audio, Audio):
        return audio
    if isinstance(audio, tuple) and len(audio) == 2:
        return audio_from_array(audio[0], int(audio[1]))
    if isinstance(audio, (np.ndarray, torch.Tensor)):
        if sample_rate is None:
            raise ValueError("an audio array needs sample_rate=")
        return audio_from_array(audio, int(sample_rate))
    return load_audio(audio)


# --------------------------------------------------------------------------------------
# many sessions


class SessionManager:
    """Live sessions under a cap. A slot is reserved before the (possibly slow) session build,
    so concurrent requests can never exceed `max_sessions`, nor the render `budget` when one is
    set (each session's cost: its share of the server's render capacity, `RenderBudget.cost`)."""

    def __init__(self, max_sessions: int = 8, budget: RenderBudget | None = None):
        self.max_sessions = int(max_sessions)
        self.budget = budget
        self._sessions: dict[str, LiveSession] = {}
        self._costs: dict[str, float] = {}
        self._reserved = 0
        self._reserved_cost = 0.0
        self._lock = threading.Lock()
        self.opened_total = 0
        self.closed_total = 0

    def render_load(self) -> float | None:
        """Share of the render budget the live sessions (and those being opened) take; None
        without a budget."""
        if self.budget is None:
            return None
        with self._lock:
            return self._load()

    def _load(self) -> float:
        """Under the lock: the budget shares of the live sessions and of those being opened."""
        return sum(self._costs.values()) + self._reserved_cost

    def open(self, factory: Callable[..., LiveSession], engine: str = "", fps: float = 0.0, **kw: Any) -> LiveSession:
        """Build a session with `factory` once a slot (and, with a budget, its render share for an
        `engine` session at `fps`) is reserved; SessionLimitError when none is free."""
        with self._lock:
            if len(self._sessions) + self._reserved >= self.max_sessions:
                raise SessionLimitError(f"too many live sessions: the limit is {self.max_sessions}; close one and retry")
            cost = 0.0
            if self.budget is not None:
                try:
                    cost = self.budget.check(engine, fps, self._load())
                except ValueError as e:
                    raise SessionLimitError(str(e)) from None
            self._reserved += 1
            self._reserved_cost += cost
        try:
            session = factory(on_close=self._forget, **kw)
        except BaseException:
            with self._lock:
                self._reserved -= 1
                self._reserved_cost -= cost
            raise
        with self._lock:
            self._reserved -= 1
            self._reserved_cost -= cost
            self._sessions[session.id] = session
            self._costs[session.id] = cost
            self.opened_total += 1
        return session

    def _forget(self, session: LiveSession) -> None:
        with self._lock:
            self._costs.pop(session.id, None)
            if self._sessions.pop(session.id, None) is not None:
                self.closed_total += 1

    def get(self, session_id: str) -> LiveSession:
        with self._lock:
            s = self._sessions.get(session_id)
        if s is None:
            raise KeyError(session_id)
        return s

    def close(self, session_id: str) -> bool:
        try:
            s = self.get(session_id)
        except KeyError:
            return False
        s.close()
        return True

    def close_all(self) -> None:
        for s in self.list():
            s.close()

    def list(self) -> list[LiveSession]:
        with self._lock:
            return list(self._sessions.values())

    def count(self) -> int:
        with self._lock:
            return len(self._sessions)

    def using_avatar(self, avatar_id: str) -> int:
        return sum(1 for s in self.list() if s.avatar_id == avatar_id)


def evict_avatar(engine: Engine, packet_path: str) -> None:
    """Drop an avatar's cached device tensors from an engine (after the avatar is deleted)."""
    from pathlib import Path

    key = str(Path(packet_path).resolve())
    cache = engine.__dict__.get("_background_cache")
    if isinstance(cache, dict):
        cache.pop(key, None)
    layers = engine.__dict__.get("_layers")
    if isinstance(layers, dict):
        layers.pop(key, None)
    idle = engine.__dict__.get("_idle_frames_cache")
    if isinstance(idle, dict):
        idle.pop(key, None)


def drive_simulated(
    session: LiveSession,
    time_source: ScaledTime,
    until: float,
    *,
    audio_block: int = 960,
    on_video: Callable[[int, torch.Tensor], None] | None = None,
    on_audio: Callable[[int, np.ndarray], None] | None = None,
    before: Callable[[float], None] | None = None,
) -> None:
    """Play a session in simulated time: pull video frames and `audio_block`-sample audio
    blocks in the order they fall due, pinning the clock to each due time, until media time
    `until`. This is what the real-time consumers (WebRTC tracks) do, minus the waiting, so a
    test can run an hour of media in seconds. `before(t)` runs before each pull (e.g. to
    feed streamed speech that has "arrived" by t)."""
    fps = session.fps
    rate = session.out_rate
    while True:
        k, s = session.video_cursor, session.audio_cursor
        tv, ta = Fraction(k) / fps, Fraction(s, rate)
        t = min(tv, ta)
        if t > until + 1e-9:
            return
        time_source.set(session.clock.origin + float(t))
        if before is not None:
            before(float(t))
        if tv <= ta:
            f = session.video_frame(k)
            if on_video is not None:
                on_video(k, f)
        else:
            a = session.audio_samples(s, audio_block)
            if on_audio is not None:
                on_audio(s, a)
