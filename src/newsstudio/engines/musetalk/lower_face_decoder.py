"""The VAE decoder for only the face rows the blend uses: a lever, not yet the engine's default.

Why: MuseTalk pastes back only the lower face (blend.py zeroes the mask above the face box's middle
row, then feathers it upward by ~20 of the 256 rows), yet the decoder computes all 256 rows, and it
is ~60 % of the engine's GPU time. Convolutions are local, so rows ``[first_row, 256)`` of the
output need only a shrinking band of rows at each earlier layer: computing just that band skips
~30 % of the decoder's multiply-adds for ``first_row=104`` (the 32x32 stage and the attention of
the mid block still run whole).

What is not local: every GroupNorm's mean and variance cover *all* rows. ``LowerFaceDecoder`` takes
the statistics of the rows it skips as an input (`upper_stats`, per item, per norm and group: mean
and variance of the skipped rows) and combines them exactly with those of the rows it computes
(Chan's parallel formula). With the upper statistics of the same latent (`record_upper_stats`), the
result equals the full decoder's rows up to float rounding; in a render they would come from the
avatar frame decoded once with the silence prompt (MuseTalk regenerates the upper face from the
unmasked reference half, so it changes little with speech), which makes the lever an
approximation whose error is measured next to its speed (benchmarks/lower_face_decoder.py).

Convolutions run as the modules are (padding 1 all round, also the phase-upsampling rewrite of
accel/upsample_conv.py); a cropped input's first output row saw zero padding instead of the row
above it, so it is dropped: one extra row per conv instead of a second set of conv modules. Norms
that see the cropped rows use accel/group_norm_nhwc.py's statistics and apply kernels on the GPU
(with the SiLU an NHWC norm took in), so the engine's decoder, NHWC norms and all, works unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from ...accel.group_norm_nhwc import group_stats, normalise_groups

FULL_ROWS = 256  # MuseTalk decodes 32x32 latents to 256x256 faces


def _conv_start(start: int) -> int:
    """First valid output row of a padding-1 conv (or nearest-2x + conv at input resolution) over
    rows ``[start, H)``: the row at ``start`` saw the zero padding unless ``start`` is the top."""
    return start + 1 if start > 0 else 0


@dataclass(frozen=True)
class RowPlan:
    """Rows each step of the up path starts at, from the output's ``first_row`` backwards.

    ``steps``: per step (in call order) its name and the first input row it needs;
    ``norm_starts``: per GroupNorm of the cropped path (call order), the first row it sees — the
    rows above it are the ones `upper_stats` summarise (norms that see every row are left out)."""

    first_row: int
    steps: tuple[tuple[str, int], ...]
    norm_starts: tuple[int, ...]


def _step_names(decoder: nn.Module) -> list[str]:
    names = []
    for b, block in enumerate(decoder.up_blocks):
        names += [f"up_blocks.{b}.resnets.{r}" for r in range(len(block.resnets))]
        if block.upsamplers is not None:
            names += [f"up_blocks.{b}.upsamplers.{u}" for u in range(len(block.upsamplers))]
    return names + ["conv_norm_out", "conv_out"]


def plan_rows(decoder: nn.Module, first_row: int) -> RowPlan:
    """The band of rows each step needs so that rows ``[first_row, H)`` of the output are exact."""
    names = _step_names(decoder)
    need, needs = first_row, []
    for name in reversed(names):  # input start needed for the output start `need`
        if ".resnets." in name:
            need = max(need - 2, 0)  # two 3x3 convs
        elif ".upsamplers." in name:
            need = max((need - 1) // 2, 0) if need > 0 else 0  # 3x3 conv at 2x, nearest from half resolution
        elif name == "conv_out":
            need = max(need - 1, 0)
        needs.append(need)
    steps = tuple(zip(names, reversed(needs)))
    norm_starts: list[int] = []
    for name, start in steps:
        if ".resnets." in name:
            norm_starts += [start, _conv_start(start)]  # norm1 before conv1, norm2 after it
        elif name == "conv_norm_out":
            norm_starts.append(start)
    return RowPlan(int(first_row), steps, tuple(s for s in norm_starts if s > 0))


def combine_group_stats(upper: torch.Tensor, n_upper: int, live_mean: torch.Tensor, live_var: torch.Tensor,
                        n_live: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and (biased) variance of two disjoint parts from each part's; ``upper[..., 0]`` is the
    mean and ``upper[..., 1]`` the variance of the first part (Chan et al.: no cancellation)."""
    n = n_upper + n_live
    delta = live_mean - upper[..., 0]
    mean = upper[..., 0] + delta * (n_live / n)
    var = (upper[..., 1] * n_upper + live_var * n_live) / n + delta * delta * (n_upper * n_live / n / n)
    return mean, var


class LowerFaceDecoder(nn.Module):
    """A diffusers ``Decoder`` (shared, not copied) run for output rows ``[first_row, H)`` only.

    ``forward(z, upper_stats)``: ``z`` is what the decoder takes (after ``post_quant_conv``);
    ``upper_stats`` ``[B, K, G, 2]`` the skipped rows' statistics from `record_upper_stats`.
    Returns ``[B, 3, H - first_row, W]``."""

    def __init__(self, decoder: nn.Module, first_row: int) -> None:
        super().__init__()
        if not 0 < first_row < FULL_ROWS:
            raise ValueError(f"first_row must be in 1..{FULL_ROWS - 1}, got {first_row}")
        if getattr(decoder, "upsample_type", None) not in (None, "nearest") or not hasattr(decoder.conv_norm_out, "num_groups"):
            raise ValueError("LowerFaceDecoder needs an AutoencoderKL decoder (GroupNorms, nearest upsampling)")
        self.decoder = decoder
        self.plan = plan_rows(decoder, first_row)
        self.groups = int(decoder.conv_norm_out.num_groups)

    @property
    def first_row(self) -> int:
        return self.plan.first_row

    def forward(self, z: torch.Tensor, upper_stats: torch.Tensor) -> torch.Tensor:
        k = len(self.plan.norm_starts)
        if upper_stats.shape[1:] != (k, self.groups, 2) or upper_stats.shape[0] != z.shape[0]:
            raise ValueError(f"upper_stats must be [{z.shape[0]}, {k}, {self.groups}, 2], got {tuple(upper_stats.shape)}")
        return self._run(z, upper_stats, None)

    @torch.no_grad()
    def record_upper_stats(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The full decode of ``z`` and, per item, the statistics of the rows `forward` skips:
        ``(decoded [B, 3, H, W], upper_stats [B, K, G, 2])``."""
        recorded: list[torch.Tensor] = []
        out = self._run(z, None, recorded)
        stats = torch.stack(recorded, dim=1) if recorded else out.new_zeros((out.shape[0], 0, self.groups, 2))
        return out, stats.float()

    # -- the walk ------------------------------------------------------------------------------
    def _run(self, z: torch.Tensor, upper: torch.Tensor | None, record: list[torch.Tensor] | None) -> torch.Tensor:
        """Cropping (``record is None``) or whole rows while recording the upper statistics: one
        walk, so the rows a norm summarises are the same in both."""
        dec, crop = self.decoder, record is None
        x = dec.mid_block(dec.conv_in(z), None)
        x = x.to(next(iter(dec.up_blocks.parameters())).dtype)
        norms = iter(range(len(self.plan.norm_starts)))
        start = 0  # first row `x` holds (0 while recording: it holds every row)

        def norm(gn: nn.GroupNorm, x: torch.Tensor, s: int) -> torch.Tensor:
            if s == 0:
                return gn(x)
            i = next(norms)
            if record is not None:
                mean, var = group_stats(x[:, :, :s], self.groups)
                record.append(torch.stack([mean, var], dim=-1))
                return gn(x)
            live_mean, live_var = group_stats(x, self.groups, getattr(gn, "statistics", None))
            per_row = x.shape[3] * (x.shape[1] // self.groups)
            mean, var = combine_group_stats(upper[:, i].float(), s * per_row, live_mean, live_var, x.shape[2] * per_row)
            silu = bool(getattr(gn, "silu", False))  # an NHWC norm that took the following SiLU (fuse_following_silu_)
            return normalise_groups(x, mean, var, gn.weight, gn.bias, gn.eps, silu=silu, apply_kernel=silu)

        def conv(module: nn.Module, x: torch.Tensor, s: int) -> tuple[torch.Tensor, int]:
            y = module(x)
            if crop and s > 0:
                y = y[:, :, 1:]
            return y, _conv_start(s)

        for name, need in self.plan.steps:
            if crop and need > start:
                x, start = x[:, :, need - start:], need
            s = need
            module = dec.get_submodule(name)
            if ".resnets." in name:
                h, s1 = conv(module.conv1, module.nonlinearity(norm(module.norm1, x, s)), s)
                h, s2 = conv(module.conv2, module.dropout(module.nonlinearity(norm(module.norm2, h, s1))), s1)
                skip = x[:, :, s2 - s:] if crop else x
                if module.conv_shortcut is not None:
                    skip = module.conv_shortcut(skip)
                x, start = (skip + h) / module.output_scale_factor, s2
            elif ".upsamplers." in name:
                y = module(x)
                if crop and s > 0:
                    y = y[:, :, 1:]
                x, start = y, 2 * s + 1 if s > 0 else 0
            elif name == "conv_norm_out":
                x, start = dec.conv_act(norm(module, x, s)), s
            else:
                x, start = conv(module, x, s)
            if not crop:
                start = 0
        return x[:, :, self.plan.first_row - start:] if crop else x
