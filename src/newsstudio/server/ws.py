"""WebSocket protocol for programmatic clients (/ws), and streamed speech into any session
(/sessions/{id}/audio).

/ws, client -> server:
  text  {"type": "start", "avatar": ID, "engine": "auto", "format": "nv12" | "h264",
         "fps": 25, "chunk_frames": 2, "sample_rate": 16000, "pcm": "s16le" | "f32le",
         "on_slow": "close" | "drop"}                       (first message, once)
  bytes PCM speech, mono, at the start message's sample_rate and pcm format; the avatar
        speaks as it arrives (the first chunk after a pause barges in)
  text  {"type": "speech_end"}   the streamed utterance is complete
  text  {"type": "interrupt"}    cut the current speech now
  text  {"type": "close"}        end the session (the server closes with 1000)

/ws, server -> client:
  text  {"type": "started", "session", "width", "height", "fps", "sample_rate", "format", ...}
  bytes a chunk: 4-byte big-endian header length L, L bytes of JSON header, then the frames,
        then the audio. The header carries the stream contract's fields: chunk_idx,
        frame_start, num_frames, is_last, pts (seconds), audio_start (output sample index),
        sample_rate, plus format, width, height, frame_bytes (size of each frame's bytes:
        raw NV12 (H*3/2 x W) or one H.264 Annex-B access unit), audio_format ("f32le"),
        channels (1), audio_samples, state. Chunk k is rendered when its first frame is due on
        the session's media clock (less the server's render_lead_s) and sent when ready, or with
        a render lead (and send_on_clock, the default) when its first frame is due.
  text  {"type": "error", "message"} before a close with a reason; also, with the session
        going on, for a control message of unknown type (the message names it)

/sessions/{id}/audio (?sample_rate=48000&format=s16le|f32le), client -> server: bytes PCM
  speech as on /ws; text {"type": "speech_end"} and {"type": "interrupt"}. Server -> client:
  text {"type": "error", "message"} for a control message of unknown type, as on /ws (the
  socket and the session go on); a malformed message closes the socket with 1008 and a reason.

A client that stops reading: chunks wait in a bounded queue (ws_send_queue chunks). When it
is full the session is closed and freed at once, and the socket is closed with 1008 and a
reason (delivered when the client reads again); with on_slow="drop" the oldest queued chunk
is dropped instead (frame_start then jumps; `dropped` in the header counts them).
"""
from __future__ import annotations

import asyncio
import json
import logging
import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from fastapi import FastAPI, HTTPException, WebSocket, WebSocketDisconnect

from ..frame_rate import frame_rate_error
from ..live import LiveSession, SessionError
from ..media.audio import check_finite
from .speech_intake import SpeechIntake
from .state import ServerState
from .video import H264Encoder
from .ws_direct import DirectBinarySender

log = logging.getLogger("newsstudio.server")

CLOSE_NORMAL = 1000
CLOSE_UNSUPPORTED = 1003
CLOSE_POLICY = 1008
CLOSE_INTERNAL = 1011
CLOSE_TRY_LATER = 1013
CLOSE_NOT_FOUND = 4404
MAX_PCM_MESSAGE = 1 << 20
LATE_S = 0.25
STREAM_FORMATS = ("nv12", "h264")  # what a client may ask the chunks to be


#: Control messages (text, {"type": ...}) each socket takes.
WS_CONTROLS = ("speech_end", "interrupt", "close")
AUDIO_CONTROLS = ("speech_end", "interrupt")


class _Slow(Exception):
    pass


def unknown_message(kind: Any, known: tuple[str, ...]) -> dict[str, str]:
    """The reply to a control message of unknown type, the same on every socket: an error that
    names it, while the session goes on (a newer client's message or a typo should not cost the
    stream, yet should not pass unnoticed either)."""
    return {"type": "error", "message": f"unknown message type {kind!r}; the session goes on (known: {', '.join(known)})"}


def _adjacent_runs(payload: tuple[bytes | torch.Tensor, ...]) -> list[bytes | torch.Tensor]:
    """``payload`` with each run of tensors that lie back to back in one buffer (a chunk's frames
    are rows of the host tensor their request was copied into) as one flat byte view: one copy
    per run instead of ~5 torch calls per frame, each a GIL hand-off on a busy server."""
    out: list[bytes | torch.Tensor] = []
    for p in payload:
        prev = out[-1] if out else None
        if (isinstance(p, torch.Tensor) and isinstance(prev, torch.Tensor) and p.is_contiguous() and p.device.type == "cpu"
                and prev.device.type == "cpu" and p.untyped_storage().data_ptr() == prev.untyped_storage().data_ptr()
                and p.data_ptr() == prev.data_ptr() + prev.numel() * prev.element_size()):
            flat = prev.view(torch.uint8).reshape(-1) if prev.dtype != torch.uint8 or prev.dim() != 1 else prev
            out[-1] = torch.as_strided(flat, (flat.numel() + p.numel() * p.element_size(),), (1,), flat.storage_offset())
        else:
            out.append(p if not isinstance(p, torch.Tensor) or p.is_contiguous() else p.contiguous())
    return out


def _uninitialised(size: int) -> np.ndarray:
    return np.empty(size, np.uint8)


def _pack(header: dict[str, Any], *payload: bytes | torch.Tensor,
          allocate: Callable[[int], np.ndarray] = _uninitialised) -> memoryview:
    """The chunk message in one buffer, each payload copied once. Frames come as CPU uint8
    tensors and are copied by torch with the GIL released: 10 raw 1080x1080 streams at 30 fps are
    ~0.5 GB/s, and copies made under the GIL (tobytes, joins; four per chunk before) hold up every
    other server thread meanwhile. Frames adjacent in memory are copied as one run. The buffer is
    not zeroed first: a ``bytearray`` of a 7 MB chunk is, under the GIL (~0.3 ms on a render thread
    of the dev machine, every chunk; `benchmarks/chunk_pack_cost.py`, which passes ``allocate``),
    and every byte of it is written here anyway."""
    payload = tuple(_adjacent_runs(payload))
    h = json.dumps(header, separators=(",", ":")).encode()
    sizes = [p.numel() * p.element_size() if isinstance(p, torch.Tensor) else len(p) for p in payload]
    out = allocate(4 + len(h) + sum(sizes))
    struct.pack_into(">I", out, 0, len(h))
    out[4:4 + len(h)] = np.frombuffer(h, np.uint8)
    pos = 4 + len(h)
    for p, size in zip(payload, sizes):
        if size and isinstance(p, torch.Tensor):
            flat = p if p.dtype == torch.uint8 and p.dim() == 1 else p.view(torch.uint8).reshape(-1)  # contiguous: _adjacent_runs
            torch.from_numpy(out[pos:pos + size]).copy_(flat)
        elif size:
            out[pos:pos + size] = np.frombuffer(p, np.uint8)
        pos += size
    return memoryview(out)


def _pcm(data: bytes, fmt: str) -> np.ndarray:
    """A PCM message's samples; ValueError (the socket is closed with it) for a malformed one:
    a cut-off sample, or f32le samples that are NaN or infinite (they would play as noise)."""
    if fmt == "f32le":
        if len(data) % 4:
            raise ValueError("f32le PCM messages must hold a whole number of 4-byte samples")
        samples = np.frombuffer(data, "<f4")
        check_finite(samples, "f32le PCM message")
        return samples
    if len(data) % 2:
        raise ValueError("s16le PCM messages must hold a whole number of 2-byte samples")
    return np.frombuffer(data, "<i2")


def register_ws(app: FastAPI, state: ServerState) -> None:
    @app.websocket("/ws")
    async def ws_session(ws: WebSocket) -> None:
        await ws.accept()
        await WsSession(ws, state).run()

    @app.websocket("/sessions/{session_id}/audio")
    async def ws_audio(ws: WebSocket, session_id: str, sample_rate: int = 48000, format: str = "s16le") -> None:
        """Streamed speech (binary PCM messages) into a session, e.g. one watched over WebRTC."""
        await ws.accept()
        try:
            session = state.session(session_id)
        except HTTPException as e:
            await ws.close(CLOSE_NOT_FOUND, e.detail[:120])
            return
        if format not in ("s16le", "f32le") or not 8000 <= sample_rate <= 192000:
            await ws.close(CLOSE_POLICY, "format must be s16le or f32le and sample_rate 8000..192000")
            return
        intake = state.speech_intake(session, sample_rate)
        feeder = asyncio.ensure_future(intake.feed())
        reader = asyncio.ensure_future(_read_speech(ws, intake, format))
        error: BaseException | None = None
        try:
            await asyncio.wait([reader, feeder], return_when=asyncio.FIRST_COMPLETED)
            if reader.done():  # the client left, or sent a malformed message
                error = reader.exception()
                intake.end()  # what arrived before plays out (in order, after the push in progress), then idle
                intake.close()
            try:
                await feeder
            except (ValueError, SessionError) as e:  # a failed push: end the utterance here instead
                error = error or e
                try:
                    await asyncio.get_running_loop().run_in_executor(state.speech_pool, session.end_speech)
                except SessionError:
                    pass
            if isinstance(error, (ValueError, SessionError)):
                await _close(ws, CLOSE_POLICY, str(error))
            elif error is not None:
                raise error
        finally:
            reader.cancel()
            feeder.cancel()


async def _read_speech(ws: WebSocket, intake: SpeechIntake, fmt: str) -> None:
    """Queue the PCM and control messages of /sessions/{id}/audio until the client disconnects."""
    while True:
        msg = await ws.receive()
        if msg["type"] == "websocket.disconnect":
            return
        if msg.get("bytes") is not None:
            intake.pcm(_pcm(msg["bytes"], fmt))
            await intake.room()
        elif msg.get("text") is not None:
            d = json.loads(msg["text"])
            kind = d.get("type") if isinstance(d, dict) else None
            if kind == "speech_end":
                intake.end()
            elif kind == "interrupt":
                intake.interrupt()
            else:  # as on /ws: say so, the socket and the session go on
                await ws.send_text(json.dumps(unknown_message(kind, AUDIO_CONTROLS)))


async def _close(ws: WebSocket, code: int, reason: str) -> None:
    try:
        await ws.close(code, reason[:120])
    except Exception:  # noqa: BLE001 - already gone
        pass


class WsSession:
    def __init__(self, ws: WebSocket, state: ServerState):
        self.ws = ws
        self.state = state
        self.session: LiveSession | None = None
        self.intake: SpeechIntake | None = None
        self.queue: asyncio.Queue[tuple[bool, bytes | memoryview]] | None = None  # (is_text, payload)
        # (due media time, is_text, payload) waiting for their time when chunks are sent on the clock
        self.held: asyncio.Queue[tuple[float, bool, bytes | memoryview]] = asyncio.Queue()
        self.on_clock = state.cfg.send_on_clock and state.cfg.render_lead_s > 0  # fixed for the session
        self.opts: dict[str, Any] = {}
        self.dropped = 0
        self.closing: tuple[int, str] | None = None

    async def run(self) -> None:
        tasks: list[asyncio.Task] = []
        try:
            start = await asyncio.wait_for(self.ws.receive(), timeout=30)
            if start["type"] == "websocket.disconnect":
                return
            self.opts = self._parse_start(start)
            loop = asyncio.get_running_loop()
            try:
                self.session = await loop.run_in_executor(None, self.state.open_session, self.opts["avatar"], self.opts["engine"], self.opts["fps"], "ws")
            except HTTPException as e:
                retry = bool(e.headers and "Retry-After" in e.headers)  # the session cap: try again later
                code = CLOSE_NOT_FOUND if e.status_code == 404 else CLOSE_TRY_LATER if retry else CLOSE_POLICY
                await self._error_close(code, e.detail)
                return
            s = self.session
            self.queue = asyncio.Queue(maxsize=max(1, self.state.cfg.ws_send_queue))
            await self.ws.send_text(json.dumps({
                "type": "started", "session": s.id, "width": s.width, "height": s.height, "fps": float(s.fps),
                "sample_rate": s.out_rate, "audio_format": "f32le", "channels": 1, "format": self.opts["format"],
                "chunk_frames": self.opts["chunk_frames"], "engine": s.engine_name, "avatar": s.avatar_id,
            }))
            self.intake = self.state.speech_intake(s, self.opts["sample_rate"],
                                                   on_interrupted=lambda info: self._text({"type": "interrupted", **info}))
            tasks = [asyncio.ensure_future(self._pump()), asyncio.ensure_future(self._send()),
                     asyncio.ensure_future(self._receive()), asyncio.ensure_future(self._feed())]
            if self.on_clock:
                tasks.append(asyncio.ensure_future(self._release()))
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            failed = next((t.exception() for t in done if t.exception() is not None), None)
            if failed is not None:
                raise failed
        except asyncio.TimeoutError:
            await self._error_close(CLOSE_POLICY, "no start message within 30 s")
        except _Protocol as e:
            self.closing = (e.code, str(e))
        except _Slow:
            self._slow()
        except WebSocketDisconnect:
            pass
        except Exception as e:  # noqa: BLE001 - a failure inside one session ends that session, with a reason
            log.exception("ws session failed")
            self.closing = (CLOSE_INTERNAL, f"internal error: {type(e).__name__}: {e}"[:120])
        finally:
            for t in tasks:
                t.cancel()
            if self.session is not None:
                self.session.close()
            # no reference cycle left for the collector (which may not run for minutes): the intake's
            # interrupt callback refers back to this object, and the tasks hold their errors, whose
            # tracebacks hold this frame
            self.intake = None
            tasks.clear()
            done = failed = None  # noqa: F841
            if self.closing is not None:
                code, reason = self.closing
                if code != CLOSE_NORMAL:
                    await self._send_error_text(reason)
                # the session is already freed; the reason reaches a stalled client when (if) it reads again
                try:
                    await asyncio.wait_for(_close(self.ws, code, reason), timeout=self.state.cfg.ws_close_timeout_s)
                except asyncio.TimeoutError:
                    pass

    async def _send_error_text(self, message: str) -> None:
        if self.closing is not None and self.closing[0] == CLOSE_POLICY and message.startswith("client too slow"):
            return  # it is not reading: only the close frame is worth queueing behind the stall
        try:
            await asyncio.wait_for(self.ws.send_text(json.dumps({"type": "error", "message": message})), timeout=2)
        except Exception:  # noqa: BLE001
            pass

    def _parse_start(self, msg: dict) -> dict[str, Any]:
        if msg.get("text") is None:
            raise _Protocol(CLOSE_POLICY, 'send {"type": "start", "avatar": ...} as the first (text) message')
        try:
            d = json.loads(msg["text"])
        except ValueError:
            raise _Protocol(CLOSE_UNSUPPORTED, "the first message is not valid JSON") from None
        if not isinstance(d, dict) or d.get("type") != "start":
            raise _Protocol(CLOSE_POLICY, 'the first message must be {"type": "start", ...}')
        fmt = d.get("format", "nv12")
        if fmt not in STREAM_FORMATS:
            raise _Protocol(CLOSE_POLICY, f"format must be one of {', '.join(STREAM_FORMATS)}, got {fmt!r}")
        pcm = d.get("pcm", "s16le")
        if pcm not in ("s16le", "f32le"):
            raise _Protocol(CLOSE_POLICY, f"pcm must be 's16le' or 'f32le', got {pcm!r}")
        try:
            chunk = int(d.get("chunk_frames", 2))
            sr = int(d.get("sample_rate", 16000))
            fps = d.get("fps")
            fps = float(fps) if fps is not None else None
        except (TypeError, ValueError):
            raise _Protocol(CLOSE_POLICY, "chunk_frames, sample_rate and fps must be numbers") from None
        if not 1 <= chunk <= 64 or not 8000 <= sr <= 192000:
            raise _Protocol(CLOSE_POLICY, "chunk_frames must be 1..64 and sample_rate 8000..192000")
        if fps is not None and (error := frame_rate_error(fps)) is not None:
            raise _Protocol(CLOSE_POLICY, error)
        on_slow = d.get("on_slow", "close")
        if on_slow not in ("close", "drop"):
            raise _Protocol(CLOSE_POLICY, "on_slow must be 'close' or 'drop'")
        avatar = d.get("avatar")
        if not isinstance(avatar, str):
            raise _Protocol(CLOSE_POLICY, "start needs an avatar id")
        return {"avatar": avatar, "engine": d.get("engine", "auto"), "format": fmt, "pcm": pcm, "chunk_frames": chunk, "sample_rate": sr, "fps": fps, "on_slow": on_slow}

    async def _error_close(self, code: int, message: str) -> None:
        try:
            await self.ws.send_text(json.dumps({"type": "error", "message": message}))
        except Exception:  # noqa: BLE001
            pass
        await _close(self.ws, code, message)

    async def _receive(self) -> None:
        """Read the client's messages: speech and its controls go to the intake (in order; the
        reader never waits on the engine), close and protocol errors end the session."""
        intake = self.intake
        assert intake is not None
        while self.closing is None:
            msg = await self.ws.receive()
            if msg["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(msg.get("code", 1000))
            if msg.get("bytes") is not None:
                data = msg["bytes"]
                if len(data) > MAX_PCM_MESSAGE:
                    raise _Protocol(CLOSE_POLICY, f"PCM messages are limited to {MAX_PCM_MESSAGE} bytes")
                try:
                    intake.pcm(_pcm(data, self.opts["pcm"]))
                except ValueError as e:
                    raise _Protocol(CLOSE_POLICY, str(e)) from None
                await intake.room()  # a client far ahead of the engine waits on the socket's flow control
                continue
            try:
                d = json.loads(msg.get("text") or "")
            except ValueError:
                raise _Protocol(CLOSE_UNSUPPORTED, "control messages must be JSON") from None
            kind = d.get("type") if isinstance(d, dict) else None
            if kind == "speech_end":
                intake.end()
            elif kind == "interrupt":
                intake.interrupt()  # replies "interrupted" once done
            elif kind == "close":
                self.closing = (CLOSE_NORMAL, "closed by the client")
                return
            elif kind == "start":
                raise _Protocol(CLOSE_POLICY, "the session is already started")
            else:  # a newer client's message, or a typo: say so, the stream goes on
                await self._text(unknown_message(kind, WS_CONTROLS))

    async def _feed(self) -> None:
        """Push the queued speech into the session (off the event loop, see speech_intake.py)."""
        assert self.intake is not None
        try:
            await self.intake.feed()
        except ValueError as e:  # speech the engine cannot take (e.g. an unusable sample rate)
            raise _Protocol(CLOSE_POLICY, str(e)) from None

    async def _text(self, obj: dict) -> None:
        # control replies go through the same queues as the chunks, in order with them
        await self._out(json.dumps(obj).encode(), text=True)

    async def _out(self, payload: bytes | memoryview, text: bool = False, due: float = 0.0) -> None:
        """Send `payload` (in order with everything before it) once media time `due` has come,
        when chunks go out on the clock; else as soon as possible."""
        if self.on_clock:
            self.held.put_nowait((due, text, payload))  # as many as the render lead covers
        else:
            await self._enqueue(payload, text)

    async def _release(self) -> None:
        """Move held chunks to the send queue when they are due."""
        s = self.session
        assert s is not None
        while True:
            due, text, payload = await self.held.get()
            await s.clock.sleep_until(due)
            await self._enqueue(payload, text)

    async def _enqueue(self, payload: bytes | memoryview, text: bool = False) -> None:
        q = self.queue
        assert q is not None
        item = (text, payload)
        try:
            q.put_nowait(item)
        except asyncio.QueueFull:
            if self.opts.get("on_slow") == "drop":
                try:
                    q.get_nowait()
                    self.dropped += 1
                except asyncio.QueueEmpty:
                    pass
                q.put_nowait(item)
                return
            raise _Slow() from None

    async def _pump(self) -> None:
        """Render chunk after chunk on the media clock and queue them for sending."""
        s = self.session
        assert s is not None
        loop = asyncio.get_running_loop()
        clock = s.clock
        n = self.opts["chunk_frames"]
        h264 = H264Encoder(s.width, s.height, s.fps, threads=self.state.h264_threads) if self.opts["format"] == "h264" else None
        k = clock.next_frame(clock.now())
        idx = 0
        try:
            while not s.closed:
                await clock.sleep_until(clock.video_time(k) - self.state.cfg.render_lead_s)
                now = clock.now()
                if clock.video_time(k) < now - LATE_S and not s.has_frames(k, n):
                    # Stalled, overloaded, or the clock jumped: skip ahead, stay live. Only where a
                    # render is due anyway: frames rendered ahead go out (late) rather than be thrown
                    # away, since an overloaded server that discards work falls further behind (CPU,
                    # 8 sessions over capacity: a third of the renders wasted). The skip goes to the
                    # frame this pump would be rendering now had it kept up, a render lead ahead (to
                    # the frame due now, its chunk was a whole render late again: 10-12 MuseTalk
                    # sessions skipped 110-140 frames per 20 s on an H200, fifteenth session).
                    k = clock.next_frame(now + self.state.cfg.render_lead_s)
                message = await loop.run_in_executor(self.state.render_pool, self._chunk_message, k, n, idx, h264)
                await self._out(message, due=clock.video_time(k))
                self.state.metrics.add_frames(n)
                k += n
                idx += 1
        except _Slow:
            self._slow()
        except SessionError:
            pass
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001
            log.exception("ws pump failed")
            self.closing = (1011, f"internal error while rendering: {type(e).__name__}: {e}"[:120])
        finally:
            if h264 is not None:  # on a render thread: it waits for a frame still being encoded there
                try:
                    self.state.render_pool.submit(h264.close)
                except RuntimeError:  # the pool is shut down (server exit): nothing is encoding any more
                    h264.close()

    def _chunk_message(self, k: int, n: int, idx: int, h264: H264Encoder | None) -> memoryview:
        """Frames [k, k+n) rendered, encoded (H.264) or raw, with their audio, as one chunk message.
        Runs on a render thread: the event loop only queues and sends the finished buffer."""
        s = self.session
        assert s is not None
        clock = s.clock
        frames = s.video_frames(k, n, stack=False)
        a0, a1 = clock.frame_sample(k), clock.frame_sample(k + n)
        audio = s.audio_samples(a0, a1 - a0)
        if h264 is not None:
            parts: list[bytes] | list[torch.Tensor] = [h264.encode(f.numpy(), k + i) for i, f in enumerate(frames)]
        else:
            parts = frames
        sizes = [len(p) if isinstance(p, bytes) else p.numel() for p in parts]
        header = {
            "type": "chunk", "session": s.id, "chunk_idx": idx, "frame_start": k, "num_frames": n, "is_last": False,
            "pts": [float(clock.video_time(k + i)) for i in range(n)], "format": self.opts["format"],
            "width": s.width, "height": s.height, "frame_bytes": sizes,
            "audio_start": a0, "audio_samples": int(audio.size), "sample_rate": s.out_rate, "audio_format": "f32le",
            "channels": 1, "state": s.state, "dropped": self.dropped,
        }
        return _pack(header, *parts, audio.astype("<f4").tobytes())

    def _slow(self) -> None:
        n = self.state.cfg.ws_send_queue
        self.state.metrics.ws_slow_closes += 1
        log.info("ws session %s: client not reading (%d chunks queued); closing", self.session.id if self.session else "?", n)
        if self.session is not None:
            self.session.close()  # free it now, not when the socket finally goes
        self.closing = (CLOSE_POLICY, f"client too slow: {n} chunks queued unsent (send queue full); session closed")

    async def _send(self) -> None:
        q = self.queue
        assert q is not None
        direct = DirectBinarySender(self.ws, socket_writes=self.state.cfg.ws_socket_writes)  # ws_direct.py
        while True:
            text, payload = await q.get()
            if text:
                await self.ws.send_text(bytes(payload).decode())
            elif not await direct.send(payload):
                await self.ws.send_bytes(payload)


class _Protocol(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
