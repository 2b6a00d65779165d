"""Dense motion network: sparse keypoint motion → dense 3-D sampling grid + occlusion map.

For each of the K keypoints (plus one identity "background" motion) it builds a sparse motion
field (identity grid − kp_driving + kp_source), warps a compressed copy of the feature volume
with it, stacks the warped copies with Gaussian heatmap differences, and lets a 3-D hourglass
predict a softmax mask over the K+1 motions (the dense deformation is the mask-weighted sum)
and a 2-D occlusion map. Any batch size B works.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .blocks import Hourglass, coordinate_grid_3d


def keypoint_gaussians(kp: torch.Tensor, grid: torch.Tensor, kp_variance: float) -> torch.Tensor:
    """kp [B, K, 3], grid [d, h, w, 3] → exp(−½‖grid − kp‖² / variance) of shape [B, K, d, h, w]."""
    diff = grid[None, None] - kp[:, :, None, None, None, :]
    return torch.exp(-0.5 * diff.pow(2).sum(-1) / kp_variance)


class DenseMotionNetwork(nn.Module):
    def __init__(self, block_expansion: int, num_blocks: int, max_features: int, num_kp: int,
                 feature_channel: int, reshape_depth: int, compress: int, estimate_occlusion_map: bool = True,
                 kp_variance: float = 0.01) -> None:
        super().__init__()
        self.num_kp = num_kp
        self.kp_variance = kp_variance
        self.hourglass = Hourglass(block_expansion=block_expansion, in_features=(num_kp + 1) * (compress + 1),
                                   max_features=max_features, num_blocks=num_blocks)
        self.mask = nn.Conv3d(self.hourglass.out_filters, num_kp + 1, kernel_size=7, padding=3)
        self.compress = nn.Conv3d(feature_channel, compress, kernel_size=1)
        self.norm = nn.BatchNorm3d(compress, affine=True)
        self.flag_estimate_occlusion_map = estimate_occlusion_map
        self.occlusion = (nn.Conv2d(self.hourglass.out_filters * reshape_depth, 1, kernel_size=7, padding=3)
                          if estimate_occlusion_map else None)

    def sparse_motions(self, grid: torch.Tensor, kp_driving: torch.Tensor, kp_source: torch.Tensor) -> torch.Tensor:
        """[B, 1+K, d, h, w, 3]: the identity grid, then per keypoint grid − kp_driving + kp_source."""
        b = kp_source.shape[0]
        identity = grid[None, None]
        driving_to_source = (identity - kp_driving[:, :, None, None, None, :]) + kp_source[:, :, None, None, None, :]
        return torch.cat([identity.expand(b, 1, *grid.shape), driving_to_source], dim=1)

    def deformed_features(self, feature: torch.Tensor, sparse_motion: torch.Tensor) -> torch.Tensor:
        """Warp `feature` [B, C, d, h, w] by each of the 1+K motions → [B, 1+K, C, d, h, w]."""
        b, c, d, h, w = feature.shape
        n = sparse_motion.shape[1]
        rep = feature[:, None].expand(b, n, c, d, h, w).reshape(b * n, c, d, h, w)
        warped = F.grid_sample(rep, sparse_motion.reshape(b * n, d, h, w, 3), align_corners=False)
        return warped.reshape(b, n, c, d, h, w)

    def forward(self, feature: torch.Tensor, kp_driving: torch.Tensor, kp_source: torch.Tensor) -> dict[str, torch.Tensor]:
        """feature [B, C, d, h, w], kp_* [B, K, 3] →
        {'mask' [B, 1+K, d, h, w], 'deformation' [B, d, h, w, 3] (x, y, z), 'occlusion_map' [B, 1, h, w]}."""
        feature = F.relu(self.norm(self.compress(feature)))
        b, _, d, h, w = feature.shape
        grid = coordinate_grid_3d(d, h, w, like=kp_source)

        sparse_motion = self.sparse_motions(grid, kp_driving, kp_source)
        deformed = self.deformed_features(feature, sparse_motion)

        heatmap = (keypoint_gaussians(kp_driving, grid, self.kp_variance)
                   - keypoint_gaussians(kp_source, grid, self.kp_variance))
        heatmap = torch.cat([heatmap.new_zeros(b, 1, d, h, w), heatmap], dim=1)

        x = torch.cat([heatmap[:, :, None], deformed], dim=2).reshape(b, -1, d, h, w)
        prediction = self.hourglass(x)

        mask = F.softmax(self.mask(prediction), dim=1)
        deformation = (sparse_motion * mask[..., None]).sum(dim=1)
        out = {"mask": mask, "deformation": deformation}
        if self.occlusion is not None:
            out["occlusion_map"] = torch.sigmoid(self.occlusion(prediction.reshape(b, -1, h, w)))
        return out
