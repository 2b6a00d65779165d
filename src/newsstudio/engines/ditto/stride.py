"""Ditto stride mode: warp + decode every k-th frame only, motion-compensated interpolation between.

Warp + SPADE decode is ~1234 GFLOP per 512x512 frame; everything before it (HuBERT, LMDM, motion
stitching) is cheap per frame. With ``DittoEngine(stride=k)`` only keyframes (output frames
``t % k == 0``, plus the stream's last frame) go through the networks, exactly as in dense mode.
An in-between frame t with neighbouring keyframes a < t < b is made in the crop space (512x512)
from the two keyframe *outputs*:

1. each keyframe image is warped towards frame t by a backward flow built from the sparse keypoint
   motion, ``flow(z) = sum_k m_k(z) (kp_key_k - kp_t_k)`` (2-D projection of the 21 driving
   keypoints; bicubic sampling, which blurs sub-pixel shifts less than bilinear);
2. the two warped images are cross-faded by time: ``(1 - w) W_a + w W_b``, ``w = (t - a) / (b - a)``.

The weights ``m_k`` (``stride_mode``):

* ``"mask"`` (default): the warp network's own dense-motion mask of that keyframe (softmax over
  [identity, 21 keypoint motions], averaged over depth), a free by-product of its render. The
  network shows at z the source point ``z + sum_k m_k(z) (kp_s_k - kp_d_k)``; holding the mask,
  the content frame t shows at z is where the keyframe shows it, to first order in the motion
  (:func:`mask_flow`). So the in-between follows the network's own motion model, whatever weights
  it has. Running the dense-motion network for in-betweens instead would cost 332 of the 1234 GFLOP.
* ``"heatmap"``: Gaussian heatmaps around frame t's keypoints normalised against an identity
  weight (:func:`keypoint_flow`) -- LivePortrait's sparse-motion form without its hourglass;
  no network quantity, but it assumes the motion is local to each keypoint.
* ``"blend"``: plain cross-fade; ``"nearest"``: the nearer keyframe (a frame repeat).

The frame's own motion is exact: x_d(t) comes from the stitching of its own LMDM row (cheap), so
the flow follows the real (not interpolated) keypoints, and the crop lands in the ROI with frame
t's own grid. Keyframes are the dense render of the same row on the same source frame (bit for
bit for the same batch; other batch sizes change float rounding only, as in dense mode).

Quality (PSNR vs dense, dB, all frames / in-betweens, measured on CPU with seeded weights at the
real size: input 256, 512 crops, 13 frames; benchmarks/ditto_bench.py ``--stride`` measures it on
the GPU). On keypoints that move like a talking head (the astronaut's landmarks, mouth opening
from a speech envelope, head sway; 0.003 per frame), k = 2 / 3 / 4:

* a natural texture moved by the seeded network's own deformation (a geometric stand-in for a
  real decoder's output): mask 53.4/50.1, 51.5/49.3, 51.1/49.6; blend 39.1/35.7, 36.2/34.0,
  34.1/32.5; heatmap 37.9/34.6, 35.0/32.9, 32.7/31.1 (the seeded mask is near-uniform, not local);
* the warped features (the decoder input, channels mapped 1..99 % -> 0..255): mask 52.0/48.6,
  48.5/46.4, 45.3/43.7; blend 51.4/48.0, 48.6/46.5, 43.8/42.2;
* the seeded decoder's output: mask 18.2/14.8, 16.6/14.5, 14.7/13.1; blend 24.6/21.2,
  22.6/20.5, 21.3/19.7. With seeded weights the decoder saturates 99.4 % of pixels into a
  pixel-scale pattern that does not move with the features (consecutive dense frames are already
  18.7 dB apart), so any resampling hurts and averaging two binary images (blend) scores best;
  this figure says nothing about real weights, whose output is an image that moves with the
  keypoints like the stand-in above.

With the seeded LMDM + stitcher (keypoints jump ~0.23 per frame, 70x the above) consecutive dense
frames are 9.8 dB apart and no interpolation is close: seeded output mask 12.4/9.0, 10.8/8.7,
10.2/8.6; blend 14.5/11.2, 13.0/10.9, 12.2/10.6.

Streams and state. The engine is shared by many streams, and ``render(layer, driving, frame_idx)``
carries no stream identity, so stride mode makes the driving rows self-contained:
:class:`StrideDriver` (wrapping the stream's ``DittoDriver``) holds rows back until the next
keyframe's row exists (at most k - 1 rows; the first frame is a keyframe, so time to first frame
does not change) and emits ``(n, 3 D + 4)`` rows::

    [own row D | t | stream key | a | b | row of keyframe a D | row of keyframe b D]

(D = 531, the dense row). Any batch can therefore be rendered from its rows alone, in any order
or split (live sessions skip and repeat frames). What one stream renders is remembered only as a
cache -- the keyframe images of its latest frames, in a :class:`StreamState` owned by the driver
and registered weakly with the engine under the stream key, so it goes away with the stream --
which lets each keyframe go through the networks once when batches arrive in order (the runner's
case). A batch that ends between keyframes renders the next keyframe ahead (on the source frame
the avatar loop will show it on, from the ping-pong pattern of the frames seen so far) and the
next batch reuses it. A server's shared batch (`StrideRenderer.render_many`: many sessions' requests) plans
each stream on its own and sends all their keyframes through the networks in one call. Rows of dense width
(``idle_driving``, the avatar at rest) render densely.
"""
from __future__ import annotations

import itertools
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ...accel.constants import device_constant
from ...accel.host_copy import tensor_on, to_device
from ...compose.splice import sample_crops_to_roi
from ..base import FrameQueue, QueuedStage, TensorFrameQueue

# Flow defaults, in the keypoints' normalised units (the face spans about [-0.6, 0.6]).
FLOW_SIGMA = 0.15  # heatmap width: about the spacing of neighbouring face keypoints
FLOW_BG = 0.02  # identity-motion weight: flow fades out ~2.5 sigma away from every keypoint
FLOW_RES = 64  # the flow is smooth: built at the warp network's feature size, then upsampled
_KEY_MOD = 1 << 24  # stream keys travel as float32: exact integers below 2**24
_STREAM_KEYS = itertools.count(1)  # next() is atomic under the GIL

# column offsets after the dense row (D columns)
T_COL, KEY_COL, A_COL, B_COL = 0, 1, 2, 3
EXTRA = 4


def stride_width(base: int) -> int:
    return 3 * base + EXTRA


# ------------------------------------------------------------------------------ interpolation


def keypoint_flow(kp_to: torch.Tensor, kp_from: torch.Tensor, feat_n: int, res: int = FLOW_RES,
                  sigma: float = FLOW_SIGMA, bg: float = FLOW_BG) -> torch.Tensor:
    """Backward flow (B, 2, res, res), in keypoint units (x, y), from frame ``to`` into frame ``from``.

    kp_*: (B, K, >=2) driving keypoints. Keypoint space is the warp network's feature grid:
    coordinate ``2 i / (n - 1) - 1`` at feature pixel i (``feat_n`` = n), so a pixel centre at
    normalised image position u (align_corners=False) sits at ``u * n / (n - 1)``."""
    dev = kp_to.device
    u = (torch.arange(res, device=dev, dtype=torch.float32) + 0.5) / res * 2 - 1
    z = u * (feat_n / (feat_n - 1))
    zy, zx = torch.meshgrid(z, z, indexing="ij")
    grid = torch.stack([zx, zy], dim=-1)  # (res, res, 2)
    kt = kp_to[..., :2].float()
    d2 = (grid[None, None] - kt[:, :, None, None, :]).pow(2).sum(-1)  # (B, K, res, res)
    g = torch.exp(d2 * (-0.5 / (sigma * sigma)))
    w = g / (g.sum(1, keepdim=True) + bg)
    disp = kp_from[..., :2].float() - kt  # (B, K, 2)
    return torch.einsum("bkhw,bkc->bchw", w, disp)


def mask_flow(mask: torch.Tensor, kp_to: torch.Tensor, kp_from: torch.Tensor) -> torch.Tensor:
    """Backward flow (B, 2, h, w) weighted by the dense motion network's own mask.

    mask: (B, 1 + K, h, w), the softmax over [identity, K keypoint motions] of the frame being
    warped, averaged over depth. The network shows at z the source point
    ``D(z) = z + sum_k m_k(z) (kp_s_k - kp_d_k)``; with the mask held fixed, the point frame
    ``to`` shows at z is shown by frame ``from`` at ``z + sum_k m_k(z) (kp_from_k - kp_to_k)``
    (first order in the motion)."""
    disp = kp_from[..., :2].float() - kp_to[..., :2].float()  # (B, K, 2)
    return torch.einsum("bkhw,bkc->bchw", mask[:, 1:].float(), disp)


def warp_by_keypoints(img: torch.Tensor, kp_to: torch.Tensor, kp_from: torch.Tensor, feat_n: int,
                      mask: torch.Tensor | None = None, sample: str = "bicubic", **flow_kw: Any) -> torch.Tensor:
    """``img`` (B, C, H, W), rendered with keypoints ``kp_from``, moved to keypoints ``kp_to``
    (flow from ``mask`` when given, else from Gaussian heatmaps)."""
    b, _, h, w = img.shape
    if mask is not None:
        flow = mask_flow(mask, kp_to, kp_from)
    else:
        flow = keypoint_flow(kp_to, kp_from, feat_n, res=min(FLOW_RES, h), **flow_kw)
    if flow.shape[-2:] != (h, w):
        flow = F.interpolate(flow, size=(h, w), mode="bilinear", align_corners=False)
    grid = _pixel_centres(h, w, img.device) + flow.permute(0, 2, 3, 1) * ((feat_n - 1) / feat_n)
    return F.grid_sample(img.float(), grid, mode=sample, padding_mode="border", align_corners=False)


def _pixel_centres(h: int, w: int, device: torch.device) -> torch.Tensor:
    """(1, h, w, 2) normalised (x, y) of the pixel centres (align_corners=False), made once per size and
    device: a dozen small ops fewer in every stride render call."""

    def make(d: torch.device) -> torch.Tensor:
        ys = (torch.arange(h, device=d, dtype=torch.float32) + 0.5) / h * 2 - 1
        xs = (torch.arange(w, device=d, dtype=torch.float32) + 0.5) / w * 2 - 1
        gy, gx = torch.meshgrid(ys, xs, indexing="ij")
        return torch.stack([gx, gy], dim=-1)[None]

    return device_constant("pixel centres", device, make, h, w)


def interpolate(img_a: torch.Tensor, img_b: torch.Tensor, kp_a: torch.Tensor, kp_b: torch.Tensor,
                kp_t: torch.Tensor, w: torch.Tensor, feat_n: int, mode: str = "flow",
                mask_a: torch.Tensor | None = None, mask_b: torch.Tensor | None = None, **flow_kw: Any) -> torch.Tensor:
    """In-between images (B, C, H, W) float32 at keypoints ``kp_t`` from keyframe images ``img_a``
    (keypoints ``kp_a``) and ``img_b`` (``kp_b``); ``w`` (B,) is the time weight of ``b``.

    mode: ``"flow"`` (motion-compensated cross-fade, the default), ``"blend"`` (plain cross-fade),
    ``"nearest"`` (the nearer keyframe in time; what a frame-repeat would show)."""
    wb = w.to(torch.float32).reshape(-1, 1, 1, 1)
    if mode == "nearest":
        return torch.where(wb >= 0.5, img_b.float(), img_a.float())
    if mode == "blend":
        return torch.lerp(img_a.float(), img_b.float(), wb)
    if mode != "flow":
        raise ValueError(f"interpolation mode must be 'flow', 'blend' or 'nearest', got {mode!r}")
    mask = None if mask_a is None or mask_b is None else torch.cat([mask_a, mask_b])
    both = warp_by_keypoints(torch.cat([img_a, img_b]), torch.cat([kp_t, kp_t]), torch.cat([kp_a, kp_b]), feat_n,
                             mask=mask, **flow_kw)
    wa, wbb = both.chunk(2)
    return torch.lerp(wa, wbb, wb)


# ------------------------------------------------------------------------------ source frames


def guess_source(seen: list[tuple[int, int]], t: int, n_frames: int) -> int:
    """Source frame that output frame ``t`` will be shown on, from (frame, source) pairs seen.

    The runner and live sessions show consecutive output frames on the ping-pong loop
    (``base.pingpong_index(t + offset)``); the offset is found from the pairs. When no offset
    fits (another mapping), the source of the nearest frame seen. A wrong guess only costs a
    re-render when that keyframe's own row arrives (see ``StrideRenderer``)."""
    if n_frames <= 1 or not seen:
        return 0
    n2 = 2 * n_frames
    ts = np.array([p[0] for p in seen], np.int64)
    ss = np.array([p[1] for p in seen], np.int64)
    p = (ts[None, :] + np.arange(n2, dtype=np.int64)[:, None]) % n2
    ok = (np.where(p < n_frames, p, n2 - 1 - p) == ss[None, :]).all(axis=1)
    if ok.any():
        q = (t + int(np.argmax(ok))) % n2
        return int(q if q < n_frames else n2 - 1 - q)
    return int(ss[np.argmin(np.abs(ts - t))])


# ------------------------------------------------------------------------------ per-stream state


@dataclass
class KeyFrame:
    """One keyframe's network output, as the in-betweens need it."""

    src: int  # source frame it was rendered on
    img: torch.Tensor  # (3, H, W) decoder output (its dtype)
    x_d: torch.Tensor  # (K, 3) driving keypoints, float32
    mask: torch.Tensor | None  # (1 + K, h, w) dense-motion mask averaged over depth ("mask" mode)


@dataclass(eq=False)
class StreamState:
    """A stream's cache of its latest keyframes (never needed for correctness, only for cost)."""

    key: int
    layer: Any  # weakref.ref to the AvatarLayer the stream renders on
    keys: dict[int, KeyFrame] = field(default_factory=dict)
    seen: list[tuple[int, int]] = field(default_factory=list)  # recent (output frame, source frame)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def observe(self, pairs: list[tuple[int, int]]) -> None:
        d = dict(self.seen)
        d.update(pairs)
        self.seen = sorted(d.items())[-16:]


@dataclass(eq=False)
class _Plan:
    """One stream's rows of a render call (`StrideRenderer._plan`): which keyframes to render (``todo``:
    (frame, source frame) -> row of the pool [own rows | rows of a | rows of b]) or reuse (``table``), and
    each in-between's pair of keyframes (``links``)."""

    layer: Any
    rows: torch.Tensor  # the request's rows, on the device
    idx: torch.Tensor  # the request's source frames, on the device
    base: int  # dense row width
    sel: list[int]  # this stream's rows in the request
    st: StreamState
    ts: list[int]
    ta: list[int]
    tb: list[int]
    src: list[int]
    is_key: list[bool] = field(default_factory=list)
    todo: dict[tuple[int, int], int] = field(default_factory=dict)
    table: dict[tuple[int, int], KeyFrame] = field(default_factory=dict)
    own: dict[int, tuple[int, int]] = field(default_factory=dict)
    links: list[tuple[tuple[int, int], tuple[int, int]]] = field(default_factory=list)


class StrideDriver(QueuedStage):
    """Wraps a stream's dense driver: rows come out self-contained for stride rendering
    (module doc), each in-between row once the row of its next keyframe exists. At ``close`` the
    stream's last frame becomes a keyframe (the frames before it need a right neighbour)."""

    def __init__(self, inner: FrameQueue, stride: int, state: StreamState, base_width: int):
        self.inner = inner
        self.k = int(stride)
        self.width = stride_width(base_width)
        self.state = state  # owned here; the renderer's registry holds it weakly
        self._buf: torch.Tensor | None = None  # dense rows of frames [_t0, _t0 + len) not yet emitted
        self._t0 = 0
        self._key_row: torch.Tensor | None = None  # row of the last keyframe emitted (frame _key_t)
        self._key_t = -1
        self.out = TensorFrameQueue(self.width, getattr(inner, "device", None))
        self.closed = False

    def __getattr__(self, name: str) -> Any:  # the inner driver's attributes (first_output_at_rows...)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def push(self, value: Any) -> None:
        if self.closed:
            raise RuntimeError("push() after close()")
        self.inner.push(value)
        self._drain(final=False)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.inner.close()
        self._drain(final=True)
        self.out.close()

    def _drain(self, final: bool) -> None:
        n = self.inner.ready
        if n:
            rows = self.inner.take(n)
            self._buf = rows if self._buf is None or self._buf.shape[0] == 0 else torch.cat([self._buf, rows])
        if self._buf is None or self._buf.shape[0] == 0:
            return
        k, t0 = self.k, self._t0
        end = t0 + int(self._buf.shape[0])  # exclusive
        last = end - 1 if final else ((end - 1) // k) * k  # last frame that can be emitted now
        if last < t0:
            return
        buf = self._buf
        dev = buf.device
        ts = torch.arange(t0, last + 1, device=dev)
        ta = ts - ts % k
        tb = ta + k
        if final:
            tail = end - 1
            if tail % k:  # the last frame is a keyframe too
                ta = torch.where(ts == tail, ts, ta)
                tb = torch.where(ts == tail, ts, tb.clamp_max(tail))
        tb = torch.where(ts == ta, ts, tb)
        # rows of the keyframes: the previous emission's last keyframe, or the buffer
        pool = buf if self._key_row is None else torch.cat([self._key_row, buf])
        shift = 0 if self._key_row is None else 1

        def at(times: torch.Tensor) -> torch.Tensor:
            pos = torch.where(times == self._key_t, torch.zeros_like(times), times - t0 + shift)
            return pool.index_select(0, pos)

        m = ts.shape[0]
        meta = torch.stack([ts, torch.full_like(ts, self.state.key), ta, tb], dim=1).to(buf.dtype)
        self.out.push(torch.cat([buf[:m], meta, at(ta), at(tb)], dim=1))
        kt = int(last - last % k)
        if kt >= t0:
            self._key_row, self._key_t = buf[kt - t0 : kt - t0 + 1], kt
        self._buf = buf[m:]
        self._t0 = last + 1


# ------------------------------------------------------------------------------ renderer

MODES = ("mask", "heatmap", "blend", "nearest")
# Batch sizes of the keyframe runner (a CUDA graph each; one shared compilation). A render of c
# frames at stride k needs c / k keyframes once the stream runs (its first keyframe cached, the
# next one ahead), a stream's first render one more, its last one to three: the powers of two,
# one more than each, and 12 / 24 keep those unpadded, where padding to 4, 8, 16, 32 had sent 52
# frames through the networks for the 42 keyframes of 165 frames at k = 4 (chunks of 32: 9 -> 16,
# 1 -> 4). No 1: torch.compile specialises a batch of one and would compile a second time.
KEYFRAME_BUCKETS = (2, 3, 4, 5, 8, 9, 12, 16, 17, 24, 32)


def check_stride(stride: Any, mode: str = "mask") -> int:
    """``stride`` as an int >= 1 (1: dense) with ``mode`` one of `MODES`, else a ValueError in a user's words."""
    if isinstance(stride, bool) or not isinstance(stride, (int, np.integer, float)) or int(stride) != stride or stride < 1:
        raise ValueError(f"stride must be an integer >= 1 (1: every frame through the networks), got {stride!r}")
    if mode not in MODES:
        raise ValueError(f"stride-mode must be one of {', '.join(MODES)}, got {mode!r}")
    return int(stride)


class StrideRenderer:
    """The engine's stride-mode renderer (one per engine, shared by its streams).

    mode: how in-betweens are made from their two keyframes -- ``"mask"`` (default): warped with
    the flow of the warp network's own dense-motion mask of each keyframe moved to frame t's
    keypoints (:func:`mask_flow`); ``"heatmap"``: flow from Gaussian keypoint heatmaps
    (:func:`keypoint_flow`, no network quantity); ``"blend"``: plain cross-fade; ``"nearest"``:
    the nearer keyframe. ``network_frames`` counts frames sent through warp + decode."""

    def __init__(self, engine: Any, stride: int, mode: str = "mask", base_width: int = 531):
        self.k = check_stride(stride, mode)
        if self.k < 2:
            raise ValueError(f"stride mode needs stride >= 2, got {stride}")
        self.engine = engine
        self.mode = mode
        self.base_width = int(base_width)
        self.width = stride_width(self.base_width)  # rows of this width render in stride mode
        self._states: weakref.WeakValueDictionary[int, StreamState] = weakref.WeakValueDictionary()
        self._lock = threading.Lock()
        self.network_frames = 0
        from ...accel.static import BucketedRunner

        # keyframes through static-shape runners like the dense path (CUDA graphs / compile on CUDA)
        self._key_runner = BucketedRunner(self._keys, getattr(engine, "accel", "eager"), sizes=KEYFRAME_BUCKETS)

    def warm_up(self, example_inputs: tuple[torch.Tensor, ...]) -> float:
        """Compile / capture the keyframe runner's buckets now (a server's first session would
        otherwise wait for them); seconds spent."""
        return self._key_runner.warm_up(example_inputs)

    # -- streams ----------------------------------------------------------------------------------
    def driver(self, inner: FrameQueue, layer: Any) -> StrideDriver:
        with self._lock:
            key = 0
            while key == 0 or key in self._states:
                key = next(_STREAM_KEYS) % _KEY_MOD  # unique across engines too
            state = StreamState(key, weakref.ref(layer))
            self._states[key] = state
        return StrideDriver(inner, self.k, state, self.base_width)

    def _state(self, key: int, layer: Any) -> StreamState:
        """The stream's state, or a throw-away one (stream gone, or rows shown on another layer)."""
        with self._lock:
            st = self._states.get(key)
        if st is None or st.layer() is not layer:
            st = StreamState(key, weakref.ref(layer))
        return st

    # -- rendering --------------------------------------------------------------------------------
    def render(self, layer: Any, rows: torch.Tensor, frame_idx: torch.Tensor) -> torch.Tensor:
        """ROIs (B, Hr, Wr, 3) float in [0, 255] for stride rows (module doc)."""
        return self.render_many([(layer, rows, frame_idx)])[0]

    def render_many(self, items: list[tuple[Any, torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
        """`render` of several requests (a server's shared batch: many streams, any avatars), with every
        stream's keyframes through ONE keyframe-runner call: per stream, a live request of ~8 frames at
        k = 4 needs ~2 keyframes, which alone would run the networks at batch 2. Every request is planned
        before any keyframe renders, so two requests of ONE stream in the same batch (not what sessions send:
        one request in flight each) would each render their keyframes rather than the second reusing the
        first's; the frames are the same either way."""
        dev = self.engine.device
        with torch.inference_mode():
            planned = []
            for layer, rows, frame_idx in items:
                base = (rows.shape[1] - EXTRA) // 3
                # The batch is planned on the CPU from its bookkeeping columns and source frames: free when
                # they come on the host (`Engine.rows_on_host`), else one sync, which waits for everything
                # queued on this stream before (the previous batch's render too).
                cols = rows[:, base : base + EXTRA].float()
                meta = torch.cat([cols, frame_idx[:, None].to(cols.device, torch.float32)], 1).tolist()
                rows_d, idx_d = to_device(rows, dev, torch.float32), to_device(frame_idx, dev)
                plans = []
                for key in sorted({int(m[KEY_COL]) for m in meta}):
                    sel = [i for i, m in enumerate(meta) if int(m[KEY_COL]) == key]
                    plans.append(self._plan(layer, rows_d, idx_d, base, [meta[i] for i in sel], sel, self._state(key, layer)))
                planned.append((layer, rows_d, idx_d, plans))
            self._render_keyframes([p for *_, plans in planned for p in plans])
            return [self._rois(layer, rows_d, idx_d, plans) for layer, rows_d, idx_d, plans in planned]

    def _rois(self, layer: Any, rows: torch.Tensor, idx: torch.Tensor, plans: list["_Plan"]) -> torch.Tensor:
        """One request's ROIs from its streams' plans, keyframes rendered."""
        dev = self.engine.device
        crops = None
        for plan in plans:
            part = self._finish(plan)
            if len(plans) == 1:
                crops = part
            else:
                if crops is None:
                    crops = part.new_empty((rows.shape[0], *part.shape[1:]))
                crops[tensor_on(plan.sel, dev)] = part
        assert crops is not None
        grid = layer.data["grid"].index_select(0, idx.to(layer.data["grid"].device)).to(dev, non_blocking=True)
        return sample_crops_to_roi(crops.clamp_(0, 1).mul_(255.0), grid)

    def _plan(self, layer: Any, rows: torch.Tensor, idx: torch.Tensor, base: int, meta: list[list[float]],
              sel: list[int], st: StreamState) -> "_Plan":
        """What rows ``sel`` (one stream's) need: the keyframes to render, to reuse, and each in-between's pair."""
        B = rows.shape[0]
        p = _Plan(layer=layer, rows=rows, idx=idx, base=base, sel=sel, st=st,
                  ts=[int(m[T_COL]) for m in meta], ta=[int(m[A_COL]) for m in meta],
                  tb=[int(m[B_COL]) for m in meta], src=[int(m[EXTRA]) for m in meta])
        p.is_key = [t == a for t, a in zip(p.ts, p.ta)]
        with st.lock:
            st.observe(list(zip(p.ts, p.src)))
            seen = list(st.seen)
            cached = dict(st.keys)
        # Keyframes needed, as (frame, source frame): a keyframe row's own, or an in-between's
        # neighbour -- shown in this batch, else cached, else rendered from the row it carries
        # on the source frame the loop will show it on.
        for j, i in enumerate(sel):
            if p.is_key[j]:
                ref = p.own[p.ts[j]] = (p.ts[j], p.src[j])
                hit = cached.get(p.ts[j])
                if hit is not None and hit.src == p.src[j]:
                    p.table[ref] = hit
                elif ref not in p.todo:
                    p.todo[ref] = i
        for j, i in enumerate(sel):
            if p.is_key[j]:
                continue
            pair = []
            for t_key, block in ((p.ta[j], 1), (p.tb[j], 2)):
                if t_key in p.own:
                    ref = p.own[t_key]
                elif t_key in cached:
                    ref = (t_key, cached[t_key].src)
                    p.table[ref] = cached[t_key]
                else:
                    ref = (t_key, guess_source(seen, t_key, layer.n_frames))
                    p.todo.setdefault(ref, block * B + i)
                pair.append(ref)
            p.links.append((pair[0], pair[1]))
        return p

    def _render_keyframes(self, plans: list["_Plan"]) -> None:
        """Every plan's keyframes to render, through one keyframe-runner call (exactly as `DittoEngine.render`
        renders them: same rows, source frames, dtypes), into each plan's table."""
        eng = self.engine
        dev = eng.device
        need = [p for p in plans if p.todo]
        if not need:
            return
        inputs = []
        for p in need:
            order = sorted(p.todo)
            b = p.base
            pool = torch.cat([p.rows[:, :b], p.rows[:, b + EXTRA : 2 * b + EXTRA], p.rows[:, 2 * b + EXTRA :]])
            src = tensor_on([r[1] for r in order], dev)
            x_s, x_d = eng.keypoints(p.layer, pool.index_select(0, tensor_on([p.todo[r] for r in order], dev)), src)
            d = p.layer.data
            f_s = d["f_s"].index_select(0, src.to(d["f_s"].device)).to(dev, eng.dtype, non_blocking=True)
            inputs.append((order, f_s, x_s, x_d))
        if len(inputs) == 1:
            out = self._key_runner(*inputs[0][1:])
        else:
            out = self._key_runner(*(torch.cat([x[k] for x in inputs]) for k in (1, 2, 3)))
        img, mask = (out[0], out[1]) if self.mode == "mask" else (out[0], None)
        s = 0
        for p, (order, _, _, x_d) in zip(need, inputs):
            for j, ref in enumerate(order):
                p.table[ref] = KeyFrame(ref[1], img[s + j], x_d[j], None if mask is None else mask[s + j])
            s += len(order)
        with self._lock:
            self.network_frames += s

    def _finish(self, p: "_Plan") -> torch.Tensor:
        """Crops (len(sel), 3, H, W) float32 (unclamped) of a plan whose keyframes are in its table:
        keyframes as rendered, in-betweens interpolated; the stream's cache updated."""
        eng = self.engine
        dev = eng.device
        ts, ta, tb, src, sel, base = p.ts, p.ta, p.tb, p.src, p.sel, p.base
        table = p.table
        kpos = [j for j in range(len(sel)) if p.is_key[j]]
        ipos = [j for j in range(len(sel)) if not p.is_key[j]]
        shape = next(iter(table.values())).img.shape
        out = torch.empty((len(sel), *shape), device=dev, dtype=torch.float32)
        if kpos:
            out[tensor_on(kpos, dev)] = torch.stack([table[(ts[j], src[j])].img for j in kpos]).float()
        if ipos:
            rsel = tensor_on([sel[j] for j in ipos], dev)
            _, x_t = eng.keypoints(p.layer, p.rows.index_select(0, rsel)[:, :base], p.idx.index_select(0, rsel))
            ka = [table[a] for a, _ in p.links]
            kb = [table[b] for _, b in p.links]
            w = tensor_on([(ts[j] - ta[j]) / (tb[j] - ta[j]) for j in ipos], dev, torch.float32)
            use_mask = self.mode == "mask"
            out[tensor_on(ipos, dev)] = interpolate(
                torch.stack([k.img for k in ka]), torch.stack([k.img for k in kb]),
                torch.stack([k.x_d for k in ka]), torch.stack([k.x_d for k in kb]), x_t, w,
                feat_n=int(p.layer.data["f_s"].shape[-1]),
                mode="flow" if self.mode in ("mask", "heatmap") else self.mode,
                mask_a=torch.stack([k.mask for k in ka]) if use_mask else None,
                mask_b=torch.stack([k.mask for k in kb]) if use_mask else None)
        # cache what the next frames need: keyframes from the newest frame's left keyframe on
        keep_from = ta[max(range(len(sel)), key=lambda j: ts[j])]
        st = p.st
        with st.lock:
            for ref in sorted(p.todo, key=lambda r: r in p.own.values()):  # a frame's own source wins
                if ref[0] >= keep_from:
                    kf = table[ref]
                    st.keys[ref[0]] = KeyFrame(kf.src, kf.img.clone(), kf.x_d.clone(),
                                               None if kf.mask is None else kf.mask.clone())
            for t_key in [t for t in st.keys if t < keep_from]:
                del st.keys[t_key]
        return out

    def _keys(self, f_s: torch.Tensor, x_s: torch.Tensor, x_d: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.engine.warp_decode(f_s, x_s, x_d, with_mask=self.mode == "mask")
