"""GroupNorm with the NHWC statistics kernel (accel/group_norm_nhwc.py): the same normalisation as
PyTorch's, computed here by the very kernel in Triton's CPU interpreter (conftest.py), and swapped
into networks without touching the originals."""
from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from newsstudio.accel import group_norm_nhwc as gn
from newsstudio.accel.group_norm_nhwc import NHWCGroupNorm, group_norm_nhwc, kernel_fits, with_nhwc_group_norms
from newsstudio.accel.triton_conv import triton_available

pytestmark = pytest.mark.skipif(not triton_available(), reason="needs Triton (its interpreter on a CPU)")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _cl(x: torch.Tensor) -> torch.Tensor:
    return x.to(DEVICE).contiguous(memory_format=torch.channels_last)


class KernelCalls(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts calls of the statistics op (``calls``) and of the SPADE modulation op (``modulations``)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = self.modulations = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += func is torch.ops.newsstudio.group_norm_partials.default
        self.modulations += func is torch.ops.newsstudio.spade_modulate_nhwc.default
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("shape, groups", [((2, 128, 16, 16), 32), ((3, 64, 7, 5), 32), ((1, 32, 3, 3), 8),
                                           ((2, 16, 5, 9), 16), ((2, 40, 6, 6), 4), ((1, 24, 5, 3), 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("statistics", gn.STATISTICS_KERNELS)
def test_equals_group_norm(shape, groups, dtype, statistics):
    g = torch.Generator().manual_seed(sum(shape))
    x = _cl((torch.randn(shape, generator=g) * 3 + 5).to(dtype))
    weight, bias = torch.randn(shape[1], generator=g).to(DEVICE, dtype), torch.randn(shape[1], generator=g).to(DEVICE, dtype)
    with KernelCalls() as spy:
        got = group_norm_nhwc(x, groups, weight, bias, 1e-6, statistics=statistics)
    assert spy.calls == 1
    ref = F.group_norm(x.double(), groups, weight.double(), bias.double(), 1e-6)
    assert got.dtype == dtype and got.is_contiguous(memory_format=torch.channels_last)
    tol = 1e-5 if dtype == torch.float32 else 4e-3
    torch.testing.assert_close(got.double(), ref, rtol=tol, atol=tol)
    # the optional apply kernel, with and without the SiLU that follows the decoders' norms
    for silu in (False, True):
        got = group_norm_nhwc(x, groups, weight, bias, 1e-6, silu=silu, apply_kernel=True, statistics=statistics)
        assert got.dtype == dtype and got.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(got.double(), F.silu(ref) if silu else ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_spade_norm_equals_instance_norm_modulated(dtype):
    """`spade_norm_nhwc`: SPADE's instance norm, modulation by the stacked gamma/beta and the
    LeakyReLU after it in one kernel pass, as PyTorch computes them; statistics shared by two norms
    of the same input are computed once."""
    from newsstudio.accel.group_norm_nhwc import instance_norm_scale_shift, spade_norm_nhwc

    g = torch.Generator().manual_seed(11)
    x = _cl((torch.randn(2, 24, 9, 7, generator=g) * 2 + 3).to(dtype))
    gb = _cl((torch.randn(2, 48, 9, 7, generator=g) * 0.5).to(dtype))
    gamma, beta = gb.double().split(24, dim=1)
    ref = F.instance_norm(x.double()) * (1 + gamma) + beta
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    with KernelCalls() as spy:
        plain = spade_norm_nhwc(x, gb)
        stats = instance_norm_scale_shift(x)
        activated = spade_norm_nhwc(x, gb, slope=0.2, scale_shift=stats)
    assert (spy.calls, spy.modulations) == (2, 2)
    for got, want in ((plain, ref), (activated, F.leaky_relu(ref, 0.2))):
        assert got.dtype == dtype and got.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
    # an NCHW input: PyTorch's ops, the same result
    with KernelCalls() as spy:
        nchw = spade_norm_nhwc(x.contiguous(), gb.contiguous(), slope=0.2)
    assert spy.calls == spy.modulations == 0
    torch.testing.assert_close(nchw.double(), F.leaky_relu(ref, 0.2), rtol=tol, atol=tol)


@pytest.mark.parametrize("statistics", gn.STATISTICS_KERNELS)
def test_regrouped_spade_decoder_on_the_kernels_keeps_its_output(statistics):
    """Ditto's regrouped decoder with `use_nhwc_spade_norms_`: every SPADE norm through the
    modulation kernel but the learned shortcut's (its beta folded into the 1x1 conv: PyTorch's ops on
    the statistics its block computed for norm_0), the image that of the plain regrouped decoder."""
    from newsstudio.engines.ditto.models import SPADEDecoder
    from newsstudio.engines.ditto.models.regrouped import RegroupedSPADEDecoder, use_nhwc_spade_norms_
    from newsstudio.weights.seeded import fill_seeded_, seeded_input

    dec = fill_seeded_(SPADEDecoder(block_expansion=16), salt=3).eval().fold_spectral_norm_().to(DEVICE)
    plain = RegroupedSPADEDecoder(dec).to(memory_format=torch.channels_last)
    fast = RegroupedSPADEDecoder(dec).to(memory_format=torch.channels_last)
    assert use_nhwc_spade_norms_(fast, statistics) == 16  # 6 x 2 middle, up_0 2 (+ its folded shortcut), up_1 2 (64 -> 64 here)
    x = _cl(seeded_input("t.spade", (1, 64, 8, 8)))
    with torch.inference_mode(), KernelCalls() as spy:
        ref = plain.forward_logits(x)
        got = fast.forward_logits(x)
    assert spy.modulations == 16 and spy.calls == 16  # the shortcut reuses its block's statistics
    assert ((got - ref).norm() / ref.norm()).item() < 1e-5


@pytest.mark.parametrize("statistics", gn.STATISTICS_KERNELS)
def test_splits_of_several_chunks_and_a_ragged_last_chunk(monkeypatch, statistics):
    """Chan's merge within a program (chunks; "streaming": sums per element) and across programs
    (splits), a last chunk cut short: still the exact statistics, also for a mean 1,000 standard
    deviations from zero (where E[x^2] - E[x]^2 in float32 would have nothing left)."""
    monkeypatch.setattr(gn, "ELEMENTS_PER_CHUNK", 256)  # 8 pixels of 32 channels per chunk
    monkeypatch.setattr(gn, "STREAMING_ELEMENTS_PER_CHUNK", 256)
    monkeypatch.setattr(gn, "SPLITS_PER_IMAGE", 3)  # ~5 chunks each
    monkeypatch.setattr(gn, "MIN_SPLIT_PIXELS", 8)
    assert gn._layout(32, 11 * 11, statistics) == (8, 48, 3)
    g = torch.Generator().manual_seed(3)
    x = _cl(torch.randn(2, 32, 11, 11, generator=g) + 1000.0)
    got = group_norm_nhwc(x, 8, eps=1e-6, statistics=statistics)
    with pytest.raises(ValueError, match="statistics must be one of"):
        group_norm_nhwc(x, 8, statistics="welford")
    ref = F.group_norm(x.double(), 8, eps=1e-6)
    torch.testing.assert_close(got.double(), ref, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("statistics", gn.STATISTICS_KERNELS)
@pytest.mark.parametrize("first_row", [0, 1, 6, 10])
def test_statistics_of_the_lower_rows_only(monkeypatch, statistics, first_row):
    """``group_stats(first_row=r)``: the kernel counts an image's rows from r on (a run of pixels in
    channels-last memory, images a whole image apart), several splits and a ragged chunk included;
    also under torch.compile (the LowerFaceDecoder's norms)."""
    monkeypatch.setattr(gn, "ELEMENTS_PER_CHUNK", 256)
    monkeypatch.setattr(gn, "STREAMING_ELEMENTS_PER_CHUNK", 256)
    monkeypatch.setattr(gn, "SPLITS_PER_IMAGE", 3)
    monkeypatch.setattr(gn, "MIN_SPLIT_PIXELS", 8)
    x = _cl(torch.randn(3, 32, 11, 9, generator=torch.Generator().manual_seed(first_row)) * 2 + 50.0)
    with KernelCalls() as spy:
        mean, var = gn.group_stats(x, 8, statistics, first_row=first_row)
    assert spy.calls == 1
    ref_var, ref_mean = torch.var_mean(x[:, :, first_row:].double().reshape(3, 8, -1), dim=-1, correction=0)
    torch.testing.assert_close(mean.double(), ref_mean, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(var.double(), ref_var, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="first_row"):
        gn.group_stats(x, 8, statistics, first_row=11)
    if first_row == 6 and (shutil.which("g++") is not None or torch.cuda.is_available()):
        fn = torch.compile(lambda t: gn.group_stats(t, 8, statistics, first_row=first_row), backend="inductor")
        with torch._inductor.config.patch(force_disable_caches=True):  # a cached graph would skip the lowering
            c_mean, c_var = fn(x)
        torch.testing.assert_close(c_mean, mean)
        torch.testing.assert_close(c_var, var)


def test_instance_norm_is_a_group_per_channel():
    norm = nn.InstanceNorm2d(32)  # Ditto's SPADE norm: affine=False, no running statistics
    fast = NHWCGroupNorm.replacing(norm)
    assert fast is not None and fast.num_groups == 32
    x = _cl(torch.randn(2, 32, 6, 10, generator=torch.Generator().manual_seed(5)) * 2 - 1)
    torch.testing.assert_close(fast(x), norm(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast(x[1]), norm(x[1]), rtol=1e-5, atol=1e-5)  # InstanceNorm2d takes one [C, H, W] image
    affine = nn.InstanceNorm2d(32, affine=True)
    nn.init.normal_(affine.weight), nn.init.normal_(affine.bias)
    torch.testing.assert_close(NHWCGroupNorm.replacing(affine)(x), affine(x), rtol=1e-5, atol=1e-5)


def test_other_inputs_and_norms_keep_pytorch():
    """NCHW input: F.group_norm, same result; BatchNorm and tracked instance norms are not replaced."""
    norm = nn.GroupNorm(4, 16)
    fast = NHWCGroupNorm.replacing(norm)
    x = torch.randn(2, 16, 5, 5).to(DEVICE)
    assert not kernel_fits(x, 4)
    with KernelCalls() as spy:
        torch.testing.assert_close(fast(x), norm(x))
    assert spy.calls == 0
    assert NHWCGroupNorm.replacing(nn.BatchNorm2d(16)) is None
    assert NHWCGroupNorm.replacing(nn.InstanceNorm2d(16, track_running_stats=True)) is None
    with pytest.raises(ValueError, match=r"expected \[N, 16, \.\.\.\]"):
        fast(torch.randn(2, 8, 5, 5))


def test_vae_decoder_copy_matches_and_leaves_the_original_alone():
    from newsstudio.engines.musetalk.engine import TINY_VAE_CONFIG
    from newsstudio.engines.musetalk.weights import random_vae

    vae = random_vae(3, DEVICE, config=TINY_VAE_CONFIG)
    dec = vae.decoder.to(memory_format=torch.channels_last)
    fast, count = with_nhwc_group_norms(dec)
    assert count == sum(type(m) is nn.GroupNorm for m in dec.modules()) > 10
    assert not any(isinstance(m, NHWCGroupNorm) for m in dec.modules())
    assert fast.conv_norm_out.weight is dec.conv_norm_out.weight  # shared, not copied
    z = _cl(torch.randn(1, 4, 4, 4, generator=torch.Generator().manual_seed(4)))
    with torch.inference_mode(), KernelCalls() as spy:
        ref = dec(vae.post_quant_conv(z))
        got = fast(vae.post_quant_conv(z))
    assert spy.calls > 0
    assert ((got - ref).norm() / ref.norm()).item() < 1e-5


@pytest.mark.parametrize("statistics", gn.STATISTICS_KERNELS)
def test_the_vae_decoder_s_norms_take_the_silu_that_follows_them(statistics):
    """`fuse_following_silu_`: each resnet's two norms and the output norm apply their SiLU in the
    apply kernel (the module's SiLU becomes an identity); the decoder's output stays the same."""
    from newsstudio.accel.group_norm_nhwc import fuse_following_silu_
    from newsstudio.engines.musetalk.engine import TINY_VAE_CONFIG
    from newsstudio.engines.musetalk.weights import random_vae

    vae = random_vae(5, DEVICE, config=TINY_VAE_CONFIG)
    dec = vae.decoder.to(memory_format=torch.channels_last)
    fast = with_nhwc_group_norms(dec, statistics=statistics)[0]
    resnets = [m for m in fast.modules() if type(m).__name__ == "ResnetBlock2D"]
    assert fuse_following_silu_(fast) == 2 * len(resnets) + 1
    assert all(isinstance(r.nonlinearity, nn.Identity) for r in resnets) and isinstance(fast.conv_act, nn.Identity)
    assert isinstance(dec.conv_act, nn.SiLU)  # the original keeps its SiLU
    z = _cl(torch.randn(1, 4, 4, 4, generator=torch.Generator().manual_seed(6)))
    with torch.inference_mode():
        ref = dec(vae.post_quant_conv(z))
        got = fast(vae.post_quant_conv(z))
    assert ((got - ref).norm() / ref.norm()).item() < 1e-5


def test_small_maps_keep_pytorch_s_norm_with_the_silu_still_applied():
    """``min_pixels``: norms of maps under the threshold run PyTorch's GroupNorm (then the SiLU they
    took in), larger ones the kernel; the decoder's output stays the same."""
    from newsstudio.accel.group_norm_nhwc import fuse_following_silu_
    from newsstudio.engines.musetalk.engine import TINY_VAE_CONFIG
    from newsstudio.engines.musetalk.weights import random_vae

    vae = random_vae(7, DEVICE, config=TINY_VAE_CONFIG)
    dec = vae.decoder.to(memory_format=torch.channels_last)
    z = _cl(torch.randn(1, 4, 4, 4, generator=torch.Generator().manual_seed(8)))
    calls = {}
    for min_pixels in (0, 8 * 8, 10**9):
        fast = with_nhwc_group_norms(dec, min_pixels)[0]
        fuse_following_silu_(fast)
        with torch.inference_mode(), KernelCalls() as spy:
            ref = dec(vae.post_quant_conv(z))
            got = fast(vae.post_quant_conv(z))
        calls[min_pixels] = spy.calls
        assert ((got - ref).norm() / ref.norm()).item() < 1e-5, min_pixels
    assert calls[0] > calls[64] > calls[10**9] == 0


def test_compiled_graph_keeps_the_op():
    """The op's fake gives torch.compile its output; the combine and the affine step trace around it."""
    norm = NHWCGroupNorm.replacing(nn.GroupNorm(8, 32)).to(DEVICE)
    x = _cl(torch.randn(2, 32, 6, 6))
    fn = torch.compile(lambda t: F.silu(norm(t)) + 1, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(fn(x), F.silu(F.group_norm(x, 8, norm.weight, norm.bias)) + 1, rtol=1e-5, atol=1e-5)
    fused = torch.compile(lambda t: group_norm_nhwc(t, 8, norm.weight, norm.bias, silu=True, apply_kernel=True) + 1,
                          backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        got = fused(x)
    torch.testing.assert_close(got, F.silu(F.group_norm(x, 8, norm.weight, norm.bias)) + 1, rtol=1e-5, atol=1e-5)
    # with autograd on (the weights require grad) the differentiable tensor ops apply instead
    torch.testing.assert_close(fused(x), got, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("statistics", gn.STATISTICS_KERNELS)
def test_one_compilation_serves_every_batch_size(monkeypatch, statistics):
    """The engines' runners share one compiled graph across batch sizes (batch dimension dynamic):
    the op's output shape follows the batch symbolically, and a process whose first trace is also
    its first use of Triton does not compile twice. Several pixel splits per image: their count
    does not depend on the batch (where it did, each batch size compiled anew)."""
    from torch._dynamo.utils import counters

    from newsstudio.accel import triton_conv

    monkeypatch.setattr(triton_conv, "triton", None)  # as in a fresh process
    monkeypatch.setattr(triton_conv, "tl", None)
    monkeypatch.setattr(gn, "ELEMENTS_PER_CHUNK", 256)  # 8 pixels of 32 channels per chunk
    monkeypatch.setattr(gn, "STREAMING_ELEMENTS_PER_CHUNK", 256)
    monkeypatch.setattr(gn, "MIN_SPLIT_PIXELS", 8)
    monkeypatch.setattr(gn, "SPLITS_PER_IMAGE", 3)
    assert gn._layout(32, 6 * 6, statistics)[2] == 3
    norm = NHWCGroupNorm.replacing(nn.GroupNorm(8, 32)).to(DEVICE)
    norm.statistics = statistics
    torch._dynamo.reset()
    fn = torch.compile(lambda t: F.silu(norm(t)), backend="aot_eager")
    counters.clear()
    with torch.no_grad(), torch._dynamo.config.patch(error_on_recompile=True):
        for n in (2, 3, 5):
            x = _cl(torch.randn(n, 32, 6, 6))
            torch._dynamo.maybe_mark_dynamic(x, 0)
            torch.testing.assert_close(fn(x), F.silu(F.group_norm(x, 8, norm.weight, norm.bias)), rtol=1e-5, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.skipif(shutil.which("g++") is None and not torch.cuda.is_available(), reason="Inductor on a CPU needs a C++ compiler")
def test_inductor_compiles_a_resnet_step_around_the_op():
    conv = nn.Conv2d(32, 32, 3, padding=1).to(DEVICE).to(memory_format=torch.channels_last)
    norm = NHWCGroupNorm.replacing(nn.GroupNorm(8, 32)).to(DEVICE)
    x = _cl(torch.randn(2, 32, 8, 8))
    with torch.inference_mode():
        eager = x + conv(F.silu(norm(x)))
        with torch._inductor.config.patch(force_disable_caches=True):  # a cached graph would skip the lowering
            got = torch.compile(lambda t: t + conv(F.silu(norm(t))), backend="inductor")(x)
    torch.testing.assert_close(got, eager, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(shutil.which("g++") is None and not torch.cuda.is_available(), reason="Inductor on a CPU needs a C++ compiler")
@pytest.mark.parametrize("statistics", gn.STATISTICS_KERNELS)
def test_inductor_lowers_the_op_with_either_statistics_kernel(statistics):
    """Inductor lowers the op through its fallback, which hands the op's arguments on as keywords:
    an argument named like one of the fallback's own (``kernel``) failed every GPU compile once
    (twenty-fifth session, run W1), so this compiles the op as the engines do, with each kernel."""
    weight, bias = torch.rand(32, device=DEVICE) + 0.5, torch.randn(32, device=DEVICE)
    x = _cl(torch.randn(2, 32, 8, 8))
    fn = torch.compile(lambda t: F.silu(group_norm_nhwc(t, 8, weight, bias, statistics=statistics)), backend="inductor")
    with torch._inductor.config.patch(force_disable_caches=True):  # a cached graph would skip the lowering
        torch.testing.assert_close(fn(x), F.silu(F.group_norm(x, 8, weight, bias)), rtol=1e-4, atol=1e-4)


def test_engines_run_their_norms_on_the_kernel_with_the_same_frames(monkeypatch):
    """``nhwc_norms=True`` (variant flag ':gn'): MuseTalk's decoder GroupNorms and Ditto's SPADE
    InstanceNorms go through the kernel; the rendered faces stay those of the plain engine."""
    if not torch.cuda.is_available():  # few, large programs: the interpreter's cost is per step
        monkeypatch.setattr(gn, "ELEMENTS_PER_CHUNK", 1 << 16)
        monkeypatch.setattr(gn, "SPLITS_PER_IMAGE", 1)
    from newsstudio.engines.ditto.config import TINY_OPTIONS
    from newsstudio.engines.ditto.engine import DittoEngine
    from newsstudio.engines.musetalk.engine import TINY_UNET_CONFIG, TINY_VAE_CONFIG, MuseTalkEngine

    musetalk = dict(weights="random", vae_config=TINY_VAE_CONFIG, unet_config=TINY_UNET_CONFIG, channels_last=True)
    ditto = dict(weights="random", steps=2, channels_last=True, **TINY_OPTIONS)
    # tolerance on the [0, 255] scale: rounding; Ditto's seeded network amplifies any rounding (its fp16 path is
    # 1.3e-1 from fp32, RESULTS.md sixth session), and both statistics kernels agree with float64 to ~1e-6 relative
    for make, kw, render, tol in ((MuseTalkEngine, musetalk, "_faces", 1.0), (DittoEngine, ditto, "_crops", 2.0)):
        plain, fast = make(DEVICE, **kw), make(DEVICE, nhwc_norms=True, **kw)
        batch = plain.calibration_batch(2)
        with torch.inference_mode():
            ref = getattr(plain, render)(*batch)
            with KernelCalls() as spy:
                got = getattr(fast, render)(*batch)
        assert spy.calls > 0, make.__name__
        assert (got - ref).abs().max().item() <= tol, make.__name__
