"""A live render batch of one avatar in ~10 torch calls: its gathers and its resize as CUDA graphs.

Why: every torch call a Python thread makes releases the GIL and takes it back. Under 16 live
sessions ~20 threads do that all the time, so each call of the render thread waits its turn, and
its batch used to be ~50 calls (the frames' gathers, the padding copies into the face runner's
static inputs, the runner's graph, the grid gathers and the resize into the avatar's boxes, the
splits). An H100 at 16 MuseTalk sessions (thirty-first session): the render thread busy 0.87 of
each second with 6 % of that in CUDA calls, the GPU 62-69 % busy -- the batches were dispatched
slower than the GPU ran them.

For a batch whose requests are all of one avatar (the usual shared batch: many sessions of one
presenter), `BatchGraphs` writes the batch's frame indices and prompts straight into buffers
(two `cat`s), replays a graph that gathers the avatar's rows into the face runner's static inputs,
replays the runner's graph, replays a graph that resizes the faces into the avatar's boxes, and
hands out one copy of the real rows, split per request. The graphs are captured per (avatar,
runner, bucket) at first use, over a memory pool per runner family (the family's lock serialises
their replays, so they may share intermediates).

Rows past the batch's own keep what an earlier batch left there: frame indices of this avatar
(each avatar has its own index buffer, so they are valid), prompts of earlier requests. The
networks treat every row on its own (no batch statistics), so the real rows are those the general
path renders (`render_many` with ``enabled`` off): the same bytes on an H100 for six batch shapes
(benchmarks/batch_dispatch.py), within CPU rounding in the tests. Off CUDA the same functions run
eagerly (the tests' path).

Measured (H100, thirty-first session, benchmarks/RESULTS.md): dispatching a batch of 2 x 14 frames
beside 16 threads that keep calling torch took 3.4-3.5 ms instead of 10.7-20.3 ms; in one live level
of 16 MuseTalk sessions the render thread's busy share fell to 0.37 from 0.84-0.89, but its batches
came out smaller (19 frames instead of 27: it no longer waits long enough for requests to pile up),
and the level did not carry 16 sessions (render batches not filled to their buckets). With the
batches filled (``fill_render_batches``), 16 of 16 were on time in every level with or without them
(thirty-second and thirty-third sessions, another H100); at 20 sessions they decided it: 20 and 18
of 20 with them, 16 of 20 without. On by default where the face runner replays CUDA graphs
(`MuseTalkEngine`'s ``batch_graphs``).
"""
from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ...accel.graph_capture import capture, normal_tensor
from ...accel.static import BucketedRunner, StaticBatchRunner, note_fallback
from ..base import AvatarLayer
from .prebake import grid_from_axes, resize_with_grid


@dataclass
class _Plan:
    """One (avatar, runner bucket): the buffers and the two graphs (or eager functions) around it."""

    runner: StaticBatchRunner
    index: torch.Tensor  # (bucket,) int64: this batch's avatar frames, then an earlier batch's
    faces: torch.Tensor  # (bucket, Hr, Wr, 3) float32: the resized faces (a view of the avatar's buffer)
    gather: Callable[[], None]
    resize: Callable[[object], None]  # takes the runner's output (ignored by a graph: its static one)
    index_rows: dict[int, torch.Tensor] = field(default_factory=dict)  # n -> index[:n]
    prompt_rows: dict[int, torch.Tensor] = field(default_factory=dict)  # n -> prompts buffer[:n]


class BatchGraphs:
    """The one-avatar fast path of `MuseTalkEngine.render_many` (see the module doc)."""

    def __init__(self, device: torch.device, use_graphs: bool, enabled: bool = True) -> None:
        self.device = device
        self.use_graphs = bool(use_graphs) and device.type == "cuda"
        self.enabled = bool(enabled)  # switched by benchmarks to compare with the general path
        self.batches = 0  # batches rendered this way (counters for benchmarks and tests)
        self._plans: dict[tuple[int, int, int], _Plan] = {}  # (id(layer), id(runner), bucket)
        self._faces: dict[int, torch.Tensor] = {}  # id(layer) -> (largest bucket, 3, Hr, Wr) float32
        self._lock = threading.Lock()

    def render(self, runner: BucketedRunner, layer: AvatarLayer, keys: Sequence[str],
               drivings: Sequence[torch.Tensor], idxs: Sequence[torch.Tensor], dtype: torch.dtype) -> list[torch.Tensor] | None:
        """Each request's faces resized into its boxes, or None where this path does not apply (a
        batch larger than the largest bucket, or indices not on the device): the caller then takes
        the general path. ``keys``: the avatar tensors gathered into the runner's inputs before and
        after the prompts (``("latents", "upper_stats")`` or ``("latents",)``)."""
        sizes = [int(i.shape[0]) for i in idxs]
        n = sum(sizes)
        dev_type = self.device.type  # by type: an engine on "cuda" holds tensors on "cuda:0", which != "cuda"
        if not self.enabled or n < 1 or n > runner.max_bucket or any(i.device.type != dev_type for i in idxs):
            return None
        drivings = [d if d.dtype == dtype and d.device.type == dev_type else d.to(self.device, dtype) for d in drivings]
        plan = self._plan(runner, layer, keys, drivings[0], n)
        r = plan.runner
        prompts = r.static_inputs[1]
        index_rows = plan.index_rows.get(n)
        if index_rows is None:
            index_rows = plan.index_rows[n] = plan.index[:n]
            plan.prompt_rows[n] = prompts[:n]
        with r.holding():
            torch.cat(idxs, out=index_rows)
            torch.cat(drivings, out=plan.prompt_rows[n])
            plan.gather()
            plan.resize(r.run_static())
            faces = plan.faces[:n].clone()
        self.batches += 1
        return list(torch.split(faces, sizes))

    def forget(self, layer_id: int) -> None:
        """Drop an avatar's buffers and graphs (it was unloaded)."""
        with self._lock:
            self._faces.pop(layer_id, None)
            for key in [k for k in self._plans if k[0] == layer_id]:
                del self._plans[key]

    # -- set-up -----------------------------------------------------------------------------------
    def _plan(self, runner: BucketedRunner, layer: AvatarLayer, keys: Sequence[str], driving: torch.Tensor,
              n: int) -> _Plan:
        bucket = runner.bucket_for(n)
        r = runner.runners.get(bucket)
        if r is None:  # made (and compiled / captured) on first use, from one row of each input
            examples = [layer.data[keys[0]][:1], driving[:1], *(layer.data[k][:1] for k in keys[1:])]
            r = runner.runner(n, examples)
        plan = self._plans.get((id(layer), id(r), bucket))
        if plan is None:
            with self._lock:
                plan = self._plans.get((id(layer), id(r), bucket))
                if plan is None:
                    with r.holding():  # prepared, and no replay of the family while capturing
                        plan = self._plans[(id(layer), id(r), bucket)] = self._new_plan(runner, r, layer, keys, bucket)
        return plan

    def _new_plan(self, runner: BucketedRunner, r: StaticBatchRunner, layer: AvatarLayer, keys: Sequence[str],
                  bucket: int) -> _Plan:
        dev = self.device
        lid = id(layer)
        if lid not in self._faces:
            hr, wr = layer.roi_hw
            self._faces[lid] = normal_tensor(lambda: torch.zeros((runner.max_bucket, 3, hr, wr), device=dev))
            weakref.finalize(layer, self.forget, lid)
        faces = self._faces[lid][:bucket].permute(0, 2, 3, 1)  # the layout resize_with_grid returns
        index = normal_tensor(lambda: torch.zeros(bucket, dtype=torch.long, device=dev))  # frame 0: valid for every avatar
        sources = [layer.data[k] for k in keys]
        targets = [r.static_inputs[0], *r.static_inputs[2:]]  # the prompts (input 1) come from the requests
        gx, gy = layer.data["grid_x"], layer.data["grid_y"]

        def gather() -> None:
            for src, dst in zip(sources, targets):
                dst.copy_(src.index_select(0, index))

        def resize(out: object) -> None:
            faces.copy_(resize_with_grid(out, grid_from_axes(gx.index_select(0, index), gy.index_select(0, index))))

        static_out = r.graph_outputs
        if self.use_graphs and static_out is not None:
            pool = r.family.memory_pool()  # the runner's own graphs' pool: all replay under one hold
            try:
                gather_replay = capture(gather, dev, pool)
                resize_replay = capture(lambda: resize(static_out), dev, pool)
            except RuntimeError as exc:  # the batch still renders: this plan's functions run eagerly
                note_fallback(f"MuseTalk batch graphs: capturing bucket {bucket}'s gather and resize failed "
                              f"({type(exc).__name__}: {exc}); they run eagerly")
            else:
                return _Plan(r, index, faces, gather_replay, lambda _out: resize_replay())
        return _Plan(r, index, faces, gather, resize)
