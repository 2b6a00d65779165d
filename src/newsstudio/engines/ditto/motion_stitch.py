"""Ditto motion stitching: LMDM motion rows + source motion -> source/driving 3D keypoints.

Reference: ``core/atomic_components/motion_stitch.py`` (``MotionStitch``) of
antgroup/ditto-talkinghead, which works frame by frame in numpy. Here every step runs batched
over a block of consecutive frames in torch (any device), with the reference's per-frame state
carried across calls (``d0``, the fade target, the blink counter), so streaming a video block by
block gives the same keypoints as one call over all frames.

Per frame, in the reference's order: merge ctrl kwargs with ``overall_ctrl_info`` -> relative
driving / key mixing -> expression row mixing (lips, eyes, blink delta) -> ``vad_alpha`` -> pose /
exp controls -> fade -> gaze correction -> ``transform_keypoint`` -> stitching network.

Pose angles are carried as 66-bin logits until a ``delta_<pose>`` control turns that frame's angle
into degrees (README S6); ``alpha_<pose>`` scales whichever representation the frame holds.
"""
from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ...accel.constants import device_constant
from ...accel.host_copy import tensor_on
from .models.stitching_network import StitchingNetwork

NUM_KP = 21
POSE_KEYS = ("pitch", "yaw", "roll")
LIP_ROWS = (6, 12, 14, 17, 19, 20)
EYE_ROWS = (11, 13, 15, 16, 18)
# LMDM motion row layout: [scale−1 | pitch 66 | yaw 66 | roll 66 | t 3 | exp 63] (+ kp 63 if present)
MOTION_LAYOUT: tuple[tuple[str, int], ...] = (("scale", 1), ("pitch", 66), ("yaw", 66), ("roll", 66), ("t", 3), ("exp", 63), ("kp", 63))
BLINK_OPEN_RANGE = (60, 100)

Info = dict[str, Tensor]


# -- format conversion ---------------------------------------------------------------------------


def motion_rows_to_info(rows: Tensor) -> Info:
    """LMDM motion rows [N, ≥265] -> {scale [N,1], pitch/yaw/roll [N,66], t [N,3], exp [N,63]}
    (+ kp when the rows carry it); scale = row[0] + 1 (``_cvt_LP_motion_info(..., 'arr2dic')``)."""
    if rows.dim() == 1:
        rows = rows[None]
    if rows.shape[-1] < 265:
        raise ValueError(f"motion rows need >= 265 columns, got {rows.shape[-1]}")
    info: Info = {}
    s = 0
    for k, n in MOTION_LAYOUT:
        if s >= rows.shape[-1]:
            break
        v = rows[:, s : s + n]
        info[k] = v + 1 if k == "scale" else v
        s += n
    return info


def info_to_motion_rows(info: Mapping[str, Tensor], ignore_keys: Sequence[str] = ("kp",)) -> Tensor:
    """Motion dict -> rows [N, dim] in the LMDM layout, scale stored as scale − 1
    (``_cvt_LP_motion_info(..., 'dic2arr')``)."""
    parts = []
    for k, n in MOTION_LAYOUT:
        if k not in info or k in ignore_keys:
            continue
        v = info[k].reshape(-1, n)
        parts.append(v - 1 if k == "scale" else v)
    return torch.cat(parts, dim=-1)


def source_kp_cond(x_s_info: Mapping[str, Tensor]) -> Tensor:
    """The LMDM reference frame ``kp_cond`` [1, 265] built from the source's first frame."""
    first = {k: v.reshape(-1, v.shape[-1])[:1] for k, v in x_s_info.items()}
    return info_to_motion_rows(first, ignore_keys=("kp",))


# -- geometry ----------------------------------------------------------------------------------------


def _bin_index(device: torch.device, dtype: torch.dtype) -> Tensor:
    """[0..65] on the device, made once per device and dtype (not one arange per call)."""
    return device_constant("bin66 index", device, lambda d: torch.arange(66, device=d, dtype=dtype), dtype)


def bin66_to_degree(logits: Tensor) -> Tensor:
    """Expected angle in degrees [...] of 66-bin logits [..., 66]: softmax · [0..65] · 3 − 97.5.
    Rows are independent, so three poses stacked as [N, 3, 66] cost one pass, not three."""
    return (torch.softmax(logits, dim=-1) * _bin_index(logits.device, logits.dtype)).sum(dim=-1) * 3 - 97.5


def poses_to_degrees(pitch: Tensor, yaw: Tensor, roll: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """`bin66_to_degree` of three poses' logits [N, 66] each, in one pass: [N] each."""
    pitch_deg, yaw_deg, roll_deg = bin66_to_degree(torch.stack([pitch, yaw, roll], dim=1)).unbind(1)
    return pitch_deg, yaw_deg, roll_deg


# Each axis's rotation as 9 picks from [0, 1, cos, sin, −sin] of its angle: Rx, Ry, Rz (row major).
_ROTATION_PICKS = ((1, 0, 0, 0, 2, 4, 0, 3, 2), (2, 0, 3, 0, 1, 0, 4, 0, 2), (2, 4, 0, 3, 2, 0, 0, 0, 1))
def _rotation_picks(device: torch.device) -> Tensor:
    """`_ROTATION_PICKS` as [1, 3, 9] on the device, uploaded once without a synchronising copy."""
    return device_constant("rotation picks", device, lambda d: tensor_on(_ROTATION_PICKS, d, torch.int64)[None])


def rotation_matrix(pitch: Tensor, yaw: Tensor, roll: Tensor) -> Tensor:
    """(Rz(roll)·Ry(yaw)·Rx(pitch))ᵀ [N, 3, 3] from angles in degrees [N].

    The three axes' matrices are gathered from one table of their angles' sines and cosines: ~13
    small ops for a batch instead of ~45 (one kernel launch each on a GPU, in every render call)."""
    ang = torch.stack([a.reshape(-1) for a in (pitch, yaw, roll)], dim=-1) / 180 * math.pi  # [N, 3]
    c, s = ang.cos(), ang.sin()
    table = torch.stack([torch.zeros_like(c), torch.ones_like(c), c, s, -s], dim=-1)  # [N, 3, 5]
    n = ang.shape[0]
    m = table.gather(2, _rotation_picks(ang.device).expand(n, -1, -1)).view(n, 3, 3, 3)
    return (m[:, 2] @ m[:, 1] @ m[:, 0]).transpose(1, 2)


def transform_keypoint(kp: Tensor, pitch_deg: Tensor, yaw_deg: Tensor, roll_deg: Tensor, t: Tensor, exp: Tensor, scale: Tensor) -> Tensor:
    """x = scale·(kp @ R + exp), then x[..., :2] += t[:2]; kp/exp [N, 63], t [N, 3], scale [N, 1]
    -> [N, 21, 3]."""
    n = kp.shape[0]
    rot = rotation_matrix(pitch_deg, yaw_deg, roll_deg)
    x = (kp.reshape(n, -1, 3) @ rot + exp.reshape(n, -1, 3)) * scale.reshape(n, 1, 1)
    return torch.cat([x[..., :2] + t.reshape(n, 1, 3)[..., :2], x[..., 2:]], dim=-1)


def transform_info(info: Mapping[str, Tensor]) -> Tensor:
    """``transform_keypoint`` of a motion dict whose poses are logits [N, 66] or degrees [N]."""
    if all(info[k].shape[-1] == 66 for k in POSE_KEYS):
        deg: Sequence[Tensor] = poses_to_degrees(*(info[k] for k in POSE_KEYS))
    else:
        deg = [info[k] if info[k].shape[-1] != 66 else bin66_to_degree(info[k]) for k in POSE_KEYS]
    return transform_keypoint(info["kp"], *deg, info["t"], info["exp"], info["scale"])


# -- blink schedule --------------------------------------------------------------------------------


def blink_schedule(n: int, blink_n: int = 15, open_n: int | Sequence[int] = -1, rng: random.Random | None = None) -> list[int]:
    """Index into ``delta_eye_arr`` for each of n frames (``_set_eye_blink_idx``).

    open_n < 0: no blink (all 0); > 0: a ``blink_n``-frame blink (indices 0..blink_n−1) starts
    at frame open_n and then every blink_n + open_n frames while the start is < n − max(open_n,
    blink_n); a list cycles through gap lengths; 0: random gaps in [60, 100] drawn from ``rng``.
    """
    idx = [0] * n
    if isinstance(open_n, int):
        if open_n < 0:
            return idx
        gaps: list[int] = [open_n] if open_n > 0 else []
    else:
        gaps = list(open_n)
    rng = rng if rng is not None else random.Random()
    draw = lambda: rng.randint(*BLINK_OPEN_RANGE)  # noqa: E731
    start = gaps[0] if gaps else draw()
    end_gap = gaps[-1] if gaps else draw()
    max_i = n - max(end_gap, blink_n)
    cur, k = start, 1
    while cur < max_i:
        span = min(blink_n, n - cur)
        idx[cur : cur + span] = range(span)
        if gaps:
            gap = gaps[k % len(gaps)]
            k += 1
        else:
            gap = draw()
        cur += blink_n + gap
    return idx


# -- the stitcher ------------------------------------------------------------------------------------


@dataclass
class MotionStitchConfig:
    """``MotionStitch.setup`` kwargs (same names and defaults as the reference)."""

    N_d: int = -1
    use_d_keys: Sequence[str] | Mapping[str, float] | None = None
    relative_d: bool = True
    drive_eye: bool | None = None
    delta_eye_arr: Tensor | None = None
    delta_eye_open_n: int | Sequence[int] = -1
    fade_out_keys: Sequence[str] = ("exp",)
    fade_type: str = ""  # "" | "d0" | "s"
    flag_stitching: bool = True
    is_image_flag: bool = True
    overall_ctrl_info: Mapping[str, object] = field(default_factory=dict)
    ch_scale: float | None = None  # scale of ch_info['x_s_info_lst'][0] (reference `ch_info`)


@dataclass
class StitchResult:
    """Keypoints of a block of frames plus the driving dict right before ``transform_keypoint``."""

    x_s: Tensor  # [N, 21, 3]
    x_d: Tensor  # [N, 21, 3] final (after stitching)
    x_d_before_stitch: Tensor  # [N, 21, 3]
    x_d_info: Info  # pitch/yaw/roll in degrees [N]; t [N,3]; exp [N,63]; scale [N,1]; kp [N,63]
    blink_idx: list[int]


class _Pose:
    """A pose angle per frame as logits [N, 66] or, where ``is_deg``, degrees ``deg`` [N]. Until a
    control sets degrees on some frame (rare), neither ``deg`` nor ``is_deg`` is made: no device
    tensors allocated and no ``where`` per render call."""

    def __init__(self, logits: Tensor) -> None:
        self.logits = logits
        self._deg: Tensor | None = None
        self._is_deg: Tensor | None = None

    @property
    def deg(self) -> Tensor:
        if self._deg is None:
            self._deg = torch.zeros(self.logits.shape[0], device=self.logits.device, dtype=self.logits.dtype)
        return self._deg

    @deg.setter
    def deg(self, value: Tensor) -> None:
        self._deg = value

    @property
    def is_deg(self) -> Tensor:
        if self._is_deg is None:
            self._is_deg = torch.zeros(self.logits.shape[0], device=self.logits.device, dtype=torch.bool)
        return self._is_deg

    @is_deg.setter
    def is_deg(self, value: Tensor) -> None:
        self._is_deg = value

    def select(self, i: int) -> "_Pose":
        p = _Pose(self.logits[i : i + 1].clone())
        if self._is_deg is not None:
            p.deg, p.is_deg = self.deg[i : i + 1].clone(), self.is_deg[i : i + 1].clone()
        return p


def _pose_degrees(poses: Sequence[_Pose]) -> list[Tensor]:
    """Degrees [N] of each pose: its logits' expected angle (the three in one pass), or its degrees
    on the frames that carry them."""
    from_logits = poses_to_degrees(*(p.logits for p in poses))
    return [d if p._is_deg is None else torch.where(p._is_deg, p.deg, d) for p, d in zip(poses, from_logits)]


def _rows_mask(rows: Sequence[int], device: torch.device, dtype: torch.dtype) -> Tensor:
    """1 on the given keypoint rows (x, y, z each), as [1, 63]; cached per device so the render
    path does not upload a fresh mask (a host-to-device copy, i.e. a stall) every batch."""

    def make(d: torch.device) -> Tensor:
        m = torch.zeros(NUM_KP, 3, device=d, dtype=dtype)
        m[list(rows)] = 1
        return m.reshape(1, -1)

    return device_constant("keypoint rows mask", device, make, tuple(rows), dtype)


def _broadcast_info(info: Mapping[str, Tensor], n: int) -> Info:
    out: Info = {}
    for k, v in info.items():
        v = v.reshape(-1, v.shape[-1]) if v.dim() > 1 else v.reshape(-1, 1)
        out[k] = v.expand(n, -1) if v.shape[0] == 1 and n > 1 else v
    return out


class MotionStitcher:
    """Stateful, batched ``MotionStitch``: ``setup`` once per avatar/run, then call on blocks of
    consecutive frames. ``stitch_net`` may be None only with ``flag_stitching=False``."""

    def __init__(self, stitch_net: StitchingNetwork | None) -> None:
        self.stitch_net = stitch_net
        self.cfg = MotionStitchConfig()

    def setup(self, cfg: MotionStitchConfig, x_s_info: Mapping[str, Tensor] | None = None, d0: Mapping[str, Tensor] | None = None, rng: random.Random | None = None) -> None:
        self.cfg = cfg
        image = cfg.is_image_flag
        keys = cfg.use_d_keys if cfg.use_d_keys is not None else (("exp", "pitch", "yaw", "roll", "t") if image else ("exp",))
        self.use_d_keys: dict[str, float] = dict(keys) if isinstance(keys, Mapping) else {k: 1.0 for k in keys}
        self.weighted = isinstance(keys, Mapping)
        self.drive_eye = cfg.drive_eye if cfg.drive_eye is not None else image
        self.delta_eye_arr = cfg.delta_eye_arr
        self.rng = rng
        self.N_d: int | None = None
        self.blink_idx: list[int] = [0]
        self.blink_rows: Tensor | None = None
        """When set: the blink index of each frame of the next call, on the device (a live render
        carries it in its driving rows), used instead of the schedule; the result's ``blink_idx`` is
        then empty. Reading it back to the host would wait for all the GPU work queued before it."""
        self.set_Nd(cfg.N_d)
        if cfg.flag_stitching and self.stitch_net is None:
            raise ValueError("flag_stitching needs a StitchingNetwork")

        self.pose_s: tuple[Tensor, Tensor] | None = None  # (yaw, pitch) degrees [1]
        self.x_s_cache: Tensor | None = None
        self.fade_dst: Info | None = None
        self.fade_dst_pose: dict[str, _Pose] | None = None
        self.scale_ratio: float | None = 1.0
        if image and x_s_info is not None:
            src = _broadcast_info(x_s_info, 1)
            self.pose_s = (bin66_to_degree(src["yaw"]), bin66_to_degree(src["pitch"]))
            self.x_s_cache = transform_info(src)
            if cfg.fade_type == "s":
                self._set_fade_dst(src)
        if cfg.ch_scale is not None:
            self.scale_ratio = None
            if x_s_info is not None:
                self._set_scale_ratio(cfg.ch_scale / float(x_s_info["scale"].reshape(-1)[0]))
        self.d0: Info | None = _broadcast_info(d0, 1) if d0 is not None else None
        self.idx = 0

    def set_Nd(self, N_d: int = -1) -> None:
        """Blink schedule for N_d frames (3000 when −1), as ``MotionStitch.set_Nd``."""
        if N_d == self.N_d:
            return
        self.N_d = N_d
        if self.drive_eye and self.delta_eye_arr is not None:
            n = 3000 if N_d == -1 else N_d
            self.blink_idx = blink_schedule(n, len(self.delta_eye_arr), self.cfg.delta_eye_open_n, self.rng)

    def _set_scale_ratio(self, ratio: float) -> None:
        self.scale_ratio = ratio
        if ratio != 1:
            self.use_d_keys = {k: w * (ratio if k in ("exp", "pitch", "yaw", "roll") else 1) for k, w in self.use_d_keys.items()}
            self.weighted = True

    def _set_fade_dst(self, info: Mapping[str, Tensor], poses: Mapping[str, _Pose] | None = None) -> None:
        self.fade_dst = {k: v[:1].clone() for k, v in info.items()}
        self.fade_dst_pose = {k: (poses[k].select(0) if poses is not None else _Pose(self.fade_dst[k])) for k in POSE_KEYS}

    # -- steps -------------------------------------------------------------------------------------

    def _mix(self, x_s: Info, x_d: Info) -> Info:
        """Relative driving against d0 and source fallback for keys that are not driven."""
        w = self.use_d_keys
        if self.d0 is not None:
            if self.weighted:
                x_d = {k: x_s[k] + (v - self.d0[k]) * w.get(k, 1) for k, v in x_d.items()}
            else:
                x_d = {k: x_s[k] + (v - self.d0[k]) for k, v in x_d.items()}
        else:
            x_d = dict(x_d)
        for k, v in x_s.items():
            if k not in x_d or k not in w:
                x_d[k] = v
        if self.weighted and self.d0 is None:
            for k, a in w.items():
                x_d[k] = x_d[k] * a
        return x_d

    def _exp_rows(self, exp_d: Tensor, exp_s: Tensor, n: int) -> tuple[Tensor, list[int]]:
        dev, dt = exp_d.device, exp_d.dtype
        a1 = _rows_mask(LIP_ROWS, dev, dt)
        blink: list[int] = []
        if self.drive_eye and self.delta_eye_arr is not None:
            a2 = _rows_mask(EYE_ROWS, dev, dt)
            table = self.delta_eye_arr.to(dev, dt).reshape(-1, 63)
            if self.blink_rows is not None:  # per-frame indices already on the device: no host round trip
                delta = table.index_select(0, self.blink_rows.to(dev).long().clamp(0, table.shape[0] - 1))
            else:
                blink = [self.blink_idx[(self.idx + i) % len(self.blink_idx)] for i in range(n)]
                delta = table[tensor_on(blink, dev)]
            return exp_d * (a1 * (1 - a2)) + exp_s * ((1 - a1) + a1 * a2) + delta * a2, blink
        if self.drive_eye:
            a1 = torch.maximum(a1, _rows_mask(EYE_ROWS, dev, dt))
        return exp_d * a1 + exp_s * (1 - a1), blink

    @staticmethod
    def _ctrl_column(ctrls: Sequence[Mapping[str, object]], key: str, default: float, like: Tensor) -> tuple[Tensor, Tensor, bool]:
        """(values [n], present [n] bool, True) of one ctrl kwarg over the frames; when no frame
        carries it (the common case), ``(like, like, False)`` and nothing is built on the device: the
        caller uses the columns only when some frame carries the key."""
        has = [key in c for c in ctrls]
        if not any(has):
            return like, like, False
        vals = [float(c.get(key, default)) for c in ctrls]  # type: ignore[arg-type]
        return torch.tensor(vals, device=like.device, dtype=like.dtype), torch.tensor(has, device=like.device), True

    def __call__(
        self,
        x_s_info: Mapping[str, Tensor],
        x_d_info: Mapping[str, Tensor],
        ctrl: Sequence[Mapping[str, object]] | None = None,
        kp_s: Tensor | None = None,
    ) -> StitchResult:
        """Keypoints for a block of n consecutive frames.

        x_s_info: source motion dict, entries [n, …] (video: one source frame per driving frame)
        or [1, …] (shared). x_d_info: driving dict from :func:`motion_rows_to_info`, entries
        [n, …]. ctrl: per-frame ctrl kwargs (fade_alpha, fade_out_keys, vad_alpha,
        delta_/alpha_ pitch|yaw|roll, delta_exp); ``overall_ctrl_info`` fills missing keys.
        kp_s: the source keypoints [n, 21, 3] (``transform_info(x_s_info)``) where the caller keeps
        them per source frame (the engine does): not made again on every call.
        """
        n = next(iter(x_d_info.values())).shape[0]
        ctrls = [dict(c) for c in (ctrl if ctrl is not None else [{}] * n)]
        if len(ctrls) != n:
            raise ValueError(f"{len(ctrls)} ctrl entries for {n} frames")
        for c in ctrls:
            for k, v in self.cfg.overall_ctrl_info.items():
                c.setdefault(k, v)
        x_s = _broadcast_info(x_s_info, n)
        x_d = _broadcast_info(x_d_info, n)
        ref = x_d["exp"]

        if self.scale_ratio is None:  # ch_info with a video source: ratio from the first frame
            self._set_scale_ratio(float(self.cfg.ch_scale) / float(x_s["scale"][0, 0]))  # type: ignore[arg-type]
        if self.cfg.relative_d and self.d0 is None:
            self.d0 = {k: v[:1].clone() for k, v in x_d.items()}

        x_d = self._mix(x_s, x_d)
        x_d["exp"], blink = self._exp_rows(x_d["exp"], x_s["exp"], n)

        vad, has_vad, any_vad = self._ctrl_column(ctrls, "vad_alpha", 1.0, ref)
        if any_vad:
            use_vad = (has_vad & (vad < 1))[:, None]
            x_d["exp"] = torch.where(use_vad, x_d["exp"] * vad[:, None] + x_s["exp"] * (1 - vad[:, None]), x_d["exp"])

        poses = {k: _Pose(x_d[k]) for k in POSE_KEYS}
        for k in POSE_KEYS:  # delta first (switches to degrees), then alpha
            p = poses[k]
            dv, has_d, any_d = self._ctrl_column(ctrls, f"delta_{k}", 0.0, ref)
            if any_d:
                p.deg = torch.where(has_d, bin66_to_degree(p.logits) + dv, p.deg)
                p.is_deg = p.is_deg | has_d
            av, has_a, any_a = self._ctrl_column(ctrls, f"alpha_{k}", 1.0, ref)
            if any_a:
                p.deg = torch.where(has_a & p.is_deg, p.deg * av, p.deg)
                p.logits = torch.where((has_a & ~p.is_deg)[:, None], p.logits * av[:, None], p.logits)
        if any("delta_exp" in c for c in ctrls):
            de = torch.stack([torch.as_tensor(c.get("delta_exp", 0.0), device=ref.device, dtype=ref.dtype).reshape(-1).expand(63) for c in ctrls])
            x_d["exp"] = x_d["exp"] + de

        if self.cfg.fade_type == "d0" and self.fade_dst is None:
            self._set_fade_dst(x_d, poses)
        self._fade(x_s, x_d, poses, ctrls)

        pitch_deg, yaw_deg, roll_deg = _pose_degrees([poses[k] for k in POSE_KEYS])
        if self.drive_eye:
            if self.pose_s is None:
                self.pose_s = (bin66_to_degree(x_s["yaw"][:1]), bin66_to_degree(x_s["pitch"][:1]))
            x_d["exp"] = _fix_gaze(x_d["exp"], yaw_deg, pitch_deg, *self.pose_s)

        if kp_s is not None:
            kp_s = kp_s.expand(n, -1, -1)
        elif self.x_s_cache is not None:
            kp_s = self.x_s_cache.expand(n, -1, -1)
        else:
            kp_s = transform_info(x_s)
            if self.cfg.is_image_flag:
                self.x_s_cache = kp_s[:1]
        kp_d = transform_keypoint(x_d["kp"], pitch_deg, yaw_deg, roll_deg, x_d["t"], x_d["exp"], x_d["scale"])
        kp_final = self.stitch_net(kp_s, kp_d) if self.cfg.flag_stitching else kp_d  # type: ignore[misc]
        self.idx += n
        info = {"pitch": pitch_deg, "yaw": yaw_deg, "roll": roll_deg, "t": x_d["t"], "exp": x_d["exp"], "scale": x_d["scale"], "kp": x_d["kp"]}
        return StitchResult(kp_s, kp_final, kp_d, info, blink)

    def _fade(self, x_s: Info, x_d: Info, poses: dict[str, _Pose], ctrls: Sequence[Mapping[str, object]]) -> None:
        """x ← x·α + dst·(1−α) for the fade keys of frames carrying ``fade_alpha``."""
        ft = self.cfg.fade_type
        if ft not in ("d0", "s") or not any("fade_alpha" in c for c in ctrls):
            return
        if ft == "s" and self.fade_dst is None:
            dst, dst_pose = {k: v for k, v in x_s.items()}, {k: _Pose(x_s[k]) for k in POSE_KEYS}
            if self.cfg.is_image_flag:
                self._set_fade_dst({k: v[:1] for k, v in x_s.items()})
        else:
            assert self.fade_dst is not None and self.fade_dst_pose is not None
            dst, dst_pose = self.fade_dst, self.fade_dst_pose
        groups: dict[tuple[str, ...], list[int]] = {}
        for i, c in enumerate(ctrls):
            if "fade_alpha" in c:
                keys = tuple(c.get("fade_out_keys", self.cfg.fade_out_keys))  # type: ignore[arg-type]
                groups.setdefault(keys, []).append(i)
        ref = x_d["exp"]
        for keys, frames in groups.items():
            sel = torch.zeros(ref.shape[0], dtype=torch.bool, device=ref.device)
            sel[frames] = True
            alpha = torch.tensor([float(ctrls[i].get("fade_alpha", 1.0)) if i in frames else 1.0 for i in range(len(ctrls))],  # type: ignore[arg-type]
                                 device=ref.device, dtype=ref.dtype)
            for k in keys:
                if k == "kp":
                    continue
                if k in POSE_KEYS:
                    _fade_pose(poses[k], dst_pose[k], alpha, sel)
                elif k in x_d:
                    a = alpha[:, None]
                    x_d[k] = torch.where(sel[:, None], x_d[k] * a + dst[k].expand_as(x_d[k]) * (1 - a), x_d[k])


def _fade_pose(p: _Pose, dst: _Pose, alpha: Tensor, sel: Tensor) -> None:
    """Fade of a pose angle. Same representation: blend it. Mixed (logits with degrees): the
    reference broadcasts a degree scalar onto 66 logits, a constant shift that the softmax
    ignores, so only the logits term survives: α·logits, or (1−α)·dst_logits."""
    n = p.logits.shape[0]
    d_is_deg = dst.is_deg.expand(n)
    d_deg, d_logits = dst.deg.expand(n), dst.logits.expand(n, -1)
    a = alpha
    both_deg = sel & p.is_deg & d_is_deg
    both_log = sel & ~p.is_deg & ~d_is_deg
    log_deg = sel & ~p.is_deg & d_is_deg
    deg_log = sel & p.is_deg & ~d_is_deg
    p.deg = torch.where(both_deg, p.deg * a + d_deg * (1 - a), p.deg)
    new_logits = torch.where(both_log[:, None], p.logits * a[:, None] + d_logits * (1 - a[:, None]), p.logits)
    new_logits = torch.where(log_deg[:, None], p.logits * a[:, None], new_logits)
    new_logits = torch.where(deg_log[:, None], d_logits * (1 - a[:, None]), new_logits)
    p.logits = new_logits
    p.is_deg = p.is_deg & ~deg_log


def _fix_gaze(exp: Tensor, yaw_d: Tensor, pitch_d: Tensor, yaw_s: Tensor, pitch_s: Tensor) -> Tensor:
    """Eye-ball correction from the head turn (degrees): the reference's ``_fix_gaze``; the
    offsets are computed in float64 like its Python-float arithmetic, then added in float32."""
    dx = (yaw_d.double() - yaw_s.double().reshape(-1)) * 0.26
    dy = (pitch_d.double() - pitch_s.double().reshape(-1)) * 0.28
    pos = dx > 0
    add = torch.zeros(exp.shape[0], 63, device=exp.device, dtype=torch.float64)
    add[:, 33] = dx * torch.where(pos, 0.0007, 0.001)
    add[:, 45] = dx * torch.where(pos, 0.001, 0.0007)
    add[:, 34] = dy * -0.001
    add[:, 46] = dy * -0.001
    cols = _gaze_columns(exp.device)
    out = exp.clone()
    out[:, cols] = exp[:, cols] + add[:, cols].to(exp.dtype)
    return out


def _gaze_columns(device: torch.device) -> Tensor:
    """The eye-ball expression columns as an index tensor on the device, made once: indexing with
    a Python list uploads it on every call (a synchronising copy in the render thread, every batch)."""
    return device_constant("gaze columns", device, lambda d: torch.tensor([33, 34, 45, 46], device=d))
