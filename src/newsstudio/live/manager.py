"""Many live sessions on one engine: admission, the render budget, closing."""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ..engines.base import Engine
from ..render_budget import RenderBudget
from .errors import SessionLimitError
from .session import LiveSession


class SessionManager:
    """Live sessions under a cap. A slot is reserved before the (possibly slow) session build,
    so concurrent requests can never exceed `max_sessions`, nor the render `budget` when one is
    set (each session's cost: its share of the server's render capacity, `RenderBudget.cost`)."""

    def __init__(self, max_sessions: int = 8, budget: RenderBudget | None = None):
        self.max_sessions = int(max_sessions)
        self.budget = budget
        self._sessions: dict[str, LiveSession] = {}
        self._costs: dict[str, float] = {}
        self._reserved = 0
        self._reserved_cost = 0.0
        self._lock = threading.Lock()
        self.opened_total = 0
        self.closed_total = 0

    def render_load(self) -> float | None:
        """Share of the render budget the live sessions (and those being opened) take; None
        without a budget."""
        if self.budget is None:
            return None
        with self._lock:
            return self._load()

    def _load(self) -> float:
        """Under the lock: the budget shares of the live sessions and of those being opened."""
        return sum(self._costs.values()) + self._reserved_cost

    def open(self, factory: Callable[..., LiveSession], engine: str = "", fps: float = 0.0, **kw: Any) -> LiveSession:
        """Build a session with `factory` once a slot (and, with a budget, its render share for an
        `engine` session at `fps`) is reserved; SessionLimitError when none is free."""
        with self._lock:
            if len(self._sessions) + self._reserved >= self.max_sessions:
                raise SessionLimitError(f"too many live sessions: the limit is {self.max_sessions}; close one and retry")
            cost = 0.0
            if self.budget is not None:
                try:
                    cost = self.budget.check(engine, fps, self._load())
                except ValueError as e:
                    raise SessionLimitError(str(e)) from None
            self._reserved += 1
            self._reserved_cost += cost
        try:
            session = factory(on_close=self._forget, **kw)
        except BaseException:
            with self._lock:
                self._reserved -= 1
                self._reserved_cost -= cost
            raise
        with self._lock:
            self._reserved -= 1
            self._reserved_cost -= cost
            self._sessions[session.id] = session
            self._costs[session.id] = cost
            self.opened_total += 1
        return session

    def _forget(self, session: LiveSession) -> None:
        with self._lock:
            self._costs.pop(session.id, None)
            if self._sessions.pop(session.id, None) is not None:
                self.closed_total += 1

    def get(self, session_id: str) -> LiveSession:
        with self._lock:
            s = self._sessions.get(session_id)
        if s is None:
            raise KeyError(session_id)
        return s

    def close(self, session_id: str) -> bool:
        try:
            s = self.get(session_id)
        except KeyError:
            return False
        s.close()
        return True

    def close_all(self) -> None:
        for s in self.list():
            s.close()

    def list(self) -> list[LiveSession]:
        with self._lock:
            return list(self._sessions.values())

    def count(self) -> int:
        with self._lock:
            return len(self._sessions)

    def using_avatar(self, avatar_id: str) -> int:
        return sum(1 for s in self.list() if s.avatar_id == avatar_id)


def evict_avatar(engine: Engine, packet_path: str) -> None:
    """Drop an avatar's cached device tensors from an engine (after the avatar is deleted)."""
    from pathlib import Path

    key = str(Path(packet_path).resolve())
    cache = engine.__dict__.get("_background_cache")
    if isinstance(cache, dict):
        cache.pop(key, None)
    layers = engine.__dict__.get("_layers")
    if isinstance(layers, dict):
        layers.pop(key, None)
    idle = engine.__dict__.get("_idle_frames_cache")
    if isinstance(idle, dict):
        idle.pop(key, None)
