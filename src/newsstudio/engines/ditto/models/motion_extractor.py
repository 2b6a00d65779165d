"""Motion extractor (LivePortrait's M): image → head pose bins, translation, expression, scale and
canonical keypoints. Loads `ditto_pytorch/models/motion_extractor.pth` strictly (keys `detector.*`)."""
from __future__ import annotations

import torch
from torch import nn

from .convnextv2 import convnextv2_tiny

MOTION_OUTPUT_NAMES: tuple[str, ...] = ("pitch", "yaw", "roll", "t", "exp", "scale", "kp")


class MotionExtractor(nn.Module):
    def __init__(self, num_kp: int = 21, backbone: str = "convnextv2_tiny", num_bins: int = 66) -> None:
        super().__init__()
        if backbone != "convnextv2_tiny":
            raise ValueError(f"unsupported motion-extractor backbone {backbone!r} (only 'convnextv2_tiny')")
        self.detector = convnextv2_tiny(num_kp=num_kp, num_bins=num_bins)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x [B, 3, H, W] RGB in [0, 1] (H, W multiples of 32) → (pitch, yaw, roll, t, exp, scale, kp):
        pitch/yaw/roll [B, num_bins] logits (not softmaxed), t [B, 3], exp [B, 3K], scale [B, 1], kp [B, 3K]."""
        return self.detector(x)

    def extract(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """The same outputs as a dict keyed by MOTION_OUTPUT_NAMES."""
        return dict(zip(MOTION_OUTPUT_NAMES, self.forward(x)))
