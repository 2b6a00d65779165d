"""WebRTC with aiortc: the browser offers, the server answers with a video and an audio track
fed from a live session.

Both tracks are paced by the session's media clock: video frame k goes out when k/fps is
due with pts k * 90000/fps, audio block s (20 ms, 960 samples at 48 kHz, s16) when s/48000 is
due with pts s. Positions are counters, so pacing never accumulates sleep error, and both
tracks start on the same frame boundary, so the receiver's RTP timestamps (which aiortc
makes relative to each track's first packet) line up. A track that falls behind the clock by
more than LATE_S (a stalled event loop, a jumped clock) skips ahead instead of bursting; video
first sends the frames the session has rendered already (at most render_ahead - 1), so no render
work is thrown away (an overloaded server that discards work falls further behind).

A data channel (any label) carries control: {"type": "interrupt"}, {"type": "ping", "t": ..}
(answered with "pong", for round-trip time), {"type": "speech_end"}; binary messages are
streamed speech as s16le mono PCM at 48 kHz. The server sends {"type": "state", ...} on it
four times a second.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from fractions import Fraction

import av
import numpy as np
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from fastapi import HTTPException

from ..live import LiveSession, SessionError
from . import models as m
from .state import ServerState
from .video import video_frame

log = logging.getLogger("newsstudio.server")
LATE_S = 0.25
AUDIO_BLOCK = 960  # 20 ms at 48 kHz
VIDEO_CLOCK = 90000


class _Origin:
    """The frame boundary both tracks of a peer start on (fixed at the first pull of either)."""

    def __init__(self, session: LiveSession):
        self.session = session
        self.frame: int | None = None

    def get(self) -> int:
        if self.frame is None:
            c = self.session.clock
            self.frame = c.next_frame(c.now()) + 1  # one frame of lead: the first frame is never late
        return self.frame


class SessionVideoTrack(MediaStreamTrack):
    kind = "video"

    def __init__(self, session: LiveSession, origin: _Origin, state: ServerState):
        super().__init__()
        self.session = session
        self.origin = origin
        self.state = state
        self.next: int | None = None
        self.sent = 0
        self.skipped = 0

    async def recv(self) -> av.VideoFrame:
        s = self.session
        if self.readyState != "live" or s.closed:
            raise MediaStreamError
        clock = s.clock
        k = self.next if self.next is not None else self.origin.get()
        now = clock.now()
        if clock.video_time(k) < now - LATE_S and not s.has_frames(k, 1):  # frames rendered ahead go out, not to waste
            k2 = clock.next_frame(now)
            self.skipped += k2 - k
            k = k2
        loop = asyncio.get_running_loop()
        try:
            nv12 = await loop.run_in_executor(self.state.render_pool, s.video_frame, k)  # rendered ahead of its due time
        except SessionError:
            self.stop()
            raise MediaStreamError from None
        await clock.sleep_until(clock.video_time(k))
        # as NV12: aiortc's encoders convert it to I420 on their own executor thread, not on this event loop
        frame = video_frame(nv12.numpy(), "nv12")
        frame.pts = clock.video_pts(k, VIDEO_CLOCK)
        frame.time_base = Fraction(1, VIDEO_CLOCK)
        self.next = k + 1
        self.sent += 1
        self.state.metrics.add_frames(1)
        return frame


class SessionAudioTrack(MediaStreamTrack):
    kind = "audio"

    def __init__(self, session: LiveSession, origin: _Origin):
        super().__init__()
        self.session = session
        self.origin = origin
        self.next: int | None = None
        self.sent = 0

    async def recv(self) -> av.AudioFrame:
        s = self.session
        if self.readyState != "live" or s.closed:
            raise MediaStreamError
        clock = s.clock
        pos = self.next if self.next is not None else clock.frame_sample(self.origin.get())
        now = clock.now()
        if clock.audio_time(pos) < now - LATE_S:
            pos = clock.frame_sample(clock.next_frame(now))
        await clock.sleep_until(clock.audio_time(pos))
        try:
            pcm = s.audio_samples(pos, AUDIO_BLOCK)
        except SessionError:
            self.stop()
            raise MediaStreamError from None
        i16 = np.clip(np.rint(pcm * 32768.0), -32768, 32767).astype(np.int16)
        frame = av.AudioFrame.from_ndarray(i16[None, :], format="s16", layout="mono")
        frame.sample_rate = s.out_rate
        frame.pts = pos
        frame.time_base = Fraction(1, s.out_rate)
        self.next = pos + AUDIO_BLOCK
        self.sent += 1
        return frame


class WebRtcHub:
    """Peer connections by session id; closing either side closes the other."""

    def __init__(self, state: ServerState):
        self.state = state
        self.peers: dict[str, RTCPeerConnection] = {}

    async def offer(self, body: m.OfferRequest) -> m.OfferAnswer:
        sdp = body.sdp
        if not sdp.lstrip().startswith("v=0") or "\nm=" not in sdp.replace("\r\n", "\n"):
            raise HTTPException(400, "malformed SDP offer: expected a session description starting with 'v=0' and holding m= lines")
        kinds = {line.split()[0][2:] for line in sdp.replace("\r\n", "\n").split("\n") if line.startswith("m=") and len(line.split()) > 1}
        if not {"audio", "video"} <= kinds:
            raise HTTPException(400, f"the offer must receive video and audio (m=video and m=audio lines); it has: {', '.join(sorted(kinds)) or 'none'}")
        state = self.state
        loop = asyncio.get_running_loop()
        session = await loop.run_in_executor(None, state.open_session, body.avatar, body.engine, body.fps, "webrtc")
        pc = RTCPeerConnection()
        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type=body.type))
            origin = _Origin(session)
            pc.addTrack(SessionVideoTrack(session, origin, state))
            pc.addTrack(SessionAudioTrack(session, origin))
            answer = await pc.createAnswer()
            await pc.setLocalDescription(answer)
        except Exception as e:  # noqa: BLE001 - aiortc raises many kinds for a bad SDP
            await pc.close()
            session.close()
            raise HTTPException(400, f"malformed SDP offer: {type(e).__name__}: {e}") from None
        self.peers[session.id] = pc
        self._wire(pc, session)
        return m.OfferAnswer(sdp=pc.localDescription.sdp, type="answer", session_id=session.id, width=session.width, height=session.height, fps=float(session.fps))

    def _wire(self, pc: RTCPeerConnection, session: LiveSession) -> None:
        state = self.state

        @pc.on("connectionstatechange")
        async def _changed() -> None:
            if pc.connectionState in ("failed", "closed"):
                await self.close_session(session.id)

        @pc.on("datachannel")
        def _channel(channel) -> None:
            async def push_state() -> None:
                while channel.readyState in ("connecting", "open") and not session.closed:
                    if channel.readyState == "open":
                        try:
                            channel.send(json.dumps({"type": "state", **session.info()}))
                        except Exception:  # noqa: BLE001
                            return
                    await asyncio.sleep(0.25)

            task = asyncio.ensure_future(push_state())
            channel.on("close", task.cancel)

            def report(e: Exception) -> None:
                if not isinstance(e, (ValueError, SessionError)):  # the peer may be gone; the session's close handles the rest
                    log.error("session %s: speech input failed", session.id, exc_info=e)
                    return
                try:
                    channel.send(json.dumps({"type": "error", "message": str(e)}))
                except Exception:  # noqa: BLE001
                    pass

            async def interrupted(info: dict) -> None:
                channel.send(json.dumps({"type": "interrupted", **info}))

            # speech input in arrival order, off the event loop, never a backlog (speech_intake.py)
            intake = state.speech_intake(session, 48000, on_interrupted=interrupted, on_error=report)
            consumer = asyncio.ensure_future(intake.feed())
            channel.on("close", consumer.cancel)

            @channel.on("message")
            def _message(msg) -> None:
                try:
                    if isinstance(msg, (bytes, bytearray)):
                        if len(msg) % 2:
                            return
                        intake.pcm(np.frombuffer(bytes(msg), "<i2"))
                        return
                    data = json.loads(msg)
                    kind = data.get("type")
                    if kind == "interrupt":
                        intake.interrupt()
                    elif kind == "speech_end":
                        intake.end()
                    elif kind == "ping":
                        channel.send(json.dumps({"type": "pong", "t": data.get("t"), "server_time": time.time()}))
                except ValueError as e:
                    report(e)

        async def watchdog() -> None:
            await asyncio.sleep(state.cfg.webrtc_connect_timeout_s)
            if pc.connectionState != "connected" and session.id in self.peers:
                log.info("session %s: peer never connected; closing", session.id)
                await self.close_session(session.id)

        asyncio.ensure_future(watchdog())

    async def close_session(self, session_id: str) -> None:
        pc = self.peers.pop(session_id, None)
        try:
            s = self.state.sessions.get(session_id)
        except KeyError:
            s = None
        if s is not None:
            s.close()
        if pc is not None:
            await pc.close()

    async def close_all(self) -> None:
        for sid in list(self.peers):
            await self.close_session(sid)
