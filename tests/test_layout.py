"""The channels-last test the NHWC norms and the phase upsampler choose their path by."""
from __future__ import annotations

import torch

from newsstudio.accel.layout import channels_last_dense


def test_channels_last_dense_from_the_strides():
    x = torch.randn(3, 8, 5, 7)
    cl = x.contiguous(memory_format=torch.channels_last)
    assert channels_last_dense(cl) and channels_last_dense(cl[:1])
    assert not channels_last_dense(x)  # NCHW
    assert not channels_last_dense(cl[:, :, 2:])  # a row slice: channels-last strides, not dense
    assert not channels_last_dense(cl[:, :4])  # a channel slice
    assert not channels_last_dense(torch.randn(3, 8, 35))  # not 4-D


def test_the_norm_kernel_and_the_interleave_see_channels_last_under_a_dynamic_batch(monkeypatch):
    """What Dynamo traces at a dynamic batch (BucketedRunner's compile): a channels-last map must
    be recognised as one, or the decoder's norms silently take PyTorch's path."""
    from newsstudio.accel import group_norm_nhwc

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    seen: list[bool] = []

    def probe(x):
        seen.append(channels_last_dense(x) and group_norm_nhwc.kernel_fits(x, 4))
        return x * 2

    fn = torch.compile(probe, backend="eager", dynamic=None)
    for b in (2, 3):
        x = torch.randn(b, 8, 6, 6).contiguous(memory_format=torch.channels_last)
        torch._dynamo.maybe_mark_dynamic(x, 0)
        fn(x)
    torch._dynamo.reset()
    assert seen and all(seen)
