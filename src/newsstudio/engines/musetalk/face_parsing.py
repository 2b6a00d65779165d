"""MuseTalk's face-parsing call: BiSeNet class map -> 0/255 blend mask.

Mirrors ``FaceParsing.__call__`` of the official code: PIL bilinear resize of the RGB crop to
512x512, ImageNet normalisation, BiSeNet, argmax of the main logits, then one of three mask
modes:

* ``raw`` (v1.0): skin, mouth, upper and lower lip (classes 1, 11, 12, 13);
* ``neck``: the same plus neck (14);
* ``jaw`` (v1.5): the skin is dilated downwards with a cone-shaped kernel (so the mask reaches
  below the chin line the generator may move), the dilation is eroded again with a flat ellipse
  near the cheeks only (outside ``256 -/+ cheek width``), the nose is removed and mouth/lips
  are added back.

``face_seg`` (``blending.py``) then resizes the 512 mask back to the crop size with PIL's
default filter for "L" images (bicubic).
"""
from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np
import torch
from PIL import Image

from .bisenet import BiSeNet, normalize_rgb

PARSE_SIZE = 512
SKIN, NOSE, MOUTH, U_LIP, L_LIP, NECK = 1, 10, 11, 12, 13, 14
MODES = ("raw", "jaw", "neck")


def cone_kernel(cone_height: int = 21, tail_height: int = 12) -> np.ndarray:
    """The jaw-mode dilation kernel: a downward-widening cone (rows ``cone_height//2 ..
    cone_height-1``, width ``2(r - cone_height//2) + 1``) over a constant-width tail."""
    size = cone_height + tail_height
    k = np.zeros((size, size), dtype=np.uint8)
    c = size // 2
    half0 = cone_height // 2
    for r in range(half0, cone_height):
        half = r - half0  # width 2*half + 1
        k[r, c - half : c + half + 1] = 1
    base_half = int(k[cone_height - 1].sum()) // 2 if cone_height > 0 else 0
    for r in range(cone_height, size):
        k[r, max(0, c - base_half) : min(size, c + base_half + 1)] = 1
    return k


CHEEK_KERNEL = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (35, 3))


def cheek_mask(left_cheek_width: int, right_cheek_width: int, size: int = PARSE_SIZE) -> np.ndarray:
    """255 on columns ``0 .. c-left`` and ``c+right .. size-1`` (``c = size//2``), else 0."""
    m = np.zeros((size, size), dtype=np.uint8)
    c = size // 2
    cv2.rectangle(m, (0, 0), (c - int(left_cheek_width), size), 255, -1)
    cv2.rectangle(m, (c + int(right_cheek_width), 0), (size, size), 255, -1)
    return m


def parsing_to_mask(
    parsing: np.ndarray,
    mode: str = "raw",
    left_cheek_width: int = 80,
    right_cheek_width: int = 80,
    kernel: np.ndarray | None = None,
) -> np.ndarray:
    """Class map ``[H,W]`` -> uint8 mask with values 0/255 (``FaceParsing.__call__`` post-processing)."""
    p = np.asarray(parsing)
    if mode == "raw":
        keep = np.isin(p, (SKIN, MOUTH, U_LIP, L_LIP))
    elif mode == "neck":
        keep = np.isin(p, (SKIN, MOUTH, U_LIP, L_LIP, NECK))
    elif mode == "jaw":
        if p.shape[0] != p.shape[1]:
            raise ValueError(f"jaw mode expects a square class map, got {p.shape}")
        skin = np.where(p == SKIN, 255, 0).astype(np.uint8)
        dilated = cv2.dilate(skin, cone_kernel() if kernel is None else kernel, iterations=1)
        eroded = cv2.erode(dilated, CHEEK_KERNEL, iterations=2)
        cheeks = cheek_mask(left_cheek_width, right_cheek_width, p.shape[0])
        region = cv2.bitwise_or(cv2.bitwise_and(eroded, cheeks), cv2.bitwise_and(dilated, cv2.bitwise_not(cheeks)))
        keep = ((region == 255) & (p != NOSE)) | np.isin(p, (MOUTH, U_LIP, L_LIP))
    else:
        raise ValueError(f"unknown parsing mode {mode!r}; expected one of {MODES}")
    return np.where(keep, 255, 0).astype(np.uint8)


def resize_for_parsing(image_rgb: np.ndarray, size: int = PARSE_SIZE) -> np.ndarray:
    """PIL bilinear resize (antialiased when shrinking; not cv2.INTER_LINEAR) to ``size x size``."""
    return np.array(Image.fromarray(np.ascontiguousarray(image_rgb)).resize((size, size), Image.BILINEAR))


def resize_mask(mask: np.ndarray, width: int, height: int) -> np.ndarray:
    """``face_seg``'s resize of the 512 mask to the crop size (PIL default for "L": bicubic)."""
    return np.array(Image.fromarray(np.ascontiguousarray(mask, dtype=np.uint8)).resize((int(width), int(height)), Image.BICUBIC))


class FaceParser:
    """BiSeNet + MuseTalk's mask post-processing, on any device/dtype the network lives on."""

    def __init__(self, net: BiSeNet, left_cheek_width: int = 80, right_cheek_width: int = 80) -> None:
        self.net = net.eval()
        self.left_cheek_width = int(left_cheek_width)
        self.right_cheek_width = int(right_cheek_width)
        self.kernel = cone_kernel()

    def _param(self) -> torch.Tensor:
        return next(self.net.parameters())

    @torch.no_grad()
    def parse(self, images_rgb: np.ndarray | Sequence[np.ndarray]) -> np.ndarray:
        """RGB uint8 crop(s) of any size -> class map(s) ``[512,512]`` (``[B,512,512]`` for a list/batch)."""
        single = isinstance(images_rgb, np.ndarray) and images_rgb.ndim == 3
        batch = [images_rgb] if single else list(images_rgb)
        resized = np.stack([resize_for_parsing(im) for im in batch])
        return self.parse_resized(resized[0] if single else resized)

    @torch.no_grad()
    def parse_resized(self, resized_rgb: np.ndarray) -> np.ndarray:
        """Class map(s) of image(s) already resized to the parse size (argmax of the main logits)."""
        w = self._param()
        x = normalize_rgb(resized_rgb, device=w.device, dtype=w.dtype)
        labels = self.net(x)[0].argmax(dim=1).to(torch.uint8).cpu().numpy()
        return labels[0] if np.asarray(resized_rgb).ndim == 3 else labels

    def mask(self, parsing: np.ndarray, mode: str = "raw") -> np.ndarray:
        """Post-process a class map with this parser's cheek widths."""
        return parsing_to_mask(parsing, mode, self.left_cheek_width, self.right_cheek_width, self.kernel)

    def __call__(self, image_rgb: np.ndarray, mode: str = "raw") -> np.ndarray:
        """``FaceParsing.__call__``: RGB crop -> 512x512 0/255 mask."""
        return self.mask(self.parse(image_rgb), mode)

    def face_seg(self, image_rgb: np.ndarray, mode: str = "raw") -> np.ndarray:
        """``blending.face_seg``: the mask resized back to the crop's own size."""
        h, w = np.asarray(image_rgb).shape[:2]
        return resize_mask(self(image_rgb, mode), w, h)
