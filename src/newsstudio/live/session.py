"""One live session: idles, speaks as speech arrives, can be cut off at once."""
from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from ..avatar.packet import Packet
from ..compose.colour import nv12_to_rgb
from ..engines.base import AvatarLayer, Engine
from ..frame_rate import check_frame_rate
from ..media.audio import Audio, audio_from_array, load_audio
from ..stream import StreamSession, background_for
from .clock import OUT_RATE, MediaClock, State, TimeSource
from .errors import SessionClosedError
from .idle import IdleFrames
from .utterance import Utterance


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
