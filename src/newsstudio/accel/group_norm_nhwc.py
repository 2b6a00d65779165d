"""GroupNorm of channels-last activations with a Triton statistics kernel that reads whole pixels.

Why: in MuseTalk's compiled VAE decoder (cuDNN convs) about half of the 45.7 ms per batch of 32 on
an H200 is GroupNorm + SiLU kernels that Inductor generates, running at ~20-40 % of the memory
bandwidth (benchmarks/RESULTS.md, twenty-first session's profile: 0.49 ms for one statistics pass
over 537 MB, which the bandwidth allows in ~0.12 ms). A group of a channels-last tensor is a few
channels in every pixel (4 of 128 in the decoder's last block), so a reduction that walks one
group reads 8 of every 256 bytes of each row. Here each program reads a run of whole pixels (all
channels, contiguous), reduces every group at once, and merges its chunks with Chan's parallel
variance formula (two-pass within a chunk held in registers: no cancellation of large means).

Only the statistics are a custom op (``newsstudio::group_norm_partials``: per image, per pixel
split, per group: count, mean, M2). Combining the splits and the affine normalisation are plain
tensor ops, so ``torch.compile`` fuses them with what surrounds them (the SiLU after the norm, a
residual add before it) as it does for its own GroupNorm.

Where the kernel cannot run (CPU tensors outside Triton's interpreter, an input that is not
channels-last, group sizes that are not powers of two) `group_norm_nhwc` is ``F.group_norm``.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from . import triton_conv
from .shared_copy import shared_copy
from .triton_conv import EXACT_STRIDES, interpreting, triton_available

__all__ = ["NHWCGroupNorm", "group_norm_nhwc", "kernel_fits", "with_nhwc_group_norms"]

ELEMENTS_PER_CHUNK = 8192  # pixels x channels one program holds in registers at once (fp32)
TARGET_PROGRAMS = 2048  # images x splits: several waves over an H200's 132 SMs


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def kernel_fits(x: torch.Tensor, groups: int) -> bool:
    """The statistics kernel takes ``x``: 4-D channels-last on CUDA (or in Triton's interpreter),
    channels and groups powers of two (the kernel's tile shapes), at most 4,096 channels."""
    if x.dim() != 4 or not triton_available():
        return False
    if not (x.is_cuda or interpreting()):
        return False
    c = x.shape[1]
    if not (_pow2(c) and _pow2(groups) and c % groups == 0 and c <= 4096 and x.shape[2] * x.shape[3] > 0):
        return False
    return x.is_contiguous(memory_format=torch.channels_last) and x.dtype in (torch.float16, torch.bfloat16, torch.float32)


def _layout(n: int, c: int, hw: int) -> tuple[int, int, int]:
    """(pixels per chunk, pixels per split, splits) for ``n`` images of ``hw`` pixels of ``c`` channels."""
    block_p = max(1, ELEMENTS_PER_CHUNK // c)
    chunks = -(-hw // block_p)
    splits = max(1, min(chunks, -(-TARGET_PROGRAMS // max(n, 1))))
    per_split = -(-chunks // splits) * block_p
    return block_p, per_split, -(-hw // per_split)


def _partials_kernel(x_ptr, out_ptr, HW, PER_SPLIT, SPLITS,
                     C: tl.constexpr, G: tl.constexpr, BLOCK_P: tl.constexpr):
    """Program (image n, split s): count, mean and M2 of every group over pixels
    ``[s * PER_SPLIT, (s + 1) * PER_SPLIT)`` of image n, chunk by chunk."""
    n = tl.program_id(0)
    s = tl.program_id(1)
    CPG: tl.constexpr = C // G
    start = s * PER_SPLIT
    stop = tl.minimum(start + PER_SPLIT, HW)
    offs_c = tl.arange(0, C)
    image = x_ptr + n.to(tl.int64) * HW * C
    count = tl.zeros((G,), dtype=tl.float32)
    mean = tl.zeros((G,), dtype=tl.float32)
    m2 = tl.zeros((G,), dtype=tl.float32)
    for p0 in range(start, stop, BLOCK_P):
        offs_p = p0 + tl.arange(0, BLOCK_P)
        ok = offs_p < stop
        v = tl.load(image + offs_p.to(tl.int64)[:, None] * C + offs_c[None, :], mask=ok[:, None], other=0.0)
        v = tl.reshape(v.to(tl.float32), (BLOCK_P, G, CPG))
        n_chunk = tl.sum(ok.to(tl.float32), axis=0) * CPG
        chunk_mean = tl.sum(tl.sum(v, axis=2), axis=0) / n_chunk
        d = tl.where(tl.reshape(ok, (BLOCK_P, 1, 1)), v - tl.reshape(chunk_mean, (1, G, 1)), 0.0)
        chunk_m2 = tl.sum(tl.sum(d * d, axis=2), axis=0)
        total = count + n_chunk
        delta = chunk_mean - mean
        mean += delta * (n_chunk / total)
        m2 += chunk_m2 + delta * delta * (count * n_chunk / total)
        count = total
    offs_g = tl.arange(0, G)
    row = out_ptr + ((n * SPLITS + s) * 3).to(tl.int64) * G
    tl.store(row + offs_g, count)
    tl.store(row + G + offs_g, mean)
    tl.store(row + 2 * G + offs_g, m2)


@functools.lru_cache(maxsize=None)
def _kernel():
    """Jitted on first use (``triton.jit`` reads TRITON_INTERPRET when it decorates)."""
    if not triton_available():
        raise RuntimeError("the GroupNorm statistics kernel needs the 'triton' package")
    global tl
    tl = triton_conv.tl
    return triton_conv.triton.jit(_partials_kernel)


tl = None  # triton.language, bound by `_kernel` (Triton is imported on first use, see triton_conv.py)


@torch.library.custom_op("newsstudio::group_norm_partials", mutates_args=(), tags=(EXACT_STRIDES,))
def _group_norm_partials(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[N, splits, 3, groups] float32: count, mean, M2 of each group over each pixel split."""
    n, c, h, w = x.shape
    block_p, per_split, splits = _layout(n, c, h * w)
    out = torch.empty((n, splits, 3, groups), dtype=torch.float32, device=x.device)
    x = x.contiguous(memory_format=torch.channels_last)
    _kernel()[(n, splits)](x, out, h * w, per_split, splits, C=c, G=groups, BLOCK_P=block_p)
    return out


@_group_norm_partials.register_fake
def _(x, groups):
    n, c, h, w = x.shape
    return x.new_empty((n, _layout(n, c, h * w)[2], 3, groups), dtype=torch.float32)


def _mean_rstd(partials: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Chan's combination of the splits: [N, G] mean and 1 / sqrt(var + eps), float32."""
    count, mean, m2 = partials.unbind(2)  # each [N, S, G]
    total = count.sum(1)
    mu = (count * mean).sum(1) / total
    var = (m2.sum(1) + (count * (mean - mu[:, None]).square()).sum(1)) / total
    return mu, torch.rsqrt(var + eps)


def group_norm_nhwc(x: torch.Tensor, groups: int, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                    eps: float = 1e-5) -> torch.Tensor:
    """``F.group_norm(x, groups, weight, bias, eps)`` for a channels-last ``x``, statistics by the
    Triton kernel where `kernel_fits`; the result has ``x``'s dtype and layout."""
    if not kernel_fits(x, groups):
        return F.group_norm(x, groups, weight, bias, eps)
    n, c = x.shape[:2]
    mu, rstd = _mean_rstd(_group_norm_partials(x, groups), eps)
    scale = rstd.repeat_interleave(c // groups, dim=1)  # [N, C]
    if weight is not None:
        scale = scale * weight.float()
    shift = -mu.repeat_interleave(c // groups, dim=1) * scale
    if bias is not None:
        shift = shift + bias.float()
    return (x.float() * scale[:, :, None, None] + shift[:, :, None, None]).to(x.dtype)


class NHWCGroupNorm(nn.Module):
    """Drop-in for an ``nn.GroupNorm``, or an ``nn.InstanceNorm2d`` without running statistics (a
    GroupNorm of one channel per group: Ditto's SPADE norms), sharing its affine parameters and
    computed by `group_norm_nhwc`."""

    def __init__(self, num_groups: int, num_channels: int, eps: float, weight: nn.Parameter | None = None,
                 bias: nn.Parameter | None = None) -> None:
        super().__init__()
        self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
        self.weight, self.bias = weight, bias

    @classmethod
    def replacing(cls, norm: nn.Module) -> "NHWCGroupNorm | None":
        """The replacement of ``norm``, or None where it is neither of the two (or its channels
        and groups are not powers of two: the kernel would never run)."""
        if type(norm) is nn.GroupNorm:
            groups, channels = norm.num_groups, norm.num_channels
        elif type(norm) is nn.InstanceNorm2d and not norm.track_running_stats:
            groups = channels = norm.num_features
        else:
            return None
        if not (_pow2(groups) and _pow2(channels)):
            return None
        return cls(groups, channels, norm.eps, norm.weight, norm.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 2 or x.shape[1] != self.num_channels:  # other ranks (attention's [N, C, L]): F.group_norm
            raise ValueError(f"expected [N, {self.num_channels}, ...], got {tuple(x.shape)}")
        return group_norm_nhwc(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}"


def with_nhwc_group_norms(module: nn.Module) -> tuple[nn.Module, int]:
    """A copy of ``module`` (every parameter shared, see shared_copy.py) whose GroupNorm and
    InstanceNorm2d layers run as `NHWCGroupNorm` where `NHWCGroupNorm.replacing` takes them, and
    how many."""
    out = shared_copy(module)
    count = 0
    for name, child in list(out.named_modules()):
        replacement = NHWCGroupNorm.replacing(child)
        if replacement is not None:
            parent_name, _, attr = name.rpartition(".")
            setattr(out.get_submodule(parent_name) if parent_name else out, attr, replacement)
            count += 1
    return out, count
