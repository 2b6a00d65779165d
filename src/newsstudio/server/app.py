"""`newsstudio serve`: HTTP API, WebSocket and WebRTC live sessions, and the web page at /.

    create_app(ServerConfig(engine, device, weights, models, avatars, max_sessions)) -> FastAPI

Engines load once per name and stay warm (shared by every session and job). Avatars are
listed, uploaded (prebake runs as a background job you poll at /jobs/{id}) and deleted;
clips render as jobs to MP4 files written atomically. Live sessions (newsstudio.live) are
reached over WebRTC (POST /webrtc/offer) or the WebSocket protocol at /ws. The OpenAPI schema is
at /openapi.json; there is no /docs page, since FastAPI's loads Swagger UI from a CDN and would
be blank on a machine without internet.
"""
from __future__ import annotations

import asyncio
import io
import logging
import math
import re
import shutil
import sys
import time
from contextlib import asynccontextmanager
from fractions import Fraction
from pathlib import Path
from typing import Annotated

from fastapi import FastAPI, File, Form, HTTPException, Request, UploadFile
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool

from .. import __version__ as _version
from ..accel.work_counts import work_counts
from ..frame_rate import MAX_FPS
from ..media.errors import MediaError
from . import models as m
from .gc_pauses import GC_PAUSES
from .jobs import Job
from .prebake_job import run_prebake
from .state import ServerConfig, ServerState, rss_bytes
from .uploads import (
    AUDIO_TYPES,
    IMAGE_TYPES,
    VIDEO_TYPES,
    BodyLimitMiddleware,
    SavedUpload,
    check_type,
    decode_speech,
    move_aside,
    read_limited,
    save_upload,
    upload_name,
)

__all__ = ["ServerConfig", "create_app"]

log = logging.getLogger("newsstudio.server")
STATIC = Path(__file__).resolve().parent / "static"
_CLIP_ID = re.compile(r"^[0-9a-f]{16}$")
_SIZE = re.compile(r"^(\d{1,9})x(\d{1,9})$")
ERRORS = {400: {"model": m.ErrorBody}, 404: {"model": m.ErrorBody}, 409: {"model": m.ErrorBody}, 413: {"model": m.ErrorBody}, 415: {"model": m.ErrorBody}, 422: {"model": m.ErrorBody}, 503: {"model": m.ErrorBody}}


async def _watch_loop_lag(metrics, period_s: float = 0.02) -> None:
    """Sample how late the event loop wakes from a short sleep (blocking work on the loop shows here)."""
    loop = asyncio.get_running_loop()
    while True:
        t0 = loop.time()
        await asyncio.sleep(period_s)
        metrics.add_loop_lag(max(0.0, loop.time() - t0 - period_s))


def create_app(cfg: ServerConfig | None = None) -> FastAPI:
    cfg = cfg or ServerConfig()
    state = ServerState(cfg)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if cfg.warm:
            try:
                await run_in_threadpool(state.engines.get, None)
            except Exception as e:  # noqa: BLE001 - reported by /health, the server still serves
                log.warning("default engine failed to load: %s", e)
        monitor = asyncio.ensure_future(_watch_loop_lag(state.metrics))
        switch = sys.getswitchinterval()
        if cfg.switch_interval_s is not None:
            sys.setswitchinterval(cfg.switch_interval_s)
        try:
            yield
        finally:
            sys.setswitchinterval(switch)
            monitor.cancel()
        await app.state.webrtc.close_all()
        state.close()

    app = FastAPI(
        title="NewsStudio",
        version=_version,
        summary="Lip-synced talking-head video: clips, live sessions over WebSocket and WebRTC.",
        lifespan=lifespan,
        docs_url=None,  # Swagger UI and ReDoc come from a CDN: blank offline (module doc)
        redoc_url=None,
    )
    app.state.ns = state
    app.add_middleware(BodyLimitMiddleware, upload_limit=cfg.max_upload_bytes)

    @app.exception_handler(MediaError)
    async def _media_error(_: Request, exc: MediaError):
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(_: Request, exc: RequestValidationError):
        """FastAPI's own 422, except that a NaN or infinite input it echoes is written as text: a
        JSON body's NaN/Infinity (Python's parser takes them) made that reply fail with a 500."""
        def text_if_not_finite(x: float) -> float | str:
            return x if math.isfinite(x) else str(x)

        return JSONResponse({"detail": jsonable_encoder(exc.errors(), custom_encoder={float: text_if_not_finite})}, status_code=422)

    # ------------------------------------------------------------------ page + status
    @app.get("/", include_in_schema=False)
    async def index():
        return FileResponse(STATIC / "index.html", media_type="text/html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/health", response_model=m.Health, tags=["status"],
             responses={503: {"model": m.Health, "description": "a shared GPU batch has stalled"}})
    async def health():
        stalled = state.engines.stalled()
        body = m.Health(
            status="stalled" if stalled else "ok",
            stalled_batchers=stalled,
            version=_version,
            uptime_s=round(time.time() - state.started, 3),
            device=str(state.device),
            default_engine=state.engines.default,
            engines=[m.EngineInfo(**e) for e in state.engines.describe()],
            active_sessions=state.sessions.count(),
            max_sessions=state.sessions.max_sessions,
            tts=m.TtsInfo(**state.tts.info()),
        )
        return JSONResponse(body.model_dump(), status_code=503) if stalled else body

    @app.get("/metrics", response_model=m.Metrics, tags=["status"])
    async def metrics():
        return m.Metrics(
            uptime_s=round(time.time() - state.started, 3),
            fps=round(state.metrics.fps(), 2),
            frames_total=state.metrics.frames_total,
            active_sessions=state.sessions.count(),
            max_sessions=state.sessions.max_sessions,
            sessions_opened_total=state.sessions.opened_total,
            sessions_closed_total=state.sessions.closed_total,
            rejected_sessions_total=state.metrics.rejected_sessions,
            render_load=state.sessions.render_load(),
            jobs=m.JobCounts(**state.jobs.counts()),
            ws_slow_client_closes_total=state.metrics.ws_slow_closes,
            rss_bytes=rss_bytes(),
            gpu=state.gpu_memory(),
            render_batching={k: m.BatchingInfo(**v) for k, v in state.engines.batcher_stats().items()},
            event_loop_lag=m.LoopLag(**state.metrics.loop_lag()),
            gc=m.GcInfo(**GC_PAUSES.snapshot()),
            compile_work=m.CompileWork(**work_counts()),
            sessions=[m.SessionInfo(**s.info()) for s in state.sessions.list() if not s.closed],
        )

    @app.get("/engines", response_model=list[m.EngineInfo], tags=["status"])
    async def engines():
        return [m.EngineInfo(**e) for e in state.engines.describe()]

    # ------------------------------------------------------------------ avatars
    def avatar_info(avatar_id: str) -> m.AvatarInfo:
        p = state.open_avatar(avatar_id)
        box = None
        if "landmarks68" in p:
            lm = p.array("landmarks68")[0][48:68]
            box = [int(math.floor(lm[:, 0].min())), int(math.floor(lm[:, 1].min())), int(math.ceil(lm[:, 0].max())), int(math.ceil(lm[:, 1].max()))]
        return m.AvatarInfo(
            id=p.id, kind=p.meta.get("kind"), frames=p.n_frames, width=p.size[0], height=p.size[1], fps=p.fps,
            engines=sorted(p.manifest.get("engines", {})), mouth_box=box, preview_url=f"/avatars/{p.id}/preview.jpg",
        )

    @app.get("/avatars", response_model=m.AvatarList, tags=["avatars"])
    async def list_avatars():
        out = []
        for d in sorted(state.avatars_root.iterdir()):
            if d.name.startswith(".") or not (d / "manifest.json").is_file():
                continue
            try:
                out.append(avatar_info(d.name))
            except HTTPException:
                continue  # a damaged packet is not offered
        return m.AvatarList(avatars=out)

    @app.get("/avatars/{avatar_id}", response_model=m.AvatarInfo, responses=ERRORS, tags=["avatars"])
    async def get_avatar(avatar_id: str):
        return avatar_info(avatar_id)

    @app.get("/avatars/{avatar_id}/preview.jpg", responses=ERRORS, tags=["avatars"], response_class=Response)
    async def avatar_preview(avatar_id: str):
        p = state.open_avatar(avatar_id)

        def jpeg() -> bytes:
            from PIL import Image

            from ..compose.colour import nv12_to_rgb

            rgb = nv12_to_rgb(p.tensor("frames_nv12")[0:1])[0].numpy()
            img = Image.fromarray(rgb)
            img.thumbnail((320, 320))
            buf = io.BytesIO()
            img.save(buf, "JPEG", quality=85)
            return buf.getvalue()

        return Response(await run_in_threadpool(jpeg), media_type="image/jpeg", headers={"Cache-Control": "max-age=60"})

    @app.post("/avatars", status_code=202, response_model=m.JobAccepted, responses=ERRORS, tags=["avatars"])
    async def upload_avatar(
        file: UploadFile = File(..., description="A portrait photo (image/*) or a presenter video loop (video/*)."),
        id: str = Form(..., description="Avatar id: 1-64 letters, digits, '_' or '-'."),
        size: str | None = Form(None, description="Output WxH, e.g. 512x512 (default: the source size)."),
        fit: str = Form("cover", pattern="^(cover|contain)$"),
        replace: bool = Form(False, description="Rebuild an existing avatar of that id."),
    ):
        dest = state.avatar_dir(id)
        ctype = check_type(file, IMAGE_TYPES + VIDEO_TYPES, "avatar upload")
        wh = _parse_size(size) if size else None
        with state.lock:
            if id in state.pending_avatars:
                raise HTTPException(409, f"avatar {id!r} is being built by another upload")
            if (dest / "manifest.json").is_file() and not replace:
                raise HTTPException(409, f"avatar {id!r} already exists (send replace=true to rebuild it)")
            state.pending_avatars.add(id)
        src: SavedUpload | None = None
        try:
            src = await save_upload(file, state.uploads_dir, cfg.max_upload_bytes)
            await run_in_threadpool(_probe_visual, src, ctype)
        except BaseException:
            with state.lock:
                state.pending_avatars.discard(id)
            if src is not None:
                src.path.unlink(missing_ok=True)
            raise

        def cleanup() -> None:
            src.path.unlink(missing_ok=True)
            with state.lock:
                state.pending_avatars.discard(id)

        job = state.jobs.submit("prebake", lambda j: run_prebake(j, src, id, state.avatars_root, wh, fit), cleanup=cleanup)
        return m.JobAccepted(job_id=job.id, status_url=f"/jobs/{job.id}", avatar_id=id)

    @app.delete("/avatars/{avatar_id}", status_code=204, responses=ERRORS, tags=["avatars"])
    async def delete_avatar(avatar_id: str):
        d = state.avatar_dir(avatar_id)
        if not d.is_dir():
            raise HTTPException(404, f"no avatar {avatar_id!r}")
        with state.lock:  # quick checks and a rename only: never held across an await
            if avatar_id in state.pending_avatars:
                raise HTTPException(409, f"avatar {avatar_id!r} is being built; delete it when the job is done")
            users = state.sessions.using_avatar(avatar_id)
            if users:
                raise HTTPException(409, f"avatar {avatar_id!r} is in use by {users} live session(s); close them first")
            from ..live import evict_avatar

            for eng in state.engines.loaded().values():
                evict_avatar(eng, str(d))
            trash = move_aside(d)  # gone for readers at once (atomic rename)
        await run_in_threadpool(shutil.rmtree, trash, True)
        return Response(status_code=204)

    # ------------------------------------------------------------------ jobs + clips
    @app.get("/jobs/{job_id}", response_model=m.JobStatus, responses=ERRORS, tags=["jobs"])
    async def get_job(job_id: str):
        job = state.jobs.get(job_id)
        if job is None:
            raise HTTPException(404, f"no job {job_id!r}")
        return m.JobStatus(**job.to_dict())

    @app.post("/clips", status_code=202, response_model=m.JobAccepted, responses=ERRORS, tags=["clips"])
    async def create_clip(
        audio: UploadFile = File(..., description="Speech: wav, mp3, m4a, flac, ogg, webm, or a video's audio track."),
        avatar: str = Form(..., description="Avatar id."),
        engine: m.EngineName = Form("auto"),
        fps: Annotated[m.Fps, Form(description=f"Frames per second, 0 < fps <= {MAX_FPS}.")] = 25.0,  # (a Form() default would drop Fps's check)
    ):
        check_type(audio, AUDIO_TYPES, "speech upload")
        packet = state.open_avatar(avatar)
        data = await read_limited(audio, cfg.max_upload_bytes)
        sound, _ = await run_in_threadpool(decode_speech, data, upload_name(audio.filename))
        name, eng = await run_in_threadpool(state.engine, engine)

        def render(job: Job) -> dict:
            from ..media.mp4_writer import Mp4Writer
            from ..stream import stream_generator

            rate = Fraction(fps).limit_denominator(1001)
            total = int(math.ceil(Fraction(sound.num_samples) * rate / sound.sample_rate))
            out = state.clips_dir / f"{job.id}.mp4"
            w, h = packet.size
            n = 0
            job.update(0.0, f"rendering 0/{total} frames")
            with Mp4Writer(out, w, h, rate, audio=sound, pixel_input="nv12", metadata={"comment": f"newsstudio {name}"}) as wr:
                for ch in stream_generator(eng, packet, sound, fps=rate, chunk_frames=16, output="nv12"):
                    wr.write(ch["frames"], owned=True)  # fresh per chunk
                    n += ch["num_frames"]
                    state.metrics.add_frames(ch["num_frames"])
                    job.update(0.97 * n / total, f"rendering {n}/{total} frames")
                job.update(0.98, "finishing the MP4")
            return {"clip_id": job.id, "frames": n, "fps": float(rate), "duration_s": round(sound.duration_s, 3), "bytes": out.stat().st_size, "engine": name, "avatar": packet.id, "download_url": f"/clips/{job.id}.mp4"}

        job = state.jobs.submit("clip", render)
        return m.JobAccepted(job_id=job.id, status_url=f"/jobs/{job.id}", avatar_id=packet.id, clip_id=job.id, download_url=f"/clips/{job.id}.mp4")

    @app.get("/clips/{clip_id}.mp4", responses=ERRORS, tags=["clips"], response_class=FileResponse)
    async def download_clip(clip_id: str):
        if not _CLIP_ID.match(clip_id):
            raise HTTPException(400, f"invalid clip id {clip_id!r}")
        job = state.jobs.get(clip_id)
        if job is not None and job.state in ("queued", "running"):
            raise HTTPException(409, f"clip {clip_id} is not ready yet ({job.stage}); poll /jobs/{clip_id}")
        if job is not None and job.state == "failed":
            raise HTTPException(422, f"clip {clip_id} failed: {job.error}")
        path = state.clips_dir / f"{clip_id}.mp4"
        if not path.is_file():
            raise HTTPException(404, f"no clip {clip_id}")
        return FileResponse(path, media_type="video/mp4", filename=f"{clip_id}.mp4")

    # ------------------------------------------------------------------ live sessions (REST)
    @app.get("/sessions", response_model=list[m.SessionInfo], tags=["sessions"])
    async def list_sessions():
        return [m.SessionInfo(**s.info()) for s in state.sessions.list() if not s.closed]

    @app.get("/sessions/{session_id}", response_model=m.SessionInfo, responses=ERRORS, tags=["sessions"])
    async def get_session(session_id: str):
        return m.SessionInfo(**state.session(session_id).info())

    @app.delete("/sessions/{session_id}", status_code=204, responses=ERRORS, tags=["sessions"])
    async def close_session(session_id: str):
        s = state.session(session_id)
        await app.state.webrtc.close_session(s.id)
        s.close()
        return Response(status_code=204)

    @app.post("/sessions/{session_id}/speak", response_model=m.SpeakResult, responses=ERRORS, tags=["sessions"])
    async def speak(session_id: str, audio: UploadFile = File(..., description="Speech to say now (barge-in).")):
        s = state.session(session_id)
        check_type(audio, AUDIO_TYPES, "speech upload")
        data = await read_limited(audio, cfg.max_upload_bytes)
        sound, speech = await run_in_threadpool(decode_speech, data, upload_name(audio.filename))
        return await _say(s, sound, speech)

    @app.post("/sessions/{session_id}/say", response_model=m.SpeakResult, responses=ERRORS, tags=["sessions"])
    async def say(session_id: str, body: m.SayRequest):
        s = state.session(session_id)
        if not state.tts.available:
            raise HTTPException(503, state.tts.info()["reason"])
        try:
            sound = await run_in_threadpool(state.tts.synthesize, body.text, body.voice)
        except Exception as e:  # noqa: BLE001
            raise HTTPException(422, f"text to speech failed: {e}") from None
        from ..audio.speech import speech_seconds

        return await _say(s, sound, speech_seconds(sound.samples, sound.sample_rate))

    async def _say(s, sound, speech: float) -> m.SpeakResult:
        try:
            placed = await run_in_threadpool(s.speak, sound)
        except Exception as e:  # noqa: BLE001
            if s.closed:
                raise HTTPException(404, f"live session {s.id} was closed") from None
            raise HTTPException(422, f"cannot speak this audio: {e}") from None
        return m.SpeakResult(utterance=placed["utterance"], start_frame=placed["start_frame"], duration_s=round(sound.duration_s, 3), speech_s=round(speech, 3), cut_latency_ms=placed["cut"]["cut_latency_ms"], state=s.state)

    @app.post("/sessions/{session_id}/interrupt", response_model=m.InterruptResult, responses=ERRORS, tags=["sessions"])
    async def interrupt(session_id: str):
        s = state.session(session_id)
        try:
            info = s.interrupt()
        except Exception:  # noqa: BLE001 - closed in between
            raise HTTPException(404, f"live session {session_id} was closed") from None
        return m.InterruptResult(state=s.state, **{k: info[k] for k in ("interrupted", "cut_frame", "cut_sample", "cut_latency_ms", "dropped_frames")})

    # ------------------------------------------------------------------ WebRTC + WebSocket
    from .webrtc import WebRtcHub
    from .ws import register_ws

    hub = WebRtcHub(state)
    app.state.webrtc = hub

    @app.post("/webrtc/offer", response_model=m.OfferAnswer, responses=ERRORS, tags=["webrtc"])
    async def webrtc_offer(body: m.OfferRequest):
        return await hub.offer(body)

    register_ws(app, state)
    return app


def _parse_size(size: str) -> tuple[int, int]:
    """The avatar upload's `size` field as (w, h); 400 saying what is wrong (the shape, or which
    side breaks geometry.check_output_size, the rule prebake itself applies)."""
    from ..avatar.geometry import check_output_size

    mt = _SIZE.match(size.strip().lower())
    if not mt:
        raise HTTPException(400, f"size must look like WxH, e.g. 512x512, got {size!r}")
    w, h = int(mt.group(1)), int(mt.group(2))
    try:
        check_output_size(w, h)
    except ValueError as e:
        raise HTTPException(400, str(e)) from None
    return w, h


def _probe_visual(upload: SavedUpload, ctype: str) -> None:
    """422 now (not a failed job later) when the upload is not a readable image/video; the
    message names the client's file, never the temp copy."""
    name = upload.name
    if ctype.startswith("image/"):
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(upload.path) as im:
                im.verify()
            with Image.open(upload.path) as im:
                w, h = im.size
                im.load()
        except UnidentifiedImageError:  # its text is only the file's path
            raise HTTPException(422, f"{name} is not a readable image (no image format recognised)") from None
        except (OSError, ValueError, SyntaxError) as e:
            raise HTTPException(422, f"{name} is not a readable image ({e.__class__.__name__}: {upload.explain(e)})") from None
        if w < 64 or h < 64:
            raise HTTPException(422, f"{name} is too small for a face ({w}x{h}; at least 64x64)")
        return
    import av

    try:
        with av.open(str(upload.path)) as c:
            if not c.streams.video:
                raise HTTPException(422, f"{name} has no video stream")
            for _ in c.decode(video=0):
                return
        raise HTTPException(422, f"no frame of {name} can be decoded")
    except av.FFmpegError as e:
        raise HTTPException(422, f"{name} is not a readable video ({upload.explain(e)})") from None
