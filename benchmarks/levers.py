"""Speed levers, one network at a time: what each lever buys in frames/s and what it costs in
accuracy against the plain float32 path, on the same GPU in the same run.

    python -m benchmarks.levers [--only unet,vae,ditto,lmdm,hubert] [--batch 16 | --batch unet=16,lmdm=32]
                                [--iters 10] [--compile-mode default] [--json levers.json] [--quick]

Networks (seeded random weights from `fill_seeded_`: speed does not depend on weight values):
  unet   MuseTalk UNet2DConditionModel (musetalk.json), [B,8,32,32] latents + [B,50,384] audio, t=0
  vae    sd-vae AutoencoderKL decode, [B,4,32,32] latents -> [B,3,256,256]
  ditto  WarpingNetwork + SPADEDecoder, [B,32,16,64,64] feature volume + keypoints -> [B,3,512,512]
  lmdm   Ditto LMDM, DDIM 4 steps (eta 1, CFG batched), B windows of 80 frames (fps counts 80 per window)
  hubert Ditto HuBERT-large (transformers, float32 in the engine), B windows of 6480 samples (fps = windows/s)

Levers: fp32 eager (the reference, TF32 off), TF32, fp32 / TF32 under a CUDA graph, fp16 / bf16 eager, channels_last, CUDA graph
(manual capture of the eager network), torch.compile, compile + CUDA graph (the compiled network
captured), FP8 linear layers (UNet attention / feed-forward projections, LMDM linear1/linear2/
out_proj; `newsstudio.accel.fp8`) eager, graphed, and compiled+graphed. Ditto also gets an
official-style row with the spectral norm computed per call (every other half-precision row
folds it).

Per lever: median of CUDA-event timings of single calls after warm-up, rotating over several sets
of fresh random inputs (never zeros); relative L2 error of the output against the float32
reference on a separate random input set (and PSNR in dB of the [0,255] image for image outputs);
FLOPs per frame from torch.utils.flop_counter on the reference call, TFLOP/s and % of a bf16
matmul peak measured in the same run (8192^3; the FP8 peak is measured too). Every lever runs in
its own try/except; a failure is a row with the error, the others still run. A time budget
(--budget, seconds) skips compile levers once 70 % of it is spent and everything past 100 %.

Prints one markdown table per network at the end; --json writes everything (after each network).
--quick: tiny configurations, batch 2, a smoke run for any machine (CPU: CUDA-only levers are
reported as skipped).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import math
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

try:  # run from a checkout without installing: python -m benchmarks.levers
    import newsstudio  # noqa: F401
except ImportError:  # pragma: no cover
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from newsstudio.accel import StaticBatchRunner, cast_, channels_last, convert_linears_to_fp8_, fp8_supported, tf32
from newsstudio.accel.group_norm_nhwc import fuse_following_silu_, with_nhwc_group_norms
from newsstudio.accel.igemm_conv import CALIBRATED_MODES, calibrate_fp8_, convert_convs_for_mode_, triton_conv_supported
from newsstudio.accel.precision import parse_dtype, to_channels_last_
from newsstudio.accel.upsample_conv import PhaseUpsampleConv
from newsstudio.engines.ditto.models.regrouped import use_nhwc_spade_norms_
from newsstudio.weights.seeded import fill_seeded_

from .common import machine

DEFAULT_BATCH = {"unet": 16, "vae": 16, "ditto": 16, "lmdm": 32, "hubert": 8}
ORDER = ("unet", "vae", "ditto", "lmdm", "hubert")
LMDM_STEPS = 4
N_INPUT_SETS = 3


# --------------------------------------------------------------------------------------------
# Networks
# --------------------------------------------------------------------------------------------

@dataclass
class Net:
    name: str
    title: str
    frames_per_item: int
    build: Callable[[torch.device], nn.Module]  # float32, seeded, eval, on device
    inputs: Callable[[int, torch.Generator, torch.device], tuple[torch.Tensor, ...]]  # float32
    make_fn: Callable[[nn.Module], Callable[..., torch.Tensor]]
    to_image: Callable[[torch.Tensor], torch.Tensor] | None = None  # output -> [0, 255]
    fp8_filter: Callable[[str, nn.Module], bool] | None = None  # None: no FP8 lever
    fp8_convs: Callable[[str, nn.Module], bool] | None = None  # the convs triton "mixed" runs in FP8
    has_conv: bool = True
    specialise: Callable[[nn.Module], None] | None = None  # e.g. fold spectral norm
    rewrite: Callable[[nn.Module], None] | None = None  # the engine's exact conv rewrites (VAE: phase upsampling)


def _randn(shape, g, device, scale=1.0):
    return torch.randn(shape, generator=g, device=device) * scale


def unet_net(quick: bool) -> Net:
    from newsstudio.engines.musetalk.weights import UNET_CONFIG, random_unet

    cfg = dict(UNET_CONFIG)
    side = 32
    if quick:
        cfg.update(block_out_channels=[32, 64, 64, 64], layers_per_block=1)
        side = 16

    def build(device):
        return random_unet(0, device=device, config=cfg)

    def inputs(b, g, device):
        return _randn((b, 8, side, side), g, device), _randn((b, 50, 384), g, device)

    def make_fn(unet):
        t0 = torch.zeros(1, dtype=torch.long, device=next(unet.parameters()).device)

        def run(latents, audio):
            return unet(latents, t0, encoder_hidden_states=audio).sample

        return run

    import re

    proj = re.compile(r"(attn[12]\.(to_q|to_k|to_v|to_out\.0)|\.ff\.net\.(0\.proj|2))$")
    return Net("unet", "MuseTalk UNet (1 step, t=0)", 1, build, inputs, make_fn,
               fp8_filter=lambda name, m: bool(proj.search(name)))


def vae_net(quick: bool) -> Net:
    from newsstudio.engines.musetalk.vae import SCALING_FACTOR
    from newsstudio.engines.musetalk.weights import VAE_CONFIG, random_vae

    cfg = dict(VAE_CONFIG)
    side = 32
    if quick:
        cfg.update(block_out_channels=[32, 32, 64, 64], layers_per_block=1)
        side = 8

    def build(device):
        return random_vae(0, device=device, config=cfg)

    def inputs(b, g, device):
        return (_randn((b, 4, side, side), g, device),)

    def make_fn(vae):
        inv = 1 / SCALING_FACTOR

        def run(latents):
            return vae.decode(latents * inv).sample

        return run

    def phase_upsample(vae) -> None:  # what MuseTalkEngine(conv_rewrites=True) decodes with
        from newsstudio.accel.upsample_conv import with_phase_upsampling

        vae.decoder = with_phase_upsampling(vae.decoder)[0]

    def fp8_convs(name, m):  # the engine's selection, named from the whole VAE
        from newsstudio.engines.musetalk.engine import fp8_safe_decoder_conv

        return name.startswith("decoder.") and fp8_safe_decoder_conv(name[len("decoder."):], m)

    return Net("vae", "sd-vae decode (latents -> RGB)", 1, build, inputs, make_fn,
               to_image=lambda x: ((x / 2 + 0.5).clamp(0, 1) * 255), rewrite=phase_upsample, fp8_convs=fp8_convs)


class DittoRender(nn.Module):
    """Warp the source feature volume to the driving keypoints, then decode to RGB."""

    def __init__(self, warp: nn.Module, dec: nn.Module) -> None:
        super().__init__()
        self.warp, self.dec = warp, dec

    def forward(self, feature_3d, kp_source, kp_driving):
        return self.dec(self.warp(feature_3d, kp_source, kp_driving))


def ditto_net(quick: bool) -> Net:
    from newsstudio.engines.ditto.models import SPADEDecoder, WarpingNetwork

    side = 32 if quick else 64
    wkw = {"block_expansion": 16} if quick else {}
    dkw = {"block_expansion": 16} if quick else {}

    def build(device):
        warp, dec = WarpingNetwork(**wkw), SPADEDecoder(**dkw)
        fill_seeded_(warp, 0)  # official key names: the same values the engine's seeded path uses
        fill_seeded_(dec, 0)
        return DittoRender(warp, dec).to(device).eval().requires_grad_(False)

    def inputs(b, g, device):
        kp_s = _randn((b, 21, 3), g, device, 0.3)
        return _randn((b, 32, 16, side, side), g, device), kp_s, kp_s + _randn((b, 21, 3), g, device, 0.05)

    def make_fn(m):
        return m.forward

    def regroup(m) -> None:
        from newsstudio.engines.ditto.models.regrouped import RegroupedSPADEDecoder, regrouped_warp

        if not m.dec.spectral_norm_folded:
            m.dec.fold_spectral_norm_()
        m.warp, m.dec = regrouped_warp(m.warp), RegroupedSPADEDecoder(m.dec)

    return Net("ditto", "Ditto warp + SPADE decoder", 1, build, inputs, make_fn,
               to_image=lambda x: x.clamp(0, 1) * 255,
               specialise=lambda m: m.dec.fold_spectral_norm_(), rewrite=regroup)


def lmdm_net(quick: bool) -> Net:
    from newsstudio.engines.ditto.ddim import DDIMSampler
    from newsstudio.engines.ditto.models.lmdm import LMDM

    def build(device):
        m = LMDM()
        fill_seeded_(m.model, 0)  # keys of the official model_state_dict
        return m.to(device).eval().requires_grad_(False)

    def inputs(b, g, device):
        return _randn((b, 265), g, device), _randn((b, 80, 1103), g, device), _randn((b, 80, 265), g, device)

    def make_fn(lmdm):
        sampler = DDIMSampler(lmdm, steps=LMDM_STEPS, eta=1.0)
        noise = torch.randn(LMDM_STEPS - 1, 1, lmdm.seq_frames, lmdm.motion_feat_dim,
                            generator=torch.Generator().manual_seed(77))
        sampler.setup(LMDM_STEPS, step_noise=noise)  # the same step noises for every lever

        def run(kp_cond, aud_cond, x_t):
            return sampler.sample(kp_cond, aud_cond, x_T=x_t)

        return run

    keep = ("linear1", "linear2", "out_proj")
    return Net("lmdm", f"Ditto LMDM (DDIM {LMDM_STEPS} steps, 80-frame windows)", 80, build, inputs, make_fn,
               fp8_filter=lambda name, m: name.endswith(keep), has_conv=False)


def hubert_net(quick: bool) -> Net:
    """Ditto's audio encoder with seeded weights (the transformers HuBERT-large the engine runs
    under ``--weights random``), on its fixed 6480-sample windows: float32 GEMMs at small M."""
    from newsstudio.engines.ditto.wav2feat import split_len
    from newsstudio.engines.ditto.weights import random_hubert

    window = split_len()  # samples per encoder window at the default chunk sizes (6480)

    def build(device):
        return random_hubert(0, device=device, num_layers=2 if quick else None)

    def inputs(b, g, device):
        return (_randn((b, window), g, device, 0.1),)

    def make_fn(enc):
        return enc.forward

    keep = ("q_proj", "k_proj", "v_proj", "out_proj", "intermediate_dense", "output_dense")
    return Net("hubert", f"Ditto HuBERT ({window}-sample windows)", 1, build, inputs, make_fn,
               fp8_filter=lambda name, m: name.endswith(keep))


NETS: dict[str, Callable[[bool], Net]] = {"unet": unet_net, "vae": vae_net, "ditto": ditto_net, "lmdm": lmdm_net,
                                          "hubert": hubert_net}


# --------------------------------------------------------------------------------------------
# Levers
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Lever:
    name: str
    dtype: str  # "fp32" | "half" | "bf16"
    mode: str = "eager"
    channels_last: bool = False
    fp8: bool = False
    tf32: bool = False
    fold: bool = True  # apply the network's `specialise` (Ditto: folded spectral norm)
    rewrite: bool = False  # apply the network's `rewrite`
    nhwc_norms: bool = False  # GroupNorm / InstanceNorm statistics by accel/group_norm_nhwc.py's kernel
    norm_silu: bool = False  # ... and the norms a SiLU follows apply it in its apply kernel (fuse_following_silu_)
    norm_min_side: int = 0  # ... only on maps of at least this side squared (PyTorch's norms on smaller ones)
    spade_norms: bool = False  # Ditto's regrouped SPADE norms: statistics, norm + modulation + LeakyReLU on the NHWC kernels
    statistics: str = "chunked"  # the NHWC statistics kernel (accel/group_norm_nhwc.py STATISTICS_KERNELS)
    interleave: str = "channels_last"  # PhaseUpsampleConv's phase interleave (accel/upsample_conv.py INTERLEAVES)
    triton: str = "off"  # the network's convs on the Triton kernel: "half" | "fp8" | "fp8-static" | "mixed" (accel/igemm_conv.py)
    reference: bool = False

    def key(self) -> tuple:
        return (self.dtype, self.channels_last, self.fp8, self.fold and self.dtype != "fp32", self.rewrite, self.interleave, self.nhwc_norms, self.norm_silu, self.norm_min_side, self.spade_norms, self.statistics, self.triton)


def levers_for(net: Net, half: str) -> list[Lever]:
    h = half
    out = [Lever("fp32 eager", "fp32", fold=False, reference=True), Lever("tf32 eager", "fp32", tf32=True, fold=False),
           # the float32 networks the engines graph as they are (Ditto's LMDM, HuBERT), and the same under TF32
           Lever("fp32 cudagraph", "fp32", mode="cudagraph", fold=False),
           Lever("tf32 cudagraph", "fp32", mode="cudagraph", tf32=True, fold=False)]
    if net.specialise is not None:
        out.append(Lever(f"{h} eager, SN per call", "half", fold=False))
    out.append(Lever(f"{h} eager", "half"))
    if h != "bf16":
        out.append(Lever("bf16 eager", "bf16"))
    out += [Lever(f"{h} channels_last", "half", channels_last=True),
            Lever(f"{h} cudagraph", "half", mode="cudagraph"),
            Lever("fp8 eager", "half", fp8=True),
            Lever("fp8 cudagraph", "half", mode="cudagraph", fp8=True),
            Lever(f"{h} compile", "half", mode="compile"),
            Lever(f"{h} compile+cudagraph", "half", mode="compile+cudagraph"),
            Lever(f"{h} channels_last cudagraph", "half", mode="cudagraph", channels_last=True),
            Lever(f"{h} channels_last compile+cudagraph", "half", mode="compile+cudagraph", channels_last=True),
            Lever("fp8 compile+cudagraph", "half", mode="compile+cudagraph", fp8=True)]
    if net.name == "unet":  # its GroupNorms' statistics by the NHWC kernel (accel/group_norm_nhwc.py)
        out.append(Lever(f"{h} channels_last compile+cudagraph, nhwc group norms", "half", mode="compile+cudagraph",
                         channels_last=True, nhwc_norms=True))
    if net.rewrite is not None:  # the engines' exact conv rewrites (MuseTalk VAE: phase upsampling; Ditto: regrouped)
        out += [Lever("fp32 eager, conv rewrites", "fp32", fold=False, rewrite=True),
                Lever(f"{h} eager, conv rewrites", "half", rewrite=True),
                Lever(f"{h} cudagraph, conv rewrites", "half", mode="cudagraph", rewrite=True),
                Lever(f"{h} channels_last compile+cudagraph, conv rewrites", "half", mode="compile+cudagraph",
                      channels_last=True, rewrite=True)]
        # the norms' statistics by the NHWC kernel (the MuseTalk decoder's GroupNorms, Ditto's InstanceNorms)
        out.append(Lever(f"{h} channels_last compile+cudagraph, conv rewrites, nhwc group norms", "half",
                         mode="compile+cudagraph", channels_last=True, rewrite=True, nhwc_norms=True))
        if net.name == "ditto":
            out += [Lever(f"{h} channels_last compile+cudagraph, conv rewrites, nhwc spade norms" + suffix, "half",
                          mode="compile+cudagraph", channels_last=True, rewrite=True, spade_norms=True, statistics=stats)
                    for stats, suffix in (("chunked", ""), ("streaming", ", streaming statistics"))]
        if net.name == "vae":  # the phases interleaved in NCHW order (before 2026-12-05); the norms taking their SiLU (the engine's)
            out += [Lever(f"{h} channels_last compile+cudagraph, conv rewrites, nchw interleave", "half",
                          mode="compile+cudagraph", channels_last=True, rewrite=True, interleave="nchw"),
                    Lever(f"{h} channels_last compile+cudagraph, conv rewrites, nhwc group norms + silu", "half",
                          mode="compile+cudagraph", channels_last=True, rewrite=True, nhwc_norms=True, norm_silu=True)]
            out += [Lever(f"{h} channels_last compile+cudagraph, conv rewrites, nhwc group norms + silu from {side}^2", "half",
                          mode="compile+cudagraph", channels_last=True, rewrite=True, nhwc_norms=True, norm_silu=True,
                          norm_min_side=side) for side in (64, 128, 256)]
            out.append(Lever(f"{h} channels_last compile+cudagraph, conv rewrites, nhwc group norms + silu, streaming statistics",
                             "half", mode="compile+cudagraph", channels_last=True, rewrite=True, nhwc_norms=True,
                             norm_silu=True, statistics="streaming"))
            # the Triton convolution kernel, in the engine's configuration otherwise
            out += [Lever(f"{h} channels_last {mode}, conv rewrites, triton {t} convs", "half", mode=mode,
                          channels_last=True, rewrite=True, triton=t)
                    for t in ("half", "fp8", "fp8-static", "mixed") for mode in ("cudagraph", "compile+cudagraph")]
            out += [Lever(f"{h} channels_last compile+cudagraph, conv rewrites, triton {t} convs, nhwc group norms", "half",
                          mode="compile+cudagraph", channels_last=True, rewrite=True, triton=t, nhwc_norms=True)
                    for t in ("half", "mixed")]
            # ... and in the engine's own decoder configuration (norms taking their SiLU, streaming statistics)
            out += [Lever(f"{h} channels_last compile+cudagraph, conv rewrites, triton {t} convs, nhwc group norms + silu, "
                          "streaming statistics", "half", mode="compile+cudagraph", channels_last=True, rewrite=True,
                          triton=t, nhwc_norms=True, norm_silu=True, statistics="streaming")
                    for t in ("half", "mixed")]
    return out


@dataclass
class Row:
    lever: str
    batch: int
    status: str = "ok"  # ok | skipped | error
    fps: float | None = None
    ms: float | None = None
    ms_min: float | None = None
    ms_max: float | None = None
    wall_fps: float | None = None
    rel_err: float | None = None
    psnr_db: float | None = None
    finite: bool | None = None
    tflops: float | None = None
    pct_peak: float | None = None
    compile_s: float | None = None
    capture_s: float | None = None
    fp8_linears: int | None = None
    runner_mode: str | None = None
    peak_mem_gb: float | None = None
    note: str = ""
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# Measuring
# --------------------------------------------------------------------------------------------

def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(call: Callable[..., Any], sets: list[tuple], iters: int, warmup: int,
               device: torch.device) -> tuple[list[float], float]:
    """Per-call milliseconds (CUDA events on GPU) and the wall time of the whole timed loop."""
    for i in range(warmup):
        call(*sets[i % len(sets)])
    sync(device)
    if device.type == "cuda":
        evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
        t0 = time.perf_counter()
        for i, (s, e) in enumerate(evs):
            s.record()
            call(*sets[i % len(sets)])
            e.record()
        sync(device)
        wall = time.perf_counter() - t0
        return [s.elapsed_time(e) for s, e in evs], wall
    ms = []
    t0 = time.perf_counter()
    for i in range(iters):
        t = time.perf_counter()
        call(*sets[i % len(sets)])
        ms.append((time.perf_counter() - t) * 1e3)
    return ms, time.perf_counter() - t0


def matmul_peak(device: torch.device, quick: bool) -> dict[str, Any]:
    """Measured dense matmul rate: bf16 8192^3 (and FP8 via _scaled_mm where supported)."""
    out: dict[str, Any] = {}
    if device.type != "cuda":
        n = 1024 if quick else 2048
        a, b = torch.randn(n, n), torch.randn(n, n)
        ms, _ = time_calls(lambda: a @ b, [()], 3, 1, device)
        out.update(dtype="fp32", n=n, tflops=2 * n**3 / (statistics.median(ms) * 1e-3) / 1e12)
        return out
    n = 8192
    g = torch.Generator(device).manual_seed(123)
    a = torch.randn(n, n, generator=g, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, generator=g, device=device, dtype=torch.bfloat16)
    ms, _ = time_calls(lambda: a @ b, [()], 20, 5, device)
    out.update(dtype="bf16", n=n, tflops=2 * n**3 / (statistics.median(ms) * 1e-3) / 1e12)
    if fp8_supported(device):
        try:
            a8 = a.to(torch.float8_e4m3fn)
            b8 = b.to(torch.float8_e4m3fn).t()  # column-major
            one = torch.ones((), device=device)
            ms8, _ = time_calls(lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                                         use_fast_accum=True), [()], 20, 5, device)
            out["fp8_tflops"] = 2 * n**3 / (statistics.median(ms8) * 1e-3) / 1e12
        except Exception as exc:  # noqa: BLE001
            out["fp8_error"] = f"{type(exc).__name__}: {exc}"[:200]
    del a, b
    torch.cuda.empty_cache()
    return out


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = out.double(), ref.double()
    return float((o - r).norm() / r.norm().clamp_min(1e-30))


def psnr(img: torch.Tensor, ref: torch.Tensor) -> float:
    mse = float((img.double() - ref.double()).pow(2).mean())
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def count_flops(call: Callable[..., Any], args: tuple) -> tuple[Any, float | None]:
    try:
        from torch.utils.flop_counter import FlopCounterMode

        with FlopCounterMode(display=False) as fc:
            out = call(*args)
        return out, float(fc.get_total_flops())
    except Exception:  # noqa: BLE001  (the count is informative; never lose the reference for it)
        return call(*args), None


def _cast_inputs(inputs: tuple[torch.Tensor, ...], dtype: torch.dtype, cl: bool) -> tuple[torch.Tensor, ...]:
    out = tuple(x.to(dtype) for x in inputs)
    return tuple(channels_last(x) for x in out) if cl else out


def _short(exc: BaseException) -> str:
    msg = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return (msg[0] if msg else type(exc).__name__)[:240]


def record_error(row: Row, exc: BaseException, net: Net, lv: Lever, log: Callable[[str], None]) -> None:
    """Record a failed lever (error, short note, traceback in the JSON)."""
    row.status, row.error = "error", _short(exc)
    row.extra["traceback"] = traceback.format_exc()[-4000:]
    row.note = row.error[:120]
    log(f"[{net.name}] {lv.name}: ERROR {row.error}")


# --------------------------------------------------------------------------------------------
# One network
# --------------------------------------------------------------------------------------------

@contextlib.contextmanager
def cudnn_benchmark(on: bool):
    """cuDNN autotuning for one lever's calls only (then restored)."""
    old = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = on
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = old


def run_network(net: Net, args, device: torch.device, half: str, peak: dict[str, Any], t_start: float,
                log: Callable[[str], None]) -> dict[str, Any]:
    batch = args.batches[net.name]
    result: dict[str, Any] = {"title": net.title, "batch": batch, "frames_per_item": net.frames_per_item,
                              "frames_per_call": batch * net.frames_per_item, "rows": []}
    rows: list[Row] = []
    t0 = time.perf_counter()
    ref_model = net.build(device)
    sync(device)
    result["build_s"] = time.perf_counter() - t0
    result["params_m"] = sum(p.numel() for p in ref_model.parameters()) / 1e6

    g = torch.Generator(device).manual_seed(1000)
    sets32 = [net.inputs(batch, g, device) for _ in range(N_INPUT_SETS)]
    acc32 = net.inputs(batch, torch.Generator(device).manual_seed(2024), device)
    with torch.no_grad(), tf32(False), cudnn_benchmark(torch.backends.cudnn.benchmark and args.autotune_fp32):
        ref_out, flops = count_flops(net.make_fn(ref_model), acc32)
    ref_out = ref_out.float()
    frames = batch * net.frames_per_item
    result["flops_per_frame"] = flops / frames if flops else None
    result["gflop_per_frame"] = flops / frames / 1e9 if flops else None
    ref_img = net.to_image(ref_out) if net.to_image is not None else None
    result["ref_finite"] = bool(torch.isfinite(ref_out).all())
    result["ref_std"] = float(ref_out.std())

    models: dict[tuple, nn.Module] = {}
    compiled: dict[tuple, Callable[..., Any]] = {}
    on_cuda = device.type == "cuda"
    fp8_ok = on_cuda and fp8_supported(device)
    triton_ok = on_cuda and triton_conv_supported(device)
    half_dtype = parse_dtype(half)

    def model_for(lv: Lever) -> tuple[nn.Module, int | None]:
        key = lv.key()
        if lv.reference or key == Lever("x", "fp32", fold=False).key():
            return ref_model, None
        if key not in models:
            m = copy.deepcopy(ref_model)
            if key[3] and net.specialise is not None:
                net.specialise(m)
            if lv.rewrite and net.rewrite is not None:
                net.rewrite(m)
                for mod in m.modules():
                    if isinstance(mod, PhaseUpsampleConv):
                        mod.interleave = lv.interleave
            if lv.spade_norms and not use_nhwc_spade_norms_(m, lv.statistics):
                raise RuntimeError("no regrouped SPADE norm to put on the kernels")
            if lv.nhwc_norms:
                m = with_nhwc_group_norms(m, lv.norm_min_side ** 2, lv.statistics)[0]
                if lv.norm_silu and not fuse_following_silu_(m):
                    raise RuntimeError("no norm takes a SiLU that follows it")
            dt = torch.float32 if lv.dtype == "fp32" else (half_dtype if lv.dtype == "half" else torch.bfloat16)
            if dt != torch.float32:
                cast_(m, dt)
            if lv.channels_last:
                to_channels_last_(m)
            if lv.triton != "off":
                if not convert_convs_for_mode_(m, lv.triton, net.fp8_convs):
                    raise RuntimeError("no convolution moved to the Triton kernel")
                # scales from the first timing input; accuracy is measured on another draw
                if lv.triton in CALIBRATED_MODES and not calibrate_fp8_(
                        m, lambda: net.make_fn(m)(*_cast_inputs(sets32[0], dt, lv.channels_last))):
                    raise RuntimeError("no convolution moved to the Triton kernel in FP8")
            n8 = None
            if lv.fp8:
                n8 = convert_linears_to_fp8_(m, filter=net.fp8_filter, granularity=args.fp8_granularity)
                if n8 == 0:
                    raise RuntimeError("no linear layer converted to FP8")
            m.n8 = n8  # type: ignore[attr-defined]
            models[key] = m.eval().requires_grad_(False)
        return models[key], getattr(models[key], "n8", None)

    exact = ";" in (args.levers or "")
    wanted = [w.strip() for w in (args.levers or "").split(";" if exact else ",") if w.strip()]
    for lv in levers_for(net, half):
        if wanted and not lv.reference and not (lv.name in wanted if exact else any(w in lv.name for w in wanted)):
            continue
        row = Row(lv.name, batch)
        rows.append(row)
        elapsed = time.perf_counter() - t_start
        skip = None
        if not on_cuda and (lv.mode != "eager" or lv.tf32 or lv.fp8 or lv.triton != "off" or (lv.dtype == "half" and half == "fp16")):
            skip = "needs CUDA"
        elif lv.fp8 and net.fp8_filter is None:
            skip = "no linear layers worth FP8 (convolutional network)"
        elif (lv.fp8 or lv.triton.startswith("fp8")) and not fp8_ok:
            skip = "FP8 needs compute capability >= 8.9 and torch._scaled_mm"
        elif lv.triton != "off" and not triton_ok:
            skip = "the Triton kernel needs CUDA and triton"
        elif lv.channels_last and not net.has_conv:
            skip = "no convolutions"
        elif lv.mode != "eager" and "compile" in lv.mode and elapsed > 0.7 * args.budget:
            skip = f"time budget ({elapsed:.0f} s of {args.budget:.0f} s spent)"
        elif elapsed > args.budget:
            skip = f"time budget ({elapsed:.0f} s of {args.budget:.0f} s spent)"
        if skip:
            row.status, row.note = "skipped", skip
            log(f"[{net.name}] {lv.name}: skipped ({skip})")
            continue
        runner = None
        try:
            if on_cuda:
                torch.cuda.reset_peak_memory_stats(device)
            model, n8 = model_for(lv)
            row.fp8_linears = n8
            dt = next((p.dtype for p in model.parameters() if p.is_floating_point() and p.dtype.itemsize > 1),
                      torch.float32)
            sets = [_cast_inputs(s, dt, lv.channels_last) for s in sets32]
            acc = _cast_inputs(acc32, dt, lv.channels_last)
            autotune = torch.backends.cudnn.benchmark and (lv.dtype != "fp32" or args.autotune_fp32)
            with torch.no_grad(), tf32(lv.tf32 or lv.dtype != "fp32"), cudnn_benchmark(autotune):
                fn = net.make_fn(model)
                key = lv.key()
                if lv.mode == "compile+cudagraph" and key in compiled:
                    # capture the network compiled by the "compile" row (one compile, no cudagraph trees)
                    runner = StaticBatchRunner(compiled[key], batch, sets[0], mode="cudagraph", warmup=args.warmup)
                    row.note = "graph over the compile row's network"
                else:
                    runner = StaticBatchRunner(fn, batch, sets[0], mode=lv.mode, compile_mode=args.compile_mode,
                                               cudagraph_compile_mode=args.cudagraph_compile_mode,
                                               warmup=args.warmup, cache_dir=args.cache_dir)
                row.runner_mode = runner.mode
                if runner.mode != lv.mode and not (lv.mode == "compile+cudagraph" and runner.mode == "cudagraph"):
                    raise RuntimeError(f"runner fell back to {runner.mode}")
                row.compile_s, row.capture_s = runner.compile_seconds, runner.capture_seconds
                if lv.mode == "compile" and runner.compiled_fn is not None:
                    compiled[key] = runner.compiled_fn
                out = runner(*acc).float()
                row.finite = bool(torch.isfinite(out).all())
                row.rel_err = rel_l2(out, ref_out)  # the reference row: a repeatability check
                if ref_img is not None and net.to_image is not None:
                    row.psnr_db = psnr(net.to_image(out), ref_img)
                del out
                ms, wall = time_calls(runner, sets, args.iters, args.warmup, device)
            row.ms, row.ms_min, row.ms_max = statistics.median(ms), min(ms), max(ms)
            row.fps = frames / (row.ms * 1e-3)
            row.wall_fps = frames * args.iters / wall
            if flops:
                row.tflops = flops / (row.ms * 1e-3) / 1e12
                row.pct_peak = 100 * row.tflops / peak["tflops"] if peak.get("tflops") else None
            if on_cuda:
                row.peak_mem_gb = torch.cuda.max_memory_allocated(device) / 2**30
            if row.compile_s is not None and not row.note:
                row.note = f"compile {row.compile_s:.0f} s"
            if n8:
                row.note = (row.note + "; " if row.note else "") + f"{n8} FP8 linears"
            if row.finite is False:
                row.note = (row.note + "; " if row.note else "") + "NON-FINITE output"
            log(f"[{net.name}] {lv.name}: {row.fps:,.1f} fps, {row.ms:.2f} ms/batch, rel err {row.rel_err:.2e}"
                + (f", compile {row.compile_s:.1f} s" if row.compile_s is not None else ""))
        except NotImplementedError as exc:
            if on_cuda:
                record_error(row, exc, net, lv, log)
            else:  # a kernel CPU PyTorch lacks (e.g. bf16 avg_pool3d): not this lever's fault
                row.status, row.note = "skipped", f"not on CPU: {_short(exc)}"[:160]
                log(f"[{net.name}] {lv.name}: skipped ({row.note})")
        except Exception as exc:  # noqa: BLE001  (one lever failing must not lose the others)
            record_error(row, exc, net, lv, log)
        finally:
            del runner
            gc.collect()
            if on_cuda:
                try:
                    torch.cuda.synchronize(device)
                    torch.cuda.empty_cache()
                except Exception:  # noqa: BLE001
                    pass

    result["rows"] = [asdict(r) for r in rows]
    del models, compiled, ref_model
    try:
        torch._dynamo.reset()
    except Exception:  # noqa: BLE001
        pass
    gc.collect()
    if on_cuda:
        torch.cuda.empty_cache()
    return result


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------

def _f(v, fmt: str, none: str = "—") -> str:
    if v is None:
        return none
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    return format(v, fmt)


def table(name: str, res: dict[str, Any]) -> str:
    if "error" in res and not res.get("rows"):
        return f"### {name}: ERROR {res['error']}\n"
    gf = res.get("gflop_per_frame")
    head = (f"### {name}: {res['title']} — batch {res['batch']} x {res['frames_per_item']} frames, "
            f"{_f(gf, '.1f')} GFLOP/frame, {res.get('params_m', 0):.0f} M params\n\n")
    lines = ["| lever | batch | fps | ms/batch | rel err vs fp32 | PSNR dB | TFLOP/s | % of peak | note |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in res["rows"]:
        if r["status"] != "ok":
            lines.append(f"| {r['lever']} | {r['batch']} | {r['status']} | | | | | | {r['note'][:90]} |")
            continue
        lines.append(
            f"| {r['lever']} | {r['batch']} | {_f(r['fps'], ',.1f')} | {_f(r['ms'], '.2f')} | "
            f"{_f(r['rel_err'], '.2e')} | {_f(r['psnr_db'], '.1f')} | {_f(r['tflops'], '.3g')} | "
            f"{_f(r['pct_peak'], '.1f')} | {r['note']} |")
    return head + "\n".join(lines) + "\n"


def parse_batches(spec: str | None, quick: bool) -> dict[str, int]:
    out = {k: ((1 if k == "lmdm" else 2) if quick else v) for k, v in DEFAULT_BATCH.items()}
    if not spec:
        return out
    if spec.isdigit():
        return {k: int(spec) for k in out}
    for part in spec.split(","):
        k, _, v = part.partition("=")
        if k.strip() not in out or not v.strip().isdigit():
            raise SystemExit(f"--batch: expected N or name=N[,name=N] with names {list(out)}, got {part!r}")
        out[k.strip()] = int(v)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(ORDER), help="networks, comma-separated: " + ",".join(ORDER))
    ap.add_argument("--batch", default=None, help="N for all, or name=N,... (default " +
                    ",".join(f"{k}={v}" for k, v in DEFAULT_BATCH.items()) + ")")
    ap.add_argument("--iters", type=int, default=None, help="timed calls per lever (default 10, quick 2)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed calls first (default 3, quick 1)")
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"], help="half precision of the levers")
    ap.add_argument("--compile-mode", default="default",
                    help="torch.compile mode of the compile rows (default 'default': no autotuning, fits the "
                         "time budget; 'max-autotune-no-cudagraphs' autotunes)")
    ap.add_argument("--cudagraph-compile-mode", default=None, choices=["reduce-overhead", "max-autotune"],
                    help="compile+cudagraph through torch.compile's own CUDA graphs instead of a manual capture")
    ap.add_argument("--levers", default=None,
                    help="only levers whose name contains one of these comma-separated words, or (with ';' between them) "
                         "exactly these names (fp32 eager always runs)")
    ap.add_argument("--fp8-granularity", default="tensor", choices=["tensor", "row"],
                    help="FP8 weight/activation scales: one per tensor (default) or per row")
    ap.add_argument("--cache-dir", default=None, help="Inductor cache folder (default ~/.cache/newsstudio/inductor)")
    ap.add_argument("--budget", type=float, default=450.0, help="seconds; compile rows stop at 70%%, all at 100%%")
    ap.add_argument("--device", default=None, help="cuda (default when present) or cpu")
    ap.add_argument("--no-cudnn-benchmark", action="store_true")
    ap.add_argument("--autotune-fp32", action="store_true",
                    help="cuDNN autotuning for the fp32/TF32 rows too (off by default: it spent 76 s of a 130 s "
                         "budget on the VAE's fp32 convolutions, with a 75 GB workspace peak)")
    ap.add_argument("--quick", action="store_true", help="tiny configurations, batch 2: a smoke run")
    ap.add_argument("--json", default=None, help="write all figures here")
    args = ap.parse_args(argv)

    t_start = time.perf_counter()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    args.batches = parse_batches(args.batch, args.quick)
    args.iters = args.iters or (2 if args.quick else 10)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    bad = [n for n in names if n not in NETS]
    if bad:
        raise SystemExit(f"--only: unknown network(s) {bad}; choose from {list(NETS)}")
    half = args.dtype if device.type == "cuda" else "bf16"  # fp16 is no CPU deployment path
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = not args.no_cudnn_benchmark
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    try:
        from diffusers.utils import logging as dlog

        dlog.set_verbosity_error()
    except Exception:  # noqa: BLE001  (diffusers absent: unet/vae report the error)
        pass

    def log(msg: str) -> None:
        print(f"{time.perf_counter() - t_start:6.1f}s {msg}", flush=True)

    report: dict[str, Any] = {"machine": machine(), "device": str(device), "half": half,
                              "args": {k: v for k, v in vars(args).items()}, "networks": {}}
    if device.type == "cuda":
        report["machine"]["capability"] = list(torch.cuda.get_device_capability(device))
        report["fp8_supported"] = fp8_supported(device)
    try:
        peak = matmul_peak(device, args.quick)
    except Exception as exc:  # noqa: BLE001
        peak = {"error": _short(exc)}
    report["peak"] = peak
    log(f"device {device} ({report['machine'].get('gpu', 'cpu')}), half={half}, peak "
        f"{_f(peak.get('tflops'), '.3g')} TFLOP/s {peak.get('dtype', '')}"
        + (f", fp8 {peak['fp8_tflops']:.0f} TFLOP/s" if "fp8_tflops" in peak else ""))

    def dump() -> None:
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=1, default=str))

    for name in names:
        log(f"[{name}] building")
        try:
            net = NETS[name](args.quick)
            report["networks"][name] = run_network(net, args, device, half, peak, t_start, log)
        except Exception as exc:  # noqa: BLE001
            report["networks"][name] = {"error": _short(exc), "traceback": traceback.format_exc()[-4000:], "rows": []}
            log(f"[{name}] ERROR {_short(exc)}")
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        dump()

    report["total_s"] = time.perf_counter() - t_start
    dump()
    print()
    print(f"peak: {_f(peak.get('tflops'), '.3g')} TFLOP/s {peak.get('dtype', '')} matmul"
          + (f", fp8 {peak['fp8_tflops']:.0f} TFLOP/s" if "fp8_tflops" in peak else "")
          + f"; {report['machine'].get('gpu', 'cpu')}, torch {torch.__version__}; total {report['total_s']:.0f} s")
    for name in names:
        print()
        print(table(name, report["networks"][name]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
