"""Ditto: our streaming pipeline vs the reference-style pipeline of the PyTorch release, one process.

    python -m benchmarks.ditto_bench [--size 1080x1920] [--seconds 6.6] [--steps 4] [--compile] [--json out.json]
    python -m benchmarks.ditto_bench --stride 4 [--stride-mode mask]   # + stride mode: fps and PSNR vs dense
    python -m benchmarks.ditto_bench --quick        # CPU smoke test (tiny sizes, developer options)
    python -m benchmarks.run --engines ditto [--quick]

Both paths use the same seeded random weights (speed does not depend on weight values) and the same
avatar (the yongen loop prebaked at --size):

* ours: ``benchmarks.run.engine_figures`` on ``DittoEngine`` (dense fps to NV12 on the CPU, time
  to first frame with the audio available, segment -> MP4 with audio);
* reference: benchmarks/ditto_reference.py (whole-file HuBERT, per-stage threads with numpy
  hand-offs, two-pass CFG, per-frame fp16 autocast warp + decode, CPU paste-back), warm;
* LMDM: one 80-frame window with ``--steps`` DDIM steps, ours (batched CFG) vs two passes, as
  effective motion fps (80 frames / window time; ``valid_fps`` counts the 80 - overlap frames a
  window adds in a stream); then B windows of different streams in one DDIM run (the server's
  MotionBatcher) for B = 16, 64, 256: effective motion fps = B x 80 / run time;
* avatar cold start: our packet opened until every array is addressable vs loading the pickled
  ``source_info`` a user of the release would cache; the Ditto prebake (registration) time;
* FLOPs per frame of warp + decoder (torch FlopCounterMode) and the share of the GPU's peak;
* ``--stride K`` (engines/ditto/stride.py): the same figures as "ours" for ``DittoEngine(stride=K)``
  (warp + decode every K-th frame), next to the dense ones, and the quality cost: PSNR (dB) of the
  stride ROIs vs the dense ROIs ([0, 255], float) on the same seeded weights and audio, over all
  frames and over the interpolated frames only, for every interpolation mode (``--stride-psnr-modes``).
  With seeded weights the decoder saturates ~99% of pixels and the seeded keypoints jump tens of times
  more per frame than a talking head's, so this figure is far below what real weights give (stride.py doc).
  ``--stride-device-rows`` (CUDA) times its segment -> MP4 again with the renderer reading its rows back from
  the device (``rows_on_host = False``, the path before the forty-third session): the host hand-over's A/B.

``--quick`` (CPU): 0.2 s of audio and the developer architecture (``config.TINY_OPTIONS``: 128 inputs,
256 crops, a 2-layer HuBERT, quarter-width image networks), so the whole section runs in a few
minutes on two cores. Figures from it only show that the code runs.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from newsstudio.accel.kernel_choice import forget_choices
from newsstudio.engines.ditto.config import TINY_OPTIONS

from .common import (add_engine_config_args, avatar, close_variant, fallback_count, kernel_choices, machine, media, median,
                     official_cudnn_defaults, parse_variant, segment_mp4_figures, stream_rows, sync, timed, variant_list,
                     weights_channels_last, write_json)

H200_PEAK_TFLOPS = 776.0  # measured dense bf16/fp16 peak of our H200 (BRIEF section 4)
QUICK_OPTIONS = dict(TINY_OPTIONS)  # the tests' developer architecture
QUICK_SECONDS = 0.2


@torch.no_grad()
def flops_per_frame(engine) -> dict[str, float]:
    """FLOPs of one frame's warp + decode (batch 1), counted on the plain modules (the model's
    FLOPs: % of peak is stated on them), and what the engine's (regrouped) networks execute (NaN
    when convs run on the Triton kernel: the flop counter does not see those)."""
    from torch.utils.flop_counter import FlopCounterMode

    m, dev = engine.models, engine.device
    f_s = torch.zeros(1, *m.feature_volume(engine.config.input_size), device=dev, dtype=m.dtype)
    kp = torch.zeros(1, 21, 3, device=dev, dtype=m.dtype)

    def count(warp, decoder) -> tuple[float, float]:
        with FlopCounterMode(display=False) as fc:
            feat = warp(f_s, kp, kp)
        w = fc.get_total_flops()
        with FlopCounterMode(display=False) as fc:
            decoder(feat)
        return w / 1e9, fc.get_total_flops() / 1e9

    warp, dec = count(m.warp, m.decoder)
    executed = sum(count(engine._warp, engine._decoder)) if engine.triton_convs == "off" else float("nan")
    return {"warp_gflop": warp, "decoder_gflop": dec, "total_gflop": warp + dec, "executed_gflop": executed}


@torch.no_grad()
def stride_psnr(dense, strided: dict[str, Any], packet, seconds: float, chunk: int) -> dict[str, Any]:
    """PSNR of stride renders vs dense renders (ROI images, [0, 255]) of the same audio, per mode.

    Rendered like the runner does (chunks of ``chunk`` consecutive frames on the ping-pong loop);
    ``strided``: {mode: DittoEngine(stride=K, stride_mode=mode)} sharing ``dense``'s networks."""
    import soxr

    from newsstudio.engines.base import pingpong_index
    from newsstudio.engines.ditto.engine import DRIVING_DIM

    from .run import segment_audio

    a = segment_audio(seconds)
    mono = a.samples.mean(axis=0)
    pcm = soxr.resample(mono, a.sample_rate, 16000).astype(np.float32) if a.sample_rate != 16000 else mono

    def stream(engine):
        layer = engine.load_avatar(packet)
        cond, drv = engine.conditioner(25), engine.driver(layer)
        cond.push(pcm)
        cond.close()
        drv.push(cond.take(cond.ready))
        drv.close()
        return layer, drv, drv.take(drv.ready)

    def rois(engine, layer, rows):
        n = rows.shape[0]
        for s in range(0, n, chunk):
            m = min(chunk, n - s)
            idx = pingpong_index(torch.arange(s, s + m, device=engine.device), layer.n_frames)
            yield s, engine.render(layer, rows[s : s + m], idx)

    layer, _, rows = stream(dense)
    ref = torch.cat([r for _, r in rois(dense, layer, rows)])
    n = ref.shape[0]
    out: dict[str, Any] = {"frames": n}
    for mode, eng in strided.items():
        lay, drv, srows = stream(eng)  # drv: keeps the stream's keyframe cache alive while rendering
        if not torch.allclose(srows[:, :DRIVING_DIM], rows, atol=1e-5):
            raise RuntimeError("stride and dense drivers made different motion from the same audio")
        key = (srows[:, DRIVING_DIM] == srows[:, DRIVING_DIM + 2]).cpu()
        before = eng._strider.network_frames
        err = torch.zeros(n, dtype=torch.float64)
        for s, r in rois(eng, lay, srows):
            err[s : s + r.shape[0]] = (r.double() - ref[s : s + r.shape[0]].double()).pow(2).mean(dim=(1, 2, 3)).cpu()

        def db(mse: torch.Tensor) -> float:
            v = float(mse.mean()) if mse.numel() else 0.0
            return float("inf") if v == 0 else 10 * np.log10(255.0**2 / v)

        out[mode] = {"psnr_all_db": db(err), "psnr_inbetween_db": db(err[~key]), "psnr_keyframes_db": db(err[key]),
                     "network_frames": eng._strider.network_frames - before, "keyframes": int(key.sum())}
        del drv
    return out


def stride_figures(packet, device: torch.device, seconds: float, chunk: int, repeat: int, workdir: Path, *, stride: int,
                   mode: str, psnr_modes: list[str], dense_engine, engine_kwargs: dict[str, Any],
                   mp4: str = "veryfast", device_rows: bool = False) -> dict[str, Any]:
    """fps etc. of ``DittoEngine(stride=K)`` (same figures as "ours") and its PSNR vs dense;
    ``device_rows``: the segment -> MP4 figures again with the renderer reading its rows on the
    device (``rows_on_host = False``: one device sync per chunk, the path before host rows)."""
    from newsstudio.engines.ditto.engine import DittoEngine

    from .run import engine_figures, segment_audio

    eng = DittoEngine(device, stride=stride, stride_mode=mode, **engine_kwargs)
    eng.load_avatar(packet)
    print(f"[ditto] stride {stride} ({mode}): warm-up and {repeat} runs ...", file=sys.stderr, flush=True)
    before_gb = torch.cuda.memory_allocated(device) / 1e9 if device.type == "cuda" else 0.0
    warm_s = eng.warm_up()  # both runners' buckets, as a server does: the keyframe graphs' cost shows here
    out: dict[str, Any] = {"stride": stride, "mode": mode, "warm_up_s": warm_s,
                           "ours": engine_figures(eng, packet, seconds, chunk, repeat, workdir, mp4=mp4)}
    if device.type == "cuda":  # what this stride engine holds beyond what was allocated before it was warmed
        out["engine_memory_gb"] = torch.cuda.memory_allocated(device) / 1e9 - before_gb
        out["reserved_gb"] = torch.cuda.memory_reserved(device) / 1e9
    if device_rows and device.type == "cuda" and eng.rows_on_host:
        eng.rows_on_host = False
        try:
            out["device_rows"] = segment_mp4_figures(eng, packet, segment_audio(seconds), 25, chunk, workdir / "ditto_stride_segment.mp4",
                                                     mp4, max(1, repeat // 2))
        finally:
            eng.rows_on_host = True
        for name, fig in (("host rows", out["ours"]), ("device rows", out["device_rows"])):  # now: a cut-short run keeps them
            stream_rows(lambda label, value, *_: print(f"[ditto] stride {stride}, {name}: {label}: {value}", file=sys.stderr,
                                                       flush=True), fig)
    engines = {m: (eng if m == mode else DittoEngine(device, stride=stride, stride_mode=m, **engine_kwargs)) for m in psnr_modes}
    print(f"[ditto] stride {stride}: PSNR vs dense for modes {list(engines)} ...", file=sys.stderr, flush=True)
    out["psnr"] = stride_psnr(dense_engine, engines, packet, seconds, chunk)
    return out


@torch.no_grad()
def lmdm_figures(lmdm, device: torch.device, steps: int, overlap: int, repeat: int,
                 batch_windows: tuple[int, ...] = (16, 64, 256), accel: str = "eager") -> dict[str, Any]:
    """One 80-frame window, ``steps`` DDIM steps: batched CFG under the engine's front-end
    ``accel`` (ours; also eager when that differs) vs two decoder passes (the reference)."""
    from newsstudio.engines.ditto.ddim import DDIMSampler

    from .ditto_reference import TwoPassCFG

    g = torch.Generator().manual_seed(0)
    cond = torch.randn(1, lmdm.seq_frames, lmdm.model.cond_projection.in_features, generator=g).to(device)
    kp = torch.randn(1, lmdm.motion_feat_dim, generator=g).to(device)
    res: dict[str, Any] = {"steps": steps, "window_frames": lmdm.seq_frames, "overlap": overlap}
    res["accel"] = accel
    runs = [("ours", lmdm, accel), ("two_pass", TwoPassCFG(lmdm), "eager")]
    if accel != "eager":
        runs.insert(1, ("ours_eager", lmdm, "eager"))
    for name, model, mode in runs:
        sampler = DDIMSampler(model, steps=steps, eta=1.0, generator=torch.Generator(device=device).manual_seed(0),
                              accel=mode)
        ts = timed(lambda: sampler.sample(kp, cond), device, repeat=repeat, warmup=2)
        t = median(ts)
        res[f"{name}_ms"] = t * 1e3
        res[f"{name}_fps"] = lmdm.seq_frames / t
        res[f"{name}_valid_fps"] = (lmdm.seq_frames - overlap) / t
    res["speedup"] = res["two_pass_ms"] / res["ours_ms"]
    # many streams' windows in one DDIM run (engines.ditto.lmdm.MotionBatcher): effective fps per batch size
    from newsstudio.engines.ditto.lmdm import MotionBatcher

    mb = MotionBatcher(lmdm, steps=steps, autostart=False, accel=accel)
    res["batched"] = {}
    for b in batch_windows:
        kb, cb = kp.expand(b, -1).contiguous(), cond.expand(b, -1, -1).contiguous()
        x = torch.randn(b, lmdm.seq_frames, lmdm.motion_feat_dim, device=device)
        noise = torch.randn(max(steps - 1, 0), b, lmdm.seq_frames, lmdm.motion_feat_dim, device=device)
        try:
            ts = timed(lambda: mb.sampler.sample(kb, cb, x_T=x, step_noise=noise), device, repeat=repeat, warmup=2)
        except torch.OutOfMemoryError:
            break
        t = median(ts)
        res["batched"][b] = {"ms": t * 1e3, "fps": b * lmdm.seq_frames / t, "valid_fps": b * (lmdm.seq_frames - overlap) / t}
    return res


def reference_figures(engine, packet, seconds: float, repeat: int, workdir: Path, steps: int, salt: int) -> dict[str, Any]:
    import soxr

    from .ditto_reference import build_source, load_source, reference_image_nets, run_reference, save_source
    from .run import segment_audio

    t = time.perf_counter()
    path = save_source(build_source(packet), workdir / "reference" / f"{packet.id}_source_info.pkl")
    build_s = time.perf_counter() - t
    source = load_source(path)
    warp, dec = reference_image_nets(salt, engine.device, engine.config.width_divisor)
    a = segment_audio(seconds)
    mono = a.samples.mean(axis=0)
    audio = soxr.resample(mono, a.sample_rate, 16000).astype(np.float32) if a.sample_rate != 16000 else mono
    kw = dict(warp=warp, decoder=dec, steps=steps)
    run_reference(engine.models, engine.config, source, audio[: 16000 // 5], **kw)  # warm-up
    runs = [run_reference(engine.models, engine.config, source, audio, **kw) for _ in range(repeat)]
    best = runs[len(runs) // 2]
    return {**best.to_json(), "dense_fps": median([r.fps for r in runs]), "dense_fps_all": [r.fps for r in runs],
            "ttff_ms": median([r.first_frame_s for r in runs]) * 1e3, "source_pickle": str(path),
            "source_pickle_mb": path.stat().st_size / 1e6, "layout_build_s": build_s}


def cold_start_figures(packet, source_pickle: Path, repeat: int, official_repeat: int) -> dict[str, Any]:
    from .cold_start import compare
    from .ditto_reference import load_source

    return compare(packet.path, lambda: load_source(source_pickle), repeat, official_repeat)


def run_section(packet, device, seconds: float | None, chunk: int, repeat: int, workdir: Path, quick: bool = False, *,
                steps: int = 4, compile: bool = False, salt: int = 0, official_repeat: int = 3,
                peak_tflops: float | None = None, skip_reference: bool = False, stride: int = 1,
                stride_mode: str = "mask", stride_psnr_modes: list[str] | None = None,
                variants: list[str] | None = None, mp4: str = "veryfast", stride_accel: str | None = None,
                stride_device_rows: bool = False) -> dict[str, Any]:
    """All Ditto figures for one avatar packet on one device: {"ours", "reference", "lmdm", "cold_start", ...}."""
    from newsstudio.engines.ditto.engine import DittoEngine

    from .run import engine_figures

    device = torch.device(device)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    opts = dict(QUICK_OPTIONS) if quick else {}
    seconds = min(seconds or QUICK_SECONDS, QUICK_SECONDS) if quick else (seconds or 6.6)
    out: dict[str, Any] = {"device": str(device), "weights": f"random (salt {salt})", "steps": steps, "compile": compile,
                           "developer_options": opts, "seconds": seconds,
                           "avatar": {"id": packet.id, "frames": packet.n_frames, "size": list(packet.size)}}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    if not variants:
        variants = ["compile+cudagraph" if compile else ("cudagraph" if device.type == "cuda" else "eager")]
    specs = [parse_variant(v, "ditto") for v in variants]
    out["variants_order"] = list(variants)
    t = time.perf_counter()
    engine = DittoEngine(device, weights="random", salt=salt, steps=steps, **specs[0], **opts)
    sync(device)
    out["engine_load_s"] = time.perf_counter() - t
    t = time.perf_counter()
    packet = engine.prebake(packet, progress=False)
    sync(device)
    out["ditto_prebake_s"] = time.perf_counter() - t
    out["prebake_meta"] = packet.engine_meta("ditto")
    t = time.perf_counter()
    engine.load_avatar(packet)
    sync(device)
    out["layer_upload_s"] = time.perf_counter() - t

    out["variants"] = {}
    first = engine
    for k, (spec, kw) in enumerate(zip(variants, specs)):
        if k:
            engine = DittoEngine(device, weights="random", salt=salt, steps=steps, **kw, **opts)
        print(f"[ditto] ours ({spec}): warm-up and {repeat} dense runs ...", file=sys.stderr, flush=True)
        forget_choices()  # this variant's own per-shape kernel choices, recorded below
        before = fallback_count()
        warm_s = engine.warm_up()  # every batch bucket, as a server does: no capture inside a timed run
        fig = engine_figures(engine, packet, seconds, chunk, repeat, workdir, mp4=mp4)
        fig.update(accel=engine.accel, channels_last=weights_channels_last(engine.models.decoder), cudnn_benchmark=engine.cudnn_benchmark,
                   compile_s=engine._crop_runner.compile_seconds, warm_up_s=warm_s)
        fig.update(triton_convs=engine.triton_convs, kernel_choices=kernel_choices())
        out["variants"][spec] = fig
        remark = close_variant(engine, fig, before, more=k + 1 < len(variants))
        print(f"[ditto] ours ({spec}): {fig['dense_fps']:.1f} fps, TTFF {fig['ttff_ms']:.1f} ms{remark}", file=sys.stderr, flush=True)
    engine = first
    out["ours"] = out["variants"][variants[0]]
    if stride > 1:
        out["stride"] = stride_figures(packet, device, seconds, chunk, repeat, workdir, stride=stride, mode=stride_mode,
                                       psnr_modes=stride_psnr_modes or [stride_mode], dense_engine=engine,
                                       engine_kwargs=dict(weights="random", salt=salt, steps=steps, accel=stride_accel or specs[0]["accel"], **opts),
                                       mp4=mp4, device_rows=stride_device_rows)
    print("[ditto] LMDM window timing ...", file=sys.stderr, flush=True)
    out["lmdm"] = lmdm_figures(engine.models.lmdm, device, steps, engine.config.overlap_v2, repeat=max(3, repeat * 3),
                               batch_windows=(2,) if quick else (16, 64, 256), accel=engine.front_end_accel)
    if not skip_reference:
        print(f"[ditto] reference: warm-up and {repeat} runs ...", file=sys.stderr, flush=True)
        with official_cudnn_defaults():
            out["reference"] = reference_figures(engine, packet, seconds, repeat, workdir, steps, salt)
        out["cold_start"] = cold_start_figures(packet, Path(out["reference"]["source_pickle"]), max(5, 5 * repeat), official_repeat)
        for fig in out["variants"].values():
            fig["ratio_dense_fps"] = fig["dense_fps"] / out["reference"]["dense_fps"]
        out["ratios"] = {
            "dense_fps": out["ours"]["dense_fps"] / out["reference"]["dense_fps"],
            "ttff": out["reference"]["ttff_ms"] / out["ours"]["ttff_ms"],
            "cold_start": out["cold_start"]["ratio"],
            "lmdm": out["lmdm"]["speedup"],
        }
    fl = flops_per_frame(engine)
    out["flops_per_frame"] = fl
    peak = peak_tflops if peak_tflops else (H200_PEAK_TFLOPS if device.type == "cuda" else None)
    if peak:
        out["peak_tflops"] = peak
        for fig in [*out["variants"].values(), out.get("reference")]:
            if fig:
                fig["pct_of_peak"] = 100 * fig["dense_fps"] * fl["total_gflop"] / (peak * 1e3)
        if "stride" in out:  # FLOPs actually spent: network frames / frames of the dense figure
            st = out["stride"]
            p = st["psnr"][st["mode"]]
            st["ours"]["pct_of_peak"] = (100 * st["ours"]["dense_fps"] * fl["total_gflop"] * p["network_frames"]
                                         / st["psnr"]["frames"] / (peak * 1e3))
    if device.type == "cuda":
        out["gpu_peak_mem_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
    return out


def print_table(sec: dict[str, Any]) -> None:
    o, r, lm = sec["ours"], sec.get("reference"), sec["lmdm"]
    cs = sec.get("cold_start")
    w, h = sec["avatar"]["size"]

    def row(name: str, a: str, b: str = "-", ratio: str = "-") -> None:
        print(f"| {name} | {a} | {b} | {ratio} |")

    dev_opts = f", developer options {sec['developer_options']}" if sec["developer_options"] else ""
    print(f"\nDitto on {sec['device']} ({sec['weights']}, {sec['steps']} DDIM steps{', torch.compile' if sec['compile'] else ''}"
          f"{dev_opts}), avatar {sec['avatar']['frames']} frames {w}x{h}, {o['frames']} output frames")
    print("| figure | ours | reference-style | ratio |")
    print("|---|---|---|---|")
    row(f"dense fps, NV12 {w}x{h}", f"{o['dense_fps']:.1f}", f"{r['dense_fps']:.1f}" if r else "-",
        f"{sec['ratios']['dense_fps']:.2f}x" if r else "-")
    row("time to first frame, ms", f"{o['ttff_ms']:.1f}", f"{r['ttff_ms']:.1f}" if r else "-",
        f"{sec['ratios']['ttff']:.1f}x" if r else "-")
    row(f"LMDM {lm['steps']}-step 80-frame window ({lm.get('accel', 'eager')}), motion fps", f"{lm['ours_fps']:.0f} ({lm['ours_ms']:.1f} ms)",
        f"{lm['two_pass_fps']:.0f} ({lm['two_pass_ms']:.1f} ms)", f"{lm['speedup']:.2f}x")
    if "ours_eager_fps" in lm:
        row(f"LMDM {lm['steps']}-step window, eager, motion fps", f"{lm['ours_eager_fps']:.0f} ({lm['ours_eager_ms']:.1f} ms)")
    for b, v in lm.get("batched", {}).items():
        row(f"LMDM {lm['steps']}-step, {b} streams' windows in one batch, motion fps", f"{v['fps']:.0f} ({v['ms']:.1f} ms)")
    if cs:
        row("avatar cold start, ms", f"{cs['ours_ms']:.3f}", f"{cs['official_ms']:.1f}", f"{cs['ratio']:.0f}x")
    stream_rows(row, o)
    st = sec.get("stride")
    if st:
        so, k = st["ours"], st["stride"]
        print(f"| **stride {k}** ({st['mode']}): fps, NV12 {w}x{h} | {so['dense_fps']:.1f} | dense (ours) {o['dense_fps']:.1f} | "
              f"{so['dense_fps'] / o['dense_fps']:.2f}x |")
        row(f"stride {k}: time to first frame, ms / segment -> MP4, s", f"{so['ttff_ms']:.1f} / {so['segment_mp4_s']:.2f}")
        if "warm_up_s" in st:
            mem = f", {st['engine_memory_gb']:.1f} GB allocated by it ({st['reserved_gb']:.1f} GB reserved)" if "engine_memory_gb" in st else ""
            row(f"stride {k}: warm-up s (both runners' graphs){', memory' if mem else ''}", f"{st['warm_up_s']:.1f}{mem}")
        if "device_rows" in st:
            stream_rows(lambda label, *v: row(f"stride {k}, rows read on the device: {label}", *v), st["device_rows"])
        ps = st["psnr"]
        for mode in [m for m in ps if m != "frames"]:
            p = ps[mode]
            row(f"stride {k} PSNR vs dense, {mode}: all / in-between / keyframes, dB",
                f"{p['psnr_all_db']:.2f} / {p['psnr_inbetween_db']:.2f} / {p['psnr_keyframes_db']:.1f}",
                f"{p['network_frames']} of {ps['frames']} frames through warp + decode")
    fl = sec["flops_per_frame"]
    row("warp + decoder GFLOP/frame", f"{fl['total_gflop']:.0f} (warp {fl['warp_gflop']:.0f}, decoder {fl['decoder_gflop']:.0f}; "
        f"executed by the engine's regrouped networks: {fl.get('executed_gflop', float('nan')):.0f})")
    for spec, v in sec.get("variants", {}).items():
        row(f"variant {spec}: dense fps / TTFF ms", f"{v['dense_fps']:.1f} / {v['ttff_ms']:.1f}", "-",
            f"{v['ratio_dense_fps']:.2f}x" if "ratio_dense_fps" in v else "-")
    if "pct_of_peak" in o:
        row(f"% of {sec['peak_tflops']:.0f} TFLOP/s peak", f"{o['pct_of_peak']:.1f}", f"{r['pct_of_peak']:.1f}" if r else "-")
    print(f"engine load {sec['engine_load_s']:.1f} s, Ditto prebake {sec['ditto_prebake_s']:.2f} s, layer upload "
          f"{sec['layer_upload_s']:.2f} s" + (f", GPU peak memory {sec['gpu_peak_mem_gb']:.1f} GB" if "gpu_peak_mem_gb" in sec else ""))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1080x1920", help="avatar output size WxH (default 1080x1920)")
    ap.add_argument("--device", default=None, help="cuda, cuda:1, cpu (default: cuda if available)")
    ap.add_argument("--seconds", type=float, default=6.6, help="audio length used")
    ap.add_argument("--chunk", type=int, default=32, help="frames per chunk for the dense runs")
    ap.add_argument("--steps", type=int, default=4, help="DDIM steps (both paths)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--official-repeat", type=int, default=3)
    ap.add_argument("--max-frames", type=int, default=750, help="avatar frames used")
    ap.add_argument("--compile", action="store_true", help="torch.compile warp + decoder (our path)")
    ap.add_argument("--stride-accel", default=None, help="accel of the stride engines (default: the first variant's)")
    add_engine_config_args(ap)
    ap.add_argument("--salt", type=int, default=0)
    ap.add_argument("--peak-tflops", type=float, default=None)
    ap.add_argument("--skip-reference", action="store_true")
    ap.add_argument("--stride", type=int, default=1, help="also run DittoEngine(stride=K): fps and PSNR vs dense")
    ap.add_argument("--stride-mode", default="mask", help="interpolation of the stride run (mask, heatmap, blend, nearest)")
    ap.add_argument("--stride-psnr-modes", default="mask,heatmap,blend,nearest",
                    help="modes whose PSNR vs dense is measured (cheap: keyframes only)")
    ap.add_argument("--stride-device-rows", action="store_true",
                    help="A/B: the stride MP4 figures again with rows read on the device (one sync per chunk)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true", help="CPU smoke test (see the module doc)")
    args = ap.parse_args(argv)
    if args.quick:
        args.size, args.repeat, args.max_frames, args.official_repeat, args.chunk = "256x448", 1, 4, 1, 4
        args.device = args.device or "cpu"
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    size = tuple(int(v) for v in args.size.split("x")) if args.size else None
    work = Path(args.workdir or tempfile.mkdtemp(prefix="ditto-bench-"))
    out: dict[str, Any] = {"machine": machine(), "args": vars(args),
                           "command": " ".join(["python -m benchmarks.ditto_bench", *(argv if argv is not None else sys.argv[1:])])}
    print(f"[ditto] workdir {work}; prebaking the yongen avatar at {args.size} ...", file=sys.stderr, flush=True)
    t = time.perf_counter()
    packet = avatar(media("yongen.mp4"), "yongen", size, work / "avatars", max_frames=args.max_frames)
    out["avatar_prebake_s"] = time.perf_counter() - t
    sec = run_section(packet, device, args.seconds, args.chunk, args.repeat, work, args.quick, steps=args.steps,
                      compile=args.compile, salt=args.salt, official_repeat=args.official_repeat,
                      peak_tflops=args.peak_tflops, skip_reference=args.skip_reference, stride=args.stride,
                      stride_mode=args.stride_mode, variants=variant_list(args.variants), mp4=args.mp4, stride_accel=args.stride_accel,
                      stride_device_rows=args.stride_device_rows, stride_psnr_modes=list(dict.fromkeys([args.stride_mode, *filter(None, args.stride_psnr_modes.split(","))])))
    out["ditto"] = sec
    print_table(sec)
    write_json(args.json, out)
    if args.json:
        print(f"wrote {args.json}")
    return out


if __name__ == "__main__":
    main()
