"""ConvNeXt-V2 body of the Ditto/LivePortrait motion extractor, with its seven regression heads.

Attribute names follow the official `convnextv2.py` so that the keys under `detector.` equal
`motion_extractor.pth`. Inference only: stochastic depth is not built (it is the identity in eval).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .blocks import GRN, LayerNorm2d


class ConvNeXtV2Block(nn.Module):
    """7×7 depthwise conv → LayerNorm → Linear(4×) → GELU → GRN → Linear → residual."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.grn = GRN(4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dwconv(x).permute(0, 2, 3, 1)  # NCHW -> NHWC
        y = self.pwconv2(self.grn(self.act(self.pwconv1(self.norm(y)))))
        return x + y.permute(0, 3, 1, 2)


class ConvNeXtV2(nn.Module):
    """Four stages (stride 4, 8, 16, 32), global average pool, LayerNorm, then linear heads for
    canonical keypoints, scale, pitch/yaw/roll bins, translation and expression."""

    def __init__(self, in_chans: int = 3, depths: Sequence[int] = (3, 3, 9, 3),
                 dims: Sequence[int] = (96, 192, 384, 768), num_kp: int = 24, num_bins: int = 66) -> None:
        super().__init__()
        self.downsample_layers = nn.ModuleList()
        self.downsample_layers.append(
            nn.Sequential(nn.Conv2d(in_chans, dims[0], kernel_size=4, stride=4), LayerNorm2d(dims[0], eps=1e-6))
        )
        for i in range(3):
            self.downsample_layers.append(
                nn.Sequential(LayerNorm2d(dims[i], eps=1e-6), nn.Conv2d(dims[i], dims[i + 1], kernel_size=2, stride=2))
            )
        self.stages = nn.ModuleList(
            nn.Sequential(*[ConvNeXtV2Block(dims[i]) for _ in range(depths[i])]) for i in range(4)
        )
        self.norm = nn.LayerNorm(dims[-1], eps=1e-6)
        # Head registration order matches the official state_dict order.
        self.fc_kp = nn.Linear(dims[-1], 3 * num_kp)
        self.fc_scale = nn.Linear(dims[-1], 1)
        self.fc_pitch = nn.Linear(dims[-1], num_bins)
        self.fc_yaw = nn.Linear(dims[-1], num_bins)
        self.fc_roll = nn.Linear(dims[-1], num_bins)
        self.fc_t = nn.Linear(dims[-1], 3)
        self.fc_exp = nn.Linear(dims[-1], 3 * num_kp)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        for down, stage in zip(self.downsample_layers, self.stages):
            x = stage(down(x))
        return self.norm(x.mean(dim=(-2, -1)))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """→ (pitch, yaw, roll, t, exp, scale, kp), the official tuple order."""
        f = self.forward_features(x)
        return (self.fc_pitch(f), self.fc_yaw(f), self.fc_roll(f), self.fc_t(f),
                self.fc_exp(f), self.fc_scale(f), self.fc_kp(f))


def convnextv2_tiny(num_kp: int = 24, num_bins: int = 66) -> ConvNeXtV2:
    return ConvNeXtV2(depths=(3, 3, 9, 3), dims=(96, 192, 384, 768), num_kp=num_kp, num_bins=num_bins)
