"""GroupNorm of channels-last activations with a Triton statistics kernel that reads whole pixels.

Why: in MuseTalk's compiled VAE decoder (cuDNN convs) about half of the 45.7 ms per batch of 32 on
an H200 is GroupNorm + SiLU kernels that Inductor generates, running at ~20-40 % of the memory
bandwidth (benchmarks/RESULTS.md, twenty-first session's profile: 0.49 ms for one statistics pass
over 537 MB, which the bandwidth allows in ~0.12 ms). A group of a channels-last tensor is a few
channels in every pixel (4 of 128 in the decoder's last block), so a reduction that walks one
group reads 8 of every 256 bytes of each row. Here each program reads a run of whole pixels (all
channels, contiguous, 16-byte loads), keeps every channel's count, mean and M2, and merges its
chunks with Chan's parallel formula (two-pass within a chunk held in registers: no cancellation of
large means). The channels of a group and the programs' pixel splits are then combined the same way.

Only the statistics are a custom op (``newsstudio::group_norm_partials``: per image, per pixel
split, per channel). Combining them into groups and the affine normalisation are plain tensor ops,
so ``torch.compile`` fuses them with what surrounds them (the SiLU after the norm, a residual add
before it) as it does for its own GroupNorm. Any group size works (the UNet's 10-40 channels, the
decoder's 4-16, an InstanceNorm's 1).

Where the kernel cannot run (CPU tensors outside Triton's interpreter, an input that is not
channels-last) `group_norm_nhwc` is ``F.group_norm``.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from . import triton_conv
from .layout import channels_last_dense
from .shared_copy import shared_copy_replacing
from .triton_conv import EXACT_STRIDES, interpreting, triton_available

__all__ = ["NHWCGroupNorm", "fuse_following_silu_", "group_norm_nhwc", "group_stats", "instance_norm_scale_shift",
           "kernel_fits", "normalise_groups", "spade_modulate", "spade_norm_nhwc", "with_nhwc_group_norms"]

ELEMENTS_PER_CHUNK = 8192  # pixels x channels one program holds in registers at once (fp32)
# The statistics kernels: "chunked" (Chan's merge after every chunk: two cross-thread reductions per
# chunk) or "streaming" (shifted sums kept per element, one reduction at the end, as Inductor's own
# reductions do). Streaming is the default: MuseTalk's compiled decoder, batch 32 on an H100, 40.07 ms
# with it, 43.44 with chunked, 44.92 with PyTorch's norms; the engine 473.0 / 463.8 / 451.8 frames/s
# (RESULTS.md, twenty-fifth session). Both agree with float64 statistics to ~1e-6 relative.
STATISTICS_KERNELS = ("chunked", "streaming")
STATISTICS_KERNEL = "streaming"
STREAMING_ELEMENTS_PER_CHUNK = 2048  # two fp32 accumulators per element stay in registers
# pixel splits per image: at batch 32, 2,048 programs (several waves over an H200's 132 SMs). Not
# derived from the batch size: the op's output shape would then depend on it, and torch.compile
# guards on every such branch (three recompiles of the MuseTalk engine's warm-up, ~17 s each)
SPLITS_PER_IMAGE = 64
MIN_SPLIT_PIXELS = 128  # a split's partials (12 bytes a channel) stay a few % of what it reads (2 a pixel)
MAX_CHANNELS = 4096


def _block_c(c: int) -> int:
    return 1 << (c - 1).bit_length()


def kernel_fits(x: torch.Tensor, groups: int) -> bool:
    """The statistics kernel takes ``x``: 4-D channels-last on CUDA (or in Triton's interpreter),
    half or float32, at most `MAX_CHANNELS` channels in whole groups."""
    if x.dim() != 4 or not triton_available():
        return False
    if not (x.is_cuda or interpreting()):
        return False
    c = x.shape[1]
    if not (0 < c <= MAX_CHANNELS and groups > 0 and c % groups == 0 and x.shape[2] * x.shape[3] > 0):
        return False
    return channels_last_dense(x) and x.dtype in (torch.float16, torch.bfloat16, torch.float32)


def _chunk_pixels(c: int, elements: int | None = None) -> int:
    """Pixels one program holds at once (the kernels' BLOCK_P) in ``elements`` (default
    `ELEMENTS_PER_CHUNK`)."""
    return max(1, (elements or ELEMENTS_PER_CHUNK) // _block_c(c))


def _modulate_pixels(c: int) -> int:
    """The SPADE modulation kernel's BLOCK_P: x, gamma and beta of each pixel are held at once, so
    a quarter of `_chunk_pixels` (at most 6,144 live fp32 values, as the apply kernel's 8,192)."""
    return _chunk_pixels(4 * c)


def _layout(c: int, hw: int, method: str) -> tuple[int, int, int]:
    """(pixels per chunk, pixels per split, splits) for images of ``hw`` pixels of ``c`` channels
    under the statistics kernel ``method``."""
    block_p = _chunk_pixels(c, STREAMING_ELEMENTS_PER_CHUNK if method == "streaming" else None)
    chunks = -(-hw // block_p)
    splits = max(1, min(chunks, SPLITS_PER_IMAGE, hw // MIN_SPLIT_PIXELS))
    per_split = -(-chunks // splits) * block_p
    return block_p, per_split, -(-hw // per_split)


def _partials_kernel(x_ptr, out_ptr, HW, STRIDE_N, CHUNKS, SPLITS,
                     C: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr):
    """Program (image n, split s): count, mean and M2 of every channel over the ``CHUNKS`` chunks of
    ``BLOCK_P`` pixels from pixel ``s * CHUNKS * BLOCK_P`` of image n's ``HW`` (groups are formed
    after); the last split's chunks past the end are masked out. Images are ``STRIDE_N`` elements
    apart (more than ``HW * C`` when only their lower rows are counted)."""
    n = tl.program_id(0)
    s = tl.program_id(1)
    start = s * CHUNKS * BLOCK_P
    offs_c = tl.arange(0, BLOCK_C)
    c_ok = offs_c < C
    image = x_ptr + n.to(tl.int64) * STRIDE_N
    count = tl.zeros((BLOCK_C,), dtype=tl.float32)
    mean = tl.zeros((BLOCK_C,), dtype=tl.float32)
    m2 = tl.zeros((BLOCK_C,), dtype=tl.float32)
    for i in range(0, CHUNKS):
        offs_p = start + i * BLOCK_P + tl.arange(0, BLOCK_P)
        ok = (offs_p < HW)[:, None] & c_ok[None, :]
        v = tl.load(image + offs_p.to(tl.int64)[:, None] * C + offs_c[None, :], mask=ok, other=0.0).to(tl.float32)
        n_chunk = tl.sum(ok.to(tl.float32), axis=0)  # [BLOCK_C]: the chunk's pixels (0 past C)
        chunk_mean = tl.sum(v, axis=0) / tl.maximum(n_chunk, 1.0)
        d = tl.where(ok, v - chunk_mean[None, :], 0.0)
        chunk_m2 = tl.sum(d * d, axis=0)
        total = tl.maximum(count + n_chunk, 1.0)
        delta = chunk_mean - mean
        mean += delta * (n_chunk / total)
        m2 += chunk_m2 + delta * delta * (count * n_chunk / total)
        count += n_chunk
    row = out_ptr + ((n * SPLITS + s) * 3).to(tl.int64) * C
    tl.store(row + offs_c, count, mask=c_ok)
    tl.store(row + C + offs_c, mean, mask=c_ok)
    tl.store(row + 2 * C + offs_c, m2, mask=c_ok)


def _streaming_partials_kernel(x_ptr, out_ptr, HW, STRIDE_N, CHUNKS, SPLITS,
                               C: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr):
    """Program (image n, split s): as `_partials_kernel`, but each element of the chunk tile keeps
    its own sums of ``x - shift`` and of its square over the chunks (no reduction in the loop), the
    tile reduced once at the end. ``shift``: the split's first pixel, per channel, so that the sums
    stay small beside a large mean (E[x^2] - E[x]^2 of the raw values would cancel)."""
    n = tl.program_id(0)
    s = tl.program_id(1)
    start = s * CHUNKS * BLOCK_P  # < HW for every split (_layout)
    offs_c = tl.arange(0, BLOCK_C)
    c_ok = offs_c < C
    image = x_ptr + n.to(tl.int64) * STRIDE_N
    shift = tl.load(image + start.to(tl.int64) * C + offs_c, mask=c_ok, other=0.0).to(tl.float32)
    acc = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    acc_sq = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    for i in range(0, CHUNKS):
        offs_p = start + i * BLOCK_P + tl.arange(0, BLOCK_P)
        ok = (offs_p < HW)[:, None] & c_ok[None, :]
        v = tl.load(image + offs_p.to(tl.int64)[:, None] * C + offs_c[None, :], mask=ok, other=0.0).to(tl.float32)
        d = tl.where(ok, v - shift[None, :], 0.0)
        acc += d
        acc_sq += d * d
    count = tl.minimum(HW - start, CHUNKS * BLOCK_P).to(tl.float32)
    total = tl.sum(acc, axis=0)
    mean_d = total / count
    m2 = tl.maximum(tl.sum(acc_sq, axis=0) - total * mean_d, 0.0)
    row = out_ptr + ((n * SPLITS + s) * 3).to(tl.int64) * C
    tl.store(row + offs_c, tl.zeros((BLOCK_C,), dtype=tl.float32) + count, mask=c_ok)
    tl.store(row + C + offs_c, shift + mean_d, mask=c_ok)
    tl.store(row + 2 * C + offs_c, m2, mask=c_ok)


def _apply_kernel(x_ptr, scale_ptr, shift_ptr, y_ptr, HW,
                  C: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr, SILU: tl.constexpr):
    """Program (image n, pixel block b): ``y = x * scale[n] + shift[n]`` (then SiLU) over BLOCK_P
    whole pixels, in x's dtype and layout."""
    n = tl.program_id(0)
    offs_p = tl.program_id(1) * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_c = tl.arange(0, BLOCK_C)
    c_ok = offs_c < C
    ok = (offs_p < HW)[:, None] & c_ok[None, :]
    at = n.to(tl.int64) * HW * C + offs_p.to(tl.int64)[:, None] * C + offs_c[None, :]
    v = tl.load(x_ptr + at, mask=ok, other=0.0).to(tl.float32)
    sc = tl.load(scale_ptr + n * C + offs_c, mask=c_ok, other=0.0)
    sh = tl.load(shift_ptr + n * C + offs_c, mask=c_ok, other=0.0)
    y = v * sc[None, :] + sh[None, :]
    if SILU:
        y = y * tl.sigmoid(y)
    tl.store(y_ptr + at, y.to(y_ptr.dtype.element_ty), mask=ok)


def _modulate_kernel(x_ptr, scale_ptr, shift_ptr, gb_ptr, y_ptr, HW, slope,
                     C: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr, ACT: tl.constexpr):
    """Program (image n, pixel block b): SPADE's modulation of the normalised ``x``,
    ``y = (x * scale[n] + shift[n]) * (1 + gamma) + beta`` (then LeakyReLU with ``slope``), gamma
    and beta the two halves of each pixel's 2C channels in ``gb`` (the stacked gamma/beta conv's
    output, channels-last like ``x``)."""
    n = tl.program_id(0)
    offs_p = tl.program_id(1) * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_c = tl.arange(0, BLOCK_C)
    c_ok = offs_c < C
    ok = (offs_p < HW)[:, None] & c_ok[None, :]
    pixel = n.to(tl.int64) * HW + offs_p.to(tl.int64)
    at = pixel[:, None] * C + offs_c[None, :]
    gb_at = pixel[:, None] * (2 * C) + offs_c[None, :]
    v = tl.load(x_ptr + at, mask=ok, other=0.0).to(tl.float32)
    gamma = tl.load(gb_ptr + gb_at, mask=ok, other=0.0).to(tl.float32)
    beta = tl.load(gb_ptr + gb_at + C, mask=ok, other=0.0).to(tl.float32)
    sc = tl.load(scale_ptr + n * C + offs_c, mask=c_ok, other=0.0)
    sh = tl.load(shift_ptr + n * C + offs_c, mask=c_ok, other=0.0)
    y = (v * sc[None, :] + sh[None, :]) * (1.0 + gamma) + beta
    if ACT:
        y = tl.where(y >= 0, y, y * slope)
    tl.store(y_ptr + at, y.to(y_ptr.dtype.element_ty), mask=ok)


@functools.lru_cache(maxsize=None)
def _kernels() -> dict:
    """{"chunked", "streaming", "apply", "modulate"}: jitted on first use (``triton.jit`` reads
    TRITON_INTERPRET when it decorates)."""
    if not triton_available():
        raise RuntimeError("the GroupNorm kernels need the 'triton' package")
    global tl
    tl = triton_conv.tl
    jit = triton_conv.triton.jit
    return {"chunked": jit(_partials_kernel), "streaming": jit(_streaming_partials_kernel), "apply": jit(_apply_kernel),
            "modulate": jit(_modulate_kernel)}


tl = None  # triton.language, bound by `_kernels` (Triton is imported on first use, see triton_conv.py)


@torch.library.custom_op("newsstudio::group_norm_partials", mutates_args=(), tags=(EXACT_STRIDES,))
def _group_norm_partials(x: torch.Tensor, method: str, first_row: int = 0) -> torch.Tensor:
    """[N, splits, 3, C] float32: count, mean, M2 of each channel over each pixel split of rows
    ``first_row`` on, by the statistics kernel ``method`` (`STATISTICS_KERNELS`). (Not named
    ``kernel``: Inductor's fallback for a custom op passes its arguments as keywords to
    ``FallbackKernel.create(kernel, ...)``.)"""
    n, c, h, w = x.shape
    hw = (h - first_row) * w
    block_p, per_split, splits = _layout(c, hw, method)
    out = torch.empty((n, splits, 3, c), dtype=torch.float32, device=x.device)
    x = x.contiguous(memory_format=torch.channels_last)
    rows = x[:, :, first_row:]  # in channels-last memory an image's lower rows are one run of pixels
    _kernels()[method][(n, splits)](rows, out, hw, h * w * c, per_split // block_p, splits, C=c, BLOCK_C=_block_c(c),
                                    BLOCK_P=block_p)
    return out


@_group_norm_partials.register_fake
def _(x, method, first_row=0):
    n, c, h, w = x.shape
    return x.new_empty((n, _layout(c, (h - first_row) * w, method)[2], 3, c), dtype=torch.float32)


def _partials(x: torch.Tensor, statistics: str | None, first_row: int = 0) -> torch.Tensor:
    method = statistics or STATISTICS_KERNEL
    if method not in STATISTICS_KERNELS:
        raise ValueError(f"statistics must be one of {STATISTICS_KERNELS}, got {method!r}")
    return _group_norm_partials(x, method, first_row)


@torch.library.custom_op("newsstudio::norm_apply_nhwc", mutates_args=(), tags=(EXACT_STRIDES,))
def _norm_apply(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, silu: bool) -> torch.Tensor:
    """``x * scale + shift`` (then SiLU) for channels-last ``x`` and [N, C] float32 ``scale``, ``shift``."""
    n, c, h, w = x.shape
    x = x.contiguous(memory_format=torch.channels_last)
    y = torch.empty_like(x, memory_format=torch.channels_last)
    block_p = _chunk_pixels(c)
    _kernels()["apply"][(n, -(-h * w // block_p))](x, scale.contiguous(), shift.contiguous(), y, h * w, C=c,
                                                    BLOCK_C=_block_c(c), BLOCK_P=block_p, SILU=silu)
    return y


@_norm_apply.register_fake
def _(x, scale, shift, silu):
    return torch.empty_like(x, memory_format=torch.channels_last)


@torch.library.custom_op("newsstudio::spade_modulate_nhwc", mutates_args=(), tags=(EXACT_STRIDES,))
def _spade_modulate(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, gamma_beta: torch.Tensor,
                    slope: float | None) -> torch.Tensor:
    """``(x * scale + shift) * (1 + gamma) + beta`` (then LeakyReLU) for channels-last ``x`` [N, C, H, W],
    [N, C] float32 ``scale``, ``shift`` and ``gamma_beta`` [N, 2C, H, W] = gamma then beta."""
    n, c, h, w = x.shape
    x = x.contiguous(memory_format=torch.channels_last)
    gamma_beta = gamma_beta.contiguous(memory_format=torch.channels_last)
    y = torch.empty_like(x, memory_format=torch.channels_last)
    block_p = _modulate_pixels(c)
    _kernels()["modulate"][(n, -(-h * w // block_p))](
        x, scale.contiguous(), shift.contiguous(), gamma_beta, y, h * w, 0.0 if slope is None else slope,
        C=c, BLOCK_C=_block_c(c), BLOCK_P=block_p, ACT=slope is not None)
    return y


@_spade_modulate.register_fake
def _(x, scale, shift, gamma_beta, slope):
    return torch.empty_like(x, memory_format=torch.channels_last)


def _mean_var(partials: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Chan's combination of every split and channel of a group: [N, G] mean and biased variance,
    float32."""
    n, s, _, c = partials.shape
    count, mean, m2 = partials.reshape(n, s, 3, groups, c // groups).unbind(2)  # each [N, S, G, C/G]
    total = count.sum((1, 3))
    mu = (count * mean).sum((1, 3)) / total
    var = (m2.sum((1, 3)) + (count * (mean - mu[:, None, :, None]).square()).sum((1, 3))) / total
    return mu, var


def _mean_rstd(partials: torch.Tensor, groups: int, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    mu, var = _mean_var(partials, groups)
    return mu, torch.rsqrt(var + eps)


def group_stats(x: torch.Tensor, groups: int, statistics: str | None = None,
                first_row: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, G] float32 mean and biased variance of each group of ``x`` [N, C, H, W] over its rows
    ``first_row`` on: by the Triton statistics kernel where `kernel_fits` (no copy of a channels-last
    ``x``), else ``torch.var_mean``."""
    if not 0 <= first_row < x.shape[2]:
        raise ValueError(f"first_row must be in 0..{x.shape[2] - 1}, got {first_row}")
    if kernel_fits(x, groups):
        return _mean_var(_partials(x, statistics, first_row), groups)
    rows = x[:, :, first_row:] if first_row else x
    var, mean = torch.var_mean(rows.float().reshape(x.shape[0], groups, -1), dim=-1, correction=0)
    return mean, var


def normalise_groups(x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor, weight: torch.Tensor | None,
                     bias: torch.Tensor | None, eps: float, *, silu: bool = False,
                     apply_kernel: bool = False) -> torch.Tensor:
    """GroupNorm's normalisation of ``x`` with the given [N, G] statistics, as one per-channel scale
    and shift (then SiLU): by the apply kernel with ``apply_kernel`` where `kernel_fits`, else as
    tensor ops that torch.compile fuses with their neighbours; ``x``'s dtype and layout."""
    c, groups = x.shape[1], mean.shape[1]
    scale = torch.rsqrt(var + eps).repeat_interleave(c // groups, dim=1)  # [N, C]
    if weight is not None:
        scale = scale * weight.float()
    shift = -mean.repeat_interleave(c // groups, dim=1) * scale
    if bias is not None:
        shift = shift + bias.float()
    if (apply_kernel and kernel_fits(x, groups)
            and not (torch.is_grad_enabled() and (scale.requires_grad or shift.requires_grad or x.requires_grad))):
        return _norm_apply(x, scale, shift, silu)  # (no backward formula: the tensor ops below have one)
    y = (x.float() * scale[:, :, None, None] + shift[:, :, None, None]).to(x.dtype)
    return F.silu(y) if silu else y


def group_norm_nhwc(x: torch.Tensor, groups: int, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                    eps: float = 1e-5, *, silu: bool = False, apply_kernel: bool = False,
                    statistics: str | None = None, min_pixels: int = 0) -> torch.Tensor:
    """``F.group_norm(x, groups, weight, bias, eps)`` (then ``F.silu`` with ``silu``) for a
    channels-last ``x``, statistics by the Triton kernel where `kernel_fits`; the result has ``x``'s
    dtype and layout. ``apply_kernel``: the normalisation (and SiLU) by a Triton kernel too instead of
    tensor ops that torch.compile fuses with their neighbours (benchmarks/group_norm_bench.py times both).
    ``statistics``: the statistics kernel (default `STATISTICS_KERNEL`); maps of fewer than
    ``min_pixels`` pixels take PyTorch's norm."""
    if not kernel_fits(x, groups) or x.shape[2] * x.shape[3] < min_pixels:
        y = F.group_norm(x, groups, weight, bias, eps)
        return F.silu(y) if silu else y
    mean, var = _mean_var(_partials(x, statistics), groups)
    return normalise_groups(x, mean, var, weight, bias, eps, silu=silu, apply_kernel=apply_kernel)


def instance_norm_scale_shift(x: torch.Tensor, eps: float = 1e-5,
                              statistics: str | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A parameter-free InstanceNorm of channels-last ``x`` as [N, C] float32 ``(scale, shift)``
    (``x * scale + shift`` normalises) from the statistics kernel, or None where it cannot run (then
    `spade_norm_nhwc` takes PyTorch's path). Two norms of the same ``x`` can share it."""
    if not kernel_fits(x, x.shape[1]) or (torch.is_grad_enabled() and x.requires_grad):
        return None
    mu, rstd = _mean_rstd(_partials(x, statistics), x.shape[1], eps)
    return rstd, -mu * rstd


def spade_modulate(normalized: torch.Tensor, gamma_beta: torch.Tensor, slope: float | None = None) -> torch.Tensor:
    """SPADE's modulation in PyTorch's ops: ``normalized * (1 + gamma) + beta`` (then
    ``leaky_relu(., slope)``), gamma and beta the two halves of ``gamma_beta``'s channels."""
    gamma, beta = torch.split(gamma_beta, normalized.shape[1], dim=1)
    y = normalized * (1 + gamma) + beta
    return y if slope is None else F.leaky_relu(y, slope)


def spade_norm_nhwc(x: torch.Tensor, gamma_beta: torch.Tensor, eps: float = 1e-5, slope: float | None = None,
                    scale_shift: tuple[torch.Tensor, torch.Tensor] | None = None,
                    statistics: str | None = None) -> torch.Tensor:
    """SPADE's ``instance_norm(x) * (1 + gamma) + beta`` (then ``leaky_relu(., slope)``) with
    ``gamma_beta`` = gamma and beta stacked on the channels, as one Triton kernel after the
    statistics one where both run (``scale_shift``: `instance_norm_scale_shift` of ``x`` if already
    computed). Why: Inductor's own instance norm of Ditto's channels-last 64x64-256x256 maps ran at
    ~450 GB/s on an H200, the kernels at 500-950 (group_norm_bench, twenty-third session)."""
    c = x.shape[1]
    fits = gamma_beta.shape == (x.shape[0], 2 * c, *x.shape[2:]) and gamma_beta.dtype == x.dtype
    if fits and scale_shift is None:
        scale_shift = instance_norm_scale_shift(x, eps, statistics)
    if not fits or scale_shift is None or (torch.is_grad_enabled() and gamma_beta.requires_grad):
        return spade_modulate(F.instance_norm(x, eps=eps), gamma_beta, slope)
    return _spade_modulate(x, scale_shift[0], scale_shift[1], gamma_beta, slope)


class NHWCGroupNorm(nn.Module):
    """Drop-in for an ``nn.GroupNorm``, or an ``nn.InstanceNorm2d`` without running statistics (a
    GroupNorm of one channel per group: Ditto's SPADE norms), sharing its affine parameters and
    computed by `group_norm_nhwc`."""

    def __init__(self, num_groups: int, num_channels: int, eps: float, weight: nn.Parameter | None = None,
                 bias: nn.Parameter | None = None, instance: bool = False) -> None:
        super().__init__()
        self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
        # maps of fewer pixels take PyTorch's norm (which Inductor compiles): alone, the kernels lose
        # to Inductor's on small maps (group_norm_bench: 2.5-6x on 32^2 and 16^2, H200)
        self.min_pixels = 0
        self.statistics: str | None = None  # the statistics kernel (None: STATISTICS_KERNEL)
        self.weight, self.bias = weight, bias
        self.instance = instance  # an InstanceNorm2d's replacement also takes one unbatched [C, H, W] image
        # the SiLU that follows this norm, taken in by `fuse_following_silu_` (then run by the apply kernel)
        self.silu = False

    @classmethod
    def replacing(cls, norm: nn.Module) -> "NHWCGroupNorm | None":
        """The replacement of ``norm``, or None where it is neither of the two (or wider than the
        kernel takes)."""
        if type(norm) is nn.GroupNorm:
            groups, channels = norm.num_groups, norm.num_channels
        elif type(norm) is nn.InstanceNorm2d and not norm.track_running_stats:
            groups = channels = norm.num_features
        else:
            return None
        if channels > MAX_CHANNELS:
            return None
        return cls(groups, channels, norm.eps, norm.weight, norm.bias, instance=type(norm) is nn.InstanceNorm2d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.instance and x.dim() == 3:
            return self(x[None])[0]
        if x.dim() < 2 or x.shape[1] != self.num_channels:  # other ranks (attention's [N, C, L]): F.group_norm
            raise ValueError(f"expected [N, {self.num_channels}, ...], got {tuple(x.shape)}")
        return group_norm_nhwc(x, self.num_groups, self.weight, self.bias, self.eps, silu=self.silu, apply_kernel=self.silu,
                               statistics=self.statistics, min_pixels=self.min_pixels)

    def extra_repr(self) -> str:
        return (f"{self.num_groups}, {self.num_channels}, eps={self.eps}" + (", then SiLU" if self.silu else "")
                + (f", kernels from {self.min_pixels} pixels" if self.min_pixels else ""))


def with_nhwc_group_norms(module: nn.Module, min_pixels: int = 0,
                          statistics: str | None = None) -> tuple[nn.Module, int]:
    """A copy of ``module`` (every parameter shared, see shared_copy.py) whose GroupNorm and
    InstanceNorm2d layers run as `NHWCGroupNorm` where `NHWCGroupNorm.replacing` takes them, and
    how many; on maps of fewer than ``min_pixels`` pixels they run PyTorch's norm; ``statistics``:
    the statistics kernel (default `STATISTICS_KERNEL`)."""
    def replacing(norm: nn.Module) -> NHWCGroupNorm | None:
        new = NHWCGroupNorm.replacing(norm)
        if new is not None:
            new.min_pixels, new.statistics = min_pixels, statistics
        return new

    return shared_copy_replacing(module, replacing)


def fuse_following_silu_(module: nn.Module) -> int:
    """Let the `NHWCGroupNorm` layers of ``module`` (after `with_nhwc_group_norms`) that a SiLU
    always follows apply it themselves, in the apply kernel, and drop that SiLU: diffusers'
    ``ResnetBlock2D`` without a time embedding (its ``nonlinearity`` follows norm1 and norm2 and
    nothing else) and the VAE ``Decoder``'s ``conv_norm_out`` + ``conv_act``. In place; returns how
    many norms took their SiLU."""
    from diffusers.models.autoencoders.vae import Decoder
    from diffusers.models.resnet import ResnetBlock2D

    count = 0
    for m in module.modules():
        if (isinstance(m, ResnetBlock2D) and m.time_emb_proj is None and type(m.nonlinearity) is nn.SiLU
                and m.upsample is None and m.downsample is None):
            norms, act = ("norm1", "norm2"), "nonlinearity"
        elif isinstance(m, Decoder) and type(m.conv_act) is nn.SiLU:
            norms, act = ("conv_norm_out",), "conv_act"
        else:
            continue
        if all(isinstance(getattr(m, n), NHWCGroupNorm) for n in norms):
            for n in norms:
                getattr(m, n).silu = True
            setattr(m, act, nn.Identity())
            count += len(norms)
    return count
