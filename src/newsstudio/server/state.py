"""What the server holds: its configuration, the warm engines, live sessions, jobs, metrics."""
from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch
from fastapi import HTTPException

from ..accel.cache import use_compile_artifacts
from ..avatar.packet import Packet, PacketError, open_packet
from ..avatar.store import avatars_root, validate_id
from ..cpus import usable_cpus
from ..engines.registry import ENGINES
from ..live import LiveSession, SessionLimitError, SessionManager
from ..render_budget import RenderBudget
from ..stream import default_device
from .engines import EnginePool, EngineUnavailable
from .gc_pauses import GC_PAUSES
from .jobs import JobManager
from .speech_intake import SpeechIntake
from .tts import EspeakTts

GOLDEN_STEP = (5 ** 0.5 - 1) / 2  # 0.618...: successive multiples mod 1 stay nearly evenly spread


@dataclass
class ServerConfig:
    """Settings of `newsstudio serve` (the CLI passes most; benchmarks set the rest)."""

    engine: str = "auto"
    device: str | None = None
    weights: str = "official"
    models: Path | None = None
    avatars: Path | None = None
    max_sessions: int = 8
    clips: Path | None = None
    """Where rendered clips go (default: `clips/` next to the avatars folder, or $NEWSSTUDIO_CLIPS)."""
    fps: float = 25.0
    max_upload_bytes: int = 200 << 20
    accel: str = "auto"
    """How the neural engines run (registry.engine_options; auto = compile+cudagraph on CUDA)."""
    batch_sessions: bool = True
    """Live sessions of one engine render through one RenderBatcher (shared GPU batches)."""
    ws_send_queue: int = 8
    """Chunks a WebSocket client may have queued unsent before it counts as not reading."""
    ws_close_timeout_s: float = 30.0
    prebuffer_s: float = 0.12
    """Streamed speech goes on air once this much of its driving is ready (the live latency)."""
    render_ahead: int = 4
    """Frames a live session renders per request. Larger requests make larger shared GPU batches
    (more streams per GPU: 8 MuseTalk streams at 30 fps on one H200 with 8, see RESULTS.md) but a
    request only covers frames whose speech has arrived, so raise `prebuffer_s` to at least
    render_ahead / fps with it (at the cost of that much latency)."""
    front_end_streams: bool = True
    """The shared front-end batchers (Whisper / HuBERT encoders, Ditto's LMDM windows) run on CUDA
    streams of their own, so their bursts do not queue in front of the sessions' renders and
    copy-outs on the one default stream (engines/batching.py); nothing changes off CUDA. On an H200
    (eleventh session, benchmarks/RESULTS.md): 8 Ditto sessions were 8 of 8 on time with them in
    every level (chunk jitter p95 65-76 ms) and 2 of 8 (130 ms) in the one level without them that
    came first on its server; 8 MuseTalk sessions with render_ahead 8 sit at the edge either way
    (0-8 of 8 with them, 0 of 8 in the two levels without; 8 of 8 without in earlier sessions)."""
    render_in_flight: int = 2
    """At most this many shared render batches on the GPU at once (engines/batching.py
    ``max_in_flight``; 0: no bound), so batches gather what arrives while the GPU works instead of
    queueing ahead of it. On an H200 a bound of 2 raised an overloaded MuseTalk server's frames/s by
    13-25 % over no bound and made 8 sessions with render_ahead 8 all on time; it beat a bound of 1 on
    a slower machine (benchmarks/RESULTS.md, ninth session)."""
    compose: str = "stream"
    """Where each live session splices its faces into its frames and starts the copy-out, on CUDA
    (`RenderBatcher` ``compose``): "stream" (its own thread, on one high-priority side stream that
    waits for its own batch only), "session" (its own thread, on the shared stream, so the work
    queues behind the batches launched meanwhile) or "worker" (the render batcher's thread, right
    after the batch; no gain measured, fifteenth session). On an H200 with 12-16 MuseTalk sessions
    at 30 fps, "stream" gave more frames/s than "session" in 5 of 7 paired levels (mean +21
    frames/s, ~7 %; one even, one -10), and 10 sessions were on time either way (sixteenth session,
    benchmarks/RESULTS.md)."""
    front_end_tf32: bool = True
    """Ditto's HuBERT and LMDM graphs captured with TF32 matmuls (`DittoEngine(front_end_tf32=)`):
    on an H200 dense 280 -> 304 fps and time to first frame 55 -> 38 ms, 8 live sessions on time
    either way (eleventh session), at ~9e-4 relative error of those networks' outputs vs float32."""
    triton_convs: str = "off"
    """The neural engines' render convolutions on the Triton implicit-GEMM kernel (accel/igemm_conv.py):
    "half" (per layer shape the fastest of the Triton kernels and cuDNN, timed at warm-up), "fp8"
    (Hopper+; FP8 operands) or "off" (cuDNN; the default until the kernel is measured on the GPU)."""
    first_face_row: int | str | None = None
    """The face rows MuseTalk's decoder makes (`MuseTalkEngine(first_face_row=)`,
    engines/musetalk/face_rows.py): None/"default" ("auto" on CUDA with a compile mode: rows 104-255
    where the avatar's blend allows, +25 % frames/s on an H100, an approximation at 36.9 dB over the
    blended pixels with seeded weights; the whole face elsewhere), "auto", 0 (the whole face) or a row."""
    gc_freeze: bool = True
    """After each engine warms up, collect once and freeze every object alive (`gc.freeze`,
    server/gc_pauses.py): later collections, which hold the GIL and so stop every session, no
    longer walk the engines' hundreds of thousands of long-lived objects. Skipped for an engine
    loaded while sessions or jobs run (frozen objects are never collected: theirs would leak)."""
    static_shapes: str | None = None
    """Which of MuseTalk's render buckets compile at their own batch size with a compile mode
    (accel/static.py `static_buckets`): None/"default" ("largest" on CUDA: 639.7 instead of 590.8
    frames/s dense on an H100), "none" (the quickest start), "largest", "all"."""
    ditto_stride: int = 1
    """Ditto sessions and jobs in stride mode (engines/ditto/stride.py): warp + decode every k-th
    frame, the frames between interpolated along the motion; 1: every frame (dense). A live
    session then holds up to k - 1 frames back (an in-between needs its next keyframe's motion)."""
    ditto_stride_mode: str = "mask"
    """How stride mode makes the frames between keyframes: mask, heatmap, blend or nearest."""
    batch_graphs: bool | None = None
    """MuseTalk's one-avatar render batches through CUDA graphs of their own (engines/musetalk/batch_graphs.py):
    the same bytes in ~10 torch calls instead of ~50 (each torch call waits for the GIL under many live
    sessions). None: the engine's default, on where it replays CUDA graphs (20 sessions on an H100: 20 and
    18 of 20 on time with them, 16 of 20 without; thirty-third session); True/False force it."""
    compose_graphs: bool | None = None
    """Live sessions' splice and copy-out through CUDA graphs of their own (compose/session_graphs.py): the
    same bytes in ~7 torch calls instead of ~36. None: on where the engine replays CUDA graphs; True/False
    force it."""
    musetalk_feature_step_ms: int | None = None
    """How often a live MuseTalk stream re-encodes its speech with Whisper (a multiple of 20 ms; None:
    every 100 ms). 200 ms halves the encoder's runs at up to 100 ms more wait for a frame's features:
    the setting of the 16- and 20-stream runs on an H100 (benchmarks/RESULTS.md, thirty-second session)."""
    batch_stall_s: float | None = None
    """A shared batch running longer than this is a stall: the sessions waiting on it end with an
    error instead of falling silent, and /health answers 503 naming the batcher (so a supervisor
    can restart the server). None: 60 s on CUDA (a batch takes milliseconds there), off on the
    CPU (a slow machine's batch may take long)."""
    compile_artifacts: Path | None = None
    """A file of compiled artifacts (accel/cache.py): loaded before the engines compile, written once
    they are warm, so a fresh machine's next server skips most of its compile (MuseTalk took 186-311 s
    on the GPU hosts). None: the on-disk cache folder only."""
    speech_push_interval_s: float = 0.0
    """Streamed speech (WebSocket, audio socket, WebRTC data channel) is pushed into a session at most
    this often, what arrived meanwhile in one push (server/speech_intake.py): fewer event-loop round
    trips and speech-thread wake-ups per second, at up to this much later speech for the engine. 0:
    whenever the previous push is done."""
    render_lead_s: float = 0.0
    """WebSocket chunks are rendered this long before they are due, so the render latency of a busy
    shared GPU batch does not reach the client as jitter. Sessions' speech prebuffer grows by the
    same amount (the frames rendered early still have their audio), and so does the worst-case
    interrupt latency."""
    send_on_clock: bool = True
    """With a render lead, each finished WebSocket chunk is held until its first frame is due on the
    media clock and sent then (off: as soon as it is ready). With render_ahead > chunk_frames one
    shared render makes several chunks at once; sent when ready, the first of them waits for the
    render and the rest follow at once, so arrivals spread by the render time (Ditto at 30 fps on
    an H200: jitter p95 125-144 ms, twelfth session). Held, they arrive evenly whenever the render
    takes less than the lead."""
    ws_socket_writes: bool = True
    """A WebSocket chunk goes to the socket in one GIL-free write wherever the connection's transport
    has nothing queued (server/ws_direct.py); off, every byte goes through the transport, whose
    first write under uvloop holds the GIL while the kernel copies. Read as each session opens."""
    spread_render_phases: bool = True
    """Each new live session gets a render phase (`LiveSession._phased`), spread over the period of
    one request (render_ahead / fps) in golden-ratio steps, so sessions that start together do not
    ask for their frames together. On an H200, 12 MuseTalk sessions at 30 fps (render_ahead 16,
    render lead 500 ms) were on time in 3 of 3 levels when the load test spread their starts over
    one period and in 5 of 8 when it started them at once (seventeenth session); with this setting
    on and the sessions started at once, 12 and 14 sessions were on time in 15 of 16 levels, with
    1.04-1.32 requests per batch at 12 against 1.14-1.70 with it off (eighteenth session, runs
    ZZ1-ZZ6). Off: each session asks for frames from the moment it started."""
    fill_render_batches: bool = False
    """Under load, a render request that does not fit whole in the next shared batch tops it up to
    the CUDA-graph bucket it runs as anyway, its other frames leading the batch after (`batching`
    module doc): padding becomes frames. Why: 16 MuseTalk sessions at 30 fps on an H100 met in
    batches of 25-29 frames, each run as 32 (433-441 frames/s of 480 owed, twenty-sixth session).
    The split request's frames come one batch later. Off until measured on the GPU."""
    max_render_fps: str | float | None = None
    """Frames per second this server can render, for every engine (``420``) or per engine
    (``"musetalk=420,ditto=240"``; `RenderBudget.parse`): a live session is admitted only while
    the sessions' frame rates fit in it (each engine's share counted against one GPU), else
    refused with 503 and Retry-After. Overloaded, every session falls behind together (16
    MuseTalk sessions at 30 fps on an H200 rendering ~420 frames/s: 0 of 16 on time), so
    turning the newest away keeps the others on time. None: only `max_sessions` limits."""
    webrtc_connect_timeout_s: float = 30.0
    time_source: Callable[[], float] | None = None
    """Injectable media-clock time source (tests: simulated or scaled time)."""
    torch_threads: int | None = None
    """Intra-op threads; default 1 on CPU (sessions render in parallel threads instead)."""
    warm: bool = True
    """Load the default engine at startup."""
    jobs_kept: int = 500
    switch_interval_s: float | None = 0.0005
    """The GIL hand-off interval while the server runs (Python's default 5 ms; None keeps it): the
    render batcher, speech and session threads and the event loop take turns, and a 5 ms slice made
    the batcher wait. H200 load test, 6 MuseTalk sessions: render-thread busy share 0.38 -> 0.15;
    8 sessions: 174 -> 213 frames/s server-wide."""


class Metrics:
    """Counters and a rolling frames-per-second window (thread-safe)."""

    def __init__(self, window_s: float = 5.0):
        self.window_s = window_s
        self.frames_total = 0
        self.rejected_sessions = 0
        self.ws_slow_closes = 0
        self._events: deque[tuple[float, int]] = deque()
        self._lags: deque[tuple[float, float]] = deque()
        self.loop_lag_max_s = 0.0
        self._lock = threading.Lock()
        self.started = time.time()

    def add_frames(self, n: int) -> None:
        now = time.monotonic()
        with self._lock:
            self.frames_total += n
            self._events.append((now, n))
            self._trim(self._events, now)

    def _trim(self, samples: deque, now: float) -> None:
        """Drop (time, value) samples older than the window."""
        while samples and samples[0][0] < now - self.window_s:
            samples.popleft()

    def add_loop_lag(self, lag_s: float) -> None:
        """One event-loop lag sample: how late a short sleep woke up (work blocking the loop
        delays every session's frames and messages by as much)."""
        now = time.monotonic()
        with self._lock:
            self._lags.append((now, lag_s))
            self._trim(self._lags, now)
            self.loop_lag_max_s = max(self.loop_lag_max_s, lag_s)

    def loop_lag(self) -> dict[str, float]:
        """Event-loop lag over the last window (p95, max) and since start (max), in ms."""
        with self._lock:
            lags = sorted(v for _, v in self._lags)
            worst = self.loop_lag_max_s
        p95 = lags[min(len(lags) - 1, int(0.95 * len(lags)))] if lags else 0.0
        return {"p95_ms": round(p95 * 1e3, 3), "max_ms": round((lags[-1] if lags else 0.0) * 1e3, 3),
                "max_since_start_ms": round(worst * 1e3, 3)}

    def fps(self) -> float:
        now = time.monotonic()
        with self._lock:
            self._trim(self._events, now)
            total = sum(n for _, n in self._events)
        span = min(self.window_s, max(1e-3, time.time() - self.started))
        return total / span


class ServerState:
    def __init__(self, cfg: ServerConfig):
        self.cfg = cfg
        self.device = torch.device(cfg.device) if cfg.device else default_device()
        if cfg.torch_threads is not None:
            torch.set_num_threads(int(cfg.torch_threads))
        elif self.device.type == "cpu":
            torch.set_num_threads(1)
        if cfg.compile_artifacts is not None:  # before any engine compiles
            use_compile_artifacts(cfg.compile_artifacts)
        self.avatars_root = avatars_root(cfg.avatars).resolve()
        self.avatars_root.mkdir(parents=True, exist_ok=True)
        self.uploads_dir = self.avatars_root / ".uploads"
        clips = cfg.clips or os.environ.get("NEWSSTUDIO_CLIPS") or (self.avatars_root.parent / "clips")
        self.clips_dir = Path(clips).resolve()
        self.clips_dir.mkdir(parents=True, exist_ok=True)
        self.fps = Fraction(cfg.fps).limit_denominator(1001)
        stall_s = cfg.batch_stall_s if cfg.batch_stall_s is not None else (60.0 if self.device.type == "cuda" else None)
        GC_PAUSES.install()  # the process's collector pauses, for /metrics
        self.engines = EnginePool(cfg.engine, self.device, cfg.weights, cfg.models, cfg.accel, cfg.batch_sessions,
                                  cfg.front_end_streams, cfg.render_in_flight, stall_s, cfg.front_end_tf32,
                                  cfg.compose, cfg.triton_convs, cfg.fill_render_batches, cfg.first_face_row,
                                  cfg.musetalk_feature_step_ms, cfg.static_shapes, cfg.gc_freeze,
                                  ditto_stride=cfg.ditto_stride, ditto_stride_mode=cfg.ditto_stride_mode)
        self.engines.work_in_progress = lambda: self.sessions.count() + len(self.jobs.active())
        if cfg.batch_graphs is not None:
            self.engines.set_batch_graphs(cfg.batch_graphs)  # engines loaded from now on too
        if cfg.compose_graphs is not None:
            self.engines.set_compose_graphs(cfg.compose_graphs)
        budget = RenderBudget.parse(cfg.max_render_fps, ENGINES) if cfg.max_render_fps is not None else None
        self.sessions = SessionManager(cfg.max_sessions, budget)
        self._sessions_phased = 0  # render phases handed out (spread_render_phases)
        self.jobs = JobManager({"prebake": 1, "clip": 2}, keep=cfg.jobs_kept)
        self.metrics = Metrics()
        self.tts = EspeakTts()
        # each live H.264 stream's share of the cores: x264's default (1.5 threads per core per encoder)
        # puts 24 threads per stream on a 16-core server, 288 for 12 streams, all competing with the render
        # thread and the sessions for the CPU
        self.h264_threads = max(1, usable_cpus() // max(1, cfg.max_sessions))
        self.render_pool = ThreadPoolExecutor(max_workers=max(4, cfg.max_sessions + 2), thread_name_prefix="newsstudio-live")
        # speech input (features, motion) runs here, never on the event loop: one call per stream
        # at a time, so a thread per session suffices
        self.speech_pool = ThreadPoolExecutor(max_workers=max(4, cfg.max_sessions + 2), thread_name_prefix="newsstudio-speech")
        self.pending_avatars: set[str] = set()
        self.lock = threading.Lock()
        self.started = time.time()

    # -- avatars
    def avatar_dir(self, avatar_id: str) -> Path:
        try:
            validate_id(avatar_id)
        except ValueError as e:
            raise HTTPException(400, str(e)) from None
        return self.avatars_root / avatar_id

    def open_avatar(self, avatar_id: str) -> Packet:
        d = self.avatar_dir(avatar_id)
        if not (d / "manifest.json").is_file():
            raise HTTPException(404, f"no avatar {avatar_id!r} (GET /avatars lists them; POST /avatars uploads one)")
        try:
            return open_packet(d)
        except PacketError as e:
            raise HTTPException(422, f"avatar {avatar_id!r} is damaged and cannot be used: {e}") from None

    # -- engines
    def engine(self, name: str | None):
        try:
            return self.engines.get(name)
        except EngineUnavailable as e:
            status = 400 if "unknown engine" in str(e) else 503
            raise HTTPException(status, str(e)) from None

    # -- sessions
    def open_session(self, avatar_id: str, engine: str | None, fps: float | None, transport: str) -> LiveSession:
        """Build a live session (call from a worker thread: it may load an engine/avatar)."""
        packet = self.open_avatar(avatar_id)
        name, eng = self.engine(engine)
        rate = Fraction(fps).limit_denominator(1001) if fps else self.fps

        def factory(on_close):
            s = LiveSession(
                eng, packet, fps=rate, time_source=self.cfg.time_source, render_ahead=self.cfg.render_ahead,
                prebuffer_s=self.cfg.prebuffer_s + self.cfg.render_lead_s, engine_name=name, on_close=on_close,
                renderer=self.engines.renderer(name),
            )
            s.transport = transport
            if self.cfg.spread_render_phases:
                s.render_phase = self._next_render_phase(s)
            return s

        try:
            return self.sessions.open(factory, engine=name, fps=float(rate))
        except SessionLimitError as e:
            self.metrics.rejected_sessions += 1
            raise HTTPException(503, str(e), headers={"Retry-After": "5"}) from None

    def _next_render_phase(self, s: LiveSession) -> float:
        """The n-th session's render phase: n golden-ratio steps around one request's period, so any
        run of consecutive sessions is spread nearly evenly (each new one lands in the largest gap)."""
        self._sessions_phased += 1
        return (self._sessions_phased * GOLDEN_STEP) % 1.0 * s.request_period_s

    def session(self, session_id: str) -> LiveSession:
        try:
            return self.sessions.get(session_id)
        except KeyError:
            raise HTTPException(404, f"no live session {session_id!r} (it may have been closed)") from None

    # -- gpu
    def speech_intake(self, session: LiveSession, sample_rate: int, **kw: Any) -> SpeechIntake:
        """A streamed-speech intake for ``session`` on the server's speech pool, spaced as configured."""
        return SpeechIntake(session, self.speech_pool, sample_rate, push_interval_s=self.cfg.speech_push_interval_s, **kw)

    def gpu_memory(self) -> list[dict[str, Any]] | None:
        if not torch.cuda.is_available():
            return None
        out = []
        for i in range(torch.cuda.device_count()):
            stats = torch.cuda.memory_stats(i)  # one walk of the allocator's statistics (each getter makes them all)
            out.append({
                "device": f"cuda:{i}",
                "allocated_bytes": int(stats.get("allocated_bytes.all.current", 0)),
                "reserved_bytes": int(stats.get("reserved_bytes.all.current", 0)),
                "max_allocated_bytes": int(stats.get("allocated_bytes.all.peak", 0)),
                "total_bytes": int(torch.cuda.get_device_properties(i).total_memory),
            })
        return out

    def close(self) -> None:
        self.sessions.close_all()
        self.engines.close()
        self.jobs.shutdown()
        self.render_pool.shutdown(wait=False, cancel_futures=True)
        self.speech_pool.shutdown(wait=False, cancel_futures=True)


def rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
