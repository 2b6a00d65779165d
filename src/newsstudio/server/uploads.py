"""Upload limits and checks: a body-size cap enforced while the body streams in, content-type
rules per upload kind, and audio decoding that turns every bad file into a clear 4xx."""
from __future__ import annotations

import json
import mimetypes
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path

from fastapi import HTTPException, UploadFile
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..audio.speech import require_speech
from ..media.audio import Audio, load_audio
from ..media.errors import MediaError

AUDIO_TYPES = ("audio/", "video/", "application/ogg")  # the audio track of a video file is fine too
IMAGE_TYPES = ("image/",)
VIDEO_TYPES = ("video/",)
#: Content types that say nothing about the file (curl -F and many clients send them for a file
#: they do not know): the file name's extension says what it is then.
GENERIC_TYPES = ("", "application/octet-stream", "binary/octet-stream")
FORM_OVERHEAD = 1 << 20  # multipart framing and form fields, allowed on top of the upload limit
DRAIN_CAP = 256 << 20  # read (and discard) at most this much of an oversized body to answer cleanly

# Python's own extension table, not the host's /etc/mime.types, so every server answers the same;
# plus the media extensions it lacks.
_EXTENSIONS = mimetypes.MimeTypes(filenames=())
for _ext, _type in ((".m4a", "audio/mp4"), (".flac", "audio/flac"), (".ogg", "audio/ogg"), (".oga", "audio/ogg"),
                    (".mkv", "video/x-matroska"), (".m4v", "video/mp4"), (".webp", "image/webp")):
    _EXTENSIONS.add_type(_type, _ext)
_EXAMPLES = {"image/": ".png", "video/": ".mp4", "audio/": ".wav"}  # for the 415's advice


def too_large(limit: int) -> str:
    """The 413 text: the limit the operator set, in its unit (serve --max-upload-mb counts MB of
    2**20 bytes), whichever check (body stream, file read) noticed."""
    return f"upload too large: the limit is {limit / (1 << 20):.4g} MB"


class BodyLimitMiddleware:
    """413 for request bodies over `upload_limit` bytes plus FORM_OVERHEAD, whether announced by
    Content-Length or not; the message states `upload_limit` (what the operator configured).

    The body is counted as it streams, so an oversized upload is never held in memory or on
    disk: once over the limit, the rest is read and thrown away (up to DRAIN_CAP, so the
    client gets a clean answer instead of a reset) and the app's own answer is replaced."""

    def __init__(self, app: ASGIApp, upload_limit: int):
        self.app = app
        self.upload_limit = int(upload_limit)
        self.limit = self.upload_limit + FORM_OVERHEAD

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
        body = json.dumps({"detail": too_large(self.upload_limit)}).encode()
        await send({"type": "http.response.start", "status": 413, "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    pass


def check_type(upload: UploadFile, allowed: tuple[str, ...], what: str) -> str:
    """The upload's content type, one of `allowed` (prefixes such as "image/"), else 415.

    The one rule of every upload: a generic type (GENERIC_TYPES) is replaced by the type the
    file name's extension names, so `curl -F file=@talk.mp4` is a video/mp4 upload and
    `curl -F audio=@speech.wav` an audio one, while a generic type with an unknown extension is
    refused like any other type nothing here reads."""
    declared = (upload.content_type or "").split(";")[0].strip().lower()
    ctype = declared
    if declared in GENERIC_TYPES:
        ctype = _EXTENSIONS.guess_type(client_file_name(upload.filename))[0] or ""
    if not ctype or not ctype.startswith(allowed):
        wanted = " or ".join(a + "*" if a.endswith("/") else a for a in allowed)
        how = f"send {wanted}"
        if declared in GENERIC_TYPES:
            examples = ", ".join(e for prefix, e in _EXAMPLES.items() if prefix in allowed)
            how += f" (or a file name whose extension says which, e.g. {examples})"
        raise HTTPException(415, f"{what}: unsupported content type {declared or '(none)'!r} for {upload_name(upload.filename)}; {how}")
    return ctype


def client_file_name(filename: str | None) -> str:
    """The base name the client gave its file (any folders and unprintable characters dropped;
    "" for none, or for "." and "..", which name folders)."""
    base = re.split(r"[\\/]", filename or "")[-1]
    base = "".join(c for c in base if c.isprintable()).strip()[:120]
    return "" if base in (".", "..") else base


def upload_name(filename: str | None) -> str:
    """How messages name an upload: the client's file name, quoted, or "the upload"."""
    base = client_file_name(filename)
    return repr(base) if base else "the upload"


async def read_limited(upload: UploadFile, limit: int) -> bytes:
    data = await upload.read(limit + 1)
    if len(data) > limit:
        raise HTTPException(413, too_large(limit))
    return data


@dataclass(frozen=True)
class SavedUpload:
    """An upload copied to a temp file on the server, known by the client's file name
    (`filename`, client_file_name's; "" when it gave none), never by `path`: the server's
    folders and temp names are none of the client's business, nor of anyone reading the avatar
    later."""

    path: Path
    filename: str

    @property
    def name(self) -> str:
        """How messages name it (upload_name's: quoted, or "the upload")."""
        return upload_name(self.filename)

    @property
    def source_name(self) -> str:
        """The name an avatar records as its source: the client's, else "upload" + extension."""
        return self.filename or f"upload{self.path.suffix}"

    def explain(self, exc: BaseException) -> str:
        """`exc`'s text for the client: OS and FFmpeg errors by their reason alone (they append
        the file's path), a leading "<temp path>: " (MediaError's form) dropped, and any other
        mention of the temp file replaced by the client's name."""
        text = getattr(exc, "strerror", None) if getattr(exc, "filename", None) else None
        text = (text or str(exc)).removeprefix(f"{self.path}: ")
        return text.replace(str(self.path), self.name).replace(self.path.name, self.name)


async def save_upload(upload: UploadFile, folder: Path, limit: int) -> SavedUpload:
    """Copy an upload to a fresh file in `folder` (removed again on any failure)."""
    folder.mkdir(parents=True, exist_ok=True)
    suffix = Path(client_file_name(upload.filename)).suffix.lower()
    if not suffix or len(suffix) > 8 or not suffix[1:].isalnum():
        suffix = ""
    path = folder / f"upload-{uuid.uuid4().hex}{suffix}"
    n = 0
    try:
        with open(path, "xb") as f:
            while block := await upload.read(1 << 20):
                n += len(block)
                if n > limit:
                    raise HTTPException(413, too_large(limit))
                f.write(block)
        if n == 0:
            raise HTTPException(422, f"{upload_name(upload.filename)} is empty (0 bytes)")
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return SavedUpload(path, client_file_name(upload.filename))


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
