"""Warping network (LivePortrait's W): warp the source feature volume f_s from the source keypoints
to the driving keypoints, then fold depth into channels and mask occluded regions.

feature_3d [B, 32, 16, H, W] (H, W multiples of 32), kp_source / kp_driving [B, K, 3]
→ [B, 256, H, W], the decoder's input. Loads `ditto_pytorch/models/warp_network.pth` strictly.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .blocks import SameBlock2d
from .dense_motion import DenseMotionNetwork

# Hard-wired in the official WarpingNetwork constructor.
DENSE_MOTION_PARAMS = {"block_expansion": 32, "max_features": 1024, "num_blocks": 5, "reshape_depth": 16, "compress": 4}


class WarpingNetwork(nn.Module):
    def __init__(
        self,
        num_kp: int = 21,
        block_expansion: int = 64,
        max_features: int = 512,
        num_down_blocks: int = 2,
        reshape_channel: int = 32,
        estimate_occlusion_map: bool = True,
        upscale: int = 1,
        flag_use_occlusion_map: bool = True,
        dense_motion: dict[str, int] | None = None,
    ) -> None:
        super().__init__()
        self.upscale = upscale  # accepted for signature parity; unused by the official forward
        self.flag_use_occlusion_map = flag_use_occlusion_map
        self.estimate_occlusion_map = estimate_occlusion_map
        self.dense_motion_network = DenseMotionNetwork(num_kp=num_kp, feature_channel=reshape_channel,
                                                       estimate_occlusion_map=estimate_occlusion_map,
                                                       **{**DENSE_MOTION_PARAMS, **(dense_motion or {})})
        width = block_expansion * (2**num_down_blocks)
        self.third = SameBlock2d(max_features, width, kernel_size=3, padding=1, lrelu=True)
        self.fourth = nn.Conv2d(width, width, kernel_size=1, stride=1)

    def forward_debug(self, feature_3d: torch.Tensor, kp_source: torch.Tensor,
                      kp_driving: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Warped feature plus the dense-motion intermediates (mask, deformation, occlusion_map)."""
        dense = self.dense_motion_network(feature=feature_3d, kp_driving=kp_driving, kp_source=kp_source)
        out = F.grid_sample(feature_3d, dense["deformation"], align_corners=False)
        b, c, d, h, w = out.shape
        out = self.fourth(self.third(out.reshape(b, c * d, h, w)))
        if self.flag_use_occlusion_map and "occlusion_map" in dense:
            out = out * dense["occlusion_map"]
        return out, dense

    def forward(self, feature_3d: torch.Tensor, kp_source: torch.Tensor, kp_driving: torch.Tensor) -> torch.Tensor:
        """Official argument order: (feature_3d, kp_source, kp_driving) → [B, 256, H, W]."""
        return self.forward_debug(feature_3d, kp_source, kp_driving)[0]
