"""Ditto/LivePortrait stitching MLP: corrects driving keypoints so the animated face pastes
back onto the source without seams.

State-dict keys equal the official module (`mlp.{0,2,4,6}.{weight,bias}`); the official
checkpoint stores them under the dict entry ``'retarget_shoulder'`` with a DDP ``module.``
prefix, see :func:`stitching_state_dict_from_checkpoint`.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch import nn

CHECKPOINT_ENTRY = "retarget_shoulder"


def stitching_state_dict_from_checkpoint(checkpoint: Mapping[str, object]) -> dict[str, torch.Tensor]:
    """The module state_dict inside an official ``stitch_network.pth`` dict.

    Only the ``'retarget_shoulder'`` entry is used (other entries are ignored), and every
    occurrence of the substring ``module.`` is removed from each key — not just a leading
    prefix — exactly like the reference loader does.
    """
    if CHECKPOINT_ENTRY not in checkpoint:
        raise KeyError(f"stitching checkpoint has no {CHECKPOINT_ENTRY!r} entry (keys: {sorted(checkpoint)[:8]})")
    sd = checkpoint[CHECKPOINT_ENTRY]
    if not isinstance(sd, Mapping):
        raise TypeError(f"checkpoint[{CHECKPOINT_ENTRY!r}] is {type(sd).__name__}, expected a state_dict")
    return {str(k).replace("module.", ""): v for k, v in sd.items()}


class StitchingNetwork(nn.Module):
    """MLP(concat(kp_source, kp_driving)) -> 3·K keypoint deltas + one shared (tx, ty) shift."""

    def __init__(self, input_size: int = 126, hidden_sizes: Sequence[int] = (128, 128, 64), output_size: int = 65) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        prev = input_size
        for h in hidden_sizes:
            layers += [nn.Linear(prev, h), nn.ReLU(inplace=True)]
            prev = h
        layers.append(nn.Linear(prev, output_size))
        self.mlp = nn.Sequential(*layers)

    def delta(self, kp_source: torch.Tensor, kp_driving: torch.Tensor) -> torch.Tensor:
        """Raw MLP output [B, 3K+2] for keypoints [B, K, 3] (or flattened [B, 3K])."""
        b = kp_source.shape[0]
        return self.mlp(torch.cat([kp_source.reshape(b, -1), kp_driving.reshape(b, -1)], dim=1))

    def forward(self, kp_source: torch.Tensor, kp_driving: torch.Tensor) -> torch.Tensor:
        """Stitched driving keypoints [B, K, 3] (kp_driving is not modified)."""
        b = kp_source.shape[0]
        k = kp_source[0].numel() // 3
        d = self.delta(kp_source, kp_driving)
        out = kp_driving.reshape(b, k, 3) + d[:, : 3 * k].reshape(b, k, 3)
        shift_xy = d[:, 3 * k : 3 * k + 2].reshape(b, 1, 2)
        return torch.cat([out[..., :2] + shift_xy, out[..., 2:]], dim=-1)

    def load_checkpoint(self, path: str | Path, map_location: str | torch.device = "cpu") -> "StitchingNetwork":
        """Load an official ``stitch_network.pth`` strictly and switch to eval mode."""
        ckpt = torch.load(str(path), map_location=map_location, weights_only=True)
        self.load_state_dict(stitching_state_dict_from_checkpoint(ckpt), strict=True)
        return self.eval()
