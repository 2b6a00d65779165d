"""Appearance feature extractor (LivePortrait's F): source image → 3-D appearance feature volume.

[B, 3, H, W] in [0, 1] → 2-D conv encoder (two 2× downsamplings) → 512 channels reshaped into
32 channels × 16 depth slices → six 3-D residual blocks → [B, 32, 16, H/4, W/4].
Loads `ditto_pytorch/models/appearance_extractor.pth` strictly.
"""
from __future__ import annotations

import torch
from torch import nn

from .blocks import DownBlock2d, ResBlock3d, SameBlock2d


class AppearanceFeatureExtractor(nn.Module):
    def __init__(
        self,
        image_channel: int = 3,
        block_expansion: int = 64,
        num_down_blocks: int = 2,
        max_features: int = 512,
        reshape_channel: int = 32,
        reshape_depth: int = 16,
        num_resblocks: int = 6,
    ) -> None:
        super().__init__()
        if reshape_channel * reshape_depth != max_features:
            raise ValueError(f"reshape_channel*reshape_depth ({reshape_channel}*{reshape_depth}) must equal max_features ({max_features})")
        self.reshape_channel = reshape_channel
        self.reshape_depth = reshape_depth

        self.first = SameBlock2d(image_channel, block_expansion, kernel_size=3, padding=1)
        widths = [min(max_features, block_expansion * (2**i)) for i in range(num_down_blocks + 1)]
        self.down_blocks = nn.ModuleList(
            DownBlock2d(widths[i], widths[i + 1], kernel_size=3, padding=1) for i in range(num_down_blocks)
        )
        self.second = nn.Conv2d(widths[-1], max_features, kernel_size=1, stride=1)
        self.resblocks_3d = nn.Sequential()
        for i in range(num_resblocks):
            self.resblocks_3d.add_module(f"3dr{i}", ResBlock3d(reshape_channel, kernel_size=3, padding=1))

    def forward(self, source_image: torch.Tensor) -> torch.Tensor:
        """source_image [B, 3, H, W] (RGB, 0..1) → f_s [B, 32, 16, H/4, W/4]."""
        out = self.first(source_image)
        for block in self.down_blocks:
            out = block(out)
        out = self.second(out)
        b, _, h, w = out.shape
        f_s = out.reshape(b, self.reshape_channel, self.reshape_depth, h, w)
        return self.resblocks_3d(f_s)
