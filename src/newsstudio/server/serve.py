"""How the app is served: one uvicorn configuration for the CLI, the load test and the tests."""
from __future__ import annotations

from typing import Any

import uvicorn


def uvicorn_config(app: Any, **kw: Any) -> uvicorn.Config:
    """uvicorn settings for a video server. WebSocket per-message deflate is OFF: uvicorn enables
    it by default and clients negotiate it, and then every video chunk (raw NV12, megabytes a
    second per session, or H.264 that does not compress) is zlib-compressed on the event loop,
    which stalls every session's frames (measured on an H200: ~22 frames/s for the whole server,
    0.7-1.4 s event-loop lag at 8-16 MuseTalk sessions of 1080x1080)."""
    kw.setdefault("ws_per_message_deflate", False)
    return uvicorn.Config(app, **kw)
