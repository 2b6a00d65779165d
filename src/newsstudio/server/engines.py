"""Engines load once per name and stay warm; every session and job shares that instance."""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import torch

from ..accel.cache import save_compile_artifacts
from ..accel.static import check_static_shapes
from ..engines.base import Engine
from ..engines.batching import Batcher, RenderBatcher, check_compose
from ..engines.ditto.stride import check_stride
from ..engines.musetalk.face_rows import parse_first_face_row
from ..engines.musetalk.frame_queues import feature_step_rows
from ..engines.registry import ENGINES, check_accel, check_triton_convs, create_engine, default_engine, engine_options
from .gc_pauses import freeze_warm_objects, unfreeze

log = logging.getLogger(__name__)


class EngineUnavailable(RuntimeError):
    """The engine cannot be loaded here (no weights, missing module, ...)."""


class EnginePool:
    def __init__(self, default: str, device: torch.device, weights: str, models: Any, accel: str = "auto",
                 batch_sessions: bool = True, front_end_streams: bool = True, render_in_flight: int = 0,
                 stall_s: float | None = None, front_end_tf32: bool = True, compose: str = "stream",
                 triton_convs: str = "off", fill_render_batches: bool = False, first_face_row: int | str | None = None,
                 feature_step_ms: int | None = None, static_shapes: str | None = None, gc_freeze: bool = True,
                 ditto_stride: int = 1, ditto_stride_mode: str = "mask"):
        self.device = device
        self.gc_freeze = gc_freeze  # freeze the objects alive after each engine's warm-up (gc_pauses.py)
        # what else is working (ServerState: live sessions, clip jobs): a freeze would keep their objects for good
        self.work_in_progress: Callable[[], int] = lambda: 0
        self.ditto_stride = check_stride(ditto_stride, ditto_stride_mode)  # Ditto's stride mode (before any session)
        self.ditto_stride_mode = ditto_stride_mode
        self.static_shapes = check_static_shapes(static_shapes)  # MuseTalk's statically compiled render buckets (before any session)
        self.feature_step_ms = feature_step_ms  # MuseTalk's live Whisper step (None: its default)
        if feature_step_ms is not None:
            feature_step_rows(feature_step_ms)  # checked before any session
        self.first_face_row = parse_first_face_row(first_face_row)  # before any session
        self.fill_render_batches = fill_render_batches
        self.compose = check_compose(compose)  # ServerConfig.compose (checked before any session): the render batchers' mode
        self.front_end_tf32 = front_end_tf32
        self.triton_convs = check_triton_convs(triton_convs)  # before any session
        self.stall_s = stall_s  # every shared batcher's `Batcher.stall_s`
        self.batch_sessions = batch_sessions
        self.front_end_streams = front_end_streams
        self.render_in_flight = render_in_flight
        self._batchers: dict[str, Batcher] = {}  # per engine its RenderBatcher, plus "<engine>/<stage>" ones
        self.weights = weights
        self.models = models
        self.accel = accel
        check_accel(accel)  # before any session
        self.default = default_engine(models) if default == "auto" else default
        if self.default not in ENGINES:
            raise ValueError(f"unknown engine {default!r}; choose one of {', '.join(ENGINES)} or 'auto'")
        self._engines: dict[str, Engine] = {}
        self._batch_graphs_on: bool | None = None  # set_batch_graphs (benchmarks); None: each engine's default
        self._compose_graphs_on: bool | None = None  # set_compose_graphs; None: each render batcher's default
        self._errors: dict[str, str] = {}
        self._locks = {name: threading.Lock() for name in ENGINES}

    def resolve(self, name: str | None) -> str:
        if not name or name == "auto":
            return self.default
        if name not in ENGINES:
            raise EngineUnavailable(f"unknown engine {name!r}; choose one of {', '.join(ENGINES)} or 'auto'")
        return name

    def get(self, name: str | None) -> tuple[str, Engine]:
        """(resolved name, the warm engine); loads it the first time (thread-safe)."""
        name = self.resolve(name)
        eng = self._engines.get(name)
        if eng is not None:
            return name, eng
        with self._locks[name]:
            eng = self._engines.get(name)
            if eng is not None:
                return name, eng
            if name in self._errors:
                raise EngineUnavailable(self._errors[name])
            kw = engine_options(name, self.weights, self.models, self.accel, self.device, long_running=True,
                                front_end_tf32=self.front_end_tf32, triton_convs=self.triton_convs,
                                first_face_row=self.first_face_row, feature_step_ms=self.feature_step_ms,
                                static_shapes=self.static_shapes, stride=self.ditto_stride,
                                stride_mode=self.ditto_stride_mode)
            try:
                eng = create_engine(name, device=self.device, **kw)
                spent = eng.warm_up()  # compile/capture now, not in the first session
                if spent > 1.0:
                    log.info("engine %s warmed up in %.1f s", name, spent)
                    self._save_compile_artifacts()
                self._freeze_if_idle(name)
            except Exception as e:  # noqa: BLE001 - any load failure is reported, the server keeps serving
                self._errors[name] = f"engine {name!r} is not available on this server: {type(e).__name__}: {e}"
                raise EngineUnavailable(self._errors[name]) from e
            graphs = getattr(eng, "batch_graphs", None)
            if self._batch_graphs_on is not None and graphs is not None:  # `serve --batch-graphs` or a benchmark, set before this engine loaded
                graphs.enabled = self._batch_graphs_on
            self._engines[name] = eng
            return name, eng

    @staticmethod
    def _save_compile_artifacts() -> None:
        """After a warm-up that compiled: the named artifacts file (`serve --compile-artifacts`), so the
        next server starts from it. A failure to write costs the next start time, never this engine."""
        try:
            save_compile_artifacts()
        except Exception as e:  # noqa: BLE001
            log.warning("compile artifacts not saved: %s: %s", type(e).__name__, e)

    def renderer(self, name: str):
        """What live sessions of a loaded engine render with: the engine's shared RenderBatcher
        (batch_sessions), else the engine's own `render`."""
        b = self.render_batcher(name)
        return self._engines[name].render if b is None else b

    def render_batcher(self, name: str) -> RenderBatcher | None:
        """The loaded engine's shared RenderBatcher, with its front-end batchers, made on first use
        (None where sessions do not share batches)."""
        eng = self._engines[name]
        if not self.batch_sessions:
            return None
        with self._locks[name]:
            b = self._batchers.get(name)
            if b is None:
                b = self._batchers[name] = RenderBatcher(eng, max_in_flight=self.render_in_flight, compose=self.compose,
                                                             fill_buckets=self.fill_render_batches)
                if self._compose_graphs_on is not None:  # `serve --[no-]compose-graphs` or a benchmark
                    b.compose_graphs = self._compose_graphs_on
                b.stall_s = self.stall_s
                for stage, shared in eng.use_stream_batchers(own_streams=self.front_end_streams).items():  # audio encoders, Ditto's LMDM windows
                    self._batchers[f"{name}/{stage}"] = shared
                    shared.stall_s = self.stall_s
        assert isinstance(b, RenderBatcher)  # the engine's own key holds its RenderBatcher
        return b

    def set_render_in_flight(self, n: int) -> None:
        """`ServerConfig.render_in_flight` for the render batchers made from now on and those running."""
        self.render_in_flight = n
        for b in list(self._batchers.values()):
            if isinstance(b, RenderBatcher):
                b.set_max_in_flight(n)

    def set_fill_render_batches(self, on: bool) -> None:
        """`ServerConfig.fill_render_batches` for the render batchers made from now on and those running
        (their next batches)."""
        self.fill_render_batches = bool(on)
        for b in list(self._batchers.values()):
            if isinstance(b, RenderBatcher):
                b.fill_buckets = self.fill_render_batches

    def set_batch_graphs(self, on: bool) -> None:
        """Whether the loaded engines' one-avatar render batches take their graph path
        (engines/musetalk/batch_graphs.py) or the general one, from their next batch (benchmarks
        compare the two on one server); engines without that path are left as they are."""
        self._batch_graphs_on = bool(on)
        for graphs in self._batch_graphs():
            graphs.enabled = self._batch_graphs_on

    @property
    def batch_graphs_on(self) -> bool | None:
        """`set_batch_graphs`' setting, applied to every engine loaded (None: each engine's default)."""
        return self._batch_graphs_on

    def _batch_graphs(self) -> list:
        """The loaded engines' `BatchGraphs` (engines without that path have none)."""
        return [g for g in (getattr(eng, "batch_graphs", None) for eng in list(self._engines.values())) if g is not None]

    def _freeze_if_idle(self, name: str) -> None:
        """Freeze the objects alive now (the engine just loaded: its modules, graphs and caches) out
        of later collections, unless sessions or jobs are running: frozen objects are never
        collected, and theirs would turn into garbage when they end."""
        if not self.gc_freeze:
            return
        busy = self.work_in_progress()
        if busy:
            log.info("engine %s: objects not frozen (%d sessions or jobs running)", name, busy)
            return
        log.info("engine %s: %d objects frozen", name, freeze_warm_objects())

    def set_gc_freeze(self, on: bool) -> None:
        """`ServerConfig.gc_freeze` from now on: freeze the objects alive now (and after each engine
        loaded later), or unfreeze them (benchmarks compare the two on one server)."""
        self.gc_freeze = bool(on)
        if self.gc_freeze:
            freeze_warm_objects()
        else:
            unfreeze()

    def set_compose_graphs(self, on: bool) -> None:
        """Whether live sessions compose through their CUDA graphs (compose/session_graphs.py) from
        their next request: the render batchers' ``compose_graphs``, those running and those made
        later (`serve --[no-]compose-graphs`; benchmarks compare the two)."""
        self._compose_graphs_on = bool(on)
        for b in list(self._batchers.values()):
            if isinstance(b, RenderBatcher):
                b.compose_graphs = self._compose_graphs_on

    def compose_graphs(self) -> bool | None:
        """Whether live sessions compose through their CUDA graphs: the running render batchers'
        setting, else `set_compose_graphs`' (None: neither yet, each batcher's default to come)."""
        batchers = [b for b in list(self._batchers.values()) if isinstance(b, RenderBatcher)]
        return any(b.compose_graphs for b in batchers) if batchers else self._compose_graphs_on

    def batch_graphs(self) -> bool | None:
        """Whether a loaded engine's batches take the graph path (None: no loaded engine has one)."""
        graphs = self._batch_graphs()
        return any(g.enabled for g in graphs) if graphs else None

    def set_compose(self, mode: str) -> None:
        """`ServerConfig.compose` for the render batchers made from now on and those running (their
        sessions' next renders)."""
        self.compose = check_compose(mode)
        for b in list(self._batchers.values()):
            if isinstance(b, RenderBatcher):
                b.set_compose(mode)

    def set_front_end_streams(self, on: bool) -> None:
        """`ServerConfig.front_end_streams` for the front-end batchers made from now on and those
        running (their next batches; see `Batcher.set_own_stream`)."""
        self.front_end_streams = on
        for b in list(self._batchers.values()):
            if not isinstance(b, RenderBatcher):
                b.set_own_stream(on)

    def stalled(self) -> list[str]:
        """The shared batchers whose current batch has run past `stall_s` (a wedged device)."""
        return [name for name, b in list(self._batchers.items()) if b.stalled()]

    def batcher_stats(self) -> dict[str, dict[str, float]]:
        return {name: b.stats.as_dict() for name, b in self._batchers.items()}

    def close(self) -> None:
        for b in self._batchers.values():
            b.close()
        self._batchers.clear()

    def loaded(self) -> dict[str, Engine]:
        return dict(self._engines)

    def describe(self) -> list[dict[str, Any]]:
        out = []
        for name in ENGINES:
            eng = self._engines.get(name)
            out.append({
                "name": name,
                "loaded": eng is not None,
                "available": True if eng is not None else (False if name in self._errors else None),
                "reason": self._errors.get(name),
                "device": str(eng.device) if eng is not None else None,
                "default": name == self.default,
            })
        return out
