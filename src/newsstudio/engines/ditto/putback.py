"""Ditto paste-back: blend the 512×512 rendered crop into the original frame with a feathered mask.

Reference: ``core/utils/get_mask.py`` and ``core/atomic_components/putback.py`` (``PutBack``, whose
blend is the C function in ``core/utils/blend/``) of antgroup/ditto-talkinghead.

The reference warps the mask and the render into the frame with ``cv2.warpAffine`` (INTER_LINEAR,
constant-0 border), then blends ``mask·render + (1−mask)·frame`` in float32, clamped to [0, 255]
and converted to uint8 by truncation.

Which bilinear warp: the goldens were made with OpenCV 5.1, whose float32 INTER_LINEAR warp is an
exact bilinear interpolation (measured: it equals a float64 bilinear to 6e-8 on the mask), while
OpenCV 4.x (4.11 is what this project installs) quantises source coordinates to 1/32 pixel with
tabulated weights (up to 6.6e-4 off on the mask and 2.3 grey levels on the render). So the default
warp here is our own exact bilinear (:func:`warp_affine_bilinear`, float64 coordinates and
weights, torch, any device), which reproduces OpenCV 5.1 whatever OpenCV is installed;
``PutBack(backend="cv2")`` uses the installed ``cv2.warpAffine`` instead. :func:`blend_torch` is
the blend for already-warped tensors on any device.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


def get_mask(W: int, H: int, ratio_w: float = 0.9, ratio_h: float = 0.9) -> np.ndarray:
    """Feather mask [H, W, 1] float32: 1 in the central int(W·ratio_w) × int(H·ratio_h) box,
    linear ramps (``np.linspace``, float64) to 0 at the borders, radial ramps in the corners."""
    w, h = int(W * ratio_w), int(H * ratio_h)
    x1, y1 = (W - w) // 2, (H - h) // 2
    x2, y2 = x1 + w, y1 + h
    mask = np.ones((H, W), dtype=np.float32)

    def ramp(col_from: float, col_to: float, n_rows: int, row_from: float, row_to: float, n_cols: int) -> np.ndarray:
        row = np.linspace(row_from, row_to, n_cols)[None, :]
        col = np.linspace(col_from, col_to, n_rows)[:, None]
        return np.sqrt(row**2 + col**2).astype(np.float32)

    def corner(col_from: float, col_to: float, n_rows: int, row_from: float, row_to: float, n_cols: int) -> np.ndarray:
        return 1 - np.clip(ramp(col_from, col_to, n_rows, row_from, row_to, n_cols), 0, 1)

    mask[0:y1, x1:x2] = ramp(0, 1, y1, 0, 0, w)  # top
    mask[y2:H, x1:x2] = ramp(1, 0, H - y2, 0, 0, w)  # bottom
    mask[y1:y2, 0:x1] = ramp(0, 0, h, 0, 1, x1)  # left
    mask[y1:y2, x2:W] = ramp(0, 0, h, 1, 0, W - x2)  # right
    mask[0:y1, 0:x1] = corner(1, 0, y1, 1, 0, x1)  # top left
    mask[0:y1, x2:W] = corner(1, 0, y1, 0, 1, W - x2)  # top right
    mask[y2:H, 0:x1] = corner(0, 1, H - y2, 1, 0, x1)  # bottom left
    mask[y2:H, x2:W] = corner(0, 1, H - y2, 0, 1, W - x2)  # bottom right
    return mask[:, :, None]


def warp_to_frame_cv2(image: np.ndarray, M_c2o: np.ndarray, width: int, height: int) -> np.ndarray:
    """``cv2.warpAffine`` of a crop-space image into a width × height frame (INTER_LINEAR,
    constant 0 border), M_c2o the crop->original affine ([2,3] or [3,3])."""
    import cv2  # only this backend needs OpenCV

    M = np.asarray(M_c2o, dtype=np.float64)[:2]
    return cv2.warpAffine(np.ascontiguousarray(image), M, dsize=(int(width), int(height)), flags=cv2.INTER_LINEAR)


def _inverse_affine(M_c2o: np.ndarray | Tensor) -> np.ndarray:
    """Frame->crop affine [2, 3] (float64) of a crop->frame affine [2|3, 3]."""
    m = np.asarray(torch.as_tensor(M_c2o).detach().cpu().numpy(), dtype=np.float64)[:2]
    full = np.vstack([m, [0.0, 0.0, 1.0]])
    return np.linalg.inv(full)[:2]


def _roi(M_c2o: np.ndarray | Tensor, src_w: int, src_h: int, width: int, height: int) -> tuple[int, int, int, int]:
    """Frame rectangle (x0, y0, x1, y1) outside which every bilinear tap of the warp falls
    outside the source (so the warp is exactly 0 there)."""
    m = np.asarray(torch.as_tensor(M_c2o).detach().cpu().numpy(), dtype=np.float64)[:2]
    corners = np.array([[-1, -1, 1], [src_w, -1, 1], [-1, src_h, 1], [src_w, src_h, 1]], dtype=np.float64)
    pts = corners @ m.T
    x0, y0 = np.floor(pts.min(0)).astype(int) - 1
    x1, y1 = np.ceil(pts.max(0)).astype(int) + 2
    return max(0, x0), max(0, y0), min(width, x1), min(height, y1)


def warp_affine_bilinear(image: Tensor, M_c2o: np.ndarray | Tensor, width: int, height: int) -> Tensor:
    """Exact bilinear warp of a crop-space image [h, w] or [h, w, C] into a width × height frame
    (pixel centres at integer coordinates, constant-0 border), M_c2o the crop->frame affine.
    Coordinates and weights in float64, result float32, on the image's device. Only the frame
    rectangle the crop can reach is computed."""
    img = image if image.dim() == 3 else image[..., None]
    h, w, c = img.shape
    out = torch.zeros((height, width, c), dtype=torch.float32, device=img.device)
    x0r, y0r, x1r, y1r = _roi(M_c2o, w, h, width, height)
    if x1r > x0r and y1r > y0r:
        inv = torch.as_tensor(_inverse_affine(M_c2o), dtype=torch.float64, device=img.device)
        ys = torch.arange(y0r, y1r, dtype=torch.float64, device=img.device)[:, None]
        xs = torch.arange(x0r, x1r, dtype=torch.float64, device=img.device)[None, :]
        sx = inv[0, 0] * xs + inv[0, 1] * ys + inv[0, 2]
        sy = inv[1, 0] * xs + inv[1, 1] * ys + inv[1, 2]
        fx0, fy0 = sx.floor(), sy.floor()
        fx, fy = (sx - fx0)[..., None], (sy - fy0)[..., None]
        ix, iy = fx0.long(), fy0.long()
        src = img.to(torch.float64)

        def tap(yy: Tensor, xx: Tensor) -> Tensor:
            ok = ((xx >= 0) & (xx < w) & (yy >= 0) & (yy < h))[..., None]
            return src[yy.clamp(0, h - 1), xx.clamp(0, w - 1)] * ok

        val = (
            tap(iy, ix) * ((1 - fx) * (1 - fy))
            + tap(iy, ix + 1) * (fx * (1 - fy))
            + tap(iy + 1, ix) * ((1 - fx) * fy)
            + tap(iy + 1, ix + 1) * (fx * fy)
        )
        out[y0r:y1r, x0r:x1r] = val.to(torch.float32)
    return out if image.dim() == 3 else out[..., 0]


def blend_numpy(mask_warped: np.ndarray, frame_warped: np.ndarray, frame_rgb: np.ndarray) -> np.ndarray:
    """mask·render + (1−mask)·frame in float32 -> uint8 by clamping and truncation.
    mask [H, W] or [H, W, 1|3], frame_warped [H, W, 3] float32, frame_rgb [H, W, 3] uint8."""
    m = np.asarray(mask_warped, dtype=np.float32)
    if m.ndim == 2:
        m = m[:, :, None]
    out = m * frame_warped.astype(np.float32, copy=False) + (np.float32(1) - m) * frame_rgb.astype(np.float32)
    return np.clip(out, 0, 255).astype(np.uint8)


def blend_torch(mask_warped: Tensor, frame_warped: Tensor, frame_rgb: Tensor) -> Tensor:
    """:func:`blend_numpy` on tensors of any device, batched over leading dims:
    mask [..., H, W] (or [..., H, W, 1]), frame_warped [..., H, W, 3] float, frame_rgb uint8."""
    m = mask_warped.to(torch.float32)
    if m.dim() == frame_warped.dim() - 1:
        m = m[..., None]
    out = m * frame_warped.to(torch.float32) + (1.0 - m) * frame_rgb.to(torch.float32)
    return out.clamp(0, 255).to(torch.uint8)  # float->uint8 truncates toward zero


class PutBack:
    """The reference paste-back: ``PutBack()(frame_rgb, render_image, M_c2o) -> uint8 [H, W, 3]``.

    ``render_image`` is the decoder output as H×W×3 float32 in [0, 255] (512×512 in the pipeline);
    the feather mask is ``get_mask(w, h, ratio, ratio)`` of the render's size. ``backend``:
    "exact" (default; bilinear = OpenCV 5.1, see the module docstring) or "cv2" (installed OpenCV).
    """

    def __init__(self, mask: np.ndarray | None = None, crop_size: int = 512, ratio: float = 0.9, backend: str = "exact") -> None:
        if backend not in ("exact", "cv2"):
            raise ValueError(f"backend must be 'exact' or 'cv2', got {backend!r}")
        m = get_mask(crop_size, crop_size, ratio, ratio) if mask is None else np.asarray(mask, dtype=np.float32)
        self.mask = np.ascontiguousarray(m[:, :, 0] if m.ndim == 3 else m)
        self.backend = backend

    def _warp(self, image: np.ndarray, M_c2o: np.ndarray, w: int, h: int) -> np.ndarray:
        if self.backend == "cv2":
            return warp_to_frame_cv2(image, M_c2o, w, h)
        return warp_affine_bilinear(torch.from_numpy(np.ascontiguousarray(image)), M_c2o, w, h).numpy()

    def warp(self, frame_shape: tuple[int, ...], render_image: np.ndarray, M_c2o: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mask_warped [H, W] clipped to [0, 1], frame_warped [H, W, 3] float32)."""
        h, w = frame_shape[:2]
        mask_warped = self._warp(self.mask, M_c2o, w, h).clip(0, 1)
        frame_warped = self._warp(np.asarray(render_image, dtype=np.float32), M_c2o, w, h)
        return mask_warped, frame_warped

    def __call__(self, frame_rgb: np.ndarray, render_image: np.ndarray, M_c2o: np.ndarray) -> np.ndarray:
        mask_warped, frame_warped = self.warp(frame_rgb.shape, render_image, M_c2o)
        return blend_numpy(mask_warped, frame_warped, frame_rgb)
