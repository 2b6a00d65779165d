"""Reading still images (portrait avatars) as RGB, the way a viewer displays them.

Pillow rather than FFmpeg: it applies EXIF orientation (phone photos are stored sideways),
understands palettes, 16-bit and CMYK files, and its errors are easy to name.
"""
from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from .errors import MediaDecodeError, MediaNotFoundError

__all__ = ["IMAGE_SUFFIXES", "is_image_path", "read_image"]

#: Still-image file suffixes. GIF is left out on purpose: an animated GIF is a video.
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff", ".jfif"})


def is_image_path(path: str | os.PathLike) -> bool:
    """True when ``path`` names a still image by its suffix (case-insensitive)."""
    return Path(path).suffix.lower() in IMAGE_SUFFIXES


def _to_rgb(img: Image.Image, background: tuple[int, int, int]) -> Image.Image:
    """Any Pillow mode -> RGB; transparent pixels are composited over ``background``."""
    if img.mode in ("I;16", "I;16B", "I;16L", "I"):
        # 16/32-bit greyscale: keep the top 8 bits of the used range rather than clipping.
        arr = np.asarray(img, dtype=np.float64)
        peak = 65535.0 if arr.max() > 255 else 255.0
        img = Image.fromarray(np.clip(arr / peak * 255.0 + 0.5, 0, 255).astype(np.uint8), "L")
    if img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")
    has_alpha = img.mode in ("RGBA", "LA", "PA", "RGBa", "La")
    if has_alpha:
        rgba = img.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, (*background, 255))
        return Image.alpha_composite(canvas, rgba).convert("RGB")
    return img.convert("RGB")


def read_image(
    path: str | os.PathLike | bytes, *, background: tuple[int, int, int] = (255, 255, 255)
) -> np.ndarray:
    """Load an image as ``(H, W, 3)`` uint8 RGB.

    * EXIF orientation is applied (the array is what a photo viewer shows).
    * Alpha is dropped by compositing over ``background``, **white** by default: a cut-out
      portrait on white looks like a studio backdrop, and white keeps anti-aliased edges
      light instead of leaving a dark fringe.
    * Greyscale, palette, CMYK and 16-bit images are expanded/reduced to 8-bit RGB.

    Raises :class:`MediaNotFoundError` or :class:`MediaDecodeError` naming the file.
    """
    if isinstance(path, (bytes, bytearray, memoryview)):
        source: object = io.BytesIO(bytes(path))
    else:
        if not Path(path).is_file():
            raise MediaNotFoundError(path)
        source = path
    try:
        with Image.open(source) as img:  # type: ignore[arg-type]
            img.load()  # decode now: truncation surfaces here, not later
            img = ImageOps.exif_transpose(img)
            rgb = _to_rgb(img, background)
    except UnidentifiedImageError as exc:
        raise MediaDecodeError(path, "not an image Pillow can read (unknown format or corrupt header)") from exc
    except (OSError, SyntaxError, ValueError) as exc:
        raise MediaDecodeError(path, f"corrupt or truncated image ({exc})") from exc
    arr = np.asarray(rgb, dtype=np.uint8)
    if arr.ndim != 3 or arr.shape[2] != 3 or arr.size == 0:
        raise MediaDecodeError(path, f"decoded to an unusable shape {arr.shape}")
    return np.ascontiguousarray(arr)
