"""Ditto prebake ("avatar registration"): source frames -> everything the renderer only gathers.

Reference: ``core/atomic_components/avatar_registrar.py`` + ``source2info.py`` and
``core/utils/crop.py`` / ``eye_info.py`` of antgroup/ditto-talkinghead. Per source frame:

1. **Crop** (``crop.py::parse_rect_from_landmark`` + ``_estimate_similar_transform_from_pts``,
   applied to our 68 landmarks with ``parse_pt2_from_pt68``'s points): the axis from the eye
   centre (mean of the two eye centres, 36/39 and 42/45) to the lip centre (mouth corners
   48/54) fixes the rotation; the landmarks' extent in that rotated frame, squared and times
   ``crop_scale`` (2.3), is the crop side; its centre moves by ``vx_ratio``/``vy_ratio`` (0,
   -0.125) of the side along the rotated axes. ``M_o2c`` maps the frame into a 512x512 crop
   (rotation removed), ``M_c2o`` is its inverse. The reference tracks 203 landmarks of its own
   detector; ours are the packet's 68 points (MediaPipe mesh -> iBUG-68), so crops are close to,
   not identical with, the reference's.
2. The crop, area-resized to 256x256, in [0, 1] -> appearance extractor -> ``f_s``
   (32x16x64x64, stored float16) and motion extractor -> ``x_s_info`` (pitch/yaw/roll logits,
   t, exp, scale, kp). Float16 autocast on CUDA like the reference wrappers.
3. **Eye state** for the LMDM condition (``EyeAttrUtilsByMP``): eye-open ratios (2) and
   eye-ball moves (6) from the MediaPipe mesh in normalised crop coordinates. The reference runs
   MediaPipe's 3-D face landmarker on the crop; the packet keeps the 2-D mesh, so z is 0 here
   (the open ratios are 2-D distances instead of 3-D; the ball move's z entries are 0).
4. Video sources: ``x_s_info`` is smoothed over frames with the reference's centred moving
   average (``smooth_x_s_info_lst``, k = ``smo_k_s`` = 13), and so are the crop parameters
   (centre, side, angle) - ours, because our per-frame landmarks are a different detector's
   and an unsmoothed crop would jitter. ``sc`` (the condition's source keypoints) is the
   *unsmoothed* first frame's ``kp``, as in the reference. Photos: one frame.

Then the ROI form for splicing on the GPU (replacing the reference's CPU ``PutBack``): a fixed
even ROI size (the bounding box of the warped crop over all frames, clamped to the frame),
per-frame even origins, per-frame sampling grids (ROI pixel -> normalised crop coordinates,
``M_o2c``; ``grid_sample(align_corners=False)`` then reproduces ``cv2.warpAffine(render,
M_c2o)``) and per-frame alphas (``get_mask(512, 512, 0.9, 0.9)`` warped the same way, zero
border). Packet arrays (``ditto/...``): f_s, x_s_info_{pitch,yaw,roll,t,exp,scale,kp}, sc,
eye_open, eye_ball, m_c2o, origins, mask, grid.
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from ...avatar.packet import Packet
from ...compose.colour import nv12_to_rgb
from .config import DittoConfig
from .models.motion_extractor import MOTION_OUTPUT_NAMES
from .putback import get_mask

INFO_KEYS = MOTION_OUTPUT_NAMES  # pitch, yaw, roll, t, exp, scale, kp
FORMAT_VERSION = 1

# MediaPipe mesh indices of EyeIdxMP (core/utils/eye_info.py)
_LW, _RW = (33, 133), (263, 362)
_LH = ((145, 159), (144, 160), (153, 158))
_RH = ((374, 386), (373, 387), (380, 385))
_LB, _RB = 468, 473


# ------------------------------------------------------------------------------------- crop


@dataclass
class CropParams:
    """Per-frame similarity crops: centre (N, 2), side (N,), angle (N,) radians (float64)."""

    center: np.ndarray
    size: np.ndarray
    angle: np.ndarray

    def smoothed(self, k: int) -> "CropParams":
        return CropParams(mean_filter(self.center, k), mean_filter(self.size, k), mean_filter(self.angle, k))


def mean_filter(arr: np.ndarray, k: int) -> np.ndarray:
    """Centred moving average over axis 0 with windows clamped at the ends (``_mean_filter``)."""
    n = arr.shape[0]
    if k <= 1 or n <= 1:
        return arr.copy()
    h = k // 2
    c = np.concatenate([np.zeros((1, *arr.shape[1:]), np.float64), np.cumsum(arr.astype(np.float64), axis=0)])
    lo = np.clip(np.arange(n) - h, 0, n)
    hi = np.clip(np.arange(n) + h + 1, 0, n)
    shape = (n,) + (1,) * (arr.ndim - 1)
    return ((c[hi] - c[lo]) / (hi - lo).reshape(shape)).astype(arr.dtype)


def crop_params_from_lm68(lm68: np.ndarray, scale: float = 2.3, vx_ratio: float = 0.0, vy_ratio: float = -0.125) -> CropParams:
    """``parse_rect_from_landmark`` (use_lip, need_square) for 68-point landmarks (N, 68, 2)."""
    pts = np.asarray(lm68, np.float64).reshape(-1, 68, 2)
    eye = (pts[:, [36, 39]].mean(1) + pts[:, [42, 45]].mean(1)) / 2
    lip = (pts[:, 48] + pts[:, 54]) / 2
    uy = lip - eye
    length = np.linalg.norm(uy, axis=-1, keepdims=True)
    uy = np.where(length <= 1e-3, np.array([0.0, 1.0]), uy / np.maximum(length, 1e-12))
    ux = np.stack([uy[:, 1], -uy[:, 0]], axis=-1)
    angle = np.arccos(np.clip(ux[:, 0], -1, 1))
    angle = np.where(ux[:, 1] < 0, -angle, angle)
    rot = np.stack([ux, uy], axis=1)  # (N, 2, 2) rows ux, uy
    c0 = pts.mean(1)
    r = np.einsum("nkd,ned->nke", pts - c0[:, None], rot)
    lt, rb = r.min(1), r.max(1)
    c1 = (lt + rb) / 2
    size = (rb - lt).max(-1) * scale
    center = c0 + ux * c1[:, :1] + uy * c1[:, 1:]
    center = center + ux * (vx_ratio * size)[:, None] + uy * (vy_ratio * size)[:, None]
    return CropParams(center, size, angle)


def crop_matrices(p: CropParams, dsize: int, flag_do_rot: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(M_o2c, M_c2o), each (N, 3, 3) float64: frame -> crop of side ``dsize`` and back."""
    s = dsize / p.size
    cos, sin = (np.cos(p.angle), np.sin(p.angle)) if flag_do_rot else (np.ones_like(p.angle), np.zeros_like(p.angle))
    cx, cy = p.center[:, 0], p.center[:, 1]
    t = dsize / 2
    m = np.zeros((len(s), 3, 3))
    m[:, 0, 0], m[:, 0, 1], m[:, 0, 2] = s * cos, s * sin, t - s * (cos * cx + sin * cy)
    m[:, 1, 0], m[:, 1, 1], m[:, 1, 2] = -s * sin, s * cos, t - s * (-sin * cx + cos * cy)
    m[:, 2, 2] = 1
    return m, np.linalg.inv(m)


# ------------------------------------------------------------------------------------- eyes


def eye_state(mesh_crop: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(eye_open (N, 2), eye_ball (N, 6)) from mesh points (N, 478, 2|3) in normalised crop
    coordinates, as ``EyeAttrUtilsByMP.LR_open`` / ``LR_ball_move`` (a missing z is 0)."""
    m = np.asarray(mesh_crop, np.float64)
    if m.shape[-1] == 2:
        m = np.concatenate([m, np.zeros_like(m[..., :1])], -1)

    def dist(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.sqrt(((a - b) ** 2).sum(-1))

    def direc(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return (a - b) / (dist(a, b)[:, None] + 1e-8)

    def side(w: tuple[int, int], hs: tuple[tuple[int, int], ...], ball: int) -> tuple[np.ndarray, np.ndarray]:
        width = dist(m[:, w[0]], m[:, w[1]])
        open_ = sum(dist(m[:, a], m[:, b]) for a, b in hs) / (width + 1e-8)
        center = (m[:, w[0]] + m[:, w[1]]) * 0.5
        b = m[:, ball]
        move = (direc(b, center) - direc(m[:, w[0]], m[:, w[1]])) * dist(b, center)[:, None]
        return open_, move

    lo, lm = side(_LW, _LH, _LB)
    ro, rm = side(_RW, _RH, _RB)
    eye_open = np.stack([lo, ro], -1).astype(np.float32)
    eye_ball = np.stack([lm, rm], -1).reshape(-1, 6).astype(np.float32)  # [n, 3, 2] -> [n, 6]
    return eye_open, eye_ball


def points_to_crop(points: np.ndarray, m_o2c: np.ndarray, dsize: int) -> np.ndarray:
    """Frame points (N, P, 2) -> normalised crop coordinates (x / dsize, y / dsize)."""
    p = np.asarray(points, np.float64)
    out = np.einsum("nij,npj->npi", m_o2c[:, :2, :2], p) + m_o2c[:, None, :2, 2]
    return out / dsize


# ------------------------------------------------------------------------------------- ROI


def roi_geometry(m_c2o: np.ndarray, crop_size: int, frame_size: tuple[int, int]) -> tuple[tuple[int, int], np.ndarray]:
    """Fixed even ROI size (w, h) covering every frame's warped crop (clamped to the frame) and
    per-frame even origins (N, 2) int32 so each ROI holds its crop and stays inside the frame."""
    w, h = frame_size
    cs = crop_size
    corners = np.array([[-1, -1, 1], [cs, -1, 1], [-1, cs, 1], [cs, cs, 1]], np.float64)
    pts = np.einsum("nij,kj->nki", m_c2o[:, :2], corners)
    lo, hi = np.floor(pts.min(1)), np.ceil(pts.max(1)) + 1
    rw = int(min(w, 2 * math.ceil(float((hi[:, 0] - lo[:, 0]).max()) / 2) + 2)) // 2 * 2
    rh = int(min(h, 2 * math.ceil(float((hi[:, 1] - lo[:, 1]).max()) / 2) + 2)) // 2 * 2
    x0 = np.clip(lo[:, 0], 0, w - rw).astype(np.int64) // 2 * 2
    y0 = np.clip(lo[:, 1], 0, h - rh).astype(np.int64) // 2 * 2
    return (rw, rh), np.stack([x0, y0], 1).astype(np.int32)


def roi_grids(m_o2c: torch.Tensor, origins: torch.Tensor, roi_hw: tuple[int, int], crop_size: int) -> torch.Tensor:
    """(B, Hr, Wr, 2) float64 normalised crop coordinates (align_corners=False) of every ROI pixel:
    frame pixel (x0 + j, y0 + i) mapped by M_o2c, so ``grid_sample`` = ``cv2.warpAffine(·, M_c2o)``."""
    hr, wr = roi_hw
    dev = m_o2c.device
    m = m_o2c.to(torch.float64)
    ys = torch.arange(hr, device=dev, dtype=torch.float64).view(1, -1, 1) + origins[:, 1].to(dev, torch.float64).view(-1, 1, 1)
    xs = torch.arange(wr, device=dev, dtype=torch.float64).view(1, 1, -1) + origins[:, 0].to(dev, torch.float64).view(-1, 1, 1)
    u = m[:, 0, 0, None, None] * xs + m[:, 0, 1, None, None] * ys + m[:, 0, 2, None, None]
    v = m[:, 1, 0, None, None] * xs + m[:, 1, 1, None, None] * ys + m[:, 1, 2, None, None]
    return torch.stack([(2 * u + 1) / crop_size - 1, (2 * v + 1) / crop_size - 1], dim=-1)


def crop_frames(rgb: torch.Tensor, m_c2o: torch.Tensor, crop_size: int) -> torch.Tensor:
    """Frames (B, H, W, 3) uint8 -> crops (B, 3, cs, cs) float 0..255 with bilinear sampling and a
    zero border (= ``cv2.warpAffine(img, M_o2c, (cs, cs))``, without OpenCV's 1/32 quantisation)."""
    b, h, w, _ = rgb.shape
    dev = rgb.device
    m = m_c2o.to(dev, torch.float64)
    g = torch.arange(crop_size, device=dev, dtype=torch.float64)
    v, u = torch.meshgrid(g, g, indexing="ij")
    x = m[:, 0, 0, None, None] * u + m[:, 0, 1, None, None] * v + m[:, 0, 2, None, None]
    y = m[:, 1, 0, None, None] * u + m[:, 1, 1, None, None] * v + m[:, 1, 2, None, None]
    grid = torch.stack([(2 * x + 1) / w - 1, (2 * y + 1) / h - 1], -1).to(torch.float32)
    img = rgb.permute(0, 3, 1, 2).to(torch.float32)
    return F.grid_sample(img, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def network_input(crops: torch.Tensor, input_size: int) -> torch.Tensor:
    """Crops (B, 3, cs, cs) 0..255 -> (B, 3, s, s) in [0, 1]: ``cv2.resize(INTER_AREA)`` (an exact
    box average for the integer factor cs / s), then / 255."""
    k = crops.shape[-1] // input_size
    if k * input_size != crops.shape[-1]:
        raise ValueError(f"crop size {crops.shape[-1]} is not a multiple of the input size {input_size}")
    x = F.avg_pool2d(crops, k) if k > 1 else crops
    return x / 255.0


# ------------------------------------------------------------------------------------- driver


@dataclass
class Registration:
    """Everything computed for one packet (numpy, ready for ``packet.add_arrays``)."""

    arrays: dict[str, np.ndarray]
    roi: tuple[int, int]  # (w, h)
    crop_size: int


def _batches(n: int, b: int) -> Iterator[tuple[int, int]]:
    for s in range(0, n, b):
        yield s, min(n, s + b)


@torch.inference_mode()
def register_packet(packet: Packet, models, cfg: DittoConfig, *, batch_size: int = 4, progress: bool = True,
                    scratch=None) -> Registration:
    """Run the registration for every frame of ``packet`` on ``models.device`` (see module doc).

    ``models``: a ``weights.DittoModels`` (appearance + motion extractor used). ``scratch``: an
    optional callable(name, shape, dtype) -> writable numpy array for the big outputs (f_s, grid),
    e.g. a memory map in the packet folder; plain arrays otherwise."""
    dev = models.device
    n = packet.n_frames
    w, h = packet.size
    cs, ins = cfg.crop_size, cfg.input_size
    alloc = scratch or (lambda name, shape, dtype: np.empty(shape, dtype))
    lm68 = np.asarray(packet.array("landmarks68"), np.float64)
    mesh = np.asarray(packet.array("mesh"), np.float64) if "mesh" in packet else None

    params = crop_params_from_lm68(lm68, cfg.crop_scale, cfg.crop_vx_ratio, cfg.crop_vy_ratio)
    if n > 1 and cfg.smo_k_s > 1:
        params = params.smoothed(cfg.smo_k_s)
    m_o2c, m_c2o = crop_matrices(params, cs, cfg.crop_flag_do_rot)

    if mesh is not None and mesh.shape[1] >= 478:
        eye_open, eye_ball = eye_state(points_to_crop(mesh, m_o2c, cs))
    else:  # no mesh: open eyes looking straight (documented fallback)
        eye_open, eye_ball = np.full((n, 2), 0.6, np.float32), np.zeros((n, 6), np.float32)

    f_s = alloc("f_s", (n, *models.feature_volume(ins)), np.float16)
    info = {k: np.empty((n, d), np.float32) for k, d in zip(INFO_KEYS, (66, 66, 66, 3, 63, 1, 63))}
    frames = packet.tensor("frames_nv12")
    autocast = models.dtype != torch.float32  # half-precision networks: autocast like the reference wrappers
    bar = tqdm(total=n, desc="ditto prebake", unit="f", disable=not progress)
    for s, e in _batches(n, batch_size):
        nv12 = frames[s:e].to(dev)
        rgb = nv12_to_rgb(nv12)
        crops = crop_frames(rgb, torch.from_numpy(m_c2o[s:e]), cs)
        x = network_input(crops, ins)
        with torch.autocast(device_type=dev.type, dtype=models.dtype, enabled=autocast):
            fs = models.appearance(x.to(models.dtype))
            outs = models.motion(x.to(models.dtype))
        f_s[s:e] = fs.to(torch.float16).cpu().numpy()
        for k, v in zip(INFO_KEYS, outs):
            info[k][s:e] = v.float().reshape(e - s, -1).cpu().numpy()
        bar.update(e - s)
    sc = info["kp"][0].copy()  # before smoothing, as the reference's register()
    if n > 1 and cfg.smo_k_s > 1:
        info = {k: mean_filter(v, cfg.smo_k_s) for k, v in info.items()}

    (rw, rh), origins = roi_geometry(m_c2o, cs, (w, h))
    grid = alloc("grid", (n, rh, rw, 2), np.float16)
    mask = np.empty((n, rh, rw), np.uint8)
    tmpl = torch.from_numpy(get_mask(cs, cs, 0.9, 0.9)[:, :, 0]).to(dev, torch.float64)[None, None]
    gb = max(1, batch_size * 2)
    for s, e in _batches(n, gb):
        g = roi_grids(torch.from_numpy(m_o2c[s:e]).to(dev), torch.from_numpy(origins[s:e]).to(dev), (rh, rw), cs)
        grid[s:e] = g.to(torch.float16).cpu().numpy()
        mk = F.grid_sample(tmpl.expand(e - s, -1, -1, -1), g, mode="bilinear", padding_mode="zeros", align_corners=False)
        mask[s:e] = (mk[:, 0].clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy()
    bar.close()

    arrays: dict[str, np.ndarray] = {"ditto/f_s": f_s}
    arrays.update({f"ditto/x_s_info_{k}": v.astype(np.float32) for k, v in info.items()})
    arrays.update({
        "ditto/sc": sc.reshape(1, 63).astype(np.float32),
        "ditto/eye_open": eye_open,
        "ditto/eye_ball": eye_ball,
        "ditto/m_c2o": m_c2o.astype(np.float32),
        "ditto/origins": origins,
        "ditto/mask": mask,
        "ditto/grid": grid,
    })
    return Registration(arrays, (rw, rh), cs)


def prebake_ditto(packet: Packet, models, cfg: DittoConfig, *, weights_id: str, batch_size: int = 4,
                  progress: bool = True) -> Packet:
    """Register the packet and add the ``ditto/...`` arrays + engine meta (atomic manifest swap)."""
    scratch_files: list = []

    def scratch(name: str, shape: tuple[int, ...], dtype) -> np.ndarray:
        p = packet.path / f".ditto_{name}.scratch.npy"
        scratch_files.append(p)
        return np.lib.format.open_memmap(p, mode="w+", dtype=dtype, shape=shape)

    try:
        reg = register_packet(packet, models, cfg, batch_size=batch_size, progress=progress, scratch=scratch)
        meta = {"format": FORMAT_VERSION, "weights": weights_id, "roi": list(reg.roi), "crop_size": reg.crop_size,
                **cfg.fingerprint()}
        out = packet.add_arrays(reg.arrays, engine="ditto", engine_meta=meta)
    finally:
        for p in scratch_files:
            try:
                p.unlink()
            except FileNotFoundError:
                pass
    return out


def expected_meta(cfg: DittoConfig, weights_id: str) -> dict:
    return {"format": FORMAT_VERSION, "weights": weights_id, **cfg.fingerprint()}


def prebake_mismatch(packet: Packet, expected: dict) -> str | None:
    """None when the packet's Ditto arrays fit ``expected``; else why not."""
    meta = packet.engine_meta("ditto")
    if meta is None:
        return "the packet has no Ditto arrays"
    for k, v in expected.items():
        if meta.get(k) != v:
            return f"its Ditto arrays were made with {k}={meta.get(k)!r}, this engine needs {v!r}"
    need = ["ditto/f_s", "ditto/m_c2o", "ditto/origins", "ditto/mask", "ditto/grid", "ditto/sc", "ditto/eye_open",
            "ditto/eye_ball", *(f"ditto/x_s_info_{k}" for k in INFO_KEYS)]
    missing = [k for k in need if k not in packet]
    if missing:
        return f"Ditto arrays missing: {', '.join(missing)}"
    return None
