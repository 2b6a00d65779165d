"""Memory-layout tests that hold while torch.compile traces with a dynamic batch.

Why not ``x.is_contiguous(memory_format=torch.channels_last)``: while Dynamo traced the MuseTalk
engine's ``_faces`` at a dynamic batch size on an H100 (torch 2.11), it answered False for maps whose
strides were exactly channels-last, so 10 of the decoder's 29 NHWC norms took PyTorch's path and the
phase upsamplers their NCHW interleave (benchmarks/norm_paths.py; benchmarks/RESULTS.md, twenty-eighth
session). The strides alone say it, and with a symbolic batch nothing here needs a guard on it.
"""
from __future__ import annotations

import torch


def channels_last_dense(x: torch.Tensor) -> bool:
    """``x`` is a 4-D map laid out densely channels-last: strides ``(H*W*C, 1, W*C, C)``."""
    if x.dim() != 4:
        return False
    _, c, h, w = x.shape
    s = x.stride()
    return bool(s[1] == 1 and s[3] == c and s[2] == w * c and s[0] == h * w * c)



def memory_format_of(x: torch.Tensor) -> torch.memory_format:
    """The layout a tensor of fixed shape is stored in: channels_last(_3d) where it is that and not
    also plain contiguous (a 1x1 map is both), else contiguous. For weights and static buffers;
    maps under a traced dynamic batch want `channels_last_dense`."""
    if x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    if x.dim() == 5 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last_3d):
        return torch.channels_last_3d
    return torch.contiguous_format
