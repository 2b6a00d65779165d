"""Putting a generated 256x256 face back into the frame, as MuseTalk's ``blending.py`` does.

Geometry: around the face box ``(x1, y1, x2, y2)`` a square crop box of half-size
``s = int((max(w, h) // 2) * expand)`` is centred on ``((x1+x2)//2, (y1+y2)//2)``; it may
extend beyond the frame (PIL fills that part with 0 and clips on paste).

Mask: the parser's 512x512 mask of that enlarged crop is resized (PIL bicubic) to ``2s x 2s``,
only its face-box rectangle is kept, everything above ``int(2s * upper_boundary_ratio)`` is
zeroed (only the lower face talks), and it is feathered with ``cv2.GaussianBlur`` of an odd
kernel ``int(fraction * 2s // 2 * 2) + 1``: ``fraction`` 0.1 for the realtime path
(``get_image_prepare_material``, once per avatar frame), 0.05 for the offline ``get_image``.

Composite: the face (resized to ``w x h`` with cv2 INTER_LINEAR) is pasted into the enlarged
crop, which is pasted back with the mask as alpha (PIL's 8-bit blend). All image operations are
per channel, so BGR arrays go through unchanged.

Two forms: :func:`composite_pil` is the CPU reference path (bit-exact with the official code);
:func:`blend_material` + :func:`composite_torch` are the GPU form (float alpha, torch ops),
equal to it up to rounding (max |difference| 1).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import cv2
import numpy as np
import torch
from PIL import Image

from .face_parsing import resize_mask

EXPAND = 1.5
UPPER_BOUNDARY_RATIO = 0.5
REALTIME_BLUR_FRACTION = 0.1
OFFLINE_BLUR_FRACTION = 0.05

Box = tuple[int, int, int, int]


def _box(box: Sequence[int]) -> Box:
    x1, y1, x2, y2 = (int(v) for v in box)
    return x1, y1, x2, y2


def expanded_crop_box(face_box: Sequence[int], expand: float = EXPAND) -> tuple[Box, int]:
    """``get_crop_box``: the square crop box around a face box and its half-size ``s``."""
    x1, y1, x2, y2 = _box(face_box)
    xc, yc = (x1 + x2) // 2, (y1 + y2) // 2
    s = int(max(x2 - x1, y2 - y1) // 2 * expand)
    return (xc - s, yc - s, xc + s, yc + s), s


def blur_ksize(crop_width: int, fraction: float) -> int:
    """Odd Gaussian kernel size, with the reference's float arithmetic: ``int(f*W // 2 * 2) + 1``."""
    return int(fraction * crop_width // 2 * 2) + 1


def crop_region(image: np.ndarray, box: Sequence[int]) -> np.ndarray:
    """``PIL.Image.crop``: rows ``y1..y2-1``, columns ``x1..x2-1``, zeros outside the image."""
    x1, y1, x2, y2 = _box(box)
    img = np.asarray(image)
    out = np.zeros((y2 - y1, x2 - x1) + img.shape[2:], dtype=img.dtype)
    H, W = img.shape[:2]
    sx1, sy1, sx2, sy2 = max(x1, 0), max(y1, 0), min(x2, W), min(y2, H)
    if sx2 > sx1 and sy2 > sy1:
        out[sy1 - y1 : sy2 - y1, sx1 - x1 : sx2 - x1] = img[sy1:sy2, sx1:sx2]
    return out


def resize_face(face256: np.ndarray, face_box: Sequence[int]) -> np.ndarray:
    """The generated face resized to the face box size (cv2 default INTER_LINEAR)."""
    x1, y1, x2, y2 = _box(face_box)
    return cv2.resize(np.ascontiguousarray(face256), (x2 - x1, y2 - y1))


def place_mask(
    mask512: np.ndarray,
    face_box: Sequence[int],
    crop_box: Sequence[int],
    upper_boundary_ratio: float = UPPER_BOUNDARY_RATIO,
) -> np.ndarray:
    """The un-blurred blend mask at crop-box size: parser mask resized (bicubic), restricted to
    the face-box rectangle, rows above ``int(height * upper_boundary_ratio)`` zeroed."""
    x1, y1, x2, y2 = _box(face_box)
    xs, ys, xe, ye = _box(crop_box)
    width, height = xe - xs, ye - ys
    resized = resize_mask(mask512, width, height)
    out = np.zeros((height, width), dtype=np.uint8)
    rx1, ry1 = max(x1 - xs, 0), max(y1 - ys, 0)
    rx2, ry2 = min(x2 - xs, width), min(y2 - ys, height)
    if rx2 > rx1 and ry2 > ry1:
        out[ry1:ry2, rx1:rx2] = resized[ry1:ry2, rx1:rx2]
    out[: int(height * upper_boundary_ratio)] = 0
    return out


def feather(mask: np.ndarray, ksize: int) -> np.ndarray:
    """Gaussian feathering; sigma derived by OpenCV from the kernel size, default border."""
    return cv2.GaussianBlur(np.ascontiguousarray(mask), (int(ksize), int(ksize)), 0)


def prepare_mask(
    mask512: np.ndarray,
    face_box: Sequence[int],
    blur_fraction: float = REALTIME_BLUR_FRACTION,
    upper_boundary_ratio: float = UPPER_BOUNDARY_RATIO,
    expand: float = EXPAND,
) -> tuple[np.ndarray, Box]:
    """Blend mask (``uint8 [2s,2s]``) and crop box from the parser's 512 mask of the enlarged crop.

    With the default fraction this is ``get_image_prepare_material``; ``OFFLINE_BLUR_FRACTION``
    gives the mask ``get_image`` builds.
    """
    crop_box, _ = expanded_crop_box(face_box, expand)
    pre = place_mask(mask512, face_box, crop_box, upper_boundary_ratio)
    return feather(pre, blur_ksize(crop_box[2] - crop_box[0], blur_fraction)), crop_box


def prepare_material(
    frame_bgr: np.ndarray,
    face_box: Sequence[int],
    mask_fn: Callable[[np.ndarray], np.ndarray],
    blur_fraction: float = REALTIME_BLUR_FRACTION,
    upper_boundary_ratio: float = UPPER_BOUNDARY_RATIO,
    expand: float = EXPAND,
) -> tuple[np.ndarray, Box]:
    """Per avatar frame: parse the enlarged crop (``mask_fn``: RGB crop -> 512 mask, e.g.
    ``lambda im: parser(im, "jaw")``) and build its blend mask and crop box."""
    crop_box, _ = expanded_crop_box(face_box, expand)
    face_large_rgb = np.ascontiguousarray(crop_region(frame_bgr, crop_box)[..., ::-1])
    return prepare_mask(mask_fn(face_large_rgb), face_box, blur_fraction, upper_boundary_ratio, expand)


def composite_pil(
    frame: np.ndarray,
    face_resized: np.ndarray,
    face_box: Sequence[int],
    mask: np.ndarray,
    crop_box: Sequence[int],
) -> np.ndarray:
    """``get_image_blending``: paste the face into the enlarged crop, paste that back through
    the mask with PIL (exact 8-bit alpha blend). Frame and face share one channel order."""
    x1, y1, x2, y2 = _box(face_box)
    xs, ys, xe, ye = _box(crop_box)
    body = Image.fromarray(np.ascontiguousarray(frame))
    face_large = body.crop((xs, ys, xe, ye))
    face_large.paste(Image.fromarray(np.ascontiguousarray(face_resized)), (x1 - xs, y1 - ys, x2 - xs, y2 - ys))
    body.paste(face_large, (xs, ys), Image.fromarray(np.ascontiguousarray(mask, dtype=np.uint8)).convert("L"))
    return np.asarray(body).copy()


def blend_offline(
    frame: np.ndarray,
    face_resized: np.ndarray,
    face_box: Sequence[int],
    mask512: np.ndarray,
    upper_boundary_ratio: float = UPPER_BOUNDARY_RATIO,
    expand: float = EXPAND,
) -> np.ndarray:
    """``get_image`` (``scripts/inference.py``): mask built per output frame, 5 % blur."""
    mask, crop_box = prepare_mask(mask512, face_box, OFFLINE_BLUR_FRACTION, upper_boundary_ratio, expand)
    return composite_pil(frame, face_resized, face_box, mask, crop_box)


# --------------------------------------------------------------------------------------- GPU form

def blend_material(
    face_box: Sequence[int],
    prepared_mask: np.ndarray | torch.Tensor,
    expand: float = EXPAND,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[Box, torch.Tensor]:
    """From a face box and its prepared uint8 mask: (crop box, float alpha in [0,1] at crop-box
    size ``[2s,2s]``) for compositing with torch instead of PIL."""
    crop_box, s = expanded_crop_box(face_box, expand)
    m = torch.as_tensor(np.asarray(prepared_mask) if not isinstance(prepared_mask, torch.Tensor) else prepared_mask)
    if m.ndim == 3:  # a mask read back as a 3-channel image
        m = m[..., 0]
    if tuple(m.shape) != (2 * s, 2 * s):
        raise ValueError(f"mask shape {tuple(m.shape)} does not match crop box {crop_box} (expected {(2 * s, 2 * s)})")
    return crop_box, m.to(device=device if device is not None else m.device).to(dtype) / 255.0


def face_alpha(face_box: Sequence[int], crop_box: Sequence[int], alpha: torch.Tensor) -> torch.Tensor:
    """The part of the crop-box alpha under the face box (``[h,w]``): the only pixels the
    composite changes, since outside the face box the enlarged crop equals the frame."""
    x1, y1, x2, y2 = _box(face_box)
    xs, ys, _, _ = _box(crop_box)
    out = alpha.new_zeros((y2 - y1, x2 - x1))
    H, W = alpha.shape
    ax1, ay1, ax2, ay2 = max(x1 - xs, 0), max(y1 - ys, 0), min(x2 - xs, W), min(y2 - ys, H)
    if ax2 > ax1 and ay2 > ay1:
        out[ay1 - (y1 - ys) : ay2 - (y1 - ys), ax1 - (x1 - xs) : ax2 - (x1 - xs)] = alpha[ay1:ay2, ax1:ax2]
    return out


def composite_torch(
    frame: torch.Tensor,
    face_resized: torch.Tensor,
    face_box: Sequence[int],
    crop_box: Sequence[int],
    alpha: torch.Tensor,
) -> torch.Tensor:
    """Torch equivalent of :func:`composite_pil` for uint8 ``[H,W,C]`` tensors on any device:
    ``frame + alpha * (face - frame)`` on the face box (clipped to the frame), rounded."""
    x1, y1, x2, y2 = _box(face_box)
    H, W = frame.shape[:2]
    fx1, fy1, fx2, fy2 = max(x1, 0), max(y1, 0), min(x2, W), min(y2, H)
    out = frame.clone()
    if fx2 <= fx1 or fy2 <= fy1:
        return out
    a = face_alpha(face_box, crop_box, alpha)[fy1 - y1 : fy2 - y1, fx1 - x1 : fx2 - x1]
    a = a.to(device=frame.device, dtype=torch.float32).unsqueeze(-1)
    bg = frame[fy1:fy2, fx1:fx2].to(torch.float32)
    fg = face_resized[fy1 - y1 : fy2 - y1, fx1 - x1 : fx2 - x1].to(device=frame.device, dtype=torch.float32)
    out[fy1:fy2, fx1:fx2] = (bg + a * (fg - bg)).round_().clamp_(0, 255).to(frame.dtype)
    return out
