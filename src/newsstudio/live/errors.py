"""Errors a live session or the session manager raises."""
from __future__ import annotations


class SessionError(RuntimeError):
    """Base class of live-session errors."""


class SessionLimitError(SessionError):
    """The configured maximum number of live sessions is reached."""


class SessionClosedError(SessionError):
    """The session was closed."""
