"""BiSeNet face parser (CelebAMask-HQ, 19 classes) as MuseTalk ships it.

Module names equal the official ``face_parsing/model.py`` + ``resnet.py`` so that
``79999_iter.pth`` loads strictly (191 keys with the BatchNorm ``num_batches_tracked``
counters; :func:`load_bisenet_state_dict` also accepts files without them). The ImageNet
ResNet-18 file the official constructor opens has no effect on outputs (79999_iter.pth holds
every ``cp.resnet.*`` key), so it is not needed here.

The spatial path is absent (the official model replaces it with the 1/8 ResNet feature).
Forward returns three logit maps ``(main, aux from the 1/8 context feature, aux from the 1/16
feature)``, each bilinearly upsampled with ``align_corners=True`` to the input size.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

N_CLASSES = 19
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _global_avg(x: torch.Tensor) -> torch.Tensor:
    """Global average pool as the official code writes it (``avg_pool2d`` over the whole map)."""
    return F.avg_pool2d(x, x.shape[2:])


class ConvBNReLU(nn.Module):
    def __init__(self, cin: int, cout: int, ks: int = 3, stride: int = 1, padding: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, ks, stride, padding, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


class BasicBlock(nn.Module):
    """ResNet basic block; ``downsample`` (1x1 conv + BN) when the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample: nn.Module | None = None
        if cin != cout or stride != 1:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = F.relu(self.bn1(self.conv1(x)))
        r = self.bn2(self.conv2(r))
        shortcut = x if self.downsample is None else self.downsample(x)
        return F.relu(shortcut + r)


def _layer(cin: int, cout: int, stride: int) -> nn.Sequential:
    return nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1))


class Resnet18(nn.Module):
    """ResNet-18 trunk without the classifier; returns the 1/8, 1/16 and 1/32 features."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = _layer(64, 64, 1)
        self.layer2 = _layer(64, 128, 2)
        self.layer3 = _layer(128, 256, 2)
        self.layer4 = _layer(256, 512, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        feat8 = self.layer2(self.layer1(x))
        feat16 = self.layer3(feat8)
        feat32 = self.layer4(feat16)
        return feat8, feat16, feat32


class AttentionRefinementModule(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = ConvBNReLU(cin, cout, 3, 1, 1)
        self.conv_atten = nn.Conv2d(cout, cout, 1, bias=False)
        self.bn_atten = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feat = self.conv(x)
        att = torch.sigmoid(self.bn_atten(self.conv_atten(_global_avg(feat))))
        return feat * att


class ContextPath(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.resnet = Resnet18()
        self.arm16 = AttentionRefinementModule(256, 128)
        self.arm32 = AttentionRefinementModule(512, 128)
        self.conv_head32 = ConvBNReLU(128, 128, 3, 1, 1)
        self.conv_head16 = ConvBNReLU(128, 128, 3, 1, 1)
        self.conv_avg = ConvBNReLU(512, 128, 1, 1, 0)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        feat8, feat16, feat32 = self.resnet(x)
        avg = self.conv_avg(_global_avg(feat32))  # global context, broadcast below
        feat32_sum = self.arm32(feat32) + avg
        feat32_up = self.conv_head32(F.interpolate(feat32_sum, feat16.shape[2:], mode="nearest"))
        feat16_sum = self.arm16(feat16) + feat32_up
        feat16_up = self.conv_head16(F.interpolate(feat16_sum, feat8.shape[2:], mode="nearest"))
        return feat8, feat16_up, feat32_up


class FeatureFusionModule(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.convblk = ConvBNReLU(cin, cout, 1, 1, 0)
        self.conv1 = nn.Conv2d(cout, cout // 4, 1, bias=False)
        self.conv2 = nn.Conv2d(cout // 4, cout, 1, bias=False)

    def forward(self, fsp: torch.Tensor, fcp: torch.Tensor) -> torch.Tensor:
        feat = self.convblk(torch.cat([fsp, fcp], dim=1))
        att = torch.sigmoid(self.conv2(F.relu(self.conv1(_global_avg(feat)))))
        return feat * att + feat


class BiSeNetOutput(nn.Module):
    def __init__(self, cin: int, cmid: int, n_classes: int) -> None:
        super().__init__()
        self.conv = ConvBNReLU(cin, cmid, 3, 1, 1)
        self.conv_out = nn.Conv2d(cmid, n_classes, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv_out(self.conv(x))


class BiSeNet(nn.Module):
    """Face parser; ``forward(x [B,3,H,W] normalised)`` -> three ``[B,n_classes,H,W]`` logit maps."""

    def __init__(self, n_classes: int = N_CLASSES) -> None:
        super().__init__()
        self.cp = ContextPath()
        self.ffm = FeatureFusionModule(256, 256)
        self.conv_out = BiSeNetOutput(256, 256, n_classes)
        self.conv_out16 = BiSeNetOutput(128, 64, n_classes)
        self.conv_out32 = BiSeNetOutput(128, 64, n_classes)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        size = x.shape[2:]
        feat8, cp8, cp16 = self.cp(x)
        outs = (self.conv_out(self.ffm(feat8, cp8)), self.conv_out16(cp8), self.conv_out32(cp16))
        return tuple(F.interpolate(o, size, mode="bilinear", align_corners=True) for o in outs)  # type: ignore[return-value]


def normalize_rgb(image_rgb, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """RGB uint8 ``[H,W,3]`` (numpy or tensor, or a batch ``[B,H,W,3]``) -> ``[B,3,H,W]`` ImageNet-normalised.

    Same order of operations as torchvision ``ToTensor`` + ``Normalize``: ``/255`` in float32,
    then ``(x - mean) / std``.
    """
    x = image_rgb if isinstance(image_rgb, torch.Tensor) else torch.from_numpy(np.array(image_rgb, dtype=np.uint8))
    if device is not None:
        x = x.to(device)
    if x.ndim == 3:
        x = x.unsqueeze(0)
    x = x.permute(0, 3, 1, 2).to(torch.float32).div(255.0)
    mean = torch.tensor(IMAGENET_MEAN, dtype=torch.float32, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD, dtype=torch.float32, device=x.device).view(1, 3, 1, 1)
    return ((x - mean) / std).to(dtype)


def load_bisenet_state_dict(net: BiSeNet, state_dict: Mapping[str, torch.Tensor]) -> BiSeNet:
    """Strict load; only missing ``num_batches_tracked`` counters are tolerated (old files lack them)."""
    sd = dict(state_dict)
    if any(k.startswith("module.") for k in sd):  # saved from DataParallel
        sd = {k.removeprefix("module."): v for k, v in sd.items()}
    own = net.state_dict()
    for k, v in own.items():
        if k.endswith("num_batches_tracked") and k not in sd:
            sd[k] = v.clone()
    net.load_state_dict(sd, strict=True)
    return net


def load_bisenet(
    weights: str | Path | Mapping[str, torch.Tensor],
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> BiSeNet:
    """BiSeNet in eval mode from ``79999_iter.pth`` (a path) or a state dict."""
    net = BiSeNet()
    sd = torch.load(str(weights), map_location="cpu", weights_only=True) if isinstance(weights, (str, Path)) else weights
    load_bisenet_state_dict(net, sd)
    return net.to(device=device, dtype=dtype).eval()
