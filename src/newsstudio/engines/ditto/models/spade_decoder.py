"""SPADE decoder (LivePortrait's G): warped feature [B, 256, H, W] → RGB image [B, 3, 8H, 8W] in (0, 1).

conv 256→512, six SPADE residual blocks at H×W, ×2 nearest up + SPADE block 512→256,
×2 up + SPADE block 256→64, LeakyReLU 0.2, conv 64→12 + PixelShuffle(2), sigmoid. Every SPADE
block is conditioned on the decoder's own input. The residual-block convs are spectral-normed
(stored u, v; no power iteration in eval): `fold_spectral_norm_()` bakes them into plain convs.
Loads `ditto_pytorch/models/decoder.pth` strictly (before folding).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .blocks import SpectralNormConv2d, SPADEResnetBlock


class SPADEDecoder(nn.Module):
    def __init__(
        self,
        upscale: int | None = 2,
        max_features: int = 512,
        block_expansion: int = 64,
        out_channels: int = 64,
        num_down_blocks: int = 2,
        spade_hidden: int = 128,
    ) -> None:
        super().__init__()
        if num_down_blocks < 1:
            raise ValueError("num_down_blocks must be >= 1")
        self.upscale = upscale
        norm_G = "spadespectralinstance"
        cin = min(max_features, block_expansion * (2**num_down_blocks))  # 256 with defaults
        label_nc = cin

        self.fc = nn.Conv2d(cin, 2 * cin, 3, padding=1)
        for i in range(6):
            self.add_module(f"G_middle_{i}", SPADEResnetBlock(2 * cin, 2 * cin, norm_G, label_nc, nhidden=spade_hidden))
        self.up_0 = SPADEResnetBlock(2 * cin, cin, norm_G, label_nc, nhidden=spade_hidden)
        self.up_1 = SPADEResnetBlock(cin, out_channels, norm_G, label_nc, nhidden=spade_hidden)
        self.up = nn.Upsample(scale_factor=2)
        # As in the official module: any upscale > 1 means conv to 12 channels + PixelShuffle(2).
        self.conv_img: nn.Module
        if upscale is None or upscale <= 1:
            self.conv_img = nn.Conv2d(out_channels, 3, 3, padding=1)
        else:
            self.conv_img = nn.Sequential(nn.Conv2d(out_channels, 3 * 2 * 2, kernel_size=3, padding=1),
                                          nn.PixelShuffle(upscale_factor=2))

    def middle_blocks(self) -> list[SPADEResnetBlock]:
        return [getattr(self, f"G_middle_{i}") for i in range(6)]

    def forward_logits(self, feature: torch.Tensor) -> torch.Tensor:
        """The pre-sigmoid image (output of the conv_img stage, after PixelShuffle)."""
        seg = feature
        x = self.fc(feature)
        for block in self.middle_blocks():
            x = block(x, seg)
        x = self.up_0(self.up(x), seg)
        x = self.up_1(self.up(x), seg)
        return self.conv_img(F.leaky_relu(x, 0.2))

    def forward(self, feature: torch.Tensor) -> torch.Tensor:
        """feature [B, 256, H, W] → image [B, 3, 8H, 8W] (with upscale 2), values in (0, 1)."""
        return torch.sigmoid(self.forward_logits(feature))

    @torch.no_grad()
    def fold_spectral_norm_(self) -> "SPADEDecoder":
        """Replace every spectral-normed conv by a plain Conv2d with weight = weight_orig / sigma,
        sigma = u·(W v) from the stored vectors (eval semantics, no power iteration). Inference
        then skips the per-call normalisation; the state_dict gets plain `weight` keys instead of
        `weight_orig/_u/_v`, so load checkpoints before folding. Returns self."""
        for module in list(self.modules()):
            for name, child in list(module.named_children()):
                if isinstance(child, SpectralNormConv2d):
                    setattr(module, name, child.folded())
        return self

    @property
    def spectral_norm_folded(self) -> bool:
        return not any(isinstance(m, SpectralNormConv2d) for m in self.modules())


def render_hwc255(image: torch.Tensor) -> torch.Tensor:
    """What the official decoder wrapper returns: batch element 0 as H×W×3, clipped to [0, 1], ×255."""
    return image[0].permute(1, 2, 0).clamp(0, 1) * 255
