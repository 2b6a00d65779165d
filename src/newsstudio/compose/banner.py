"""The "RANDOM WEIGHTS" banner burnt into frames rendered with seeded random weights.

Why: benchmark runs use seeded weights (the official ones cannot be downloaded here); their
video must never be mistaken for a real model's output, so every frame says so.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

TEXT = "RANDOM WEIGHTS - NOT A REAL MODEL"


@dataclass
class Banner:
    """A luma overlay for the top rows of NV12 frames: white text on a dark band."""

    alpha: torch.Tensor  # (h, W) float in [0, 1]: band opacity
    luma: torch.Tensor  # (h, W) float: band luma (16 band, 235 text)

    def apply_(self, nv12: torch.Tensor) -> torch.Tensor:
        h = self.alpha.shape[0]
        y = nv12[:, :h, :].float()
        y = y + self.alpha * (self.luma - y)
        nv12[:, :h, :] = y.round_().clamp_(0, 255).to(torch.uint8)
        return nv12


def random_weights_banner(size: tuple[int, int], device: torch.device) -> Banner:
    w, h = size
    band = max(16, (h // 24) // 2 * 2)
    img = Image.new("L", (w, band), 0)
    draw = ImageDraw.Draw(img)
    try:
        font = ImageFont.load_default(size=max(10, int(band * 0.7)))
    except TypeError:  # Pillow < 10.1
        font = ImageFont.load_default()
    draw.text((max(2, w // 40), band * 0.12), TEXT, fill=255, font=font)
    text = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0)
    luma = 16.0 + text * (235.0 - 16.0)
    alpha = torch.full_like(text, 0.75).maximum(text)
    return Banner(alpha.to(device), luma.to(device))
