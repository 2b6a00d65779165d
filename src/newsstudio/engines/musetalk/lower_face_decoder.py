"""The VAE decoder for only the face rows the blend uses: a lever, not yet the engine's default.

Why: MuseTalk pastes back only the lower face (blend.py zeroes the mask above the face box's middle
row, then feathers it upward by ~20 of the 256 rows), yet the decoder computes all 256 rows, and it
is ~60 % of the engine's GPU time. Convolutions are local, so rows ``[first_row, 256)`` of the
output need only a band of rows at each earlier layer: computing just that band skips
~27 % of the decoder's multiply-adds for ``first_row=104`` (the 32x32 stage and the attention of
the mid block still run whole).

What is not local: every GroupNorm's mean and variance cover *all* rows. ``LowerFaceDecoder`` takes
the statistics of the rows it skips as an input (`upper_stats`, per item, per norm and group: mean
and variance of the skipped rows) and combines them exactly with those of the rows it computes
(Chan's parallel formula). With the upper statistics of the same latent (`record_upper_stats`), the
result equals the full decoder's rows up to float rounding; in a render they would come from the
avatar frame decoded once with the silence prompt (MuseTalk regenerates the upper face from the
unmasked reference half, so it changes little with speech), which makes the lever an
approximation whose error is measured next to its speed (benchmarks/lower_face_decoder.py).

Each resolution stage is cut once, at the input of the upsampler that starts it (the smaller map:
the one copy per stage), as many rows above the rows the output needs as the stage has convs.
Convolutions then run as the modules are (padding 1 all round, also the phase-upsampling rewrite of
accel/upsample_conv.py), on whole maps, no copies between them: each leaves one more wrong row at
the map's top (it saw the cut or the row above it that did), which is tracked, left out of the norm
statistics and never reaches the output. Norms use accel/group_norm_nhwc.py's statistics kernel
over the right rows and its apply kernel on the GPU (with the SiLU an NHWC norm took in), so the
engine's decoder, NHWC norms and all, works unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from ...accel.group_norm_nhwc import group_stats, normalise_groups
from ...accel.layout import channels_last_dense, memory_format_of

FULL_ROWS = 256  # MuseTalk decodes 32x32 latents to 256x256 faces


def _conv_start(start: int) -> int:
    """First valid output row of a padding-1 conv over a map whose rows from ``start`` on are valid
    (those above it are missing or wrong): the row at ``start`` saw them, unless it is the top."""
    return start + 1 if start > 0 else 0


@dataclass(frozen=True)
class RowPlan:
    """Where the up path is cut and which rows each norm sees, for output rows ``[first_row, H)``.

    ``steps``: per step (in call order) its name and, for the first step and each upsampler, the
    first input row it is given (the map is cut there: one copy per stage, of its smallest map),
    else 0.
    ``norm_rows``: per GroupNorm (call order) the first valid row of its map (0: every row): rows
    above it are the ones `upper_stats` summarise. Within a stage nothing is cut: each conv leaves
    one more wrong row at the top, which is tracked, left out of the statistics and never reaches
    the output."""

    first_row: int
    steps: tuple[tuple[str, int], ...]
    norm_rows: tuple[int, ...]

    @property
    def norm_starts(self) -> tuple[int, ...]:
        """The first valid rows of the norms whose maps lack rows: one `upper_stats` entry each."""
        return tuple(v for v in self.norm_rows if v > 0)


def _step_names(decoder: nn.Module) -> list[str]:
    names = []
    for b, block in enumerate(decoder.up_blocks):
        names += [f"up_blocks.{b}.resnets.{r}" for r in range(len(block.resnets))]
        if block.upsamplers is not None:
            names += [f"up_blocks.{b}.upsamplers.{u}" for u in range(len(block.upsamplers))]
    return names + ["conv_norm_out", "conv_out"]


def _walk_valid_rows(steps: tuple[tuple[str, int], ...]) -> tuple[list[int], int]:
    """Forward: the first valid row each norm sees, and the output's."""
    valid, norms = 0, []
    for name, cut in steps:
        if valid > cut > 0:
            raise AssertionError(f"{name}: rows from {valid} valid, cut at {cut}")
        valid = max(valid, cut)  # a cut map's rows are right; the next conv's top row is not
        if ".resnets." in name:
            norms += [valid, _conv_start(valid)]  # norm1 before conv1, norm2 after it
            valid = _conv_start(_conv_start(valid))
        elif ".upsamplers." in name:
            valid = _conv_start(2 * valid)  # nearest 2x, then a 3x3 conv whose top row saw the cut
        elif name == "conv_norm_out":
            norms.append(valid)
        else:
            valid = _conv_start(valid)
    return norms, valid


def plan_rows(decoder: nn.Module, first_row: int) -> RowPlan:
    """The latest row each upsampler's input can be cut at so that rows ``[first_row, H)`` of the
    output are exact (given every norm's statistics), and the rows each norm then sees."""
    names = _step_names(decoder)
    need, cuts = first_row, []
    for i, name in reversed(list(enumerate(names))):  # the first row needed at each step's input, from the output back
        if ".resnets." in name:
            need = max(need - 2, 0)  # two 3x3 convs
        elif ".upsamplers." in name:
            need = max((need - 1) // 2, 0) if need > 0 else 0  # 3x3 conv at 2x, nearest from half resolution
        elif name == "conv_out":
            need = max(need - 1, 0)
        cuts.append(need if i == 0 or ".upsamplers." in name else 0)
    steps = tuple(zip(names, reversed(cuts)))
    norms, valid = _walk_valid_rows(steps)
    if valid > first_row:
        raise AssertionError(f"output rows from {valid} valid, {first_row} asked for")
    return RowPlan(int(first_row), steps, tuple(norms))


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
        w = next(p for p in decoder.up_blocks.parameters() if p.dim() == 4)  # channels-last weights: maps too
        self.channels_last = memory_format_of(w) is torch.channels_last

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

    def _dense(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` contiguous in the decoder's layout. A row slice of a channels-last map is not
        channels-last *contiguous*, and what follows tests exactly that: the phase upsampler then
        interleaves in NCHW and the NHWC norms fall back to PyTorch's reductions for every map
        after it (on an H100 the engine gained 1 % instead of the decoder's 15 %, 2026-12-05).
        A no-op on a map already so (tested by the strides: `channels_last_dense`, as under a traced
        dynamic batch ``contiguous()`` may copy a map that is); the copies are of each stage's
        smallest map."""
        if not self.channels_last:
            return x.contiguous()
        return x if channels_last_dense(x) else x.contiguous(memory_format=torch.channels_last)

    # -- the walk ------------------------------------------------------------------------------
    def _run(self, z: torch.Tensor, upper: torch.Tensor | None, record: list[torch.Tensor] | None) -> torch.Tensor:
        """Cut (``record is None``) or whole while recording the upper statistics: one walk over the
        plan, so the rows a norm summarises are the same in both. ``top``: the row the map's first
        row is (the plan's ``norm_rows`` say from which row on it is right)."""
        dec, cut_maps = self.decoder, record is None
        x = dec.mid_block(dec.conv_in(z), None)
        x = x.to(next(iter(dec.up_blocks.parameters())).dtype)
        norm_rows, upper_index = iter(self.plan.norm_rows), iter(range(len(self.plan.norm_starts)))
        top = 0

        def norm(gn: nn.Module, x: torch.Tensor) -> torch.Tensor:
            valid = next(norm_rows)
            if valid == 0:
                return gn(x)
            i = next(upper_index)
            if record is not None:
                mean, var = group_stats(x[:, :, :valid], self.groups)
                record.append(torch.stack([mean, var], dim=-1))
                return gn(x)
            x = self._dense(x)
            live_mean, live_var = group_stats(x, self.groups, getattr(gn, "statistics", None), first_row=valid - top)
            per_row = x.shape[3] * (x.shape[1] // self.groups)
            mean, var = combine_group_stats(upper[:, i].float(), valid * per_row, live_mean, live_var,
                                            (x.shape[2] - valid + top) * per_row)
            silu = bool(getattr(gn, "silu", False))  # an NHWC norm that took the following SiLU (fuse_following_silu_)
            return normalise_groups(x, mean, var, gn.weight, gn.bias, gn.eps, silu=silu, apply_kernel=silu)

        for name, cut in self.plan.steps:
            module = dec.get_submodule(name)
            if cut_maps and cut > top:
                x, top = self._dense(x[:, :, cut - top:]), cut
            if ".resnets." in name:
                h = module.conv1(module.nonlinearity(norm(module.norm1, x)))
                h = module.conv2(module.dropout(module.nonlinearity(norm(module.norm2, h))))
                skip = module.conv_shortcut(x) if module.conv_shortcut is not None else x
                x = (skip + h) / module.output_scale_factor
            elif ".upsamplers." in name:
                x, top = module(x), 2 * top
            elif name == "conv_norm_out":
                x = dec.conv_act(norm(module, x))
            else:
                x = module(x)
        return x[:, :, self.plan.first_row - top:] if cut_maps else x
