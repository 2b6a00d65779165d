"""MuseTalk's per-avatar tensors, computed once and stored in the avatar packet.

What the official realtime script prepares per avatar frame (crop box, 256x256 crop, 8-channel
VAE latent, blend mask), laid out for GPU splicing instead of CPU pasting:

* crop boxes from the packet's 68 landmarks (``crop.crop_boxes``: v1.5 = +10 px margin below the
  chin clamped to the frame height; v1.0 = ``bbox_shift``). Our landmarks are in OUTPUT-frame
  pixels and the crop is taken from the output frames (``frames_nv12``), so crop and paste-back
  happen in one coordinate system. Boxes are clipped to the frame: the official crops the clipped
  region but pastes the face at the unclipped size, which shifts the face at frame edges;
* crops resized to 256x256 with LANCZOS4 and encoded by the VAE in batches on the engine's device:
  ``musetalk/latents`` (N, 8, 32, 32), masked-lower-half latent first, then the reference latent;
  the posterior mean (``.mode()``) by default, or a sample with a seeded generator. Stored as
  float16 after measuring the rounding error (recorded in the engine meta; float32 is kept if the
  error is above ``FP16_MAX_RELERR`` or a value overflows);
* blend alpha: BiSeNet parsing (``jaw`` mode, cheek widths 90/90 for v1.5, ``raw`` for v1.0) of the
  enlarged crop when a parser is given, else the landmark jaw polygon; either way the same
  bicubic resize, face-box restriction, upper-half cut and realtime feathering (10 % blur);
* ROI form: one fixed ROI size for the avatar (the largest face box, +1 so an odd box start still
  fits after rounding the origin down to even, capped at the frame), per-frame even origins
  ``musetalk/origins`` (N, 2), per-frame alpha ``musetalk/mask`` (N, Hr, Wr) uint8 that is 0
  outside the face box (the official composite changes nothing there either), and the face box
  relative to the ROI, ``musetalk/boxes`` (N, 4) int32 ``[x1, y1, x2, y2)``, from which the renderer
  builds the grid that resizes the 256x256 output into the box (:func:`box_grid`); the absolute
  (clipped) boxes are kept as ``musetalk/crop_boxes`` (N, 4) int32 (the official ``coords``).
"""
from __future__ import annotations

import hashlib
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from ...avatar.packet import Packet
from ...compose.colour import nv12_to_rgb
from .blend import REALTIME_BLUR_FRACTION, prepare_material
from .crop import CROP_SIZE, BoxSource, crop_boxes, crop_face
from .landmark_mask import landmark_prepare_mask
from .vae import latents_for_unet

PREBAKE_FORMAT = 1
FP16_MAX_RELERR = 1e-3  # relative L2 error allowed for float16 storage of the latents
ARRAYS = ("musetalk/latents", "musetalk/origins", "musetalk/mask", "musetalk/boxes", "musetalk/crop_boxes")
V15_MARGIN = 10
V15_CHEEKS = (90, 90)


@dataclass(frozen=True)
class PrebakeOptions:
    """Everything that changes the stored tensors (compared with the packet's engine meta)."""

    version: str = "v15"
    bbox_shift: int = 0  # v1.0 only (v1.5 forces 0)
    extra_margin: int = V15_MARGIN  # v1.5 only
    mask: str = "landmark"  # "bisenet" or "landmark" (resolved by the engine)
    latent: str = "mode"  # "mode" (posterior mean, deterministic) or "sample"
    seed: int = 0  # generator seed when latent == "sample"
    blur_fraction: float = REALTIME_BLUR_FRACTION

    def __post_init__(self) -> None:
        if self.version not in ("v15", "v10"):
            raise ValueError(f"MuseTalk version must be 'v15' or 'v10', got {self.version!r}")
        if self.mask not in ("bisenet", "landmark"):
            raise ValueError(f"mask must be 'bisenet' or 'landmark', got {self.mask!r}")
        if self.latent not in ("mode", "sample"):
            raise ValueError(f"latent must be 'mode' or 'sample', got {self.latent!r}")

    @property
    def parsing_mode(self) -> str:
        return "jaw" if self.version == "v15" else "raw"

    def meta(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "bbox_shift": int(self.bbox_shift) if self.version == "v10" else 0,
            "extra_margin": int(self.extra_margin) if self.version == "v15" else 0,
            "mask": self.mask,
            "parsing_mode": self.parsing_mode if self.mask == "bisenet" else None,
            "latent": self.latent,
            "seed": int(self.seed) if self.latent == "sample" else None,
            "blur_fraction": float(self.blur_fraction),
        }


def module_fingerprint(module: torch.nn.Module, keys: tuple[str, ...] | None = None) -> str:
    """Short hash of a module's weights (float16 bytes of a few tensors, or all of them).

    Float16 so the same weights give the same id whether the engine runs them in fp32 (CPU) or
    fp16 (CUDA). Used to tell whether stored latents were made by this VAE."""
    sd = module.state_dict()
    names = [k for k in (keys or sorted(sd)) if k in sd]
    if not names:
        raise ValueError("no tensors to fingerprint")
    h = hashlib.sha256()
    for k in names:
        t = sd[k].detach().to("cpu", torch.float16).contiguous()
        h.update(k.encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()[:16]


VAE_FINGERPRINT_KEYS = ("encoder.conv_in.weight", "encoder.conv_out.weight", "quant_conv.weight", "quant_conv.bias",
                        "encoder.mid_block.attentions.0.to_q.weight")


def vae_fingerprint(vae: torch.nn.Module) -> str:
    return module_fingerprint(vae, VAE_FINGERPRINT_KEYS)


# ------------------------------------------------------------------------------------ geometry

def clip_boxes(boxes: np.ndarray, frame_size: tuple[int, int]) -> np.ndarray:
    """Crop boxes clipped to the frame; raises naming the frames whose box is (nearly) empty."""
    w, h = frame_size
    b = np.asarray(boxes, np.int64).copy()
    b[:, 0] = np.clip(b[:, 0], 0, w)
    b[:, 2] = np.clip(b[:, 2], 0, w)
    b[:, 1] = np.clip(b[:, 1], 0, h)
    b[:, 3] = np.clip(b[:, 3], 0, h)
    bad = np.nonzero((b[:, 2] - b[:, 0] < 2) | (b[:, 3] - b[:, 1] < 2))[0]
    if bad.size:
        raise ValueError(f"MuseTalk crop box is empty or smaller than 2 px in frame(s) {bad[:10].tolist()}"
                         f"{' ...' if bad.size > 10 else ''}: the face is outside the frame or the landmarks are broken")
    return b


def _even_up(v: int) -> int:
    return int(v + (v % 2))


def roi_geometry(boxes: np.ndarray, frame_size: tuple[int, int]) -> tuple[tuple[int, int], np.ndarray, np.ndarray]:
    """Fixed ROI size (Hr, Wr), per-frame even origins (N, 2) as (x0, y0), and the boxes relative
    to their ROI (N, 4). Every box lies inside its ROI and every ROI inside the frame."""
    w, h = frame_size
    if w % 2 or h % 2:
        raise ValueError(f"frame size {w}x{h} must be even")
    bw = boxes[:, 2] - boxes[:, 0]
    bh = boxes[:, 3] - boxes[:, 1]
    wr = min(_even_up(int(bw.max()) + 1), w)
    hr = min(_even_up(int(bh.max()) + 1), h)
    x0 = np.minimum(boxes[:, 0] - boxes[:, 0] % 2, w - wr)
    y0 = np.minimum(boxes[:, 1] - boxes[:, 1] % 2, h - hr)
    origins = np.stack([x0, y0], axis=1).astype(np.int32)
    rel = (boxes - np.concatenate([origins, origins], axis=1)).astype(np.int32)
    assert (rel[:, :2] >= 0).all() and (rel[:, 2] <= wr).all() and (rel[:, 3] <= hr).all(), "box outside its ROI"
    return (hr, wr), origins, rel


def alpha_in_box(prepared: np.ndarray, face_box, crop_box) -> np.ndarray:
    """The part of a prepared ``[2s, 2s]`` uint8 mask that lies under the face box (``[h, w]``,
    zero where the crop box does not cover the face box): the only pixels the official composite
    changes, since elsewhere the enlarged crop equals the frame."""
    x1, y1, x2, y2 = (int(v) for v in face_box)
    xs, ys = int(crop_box[0]), int(crop_box[1])
    out = np.zeros((y2 - y1, x2 - x1), np.uint8)
    m = np.asarray(prepared)
    if m.ndim == 3:
        m = m[..., 0]
    H, W = m.shape
    ax1, ay1, ax2, ay2 = max(x1 - xs, 0), max(y1 - ys, 0), min(x2 - xs, W), min(y2 - ys, H)
    if ax2 > ax1 and ay2 > ay1:
        out[ay1 - (y1 - ys):ay2 - (y1 - ys), ax1 - (x1 - xs):ax2 - (x1 - xs)] = m[ay1:ay2, ax1:ax2]
    return out


def box_grid(boxes: torch.Tensor, roi_hw: tuple[int, int]) -> torch.Tensor:
    """Sampling grid (B, Hr, Wr, 2) that resizes a crop into each ROI-relative box.

    For ``F.grid_sample(..., align_corners=False, padding_mode="border")``: ROI pixel ``x`` inside
    box ``[x1, x2)`` reads source coordinate ``(x - x1 + 0.5) * S / (x2 - x1) - 0.5``, exactly
    cv2.resize's INTER_LINEAR mapping (with edge replication); pixels outside the box clamp to the
    crop's border (their alpha is 0)."""
    return grid_from_axes(*box_grid_axes(boxes, roi_hw))


def box_grid_axes(boxes: torch.Tensor, roi_hw: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The separable parts of :func:`box_grid`: ``gx`` (B, Wr) and ``gy`` (B, Hr). An avatar's are
    computed once at load, so a render batch gathers its frames' rows instead of launching a
    dozen small kernels on the render thread."""
    hr, wr = roi_hw
    b = boxes.to(torch.float32)
    dev = b.device
    xs = torch.arange(wr, device=dev, dtype=torch.float32) + 0.5
    ys = torch.arange(hr, device=dev, dtype=torch.float32) + 0.5
    gx = (xs[None, :] - b[:, 0:1]) * (2.0 / (b[:, 2:3] - b[:, 0:1])) - 1.0  # (B, Wr)
    gy = (ys[None, :] - b[:, 1:2]) * (2.0 / (b[:, 3:4] - b[:, 1:2])) - 1.0  # (B, Hr)
    return gx, gy


def grid_from_axes(gx: torch.Tensor, gy: torch.Tensor) -> torch.Tensor:
    """(B, Hr, Wr, 2) sampling grid from :func:`box_grid_axes`' parts."""
    n, hr, wr = gx.shape[0], gy.shape[1], gx.shape[1]
    return torch.stack([gx[:, None, :].expand(n, hr, wr), gy[:, :, None].expand(n, hr, wr)], dim=-1)


def first_blended_face_rows(masks: torch.Tensor, boxes: torch.Tensor, size: int = CROP_SIZE) -> torch.Tensor:
    """Per frame, the first row of the ``size`` x ``size`` generated face that reaches the frame with
    a non-zero alpha (``size`` where the alpha is 0 everywhere): the ROI's first row with alpha,
    mapped through `box_grid`'s resize, minus the bilinear resize's upper tap. ``masks`` (N, Hr, Wr),
    ``boxes`` (N, 4) ROI-relative ``[x1, y1, x2, y2)``."""
    rows_used = (masks > 0).any(dim=2)  # (N, Hr)
    y0 = rows_used.float().argmax(dim=1).float()  # first True (0 when none: handled below)
    b = boxes.to(torch.float32)
    src = (y0 + 0.5 - b[:, 1]) * (size / (b[:, 3] - b[:, 1])) - 0.5
    first = src.floor().clamp(0, size).long()
    return torch.where(rows_used.any(dim=1), first, torch.full_like(first, size))


def resize_into_boxes(crops: torch.Tensor, boxes: torch.Tensor, roi_hw: tuple[int, int]) -> torch.Tensor:
    """Crops (B, 3, S, S) -> (B, Hr, Wr, 3) float32, each resized into its box (bilinear,
    = cv2 INTER_LINEAR up to its fixed-point rounding)."""
    return resize_with_grid(crops, box_grid(boxes.to(crops.device), roi_hw))


def resize_with_grid(crops: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """:func:`resize_into_boxes` with the boxes' grid given (gathered from an avatar's axes)."""
    out = F.grid_sample(crops.to(torch.float32), grid, mode="bilinear", padding_mode="border", align_corners=False)
    return out.permute(0, 2, 3, 1)


# ------------------------------------------------------------------------------------ prebake

def crop_boxes_for(packet: Packet, opts: PrebakeOptions) -> tuple[np.ndarray, np.ndarray]:
    """Per-frame crop boxes (N, 4) int64 in output-frame pixels (clipped) and their source codes."""
    w, h = packet.size
    lm = np.asarray(packet.array("landmarks68"), np.float32)
    det = np.asarray(packet.array("face_boxes"), np.float32)
    valid = np.ones(len(lm), bool)  # the packet's landmarks already fill face-less frames (nearest face)
    boxes, src = crop_boxes(lm, det, valid, h, version=opts.version, bbox_shift=opts.bbox_shift,
                            extra_margin=opts.extra_margin)
    return clip_boxes(boxes, (w, h)), src


def _prepared_mask(opts: PrebakeOptions, frame_rgb: np.ndarray, landmarks: np.ndarray, box,
                   parser: Callable[[np.ndarray, str], np.ndarray] | None) -> tuple[np.ndarray, tuple]:
    if opts.mask == "bisenet":
        if parser is None:
            raise ValueError("mask='bisenet' needs a face parser")
        mode = opts.parsing_mode
        return prepare_material(np.ascontiguousarray(frame_rgb[..., ::-1]), box, lambda im: parser(im, mode),
                                blur_fraction=opts.blur_fraction)
    return landmark_prepare_mask(landmarks, box, blur_fraction=opts.blur_fraction)


def fp16_error(latents: np.ndarray) -> tuple[float, float, bool]:
    """(relative L2 error, max abs error, all finite) of storing float32 latents as float16."""
    with np.errstate(over="ignore"):
        half = latents.astype(np.float16)
    finite = bool(np.isfinite(half).all())
    d = half.astype(np.float64) - latents.astype(np.float64)
    ref = float(np.linalg.norm(latents.astype(np.float64)))
    rel = float(np.linalg.norm(d) / ref) if ref > 0 else 0.0
    return rel, float(np.abs(d).max()) if d.size else 0.0, finite


@torch.no_grad()
def prebake_musetalk(
    packet: Packet,
    vae: torch.nn.Module,
    opts: PrebakeOptions,
    *,
    parser: Callable[[np.ndarray, str], np.ndarray] | None = None,
    weights_meta: dict[str, Any] | None = None,
    batch_size: int = 8,
    progress: bool = True,
) -> Packet:
    """Compute MuseTalk's arrays for every frame of `packet` and add them (atomic manifest swap).

    `vae` runs on its own device/dtype; `parser(rgb_crop, mode) -> 512x512 0/255 mask` is the
    BiSeNet call (needed when ``opts.mask == "bisenet"``)."""
    n = packet.n_frames
    w, h = packet.size
    boxes, sources = crop_boxes_for(packet, opts)
    (hr, wr), origins, rel = roi_geometry(boxes, (w, h))
    lm = np.asarray(packet.array("landmarks68"), np.float32)
    frames = packet.tensor("frames_nv12")
    p = next(vae.parameters())
    gen = None
    if opts.latent == "sample":
        gen = torch.Generator(device=p.device).manual_seed(int(opts.seed))
    latents = np.empty((n, 8, CROP_SIZE // 8, CROP_SIZE // 8), np.float32)
    masks = np.zeros((n, hr, wr), np.uint8)
    bar = tqdm(total=n, desc="musetalk prebake", unit="f", disable=not progress, file=sys.stderr)
    for b0 in range(0, n, batch_size):
        b1 = min(n, b0 + batch_size)
        rgb = nv12_to_rgb(frames[b0:b1]).numpy()
        crops = np.stack([crop_face(rgb[i - b0], boxes[i]) for i in range(b0, b1)])  # RGB 256x256 (LANCZOS4)
        lat = latents_for_unet(vae, crops, channel_order="rgb", sample=opts.latent == "sample", generator=gen)
        latents[b0:b1] = lat.float().cpu().numpy()
        for i in range(b0, b1):
            prepared, cbox = _prepared_mask(opts, rgb[i - b0], lm[i], boxes[i], parser)
            x1, y1, x2, y2 = rel[i]
            masks[i, y1:y2, x1:x2] = alpha_in_box(prepared, boxes[i], cbox)
        bar.update(b1 - b0)
    bar.close()
    if not np.isfinite(latents).all():
        raise ValueError("the VAE produced non-finite latents (broken weights or a float16 overflow)")
    rel_err, max_err, finite = fp16_error(latents)
    store16 = finite and rel_err <= FP16_MAX_RELERR
    if not store16:
        print(f"musetalk prebake: float16 storage of the latents would cost {rel_err:.2e} relative error "
              f"(finite={finite}); storing float32", file=sys.stderr)
    meta = {
        "format": PREBAKE_FORMAT,
        **opts.meta(),
        **(weights_meta or {}),
        "n_frames": n,
        "roi": [wr, hr],
        "latents_dtype": "float16" if store16 else "float32",
        "latents_fp16_relerr": rel_err,
        "latents_fp16_maxabs": max_err,
        "box_sources": {s.name.lower(): int((sources == int(s)).sum()) for s in BoxSource},
        "box_size_max": [int((boxes[:, 2] - boxes[:, 0]).max()), int((boxes[:, 3] - boxes[:, 1]).max())],
    }
    arrays = {
        "musetalk/latents": latents.astype(np.float16) if store16 else latents,
        "musetalk/origins": origins,
        "musetalk/mask": masks,
        "musetalk/boxes": rel,
        "musetalk/crop_boxes": boxes.astype(np.int32),
    }
    return packet.add_arrays(arrays, engine="musetalk", engine_meta=meta)


def prebake_mismatch(packet: Packet, expected: dict[str, Any]) -> str | None:
    """Why the packet's MuseTalk arrays cannot be used with `expected` meta (None = they can)."""
    meta = packet.engine_meta("musetalk")
    if meta is None:
        return "the packet has no MuseTalk arrays"
    missing = [a for a in ARRAYS if a not in packet]
    if missing:
        return f"the packet lacks {', '.join(missing)}"
    if meta.get("format") != PREBAKE_FORMAT:
        return f"its MuseTalk arrays have format {meta.get('format')}, this build writes {PREBAKE_FORMAT}"
    for k, v in expected.items():
        have = meta.get(k)
        if isinstance(v, float) or isinstance(have, float):
            same = have is not None and v is not None and math.isclose(float(have), float(v))
        else:
            same = have == v
        if not same:
            return f"its MuseTalk arrays were made with {k}={have!r}, this engine uses {k}={v!r}"
    n = packet.n_frames
    if packet.specs["musetalk/latents"].shape[0] != n or packet.specs["musetalk/mask"].shape[0] != n:
        return "its MuseTalk arrays do not cover every frame"
    return None

