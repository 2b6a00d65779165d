"""The Triton implicit-GEMM convolution (accel/triton_conv.py, accel/igemm_conv.py).

Without a GPU the very same kernel runs in Triton's CPU interpreter (``TRITON_INTERPRET=1``, which
conftest.py sets before anything imports Triton): these tests check its indexing, padding, masks, fused
bias/residual, FP8 scaling and the layer swap; and every tile the autotuner may choose is compiled for
Hopper (tests/triton_sm90_compile.py). Speed is the GPU benchmark's job (benchmarks/triton_conv_bench.py).
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytest.importorskip("triton")

from newsstudio.accel.fp8 import E4M3, E4M3_MAX  # noqa: E402
from newsstudio.accel.igemm_conv import (TritonConv2d, convert_convs_to_triton_, eligible_conv, pack_weight,  # noqa: E402
                                         with_triton_convs)
from newsstudio.accel.triton_conv import conv2d_nhwc  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ROOT = Path(__file__).resolve().parents[1]


def _cl(t: torch.Tensor) -> torch.Tensor:
    return t.to(DEVICE).contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("cin,cout,h,w,k,pad", [
    (32, 48, 9, 7, 3, 1),   # 3x3 'same', odd sizes, C_out not a multiple of the tile
    (16, 16, 5, 6, 1, 0),   # 1x1 (a resnet shortcut)
    (32, 64, 6, 5, 2, 1),   # 2x2, padding 1: the phase convolution of upsampling (H+1 x W+1 out)
    (16, 24, 4, 4, 3, 0),   # 'valid'
    (48, 16, 5, 6, 3, 1),   # 48 channels: a 32-wide K step, the tap's second one masked to 16 channels
    (24, 16, 5, 6, 3, 1),   # 24 channels: a 16-wide K step, the second masked to 8
])
@pytest.mark.parametrize("bias", [True, False])
def test_pointer_kernel_equals_conv2d(cin, cout, h, w, k, pad, bias):
    _check_kernel("pointer", cin, cout, h, w, k, pad, bias)


@pytest.mark.parametrize("cin,cout,h,w,k,pad", [
    (32, 48, 3, 64, 3, 1),   # 3x3 'same': boxes start at -1 (zero-filled), C_out 48: a partial tile in N
    (64, 32, 2, 64, 3, 1),   # several channel steps per tap
    (16, 16, 2, 64, 1, 0),   # 1x1
    (32, 64, 2, 63, 2, 1),   # the 2x2 phase convolution: 64 wide out
    (48, 16, 2, 64, 3, 1),   # a tap's last box reaches past C_in: zeros there meet the next tap's weights
])
def test_tma_kernel_equals_conv2d(cin, cout, h, w, k, pad):
    _check_kernel("tma", cin, cout, h, w, k, pad, True)


def _check_kernel(kernel, cin, cout, h, w, k, pad, bias):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, cin, h, w, generator=g)
    wt = torch.randn(cout, cin, k, k, generator=g) * 0.2
    b = torch.randn(cout, generator=g) if bias else None
    ref = F.conv2d(x, wt, b, padding=pad)
    got = conv2d_nhwc(_cl(x), pack_weight(wt).to(DEVICE), (k, k), (pad, pad), bias=None if b is None else b.to(DEVICE),
                      kernel=kernel)
    assert got.shape == ref.shape
    assert got.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(got.cpu(), ref, rtol=2e-3, atol=2e-3)  # TF32 on a GPU, exact in the interpreter


def test_tma_kernel_in_fp8_equals_the_pointer_kernel():
    g = torch.Generator().manual_seed(6)
    conv = nn.Conv2d(32, 48, 3, padding=1).to(DEVICE)
    x = _cl(torch.randn(2, 32, 2, 64, generator=g))
    ptr, tma = (TritonConv2d.from_conv(conv, "fp8", kernel=k) for k in ("pointer", "tma"))
    torch.testing.assert_close(ptr(x), tma(x), rtol=1e-5, atol=1e-5)
    for width in (5, 32):  # no one-row patch: 5 is no TMA width, 32 would need a 4-row patch (slow; wrong on an H200)
        with pytest.raises(ValueError, match="output width"):
            conv2d_nhwc(_cl(torch.randn(1, 16, 4, width)), torch.randn(8, 9 * 16, device=DEVICE), (3, 3), (1, 1), kernel="tma")


def test_fastest_picks_by_time_drops_failures_and_remembers():
    """kernel_choice.fastest with a stand-in timer (the real one needs a GPU): the quickest candidate
    wins, one that raises is dropped, the choice is kept for the key, and nothing is timed without
    timing."""
    from newsstudio.accel import kernel_choice

    kernel_choice.forget_choices()
    cost = {"pointer": 2.0, "tma": 1.0, "cudnn": 1.5}
    calls = []

    def timer(fn):
        name = fn()
        calls.append(name)
        return cost[name]

    def broken():
        raise RuntimeError("this Triton cannot compile that")

    cands = {"pointer": lambda: "pointer", "tma": lambda: "tma", "cudnn": lambda: "cudnn", "odd": broken}
    assert kernel_choice.fastest(("k", 1), cands, timer=timer) == "tma"
    assert kernel_choice.fastest(("k", 1), cands, timer=timer) == "tma" and len(calls) == 3  # remembered
    assert kernel_choice.choices()[("k", 1)] == ("tma", {"pointer": 2.0, "tma": 1.0, "cudnn": 1.5})
    assert kernel_choice.fastest(("k", 2), cands, timing=False) == "pointer" and ("k", 2) not in kernel_choice.choices()
    with pytest.raises(RuntimeError, match="no candidate ran"):
        kernel_choice.fastest(("k", 3), {"a": broken, "b": broken}, timer=timer)
    kernel_choice.forget_choices()
    assert kernel_choice.choices() == {}


def test_residual_is_added_in_the_epilogue():
    g = torch.Generator().manual_seed(1)
    x, wt, b = torch.randn(1, 32, 6, 6, generator=g), torch.randn(32, 32, 3, 3, generator=g) * 0.1, torch.randn(32, generator=g)
    res = torch.randn(1, 32, 6, 6, generator=g)
    got = conv2d_nhwc(_cl(x), pack_weight(wt).to(DEVICE), (3, 3), (1, 1), bias=b.to(DEVICE), residual=_cl(res))
    torch.testing.assert_close(got.cpu(), F.conv2d(x, wt, b, padding=1) + res, rtol=2e-3, atol=2e-3)
    with pytest.raises(ValueError, match="residual shape"):
        conv2d_nhwc(_cl(x), pack_weight(wt).to(DEVICE), (3, 3), (1, 1), residual=_cl(res[:, :16]))


def test_half_precision_module():
    g = torch.Generator().manual_seed(2)
    conv = nn.Conv2d(32, 40, 3, padding=1)
    x = torch.randn(2, 32, 8, 8, generator=g)
    ref = conv(x)
    m = TritonConv2d.from_conv(conv.half().to(DEVICE))
    got = m(_cl(x.half()))
    assert got.dtype == torch.float16 and got.is_contiguous(memory_format=torch.channels_last)
    assert ((got.float().cpu() - ref).norm() / ref.norm()).item() < 2e-3


def test_input_of_another_dtype_is_cast_like_autocast():
    """Ditto runs its half-precision networks under autocast, where a conv casts a float32 input."""
    conv = nn.Conv2d(16, 16, 3, padding=1).half().to(DEVICE)
    m = TritonConv2d.from_conv(conv)
    x = _cl(torch.randn(1, 16, 5, 5))
    got = m(x)
    assert got.dtype == torch.float16
    torch.testing.assert_close(got, conv(x.half()).contiguous(memory_format=torch.channels_last), rtol=2e-3, atol=2e-3)


def test_fp8_module_is_the_quantised_arithmetic():
    """FP8: weight per output channel, input per tensor, float32 accumulation, rescaled: equal to the
    same quantisation done in plain torch, and within e4m3's error of the float32 conv."""
    g = torch.Generator().manual_seed(3)
    conv = nn.Conv2d(32, 48, 3, padding=1)
    x = torch.randn(2, 32, 8, 8, generator=g) * 3
    ref = conv(x)
    m = TritonConv2d.from_conv(conv.to(DEVICE), "fp8")
    assert m.packed.dtype == E4M3 and m.w_scale.shape == (48,)
    got = m(_cl(x)).cpu()
    xs = x.abs().amax() / E4M3_MAX
    xq = (x / xs).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3).float() * xs
    wq = (m.packed.float() * m.w_scale[:, None]).cpu().reshape(48, 3, 3, 32).permute(0, 3, 1, 2)
    torch.testing.assert_close(got, F.conv2d(xq, wq, conv.bias.detach().cpu(), padding=1), rtol=1e-4, atol=1e-4)
    rel = ((got - ref).norm() / ref.norm()).item()
    assert 1e-3 < rel < 6e-2  # it did quantise, and no worse than e4m3 rounding of both operands


def test_fp8_static_scale_comes_from_calibration():
    """fp8-static: the input scale is fixed by calibrate_fp8_ from the largest input seen, so a later
    input quantises with it (larger values saturate instead of overflowing); uncalibrated it refuses."""
    from newsstudio.accel.igemm_conv import calibrate_fp8_

    g = torch.Generator().manual_seed(5)
    conv = nn.Conv2d(16, 32, 3, padding=1).to(DEVICE)
    net = nn.Sequential(TritonConv2d.from_conv(conv, "fp8-static"))
    small, big = _cl(torch.randn(1, 16, 6, 6, generator=g)), _cl(torch.randn(1, 16, 6, 6, generator=g) * 4)
    with pytest.raises(RuntimeError, match="calibrate_fp8_"):
        net(small)
    assert calibrate_fp8_(net, lambda: (net(small), net(small * 0.5))) == 1
    m = net[0]
    torch.testing.assert_close(m.x_scale.cpu(), (small.abs().amax() / E4M3_MAX).reshape(1).cpu())
    for x in (small, big):
        got = m(x).cpu()
        xq = (x.cpu() / m.x_scale.cpu()).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3).float() * m.x_scale.cpu()
        wq = (m.packed.float() * m.w_scale[:, None]).cpu().reshape(32, 3, 3, 16).permute(0, 3, 1, 2)
        torch.testing.assert_close(got, F.conv2d(xq, wq, conv.bias.detach().cpu(), padding=1), rtol=1e-4, atol=1e-4)
        assert torch.isfinite(got).all()
    ref = conv(small).detach().cpu()
    assert ((m(small).cpu() - ref).norm() / ref.norm()).item() < 6e-2
    # an engine's headroom: the scale covers twice the largest input seen, so `big` / 2 still fits
    assert calibrate_fp8_(net, lambda: net(small), headroom=2.0) == 1
    torch.testing.assert_close(m.x_scale.cpu(), (2 * small.abs().amax() / E4M3_MAX).reshape(1).cpu())
    with pytest.raises(ValueError, match="headroom"):
        calibrate_fp8_(net, lambda: net(small), headroom=0.5)
    # a conv the sample run does not reach (a VAE's encoder while decoding) stays uncalibrated; none reached: an error
    unused = TritonConv2d.from_conv(nn.Conv2d(16, 32, 3, padding=1).to(DEVICE), "fp8-static")
    pair = nn.ModuleList([TritonConv2d.from_conv(conv, "fp8-static"), unused])
    assert calibrate_fp8_(pair, lambda: pair[0](small)) == 1 and pair[0].calibrated and not unused.calibrated
    with pytest.raises(RuntimeError, match="calibrate_fp8_"):
        unused(small)
    with pytest.raises(RuntimeError, match="no input"):
        calibrate_fp8_(pair, lambda: None)
    mode, swapped = with_triton_convs(nn.Sequential(conv), "fp8-static", DEVICE)
    assert mode == "fp8-static" and isinstance(swapped[0], TritonConv2d) and not swapped[0].calibrated


def test_mixed_runs_the_selected_convs_in_fp8_and_the_rest_in_half():
    """``"mixed"``: the network's FP8-safe convs fp8-static, every other eligible conv half; a
    network without a selection (Ditto) runs all in half; the caller's network keeps its convs."""
    from newsstudio.accel.igemm_conv import calibrate_fp8_

    net = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.SiLU(), nn.Conv2d(32, 32, 1)).to(DEVICE)
    mode, swapped = with_triton_convs(net, "mixed", DEVICE, fp8_convs=lambda name, m: name == "2")
    assert mode == "mixed" and (swapped[0].mode, swapped[2].mode) == ("half", "fp8-static")
    assert isinstance(net[0], nn.Conv2d) and isinstance(net[2], nn.Conv2d)
    x = _cl(torch.randn(1, 16, 6, 6, generator=torch.Generator().manual_seed(3)))
    with torch.inference_mode():
        assert calibrate_fp8_(swapped, lambda: swapped(x)) == 1
        ref, got = net(x).cpu(), swapped(x).cpu()
    assert 1e-4 < ((got - ref).norm() / ref.norm()).item() < 6e-2  # the last conv quantised, not the first alone
    mode, unselected = with_triton_convs(net, "mixed", DEVICE)
    assert mode == "half" and (unselected[0].mode, unselected[2].mode) == ("half", "half")


def test_bad_calls_are_refused():
    x = _cl(torch.randn(1, 12, 4, 4))
    with pytest.raises(ValueError, match="multiple of 8"):
        conv2d_nhwc(x, torch.randn(8, 9 * 12, device=DEVICE), (3, 3), (1, 1))
    x = _cl(torch.randn(1, 16, 4, 4))
    with pytest.raises(ValueError, match="packed weight"):
        conv2d_nhwc(x, torch.randn(8, 16, 3, 3, device=DEVICE), (3, 3), (1, 1))
    with pytest.raises(ValueError, match="FP8 needs"):
        conv2d_nhwc(x.to(E4M3), torch.randn(8, 9 * 16, device=DEVICE).to(E4M3), (3, 3), (1, 1))
    with pytest.raises(ValueError, match="does not fit"):
        conv2d_nhwc(x, torch.randn(8, 25 * 16, device=DEVICE), (5, 5), (0, 0))
    with pytest.raises(ValueError, match="C_in a multiple"):
        TritonConv2d(torch.randn(8, 12, 3, 3), None, (1, 1))
    assert not eligible_conv(nn.Conv2d(8, 32, 3, padding=1))  # a stem: K too short to pay
    with pytest.raises(ValueError, match="mode must be one of"):
        TritonConv2d(torch.randn(8, 16, 3, 3), None, (1, 1), "int4")
    assert not eligible_conv(nn.Conv2d(32, 32, 3, stride=2, padding=1))
    assert not eligible_conv(nn.Conv2d(32, 3, 3, padding=1))  # an RGB head: cuDNN keeps it
    assert not eligible_conv(nn.Conv2d(4, 32, 3, padding=1))  # C_in 4
    assert eligible_conv(nn.Conv2d(32, 32, 3, padding=1))


def test_compiled_graph_sees_the_op_shape():
    """The custom op's fake implementation gives torch.compile the output shape and layout."""
    conv = nn.Conv2d(16, 32, 3, padding=1).to(DEVICE)
    m = TritonConv2d.from_conv(conv)
    x = _cl(torch.randn(2, 16, 5, 7))
    fn = torch.compile(lambda t: F.silu(m(t)) * 2, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(fn(x), F.silu(conv(x)) * 2, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("mode", ["half", "fp8", "fp8-static"])
def test_the_op_gets_channels_last_input_after_group_norm(mode):
    """A CUDA GroupNorm's output is NCHW whatever its input's layout (the meta device, which
    compilers trace with, says the same); the module asks for channels-last before the op, in the
    traced graph, so the compiler writes the producer's output in that layout in the same kernel
    instead of the opaque op copying every activation (the H200's compiled Triton decoder lost
    35 % to such copies)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpInputs(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[torch.Tensor] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.newsstudio.triton_conv2d.default:
                self.seen.append(args[0])
            return func(*args, **(kwargs or {}))

    conv = nn.Conv2d(16, 32, 3, padding=1)
    gn = nn.GroupNorm(4, 16).to("meta")
    m = TritonConv2d.from_conv(conv, mode).to("meta")
    m.calibrated = True  # fp8-static: the scale's value does not matter for the layout
    y = F.silu(gn(_cl(torch.randn(2, 16, 8, 8)).to("meta")))
    assert not y.is_contiguous(memory_format=torch.channels_last)
    with OpInputs() as spy:
        out = m(y)
    assert len(spy.seen) == 1 and spy.seen[0].is_contiguous(memory_format=torch.channels_last)
    assert out.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.skipif(shutil.which("g++") is None and not torch.cuda.is_available(), reason="Inductor on a CPU needs a C++ compiler")
@pytest.mark.parametrize("mode", ["half", "fp8-static"])
def test_inductor_compiles_a_network_around_the_op(mode):
    """GroupNorm + SiLU (Inductor's own kernels) then the op: the layout the op promised, the same
    result as eager; the static FP8 quantisation traced into the graph."""
    from newsstudio.accel.igemm_conv import calibrate_fp8_

    torch.manual_seed(7)
    dtype = torch.float16 if DEVICE == "cuda" else torch.float32
    conv = nn.Conv2d(16, 32, 3, padding=1).to(DEVICE, dtype)
    gn = nn.GroupNorm(4, 16).to(DEVICE, dtype)
    m = TritonConv2d.from_conv(conv, mode)
    x = _cl(torch.randn(2, 16, 8, 8)).to(dtype)
    with torch.inference_mode():
        if mode == "fp8-static":
            calibrate_fp8_(m, lambda: m(F.silu(gn(x))))
        eager = F.silu(m(F.silu(gn(x)))) + 1
        with torch._inductor.config.patch(force_disable_caches=True):  # a cached graph would skip the lowering
            got = torch.compile(lambda t: F.silu(m(F.silu(gn(t)))) + 1, backend="inductor")(x)
    assert got.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(got, eager, rtol=1e-3, atol=1e-3)


def test_vae_decoder_swap_matches_and_leaves_the_original_alone():
    """The tiny SD-VAE decoder with phase upsampling: every eligible conv (and each phase conv) on
    the kernel, same output; the caller's decoder keeps its convs."""
    from newsstudio.accel.upsample_conv import with_phase_upsampling
    from newsstudio.engines.musetalk.engine import TINY_VAE_CONFIG
    from newsstudio.engines.musetalk.weights import random_vae

    vae = random_vae(3, DEVICE, config=TINY_VAE_CONFIG)
    dec = with_phase_upsampling(vae.decoder)[0].to(memory_format=torch.channels_last)
    z = _cl(torch.randn(1, 4, 4, 4, generator=torch.Generator().manual_seed(4)))
    with torch.inference_mode():
        ref = dec(vae.post_quant_conv(z))
        mode, fast = with_triton_convs(dec, "half", DEVICE)
        got = fast(vae.post_quant_conv(z))
    assert mode == "half"
    swapped = [n for n, m in fast.named_modules() if isinstance(m, TritonConv2d)]
    # mid block 2 resnets x 2 convs + 4 up blocks x 2 resnets x 2 convs + 1 shortcut (64 -> 32) + 3 phase convs
    assert len(swapped) == 4 + 16 + 1 + 3
    assert sum(n.endswith("up_conv.conv") for n in swapped) == 3
    assert not any(isinstance(m, TritonConv2d) for m in dec.modules())  # original untouched
    assert isinstance(fast.conv_out, nn.Conv2d) and isinstance(fast.conv_in, nn.Conv2d)  # 3 outputs / 4 inputs
    assert ((got - ref).norm() / ref.norm()).item() < 1e-4


def test_depth_sliced_conv3d_slices_run_on_the_kernel():
    """The 2-D convolution of Ditto's depth-sliced 3-D convs goes to the kernel through its slot; the
    3-D result is unchanged (its bias is added after the depth sum, not in the kernel)."""
    from newsstudio.accel.depth_sliced_conv3d import DepthSlicedConv3d

    torch.manual_seed(8)
    conv = nn.Conv3d(16, 5, 3, padding=1).to(DEVICE)
    x = torch.randn(2, 16, 4, 6, 8, device=DEVICE).contiguous(memory_format=torch.channels_last_3d)
    sliced = DepthSlicedConv3d(conv)
    with torch.inference_mode():
        ref = conv(x)
        assert convert_convs_to_triton_(sliced, force=True) == 1 and isinstance(sliced.conv, TritonConv2d)
        got = sliced(x)
    torch.testing.assert_close(got, ref, rtol=2e-3, atol=2e-3)


def test_modes():
    with pytest.raises(ValueError, match="triton_convs must be one of"):
        with_triton_convs(nn.Conv2d(16, 16, 3), "int8", DEVICE)
    conv = nn.Conv2d(16, 16, 3)
    assert with_triton_convs(conv, "off", DEVICE) == ("off", conv)


def test_engines_without_the_kernel_keep_cudnn(monkeypatch):
    """Where the kernel cannot run the engines say so and keep their convs (mode 'off')."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    from newsstudio.engines.ditto.config import TINY_OPTIONS
    from newsstudio.engines.ditto.engine import DittoEngine

    for mode in ("fp8", "fp8-static"):  # fp8-static: nothing to calibrate either
        ditto = DittoEngine("cpu", weights="random", steps=2, triton_convs=mode, **TINY_OPTIONS)
        assert ditto.triton_convs == "off"
    assert not any(isinstance(m, TritonConv2d) for net in (ditto._warp, ditto._decoder) for m in net.modules())
    from newsstudio.engines.musetalk.engine import TINY_VAE_CONFIG, MuseTalkEngine

    eng = MuseTalkEngine("cpu", weights="random", triton_convs="half", vae_config=TINY_VAE_CONFIG,
                         unet_config={"block_out_channels": [32, 64, 64, 64], "layers_per_block": 1})
    assert eng.triton_convs == "off"
    assert not any(isinstance(m, TritonConv2d) for m in eng._vae_decoder.modules())
    with pytest.raises(ValueError, match="triton_convs"):
        MuseTalkEngine("cpu", weights="random", triton_convs="fast", vae_config=TINY_VAE_CONFIG,
                       unet_config={"block_out_channels": [32, 64, 64, 64], "layers_per_block": 1})


def test_every_allowed_channel_count_has_a_tile_to_tune():
    """The GPU autotuner's candidate tiles: for any C_in the kernel accepts, at least one whose K step
    divides it (a K step never straddles two taps), the wide ones only where they fit; FP8 K steps of
    32 at least (the narrowest FP8 tensor-core step); TMA patches one row high."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from newsstudio.accel.triton_conv import (FP8_MIN_BLOCK_K, TMA_WIDTHS, _configs, _prune, _prune_tma, _tma_configs,
                                              k_waste, triton_available)

    assert triton_available()
    inputs = {dt: torch.zeros(1, 2, 2, 16, dtype=dt) for dt in (torch.float16, E4M3)}
    descs = {dt: TensorDescriptor(x, [1, 2, 2, 16], [64, 32, 16, 1], [1, 1, 2, 16]) for dt, x in inputs.items()}
    for c_in in range(16, 1025, 8):
        for c_out in (16, 64, 128, 2048):
            for dt, x in inputs.items():
                tiles = [c.kwargs for c in _prune(_configs(), {"x_ptr": x}, C_IN=c_in, C_OUT=c_out)]
                assert tiles
                if dt == E4M3:
                    assert all(t["BLOCK_K"] >= FP8_MIN_BLOCK_K for t in tiles)
                    assert all(k_waste(c_in, t["BLOCK_K"]) <= max(0.25, k_waste(c_in, FP8_MIN_BLOCK_K)) for t in tiles)
                else:
                    assert all(k_waste(c_in, t["BLOCK_K"]) <= 0.25 for t in tiles)
                if c_in % 64 == 0:
                    assert all(t["BLOCK_K"] >= 64 for t in tiles)  # the wide tiles where channels allow
                assert all(t["BLOCK_N"] <= max(64, 2 * c_out) for t in tiles) or len(tiles) == 1
            for dt, desc in descs.items():  # TMA: also rows of at most 128 bytes
                for bw in TMA_WIDTHS:  # one row of bw pixels per tile
                    tiles = [c.kwargs for c in _prune_tma(_tma_configs(), {"x_desc": desc}, C_IN=c_in, C_OUT=c_out, BW=bw)]
                    assert tiles and all(t["BLOCK_K"] * desc.base.element_size() <= 128 for t in tiles)
                    assert {t["BLOCK_M"] for t in tiles} == {bw}
                    assert dt != E4M3 or all(t["BLOCK_K"] >= FP8_MIN_BLOCK_K for t in tiles)


@pytest.mark.skipif(importlib.util.find_spec("triton.backends.nvidia") is None, reason="needs Triton's CUDA backend")
def test_every_tile_the_autotuner_may_pick_compiles_for_hopper():
    """Compiled for sm_90 without a GPU (Triton's own ptxas): every tile left after pruning, for the
    engines' kinds of layer shape, fp16 and FP8, both loaders, compiles within the H200's shared
    memory with pipelined (asynchronous) loads; a TMA box (one output row) feeds the tensor cores
    straight from shared memory."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "triton_sm90_compile.py")], capture_output=True,
                          text=True, env=env, timeout=900)
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0, [r for r in records if "error" in r or "failures" in r] or proc.stderr[-2000:]
    assert records[-1] == {"compiled": len(records) - 1, "failures": 0}
    tiles = [r for r in records[:-1] if r["kernel"] in ("pointer", "tma")]
    assert len(tiles) > 50
    assert {(r["kernel"], r["dtype"]) for r in tiles} == {(k, d) for k in ("pointer", "tma") for d in ("fp16", "fp8e4nv")}
    # the GroupNorm statistics kernel (accel/group_norm_nhwc.py) reads whole pixels in 16-byte loads
    # where the channels are a power of two (else masked lanes past C)
    norms = {(r["shape"][0], r["dtype"]): r for r in records[:-1] if r["kernel"] == "chunked"}
    assert len(norms) == 14 and all(r["loads"] for r in norms.values())
    assert all(norms[c, "fp16"]["vector_loads"] == norms[c, "fp16"]["loads"] for c in (64, 128, 256, 512))
    # the streaming statistics kernel, the apply kernel and SPADE's modulation kernel for every channel count
    others = [(r["kernel"], r["shape"][0]) for r in records[:-1] if r["kernel"] in ("streaming", "apply", "modulate")]
    assert sorted(others) == sorted((k, c) for k in ("streaming", "apply", "modulate") for c in {c for c, _ in norms}
                                    for _ in range(2 if k == "streaming" else 1))
    # the apply (+ SiLU) and modulation (+ LeakyReLU) kernels load vectors
    assert all(r["vector_loads"] for r in records[:-1] if r["kernel"] in ("apply", "modulate"))
    tma = [r for r in tiles if r["kernel"] == "tma"]
    assert tma and not any(r["operand_a_from_registers"] for r in tma)  # one-row boxes: the operand in place


def test_the_setting_reaches_neural_engines_and_bad_values_fail_early():
    from newsstudio.engines.registry import engine_options
    from newsstudio.server.engines import EnginePool

    assert engine_options("musetalk", "random", None, triton_convs="half")["triton_convs"] == "half"
    assert "triton_convs" not in engine_options("ditto", "random", None)
    assert engine_options("classic", "random", None, triton_convs="fp8") == {}
    assert engine_options("ditto", "random", None, triton_convs="fp8-static")["triton_convs"] == "fp8-static"
    with pytest.raises(ValueError, match="triton-convs must be one of"):
        engine_options("ditto", "random", None, triton_convs="int8")
    with pytest.raises(ValueError, match="triton-convs must be one of"):
        EnginePool("classic", torch.device("cpu"), "random", None, triton_convs="fast")


@pytest.mark.skipif(torch.cuda.is_available(), reason="about a CPU tensor without the interpreter")
def test_a_cpu_tensor_without_the_interpreter_is_refused_clearly(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x = torch.randn(1, 16, 4, 4).contiguous(memory_format=torch.channels_last)
    with pytest.raises(ValueError, match="runs on CUDA"):
        conv2d_nhwc(x, torch.randn(16, 9 * 16), (3, 3), (1, 1))


def test_engines_calibrate_fp8_on_the_builtin_portrait_the_same_way_every_time():
    """fp8-static's sample inputs need no avatar: the built-in portrait (and its mirror image) through
    the engine's own encoders, with silence and speech (MuseTalk) or seeded small motions (Ditto);
    the same every time, so a render's FP8 scales do not depend on what ran before it."""
    from newsstudio.engines.ditto.config import TINY_OPTIONS
    from newsstudio.engines.ditto.engine import DittoEngine
    from newsstudio.engines.musetalk.engine import TINY_UNET_CONFIG, TINY_VAE_CONFIG, MuseTalkEngine

    muse = MuseTalkEngine("cpu", weights="random", unet_config=TINY_UNET_CONFIG, vae_config=TINY_VAE_CONFIG)
    latents, prompts = muse.calibration_batch(5)
    assert latents.shape == (5, 8, 32, 32) and prompts.shape == (5, 50, 384) and torch.isfinite(latents).all()
    assert not torch.equal(latents[0], latents[1]) and torch.equal(latents[0], latents[2])  # face, mirror, face...
    torch.testing.assert_close(prompts[0], muse.idle_prompt().to(prompts))  # silence first, then speech
    assert (prompts[1:] - prompts[:1]).abs().amax() > 0
    again = muse.calibration_batch(5)
    assert torch.equal(again[0], latents) and torch.equal(again[1], prompts)
    with torch.inference_mode():
        assert muse._faces(latents[:2], prompts[:2]).shape == (2, 3, 256, 256)

    ditto = DittoEngine("cpu", weights="random", steps=2, **TINY_OPTIONS)
    f_s, x_s, x_d = ditto.calibration_batch(4)
    assert f_s.shape == (4, 8, 16, 32, 32) and x_s.shape == x_d.shape == (4, 21, 3)  # quarter width
    assert torch.equal(x_d[0], x_s[0]) and 0 < (x_d - x_s).abs().amax() < x_s.abs().amax()
    assert all(torch.equal(a, b) for a, b in zip(ditto.calibration_batch(4), (f_s, x_s, x_d)))


def test_the_tuned_tiles_are_reported_per_kernel():
    """Benchmarks record which tile the autotuner chose per layer shape (`tuned_tiles`); in the
    interpreter tiles are fixed, so each kernel's record is there and empty."""
    from newsstudio.accel.triton_conv import tuned_tiles

    conv2d_nhwc(_cl(torch.randn(1, 16, 4, 4)), torch.randn(16, 9 * 16, device=DEVICE), (3, 3), (1, 1))
    tiles = tuned_tiles()
    assert set(tiles) == {"pointer", "tma"} and all(isinstance(v, dict) for v in tiles.values())
