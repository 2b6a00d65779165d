"""Typed request/response bodies of the HTTP API (they are what /openapi.json describes)."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, Field
from pydantic_core import PydanticCustomError

from ..frame_rate import MAX_FPS, frame_rate_error

JobState = Literal["queued", "running", "done", "failed"]
EngineName = Literal["auto", "classic", "musetalk", "ditto"]


def _frame_rate(fps: float) -> float:
    """The CLI's frame-rate rule (frame_rate.py) with its own words as the 422's msg, instead of
    pydantic's range texts: a rate is refused the same way wherever it is typed."""
    error = frame_rate_error(fps)
    if error is not None:
        raise PydanticCustomError("frame_rate", error)
    return fps


#: Every fps field (clips, WebRTC offers). The schema states the range; _frame_rate enforces it.
Fps = Annotated[float, AfterValidator(_frame_rate), Field(json_schema_extra={"exclusiveMinimum": 0, "maximum": MAX_FPS})]


class ErrorBody(BaseModel):
    detail: str = Field(description="What is wrong, in words a user can act on.")


class EngineInfo(BaseModel):
    name: str
    loaded: bool = Field(description="Loaded and warm (shared by every session and job).")
    available: bool | None = Field(description="False when it failed to load; None when not tried yet.")
    reason: str | None = None
    device: str | None = None
    default: bool = False


class TtsInfo(BaseModel):
    available: bool
    engine: str | None = None
    reason: str | None = None


class Health(BaseModel):
    status: Literal["ok", "stalled"] = "ok"
    """"stalled" (HTTP 503): a shared GPU batch has run past the server's stall limit."""
    stalled_batchers: list[str] = []
    version: str
    uptime_s: float
    device: str
    default_engine: str
    engines: list[EngineInfo]
    active_sessions: int
    max_sessions: int
    tts: TtsInfo


class GpuMemory(BaseModel):
    device: str
    allocated_bytes: int
    reserved_bytes: int
    max_allocated_bytes: int
    total_bytes: int


class JobCounts(BaseModel):
    queued: int = 0
    running: int = 0
    done: int = 0
    failed: int = 0


class SessionInfo(BaseModel):
    id: str
    avatar: str
    engine: str
    state: Literal["idle", "buffering", "speaking", "closed"]
    transport: str | None = None
    fps: float
    width: int
    height: int
    sample_rate: int
    media_time: float
    video_frame: int
    audio_sample: int
    av_offset_ms: float = Field(description="Audio position minus video position handed out (one audio block at most).")
    frames_out: int
    frames_rendered: int
    speech_frames: int
    utterances: int
    interrupts: int
    barge_ins: int
    dropped_frames: int
    underrun_ms: float
    skipped_frames: int
    last_cut_ms: float | None = None
    last_start_ms: float | None = None
    renders: int = Field(0, description="Render calls (speech, or idle frames not served from the shared idle cache).")
    render_call_ms_mean: float = Field(0.0, description="Per render call: until its GPU work was queued (waiting for the shared render batch included).")
    render_wait_ms_mean: float = Field(0.0, description="Per render call: of render_call_ms_mean, the time inside the renderer (the shared batch's queue and launch); the rest is the session's splice and copy launches.")
    copy_out_ms_mean: float = Field(0.0, description="Per render call: then until the frames were in host memory (the GPU queue ahead of them).")
    speech_renders: int = Field(0, description="Render calls of speech frames.")
    short_renders: int = Field(0, description="Of them, cut short of render_ahead frames because the speech's driving "
                               "(features, motion) for the rest was not ready yet.")
    driving_ahead_frames_mean: float = Field(0.0, description="Per speech render: frames of driving ready from its first "
                                             "frame on (how far the speech input runs ahead of the renders).")
    render_ahead: int = Field(description="Frames the session renders per request.")
    prebuffer_ms: float = Field(description="Streamed speech goes on air once this much of it is ready.")


class BatchingInfo(BaseModel):
    requests: int = Field(description="Render requests from live sessions.")
    batches: int = Field(description="Engine calls they were merged into.")
    frames: int
    largest_batch_frames: int
    requests_per_batch: float
    wait_s_total: float = Field(description="Seconds requests spent queued before their batch started, summed.")
    max_wait_ms: float = Field(description="Longest such wait.")
    busy_s_total: float = Field(description="Seconds the render thread spent in engine calls (GPU: dispatch time).")
    bucket_frames: int = Field(0, description="Frames the batches ran as, padded up to the engine's batch buckets "
                               "(0 where it has none): frames / bucket_frames is how full they were.")
    split_requests: int = Field(0, description="Requests split across two batches to fill a bucket "
                                "(serve --fill-render-batches).")


class LoopLag(BaseModel):
    """How late the server's event loop wakes from a 20 ms sleep: work that blocks the loop delays
    every session's frames and messages by as much."""
    p95_ms: float = Field(description="95th percentile over the last 5 s.")
    max_ms: float = Field(description="Worst over the last 5 s.")
    max_since_start_ms: float


class GcInfo(BaseModel):
    """The process's garbage-collector runs since start (server/gc_pauses.py): each holds the GIL,
    so a long one stops every live session."""
    collections: list[int] = Field(description="Runs per generation 0, 1, 2.")
    pause_ms_total: list[float] = Field(description="Milliseconds spent in them per generation.")
    long_pauses: list[list[float]] = Field(description="The latest runs of 10 ms or more: [number, ms, generation].")
    frozen_objects: int = Field(description="Objects in the permanent generation (frozen after engine warm-up).")


class CompileWork(BaseModel):
    """Compile and capture work since start (accel/work_counts.py): growth while sessions run is work
    the engines' warm-up did not cover, a stall for the sessions of that moment."""
    graph_captures: int = Field(description="CUDA graph captures begun: the engines' batch buckets at warm-up, "
                                "each live session's compose graphs, ...")
    compiled_frames: int = Field(description="Python frames torch.compile compiled, recompiles included.")
    fallbacks: int = Field(description="Distinct reasons a runner asked to compile or capture runs eager instead.")


class Metrics(BaseModel):
    uptime_s: float
    fps: float = Field(description="Frames handed to clients per second, all sessions and jobs, last 5 s.")
    frames_total: int
    active_sessions: int
    max_sessions: int
    sessions_opened_total: int
    sessions_closed_total: int
    rejected_sessions_total: int
    render_load: float | None = Field(None, description="Share of the render capacity (--max-render-fps) the live "
                                      "sessions take, 0..1; null when no capacity is set.")
    jobs: JobCounts
    ws_slow_client_closes_total: int
    rss_bytes: int | None
    gpu: list[GpuMemory] | None = Field(description="Per CUDA device; null without CUDA.")
    render_batching: dict[str, BatchingInfo] = Field(
        default_factory=dict, description="Per engine: how live sessions' renders were merged into shared batches.")
    event_loop_lag: LoopLag
    gc: GcInfo | None = None
    compile_work: CompileWork | None = None
    sessions: list[SessionInfo]


class AvatarInfo(BaseModel):
    id: str
    kind: str | None
    frames: int
    width: int
    height: int
    fps: float
    engines: list[str]
    mouth_box: list[int] | None = Field(description="[x0, y0, x1, y1] of the mouth in frame 0 (output pixels).")
    preview_url: str


class AvatarList(BaseModel):
    avatars: list[AvatarInfo]


class JobAccepted(BaseModel):
    job_id: str
    status_url: str
    avatar_id: str | None = None
    clip_id: str | None = None
    download_url: str | None = None


class JobStatus(BaseModel):
    id: str
    kind: Literal["prebake", "clip"]
    state: JobState
    progress: float = Field(ge=0.0, le=1.0)
    stage: str
    error: str | None = None
    created: float
    started: float | None = None
    finished: float | None = None
    result: dict | None = None


class OfferRequest(BaseModel):
    sdp: str = Field(min_length=1, max_length=200_000)
    type: Literal["offer"]
    avatar: str
    engine: EngineName = "auto"
    fps: Fps | None = None


class OfferAnswer(BaseModel):
    sdp: str
    type: Literal["answer"]
    session_id: str
    width: int
    height: int
    fps: float


class SpeakResult(BaseModel):
    utterance: str
    start_frame: int | None
    duration_s: float
    speech_s: float
    cut_latency_ms: float
    state: str


class SayRequest(BaseModel):
    text: str = Field(min_length=1, max_length=2000)
    voice: str | None = Field(default=None, max_length=40, pattern=r"^[A-Za-z0-9_+\-]+$")


class InterruptResult(BaseModel):
    interrupted: bool
    cut_frame: int
    cut_sample: int
    cut_latency_ms: float
    dropped_frames: int
    state: str
