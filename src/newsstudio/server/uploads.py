"""Upload limits and checks: a body-size cap enforced while the body streams in, content-type
rules per upload kind, and audio decoding that turns every bad file into a clear 4xx."""
from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

from fastapi import HTTPException, UploadFile
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..audio.speech import require_speech
from ..media.audio import Audio, load_audio
from ..media.errors import MediaError

AUDIO_TYPES = ("audio/", "video/")  # the audio track of a video file is fine too
AUDIO_EXTRA = ("application/octet-stream", "application/ogg")
IMAGE_TYPES = ("image/",)
VIDEO_TYPES = ("video/",)
DRAIN_CAP = 256 << 20  # read (and discard) at most this much of an oversized body to answer cleanly


class BodyLimitMiddleware:
    """413 for request bodies over `limit` bytes, whether announced by Content-Length or not.

    The body is counted as it streams, so an oversized upload is never held in memory or on
    disk: once over the limit, the rest is read and thrown away (up to DRAIN_CAP, so the
    client gets a clean answer instead of a reset) and the app's own answer is replaced."""

    def __init__(self, app: ASGIApp, limit: int):
        self.app = app
        self.limit = int(limit)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._drain(receive, int(declared))
            await self._reject(send, int(declared))
            return
        state = {"n": 0, "over": False, "sent": False}

        async def counted() -> Message:
            msg = await receive()
            if msg["type"] == "http.request":
                state["n"] += len(msg.get("body", b""))
                if state["n"] > self.limit and not state["over"]:
                    state["over"] = True
                    if msg.get("more_body"):
                        await self._drain(receive, DRAIN_CAP)
                    raise _TooLarge()
            return msg

        async def guarded_send(msg: Message) -> None:
            if state["over"]:
                if not state["sent"]:
                    state["sent"] = True
                    await self._reject(send, state["n"])
                return
            await send(msg)

        try:
            await self.app(scope, counted, guarded_send)
        except _TooLarge:
            pass
        if state["over"] and not state["sent"]:
            state["sent"] = True
            await self._reject(send, state["n"])

    async def _drain(self, receive: Receive, cap: int) -> None:
        n = 0
        while n < cap:
            msg = await receive()
            if msg["type"] != "http.request":
                return
            n += len(msg.get("body", b""))
            if not msg.get("more_body"):
                return

    async def _reject(self, send: Send, size: int) -> None:
        body = json.dumps({"detail": f"upload too large: the limit is {self.limit} bytes ({self.limit / 1e6:.1f} MB)"}).encode()
        await send({"type": "http.response.start", "status": 413, "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    pass


def check_type(upload: UploadFile, allowed: tuple[str, ...], what: str, extra: tuple[str, ...] = ()) -> str:
    ctype = (upload.content_type or "").split(";")[0].strip().lower()
    if not ctype or not (ctype.startswith(allowed) or ctype in extra):
        raise HTTPException(415, f"{what}: unsupported content type {ctype or '(none)'!r}; send {' or '.join(a + '*' for a in allowed)}")
    return ctype


async def read_limited(upload: UploadFile, limit: int) -> bytes:
    data = await upload.read(limit + 1)
    if len(data) > limit:
        raise HTTPException(413, f"upload too large: the limit is {limit} bytes ({limit / 1e6:.1f} MB)")
    return data


async def save_upload(upload: UploadFile, folder: Path, limit: int) -> Path:
    """Copy an upload to a fresh file in `folder` (removed again on any failure)."""
    folder.mkdir(parents=True, exist_ok=True)
    suffix = Path(upload.filename or "").suffix.lower()
    if not suffix or len(suffix) > 8 or not suffix[1:].isalnum():
        suffix = ""
    path = folder / f"upload-{uuid.uuid4().hex}{suffix}"
    n = 0
    try:
        with open(path, "xb") as f:
            while block := await upload.read(1 << 20):
                n += len(block)
                if n > limit:
                    raise HTTPException(413, f"upload too large: the limit is {limit} bytes ({limit / 1e6:.1f} MB)")
                f.write(block)
        if n == 0:
            raise HTTPException(422, "the uploaded file is empty (0 bytes)")
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


def decode_speech(data: bytes, name: str) -> tuple[Audio, float]:
    """Decode uploaded speech; 422 with the reason for empty, corrupt, or speech-free audio."""
    if not data:
        raise HTTPException(422, f"{name}: the uploaded file is empty (0 bytes)")
    try:
        audio = load_audio(data)
        return audio, require_speech(audio, name)
    except MediaError as e:
        raise HTTPException(422, f"{name}: {e.reason}") from None


def move_aside(path: Path) -> Path:
    """Take a folder away from readers atomically (a rename); the caller removes the result."""
    trash = path.with_name(f".trash-{path.name}-{uuid.uuid4().hex[:8]}")
    os.replace(path, trash)
    return trash
