"""Building blocks shared by the Ditto (LivePortrait-style) image networks.

Attribute names follow the official release (`core/models/modules/util.py`) so that every
network's `state_dict()` keys equal the official checkpoints. The blocks are inference-first:
no in-place tricks on inputs, `reshape` instead of `view` (so channels_last tensors work), and no
Python control flow that depends on tensor values (friendly to `torch.compile` / CUDA graphs).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "SameBlock2d",
    "DownBlock2d",
    "DownBlock3d",
    "UpBlock3d",
    "ResBlock3d",
    "HourglassEncoder",
    "HourglassDecoder",
    "Hourglass",
    "SpectralNormConv2d",
    "SPADE",
    "SPADEResnetBlock",
    "LayerNorm2d",
    "GRN",
    "coordinate_grid_3d",
]


class SameBlock2d(nn.Module):
    """conv → BatchNorm → ReLU (or LeakyReLU 0.01), resolution preserved."""

    def __init__(self, in_features: int, out_features: int, kernel_size: int = 3, padding: int = 1,
                 groups: int = 1, lrelu: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_features, out_features, kernel_size=kernel_size, padding=padding, groups=groups)
        self.norm = nn.BatchNorm2d(out_features, affine=True)
        self.ac: nn.Module = nn.LeakyReLU() if lrelu else nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ac(self.norm(self.conv(x)))


class DownBlock2d(nn.Module):
    """conv → BatchNorm → ReLU → 2×2 average pool (halves H and W)."""

    def __init__(self, in_features: int, out_features: int, kernel_size: int = 3, padding: int = 1,
                 groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_features, out_features, kernel_size=kernel_size, padding=padding, groups=groups)
        self.norm = nn.BatchNorm2d(out_features, affine=True)
        self.pool = nn.AvgPool2d(kernel_size=(2, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(F.relu(self.norm(self.conv(x))))


class DownBlock3d(nn.Module):
    """3-D conv → BatchNorm → ReLU → (1, 2, 2) average pool (halves H and W, keeps depth)."""

    def __init__(self, in_features: int, out_features: int, kernel_size: int = 3, padding: int = 1,
                 groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv3d(in_features, out_features, kernel_size=kernel_size, padding=padding, groups=groups)
        self.norm = nn.BatchNorm3d(out_features, affine=True)
        self.pool = nn.AvgPool3d(kernel_size=(1, 2, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(F.relu(self.norm(self.conv(x))))


class UpBlock3d(nn.Module):
    """Nearest ×2 upsampling of H and W (depth kept) → 3-D conv → BatchNorm → ReLU."""

    def __init__(self, in_features: int, out_features: int, kernel_size: int = 3, padding: int = 1,
                 groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv3d(in_features, out_features, kernel_size=kernel_size, padding=padding, groups=groups)
        self.norm = nn.BatchNorm3d(out_features, affine=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.interpolate(x, scale_factor=(1.0, 2.0, 2.0), mode="nearest")
        return F.relu(self.norm(self.conv(out)))


class ResBlock3d(nn.Module):
    """Pre-activation residual block (BN → ReLU → conv, twice) on a 3-D volume."""

    def __init__(self, in_features: int, kernel_size: int = 3, padding: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv3d(in_features, in_features, kernel_size=kernel_size, padding=padding)
        self.conv2 = nn.Conv3d(in_features, in_features, kernel_size=kernel_size, padding=padding)
        self.norm1 = nn.BatchNorm3d(in_features, affine=True)
        self.norm2 = nn.BatchNorm3d(in_features, affine=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(F.relu(self.norm1(x)))
        out = self.conv2(F.relu(self.norm2(out)))
        return out + x


def _hourglass_width(block_expansion: int, max_features: int, level: int) -> int:
    return min(max_features, block_expansion * (2**level))


class HourglassEncoder(nn.Module):
    """`num_blocks` DownBlock3d levels; returns the input and every level's output (the skips)."""

    def __init__(self, block_expansion: int, in_features: int, num_blocks: int = 3, max_features: int = 256) -> None:
        super().__init__()
        self.down_blocks = nn.ModuleList(
            DownBlock3d(
                in_features if i == 0 else _hourglass_width(block_expansion, max_features, i),
                _hourglass_width(block_expansion, max_features, i + 1),
                kernel_size=3,
                padding=1,
            )
            for i in range(num_blocks)
        )

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        outs = [x]
        for block in self.down_blocks:
            outs.append(block(outs[-1]))
        return outs


class HourglassDecoder(nn.Module):
    """UpBlock3d levels, each followed by concatenation with the matching encoder skip, then a
    final 3-D conv → BatchNorm → ReLU at full resolution (`block_expansion + in_features` channels)."""

    def __init__(self, block_expansion: int, in_features: int, num_blocks: int = 3, max_features: int = 256) -> None:
        super().__init__()
        ups = []
        for i in reversed(range(num_blocks)):
            mult = 1 if i == num_blocks - 1 else 2
            ups.append(UpBlock3d(mult * _hourglass_width(block_expansion, max_features, i + 1),
                                 _hourglass_width(block_expansion, max_features, i), kernel_size=3, padding=1))
        self.up_blocks = nn.ModuleList(ups)
        self.out_filters = block_expansion + in_features
        self.conv = nn.Conv3d(self.out_filters, self.out_filters, kernel_size=3, padding=1)
        self.norm = nn.BatchNorm3d(self.out_filters, affine=True)

    def forward(self, skips: list[torch.Tensor]) -> torch.Tensor:
        out = skips[-1]
        for i, block in enumerate(self.up_blocks):
            out = torch.cat([block(out), skips[-2 - i]], dim=1)
        return F.relu(self.norm(self.conv(out)))


class Hourglass(nn.Module):
    """3-D U-Net used by the dense-motion network; spatial H, W must be divisible by 2**num_blocks."""

    def __init__(self, block_expansion: int, in_features: int, num_blocks: int = 3, max_features: int = 256) -> None:
        super().__init__()
        self.encoder = HourglassEncoder(block_expansion, in_features, num_blocks, max_features)
        self.decoder = HourglassDecoder(block_expansion, in_features, num_blocks, max_features)
        self.out_filters = self.decoder.out_filters

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(x))


def coordinate_grid_3d(d: int, h: int, w: int, like: torch.Tensor) -> torch.Tensor:
    """Identity sampling grid [d, h, w, 3] in (x, y, z) order, each axis linearly spaced over [-1, 1]
    with its end points on the first and last voxel centres (i.e. `2·i/(n−1) − 1`, like the
    official `make_coordinate_grid`), on `like`'s device and dtype."""

    def axis(n: int) -> torch.Tensor:
        t = torch.arange(n, device=like.device, dtype=like.dtype)
        return 2 * (t / (n - 1)) - 1

    zz, yy, xx = torch.meshgrid(axis(d), axis(h), axis(w), indexing="ij")
    return torch.stack([xx, yy, zz], dim=-1)


class SpectralNormConv2d(nn.Module):
    """Conv2d whose weight is spectrally normalised exactly like the old-style
    `torch.nn.utils.spectral_norm(conv)` (dim 0, one power iteration in training, eps 1e-12).

    State-dict entries match that utility: `bias` (if any), `weight_orig`, `weight_u`, `weight_v`.
    In eval mode the effective weight is `weight_orig / sigma` with `sigma = u · (W v)` from the
    stored vectors and no power iteration. `folded()` returns a plain `nn.Conv2d` holding that
    effective weight, so inference need not recompute it.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, padding: int = 0,
                 dilation: int = 1, bias: bool = True, n_power_iterations: int = 1, eps: float = 1e-12) -> None:
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.padding, self.dilation = kernel_size, padding, dilation
        self.n_power_iterations, self.eps = n_power_iterations, eps
        # Registration order reproduces the official key order: bias, weight_orig, weight_u, weight_v.
        self.bias = nn.Parameter(torch.zeros(out_channels)) if bias else None
        self.weight_orig = nn.Parameter(torch.empty(out_channels, in_channels, kernel_size, kernel_size))
        nn.init.kaiming_uniform_(self.weight_orig, a=5**0.5)
        fan_in = in_channels * kernel_size * kernel_size
        u = F.normalize(torch.randn(out_channels), dim=0, eps=eps)
        v = F.normalize(torch.randn(fan_in), dim=0, eps=eps)
        self.register_buffer("weight_u", u)
        self.register_buffer("weight_v", v)

    def _power_iteration_(self, w_mat: torch.Tensor) -> None:
        with torch.no_grad():
            u, v = self.weight_u, self.weight_v
            for _ in range(self.n_power_iterations):
                v.copy_(F.normalize(torch.mv(w_mat.t(), u), dim=0, eps=self.eps))
                u.copy_(F.normalize(torch.mv(w_mat, v), dim=0, eps=self.eps))

    def effective_weight(self) -> torch.Tensor:
        """weight_orig / sigma (power iteration first, in place, only in training mode).

        sigma is computed in at least float32, so half-precision copies of the module keep an
        accurate normalisation; the result has weight_orig's dtype."""
        w_mat = self.weight_orig.reshape(self.out_channels, -1)
        if self.training:
            self._power_iteration_(w_mat)
        acc = torch.promote_types(self.weight_orig.dtype, torch.float32)
        u = self.weight_u.to(acc)
        v = self.weight_v.to(acc)
        sigma = torch.dot(u, torch.mv(w_mat.to(acc), v))
        return (self.weight_orig.to(acc) / sigma).to(self.weight_orig.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.effective_weight().to(x.dtype)
        b = None if self.bias is None else self.bias.to(x.dtype)
        return F.conv2d(x, w, b, padding=self.padding, dilation=self.dilation)

    @torch.no_grad()
    def folded(self) -> nn.Conv2d:
        """A plain Conv2d computing the same eval-mode function (same device and dtype)."""
        conv = nn.Conv2d(self.in_channels, self.out_channels, self.kernel_size, padding=self.padding,
                         dilation=self.dilation, bias=self.bias is not None,
                         device=self.weight_orig.device, dtype=self.weight_orig.dtype)
        was_training = self.training
        self.eval()
        conv.weight.copy_(self.effective_weight())
        self.train(was_training)
        if self.bias is not None:
            conv.bias.copy_(self.bias)
        return conv.train(was_training)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, padding={self.padding}, "
                f"dilation={self.dilation}, bias={self.bias is not None}")


class SPADE(nn.Module):
    """Spatially adaptive normalisation: parameter-free instance norm of `x`, then a per-pixel
    affine transform predicted from `segmap` (resized to x's size, nearest)."""

    def __init__(self, norm_nc: int, label_nc: int, nhidden: int = 128) -> None:
        super().__init__()
        self.param_free_norm = nn.InstanceNorm2d(norm_nc, affine=False)
        self.mlp_shared = nn.Sequential(nn.Conv2d(label_nc, nhidden, kernel_size=3, padding=1), nn.ReLU())
        self.mlp_gamma = nn.Conv2d(nhidden, norm_nc, kernel_size=3, padding=1)
        self.mlp_beta = nn.Conv2d(nhidden, norm_nc, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor, segmap: torch.Tensor) -> torch.Tensor:
        normalized = self.param_free_norm(x)
        segmap = F.interpolate(segmap, size=x.shape[2:], mode="nearest")
        actv = self.mlp_shared(segmap)
        return normalized * (1 + self.mlp_gamma(actv)) + self.mlp_beta(actv)


class SPADEResnetBlock(nn.Module):
    """SPADE residual block: (SPADE → LeakyReLU 0.2 → conv) twice, plus a shortcut that is learned
    (SPADE → 1×1 conv without bias) when the channel count changes. Convs may be spectral-normed."""

    def __init__(self, fin: int, fout: int, norm_G: str, label_nc: int, dilation: int = 1, nhidden: int = 128) -> None:
        super().__init__()
        self.learned_shortcut = fin != fout
        fmiddle = min(fin, fout)
        spectral = "spectral" in norm_G

        def conv(cin: int, cout: int, k: int, pad: int, dil: int, bias: bool) -> nn.Module:
            if spectral:
                return SpectralNormConv2d(cin, cout, k, padding=pad, dilation=dil, bias=bias)
            return nn.Conv2d(cin, cout, k, padding=pad, dilation=dil, bias=bias)

        self.conv_0 = conv(fin, fmiddle, 3, dilation, dilation, True)
        self.conv_1 = conv(fmiddle, fout, 3, dilation, dilation, True)
        if self.learned_shortcut:
            self.conv_s = conv(fin, fout, 1, 0, 1, False)
        self.norm_0 = SPADE(fin, label_nc, nhidden)
        self.norm_1 = SPADE(fmiddle, label_nc, nhidden)
        if self.learned_shortcut:
            self.norm_s = SPADE(fin, label_nc, nhidden)

    def forward(self, x: torch.Tensor, seg: torch.Tensor) -> torch.Tensor:
        x_s = self.conv_s(self.norm_s(x, seg)) if self.learned_shortcut else x
        dx = self.conv_0(F.leaky_relu(self.norm_0(x, seg), 0.2))
        dx = self.conv_1(F.leaky_relu(self.norm_1(dx, seg), 0.2))
        return x_s + dx


class LayerNorm2d(nn.Module):
    """LayerNorm over the channel axis of an NCHW tensor (ConvNeXt "channels_first" LayerNorm).

    Computed as a standard layer norm over a channels-last view, which equals the official
    explicit mean/variance formula and stays accurate in half precision."""

    def __init__(self, num_channels: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(num_channels))
        self.bias = nn.Parameter(torch.zeros(num_channels))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.layer_norm(x.permute(0, 2, 3, 1), self.weight.shape, self.weight, self.bias, self.eps)
        return y.permute(0, 3, 1, 2)


class GRN(nn.Module):
    """Global Response Normalisation (ConvNeXt-V2) on channels-last input [N, H, W, C]."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.zeros(1, 1, 1, dim))
        self.beta = nn.Parameter(torch.zeros(1, 1, 1, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gx = torch.linalg.vector_norm(x, ord=2, dim=(1, 2), keepdim=True)
        nx = gx / (gx.mean(dim=-1, keepdim=True) + 1e-6)
        return self.gamma * (x * nx) + self.beta + x
