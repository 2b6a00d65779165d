"""A live session's splice and copy-out in ~7 torch calls: its compose as CUDA graphs per request size.

Why: with 16 live sessions every server thread waits ~1.1 ms (median; p95 6-7 ms) for the GIL after
each torch call (benchmarks/gil_probe.py, thirty-first session on an H100), and a session's compose
-- gathering its background frames, splicing the rendered faces into them (colour conversion,
blend, chroma subsampling), the banner, the copy to the host -- is ~36 calls per request: a
session's render call took 212-271 ms, of which only 43-125 ms waiting for its shared batch.

`ComposeGraphs` captures ``compose(rois, idx)`` (the session's own function: same ops, same bytes)
once per (request size, output format) over static buffers, and runs a request as: copy its faces
and frame indices in, replay, start the copy to pinned host memory. Graphs of one session share a
memory pool and run one at a time (a session renders one request at a time; a lock makes sure).
Sizes past ``max_sizes`` compose eagerly. Off CUDA the same steps run eagerly (tests). A capture
that fails (a driver or capture-mode error) costs nothing but speed: that session composes
eagerly from then on, and `accel.static.fallbacks` names the failure.

The compose is passed with each request, never stored: a `StreamSession` holds its `ComposeGraphs`,
and a stored bound method would tie the two in a reference cycle, so a closed session's graphs,
their memory pool and its frames on the GPU would wait for a full garbage collection (the
thirty-fourth session measured 2.2-3.7 GB of a 20-session level's GPU memory freed only by one).
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..accel.graph_capture import capture, normal_tensor
from ..accel.host_copy import to_host_async
from ..accel.static import note_fallback

#: (rois, idx, output) -> frames: a session's compose (`StreamSession._compose`)
Compose = Callable[[torch.Tensor, torch.Tensor, str], torch.Tensor]


@dataclass
class _Plan:
    idx: torch.Tensor  # (n,) the request's avatar frames
    rois: torch.Tensor  # (n, Hr, Wr, 3): its rendered faces, in the dtype and layout they come in
    replay: Callable[[], torch.Tensor] | None  # the captured compose on those buffers: its frames (None off CUDA)


class ComposeGraphs:
    """One live session's compose as graphs (see the module doc)."""

    def __init__(self, device: torch.device, max_sizes: int = 4) -> None:
        self.device = device
        self.use_graphs = device.type == "cuda"
        self.max_sizes = max_sizes
        self.replays = 0  # requests composed through a plan (tests, benchmarks)
        self._plans: dict[tuple, _Plan] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        self._lock = threading.Lock()
        self.failed: str | None = None  # why a capture failed: every request composes eagerly since

    def to_host(self, compose: Compose, rois: torch.Tensor, idx: torch.Tensor,
                output: str) -> tuple[torch.Tensor, "torch.cuda.Event | None"] | None:
        """``to_host_async(compose(rois, idx, output))`` through this session's plan for the request's
        size, on the current stream; None where no plan applies (too many sizes): compose eagerly.
        ``compose`` is the session's own (the same one on every call)."""
        key = (int(idx.shape[0]), output, tuple(rois.shape[1:]), rois.stride(), rois.dtype)
        with self._lock:
            plan = self._plans.get(key)
            if plan is None:
                if self.failed is not None or len(self._plans) >= self.max_sizes or rois.dim() != 4:
                    return None
                try:
                    plan = self._new_plan(compose, rois, idx, output)
                except RuntimeError as exc:  # the session keeps going, composing eagerly
                    self.failed = f"{type(exc).__name__}: {exc}"
                    note_fallback(f"ComposeGraphs: capture of a {key[0]}-frame {output} compose failed "
                                  f"({self.failed}); this session composes eagerly")
                    return None
                self._plans[key] = plan
            plan.idx.copy_(idx)
            plan.rois.copy_(rois)
            frames = plan.replay() if plan.replay is not None else compose(plan.rois, plan.idx, output)
            self.replays += 1
            return to_host_async(frames)  # queued before the next replay can rewrite the frames

    def _new_plan(self, compose: Compose, rois: torch.Tensor, idx: torch.Tensor, output: str) -> _Plan:
        dev = self.device
        idx_buf = normal_tensor(lambda: idx.detach().to(dev, torch.long).clone())
        # the faces' own dtype and layout: the compose's kernels (and so its rounding) follow the layout
        rois_buf = normal_tensor(lambda: torch.empty_like(rois, device=dev).copy_(rois))
        if not self.use_graphs:
            return _Plan(idx_buf, rois_buf, None)
        frames: list[torch.Tensor] = []

        def step() -> None:
            frames[:] = [compose(rois_buf, idx_buf, output)]

        replay = capture(step, dev, self._pool)
        out = frames[0]  # the captured run's output: what every replay rewrites

        def run() -> torch.Tensor:
            replay()
            return out

        return _Plan(idx_buf, rois_buf, run)
