"""How much of a server's render capacity its live sessions may take (``serve --max-render-fps``).

A GPU renders a fixed number of frames per second for an engine (one H200, 1080x1080 avatar:
MuseTalk ~420, Ditto ~240, measured in benchmarks/RESULTS.md). Sessions past that do not only
make the newest one late: every session falls behind together (16 MuseTalk sessions at 30 fps on
an H200: 0 of 16 on time, 41-48 skipped frames each). So the server admits a session only while
it fits: each session costs its frame rate over its engine's capacity, and the costs of all live
sessions may add up to at most 1 (one GPU shared by engines of different speeds is one budget).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

ALL_ENGINES = "*"
FULL = "render capacity full"  # how a refusal starts (clients and the load test look for it)
_SLACK = 1e-5  # rounding: a capacity written 29.97 or 59.94 holds 30000/1001 fps sessions


@dataclass(frozen=True)
class RenderBudget:
    """Frames per second the server can render, per engine name (``"*"``: every engine not named;
    an engine neither named nor covered by ``"*"`` is not budgeted: its sessions cost nothing)."""

    fps_by_engine: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, fps in self.fps_by_engine.items():
            if not fps > 0:
                raise ValueError(f"max-render-fps: the capacity of {name!r} must be > 0 frames/s, got {fps!r}")

    @classmethod
    def parse(cls, spec: str | float | Mapping[str, float], engines: Iterable[str] = ()) -> "RenderBudget":
        """``420`` or ``"420"`` (every engine) or ``"musetalk=420,ditto=240"`` (per engine; ``*=N``
        for the others); a mapping is taken as it is. With `engines`, a name not among them is an
        error (a typo would otherwise leave that engine unbudgeted)."""
        budget = cls._parse(spec)
        known = set(engines)
        unknown = sorted(set(budget.fps_by_engine) - known - {ALL_ENGINES}) if known else []
        if unknown:
            raise ValueError(f"max-render-fps: unknown engine {unknown[0]!r} (engines: {', '.join(sorted(known))})")
        return budget

    @classmethod
    def _parse(cls, spec: str | float | Mapping[str, float]) -> "RenderBudget":
        if isinstance(spec, Mapping):
            return cls(dict(spec))
        if isinstance(spec, (int, float)):
            return cls({ALL_ENGINES: float(spec)})
        out: dict[str, float] = {}
        for part in str(spec).split(","):
            part = part.strip()
            if not part:
                continue
            name, _, value = part.rpartition("=") if "=" in part else (ALL_ENGINES, "=", part)
            name = name.strip()
            try:
                fps = float(value)
            except ValueError:
                raise ValueError(f"max-render-fps: {part!r} is not N or ENGINE=N (frames per second)") from None
            if not name:
                raise ValueError(f"max-render-fps: {part!r} is not N or ENGINE=N (frames per second)")
            if name in out:
                raise ValueError(f"max-render-fps: {name!r} is given twice")
            out[name] = fps
        if not out:
            raise ValueError("max-render-fps: empty; give N or ENGINE=N,ENGINE=N")
        return cls(out)

    def capacity(self, engine: str) -> float | None:
        """Frames/s the server can render for `engine`, None when it is not budgeted."""
        return self.fps_by_engine.get(engine, self.fps_by_engine.get(ALL_ENGINES))

    def cost(self, engine: str, fps: float) -> float:
        """The share of the server's render capacity one `engine` session at `fps` takes."""
        cap = self.capacity(engine)
        return 0.0 if cap is None else float(fps) / cap

    def check(self, engine: str, fps: float, load: float) -> float:
        """The cost of a new session when it fits next to sessions taking `load` in all; raises
        ValueError saying how much is in use when it does not."""
        cost = self.cost(engine, fps)
        if load + cost <= 1.0 + _SLACK:
            return cost
        cap = self.capacity(engine)
        if cost > 1.0 + _SLACK:
            raise ValueError(f"a {float(fps):g} fps {engine} session needs more than this server renders "
                             f"({cap:g} frames/s, --max-render-fps)")
        raise ValueError(f"{FULL}: live sessions use {load:.0%}, a {float(fps):g} fps {engine} session "
                         f"needs {cost:.0%} of {cap:g} frames/s; retry later")
