"""MuseTalk: our streaming pipeline vs the reference-style realtime pipeline, one process, one GPU.

    python -m benchmarks.musetalk_bench [--size 1080x1920] [--seconds 6.6] [--variants cudagraph,compile+cudagraph]
                                        [--json out.json]
    python -m benchmarks.musetalk_bench --quick          # CPU smoke test: tiny sizes, tiny test networks

Both paths use the same seeded random weights (speed does not depend on weight values) and the same
avatar (the yongen loop prebaked at --size, with landmarks carried to GPU machines by
benchmarks/prepare_carry.py):

* ours, once per --variants entry (`ACCEL[:nchw]`: the engine's `accel` mode, `:nchw` = without
  channels_last; the first entry is the one compared with the reference): `stream_generator` (incremental Whisper features + UNet + VAE decode + grid resize + NV12
  splice on the device), warm; dense fps with frames copied to the CPU (the default) and kept on
  the device, time to first frame (audio available, chunk of --ttff-chunk frames), the segment to an
  MP4 with audio on disk, and the render stage alone (UNet + decode + resize, batch --chunk);
* reference: benchmarks/musetalk_reference.py (official avatar folder, whole-file features, eager
  fp16 batches of 20, CPU blending thread with PIL), warm;
* avatar cold start of both layouts (packet open vs PNG/pickle/latents.pt load), FLOPs per frame
  (UNet + VAE decode, counted by torch's FlopCounterMode) and the share of the GPU's peak.

`run_section(...)` is what benchmarks/run.py calls; `main()` is the standalone command.
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

from .common import (add_engine_config_args, avatar, close_variant, fallback_count, kernel_choices, live_ttff, machine, media, median,
                     official_cudnn_defaults, parse_variant, segment_mp4_figures, stream_rows, sync, timed,
                     variant_list, weights_channels_last, write_json)

H200_PEAK_TFLOPS = 776.0  # measured dense bf16/fp16 peak of our H200 (BRIEF section 4)


def segment_wav(source: Path, seconds: float | None, dest: Path) -> Path:
    """The first `seconds` of `source` as a WAV (both pipelines read the same file)."""
    from newsstudio.media.audio import Audio, load_audio, write_wav

    a = load_audio(source)
    n = a.num_samples if not seconds else min(a.num_samples, int(round(seconds * a.sample_rate)))
    return write_wav(dest, Audio(np.ascontiguousarray(a.samples[:, :n]), a.sample_rate))


@torch.no_grad()
def flops_per_frame(models, device: torch.device) -> dict[str, float]:
    """FLOPs of one frame's UNet step and VAE decode (batch 1), counted on the real modules; also
    what the decoder executes with phase upsampling (% of peak is stated on the model's FLOPs)."""
    from torch.utils.flop_counter import FlopCounterMode

    from newsstudio.accel.upsample_conv import with_phase_upsampling

    p = next(models.unet.parameters())
    lat = torch.zeros(1, 8, 32, 32, device=device, dtype=p.dtype)
    prompts = torch.zeros(1, 50, 384, device=device, dtype=p.dtype)
    t = torch.zeros(1, dtype=torch.long, device=device)
    with FlopCounterMode(display=False) as fc:
        pred = models.unet(lat, t, encoder_hidden_states=models.pe(prompts)).sample
    unet = fc.get_total_flops()
    with FlopCounterMode(display=False) as fc:
        models.vae.decode(pred).sample
    vae = fc.get_total_flops()
    phase_decoder = with_phase_upsampling(models.vae.decoder)[0]
    with FlopCounterMode(display=False) as fc:
        phase_decoder(models.vae.post_quant_conv(pred))
    return {"unet_gflop": unet / 1e9, "vae_decode_gflop": vae / 1e9, "total_gflop": (unet + vae) / 1e9,
            "vae_decode_phase_upsampling_gflop": fc.get_total_flops() / 1e9}


def ours_figures(engine, packet, audio_path: Path, fps: int, chunk: int, ttff_chunk: int, repeat: int,
                 out_dir: Path, ttff_repeat: int = 5, mp4: str = "veryfast") -> dict[str, Any]:
    from newsstudio.media.audio import load_audio
    from newsstudio.stream import stream_generator

    dev = engine.device

    def dense(on_device: bool) -> tuple[int, float]:
        sync(dev)
        t0 = time.perf_counter()
        n = 0
        for ch in stream_generator(engine, packet, audio_path, fps=fps, chunk_frames=chunk, output="nv12",
                                   keep_on_device=on_device):
            n += ch["num_frames"]
        sync(dev)
        return n, time.perf_counter() - t0

    def ttff() -> float:
        sync(dev)
        t0 = time.perf_counter()
        gen = stream_generator(engine, packet, audio_path, fps=fps, chunk_frames=ttff_chunk, output="nv12")
        first = next(gen)
        assert first["num_frames"] > 0
        dt = time.perf_counter() - t0  # frames are on the CPU (the runner waited for the copy)
        gen.close()
        return dt

    t = time.perf_counter()
    n_warm, _ = dense(False)  # warm-up: compile (if any), avatar upload, allocator, cuDNN plans
    dense(True)
    ttff()
    warm_s = time.perf_counter() - t
    cpu_runs = [dense(False) for _ in range(repeat)]
    dev_runs = [dense(True) for _ in range(repeat)]
    ttffs = [ttff() for _ in range(max(1, ttff_repeat))]
    audio = load_audio(audio_path)

    def render_stage() -> float:
        """Frames/s of engine.render alone (UNet + VAE decode + resize into the boxes), batch `chunk`."""
        layer = engine.load_avatar(packet)
        idx = torch.arange(chunk, device=dev) % packet.n_frames
        prompts = engine.idle_driving(chunk).contiguous()
        ts = timed(lambda: engine.render(layer, prompts, idx), dev, repeat=10, warmup=2)
        return chunk / median(ts)

    render_fps = render_stage()
    n = cpu_runs[0][0]
    assert n == n_warm and all(r[0] == n for r in cpu_runs + dev_runs), "frame counts differ between runs"
    return {
        "frames": n,
        "dense_fps": median([r[0] / r[1] for r in cpu_runs]),
        "dense_fps_all": [r[0] / r[1] for r in cpu_runs],
        "dense_fps_on_device": median([r[0] / r[1] for r in dev_runs]),
        "ttff_ms": median(ttffs) * 1e3,
        "ttff_ms_all": [x * 1e3 for x in ttffs],
        **segment_mp4_figures(engine, packet, audio, fps, chunk, out_dir / "musetalk_segment.mp4", mp4, repeat // 2),
        "render_stage_fps": render_fps,
        "live_ttff": live_ttff(engine, packet, audio, fps, ttff_chunk),
        "warmup_s": warm_s,
        "chunk": chunk,
        "ttff_chunk": ttff_chunk,
    }


def reference_figures(engine, packet, audio_path: Path, warm_audio: Path, fps: int, batch: int, repeat: int,
                      workdir: Path) -> dict[str, Any]:
    from .cold_start import load_official
    from .musetalk_reference import build_reference_avatar, run_reference

    t = time.perf_counter()
    folder = build_reference_avatar(packet, workdir / "official" / packet.id)
    build_s = time.perf_counter() - t
    av = load_official(folder)
    run_reference(engine.models, folder, warm_audio, fps, batch_size=batch, avatar=av)  # warm-up
    runs = [run_reference(engine.models, folder, audio_path, fps, batch_size=batch, avatar=av) for _ in range(repeat)]
    best = runs[len(runs) // 2]
    return {
        **best.to_json(),
        "dense_fps": median([r.fps for r in runs]),
        "dense_fps_all": [r.fps for r in runs],
        "ttff_ms": median([r.first_frame_s for r in runs]) * 1e3,
        "batch": batch,
        "layout_build_s": build_s,
        "folder": str(folder),
    }


def cold_start_figures(packet, folder: Path, repeat: int, official_repeat: int) -> dict[str, Any]:
    from .cold_start import compare, load_official

    return compare(packet.path, lambda: load_official(folder), repeat, official_repeat)


def run_section(packet, device, seconds: float | None, chunk: int, repeat: int, workdir: Path, quick: bool = False, *,
                audio: Path | None = None, fps: int = 25, compile: bool = False, salt: int = 0, ttff_chunk: int = 4,
                ref_batch: int = 20, official_repeat: int = 3, peak_tflops: float | None = None,
                skip_reference: bool = False, variants: list[str] | None = None, mp4: str = "veryfast") -> dict[str, Any]:
    """All MuseTalk figures for one avatar packet on one device (see the module docstring)."""
    from newsstudio.engines.musetalk.engine import TINY_UNET_CONFIG, TINY_VAE_CONFIG, MuseTalkEngine

    device = torch.device(device)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    tiny = {"unet_config": TINY_UNET_CONFIG, "vae_config": TINY_VAE_CONFIG} if quick else {}
    out: dict[str, Any] = {"device": str(device), "weights": f"random (salt {salt})", "tiny_test_networks": quick,
                           "compile": compile, "avatar": {"id": packet.id, "frames": packet.n_frames, "size": list(packet.size)}}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    if not variants:
        variants = ["compile+cudagraph" if compile else ("cudagraph" if device.type == "cuda" else "eager")]
    specs = [parse_variant(v, "musetalk") for v in variants]
    out["variants_order"] = list(variants)
    t = time.perf_counter()
    engine = MuseTalkEngine(device, weights="random", salt=salt, **specs[0], **tiny)
    sync(device)
    out["engine_load_s"] = time.perf_counter() - t
    t = time.perf_counter()
    packet = engine.prebake(packet, progress=False)
    sync(device)
    out["musetalk_prebake_s"] = time.perf_counter() - t
    out["prebake_meta"] = {k: v for k, v in packet.engine_meta("musetalk").items() if k not in ("box_sources",)}
    t = time.perf_counter()
    engine.load_avatar(packet)
    sync(device)
    out["layer_upload_s"] = time.perf_counter() - t

    src = audio or media("speech.wav")
    audio_path = segment_wav(src, seconds, workdir / "musetalk_audio.wav")
    warm_audio = segment_wav(src, 1.0, workdir / "musetalk_warm.wav")
    out["audio"] = {"source": str(src), "seconds": seconds}

    out["variants"] = {}
    for k, (spec, kw) in enumerate(zip(variants, specs)):
        if k:
            engine = MuseTalkEngine(device, weights="random", salt=salt, **kw, **tiny)
        print(f"[musetalk] ours ({spec}): warm-up and {repeat} dense runs ...", file=sys.stderr, flush=True)
        forget_choices()  # this variant's own per-shape kernel choices, recorded below
        before = fallback_count()
        warm_s = engine.warm_up()  # every batch bucket, as a server does: no capture inside a timed run
        fig = ours_figures(engine, packet, audio_path, fps, chunk, ttff_chunk, repeat, workdir,
                           ttff_repeat=1 if quick else 5, mp4=mp4)
        fig.update(accel=engine.accel, channels_last=weights_channels_last(engine.models.vae), cudnn_benchmark=engine.cudnn_benchmark,
                   compile_s=engine._face_runner.compile_seconds, warm_up_s=warm_s)
        fig.update(triton_convs=engine.triton_convs, kernel_choices=kernel_choices())
        out["variants"][spec] = fig
        remark = close_variant(engine, fig, before, more=k + 1 < len(variants))
        print(f"[musetalk] ours ({spec}): {fig['dense_fps']:.1f} fps, render stage {fig['render_stage_fps']:.1f} fps, "
              f"TTFF {fig['ttff_ms']:.1f} ms{remark}", file=sys.stderr, flush=True)
    out["ours"] = out["variants"][variants[0]]
    if not skip_reference:
        print(f"[musetalk] reference: official layout, warm-up and {repeat} runs ...", file=sys.stderr, flush=True)
        with official_cudnn_defaults():
            out["reference"] = reference_figures(engine, packet, audio_path, warm_audio, fps, ref_batch, repeat, workdir)
        out["cold_start"] = cold_start_figures(packet, Path(out["reference"]["folder"]), max(5, 5 * repeat), official_repeat)
        for fig in out["variants"].values():
            fig["ratio_dense_fps"] = fig["dense_fps"] / out["reference"]["dense_fps"]
        out["ratios"] = {
            "dense_fps": out["ours"]["dense_fps"] / out["reference"]["dense_fps"],
            "ttff": out["reference"]["ttff_ms"] / out["ours"]["ttff_ms"],
            "cold_start": out["cold_start"]["ratio"],
        }
    fl = flops_per_frame(engine.models, device)
    out["flops_per_frame"] = fl
    peak = peak_tflops if peak_tflops else (H200_PEAK_TFLOPS if device.type == "cuda" else None)
    if peak:
        out["peak_tflops"] = peak
        for fig in out["variants"].values():
            fig["pct_of_peak"] = 100 * fig["dense_fps"] * fl["total_gflop"] / (peak * 1e3)
        if "reference" in out:
            out["reference"]["pct_of_peak"] = 100 * out["reference"]["dense_fps"] * fl["total_gflop"] / (peak * 1e3)
    if device.type == "cuda":
        out["gpu_peak_mem_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
    return out


def print_table(sec: dict[str, Any]) -> None:
    o, r = sec["ours"], sec.get("reference")
    cs = sec.get("cold_start")
    w, h = sec["avatar"]["size"]

    def row(name: str, a: str, b: str = "-", ratio: str = "-") -> None:
        print(f"| {name} | {a} | {b} | {ratio} |")

    print(f"\nMuseTalk on {sec['device']} ({sec['weights']}{', TINY test networks' if sec['tiny_test_networks'] else ''}"
          f"{', torch.compile' if sec['compile'] else ''}), avatar {sec['avatar']['frames']} frames {w}x{h}, "
          f"{o['frames']} output frames")
    print("| figure | ours | reference-style | ratio |")
    print("|---|---|---|---|")
    row(f"dense fps, NV12 {w}x{h} to CPU", f"{o['dense_fps']:.1f}", f"{r['dense_fps']:.1f}" if r else "-",
        f"{sec['ratios']['dense_fps']:.2f}x" if r else "-")
    row("dense fps, NV12 kept on device", f"{o['dense_fps_on_device']:.1f}")
    row("time to first frame, ms", f"{o['ttff_ms']:.1f} (chunk {o['ttff_chunk']})", f"{r['ttff_ms']:.1f}" if r else "-",
        f"{sec['ratios']['ttff']:.1f}x" if r else "-")
    if cs:
        row("avatar cold start, ms", f"{cs['ours_ms']:.3f}", f"{cs['official_ms']:.1f}", f"{cs['ratio']:.0f}x")
    stream_rows(row, o)
    for spec, v in sec.get("variants", {}).items():
        row(f"variant {spec}: dense fps / render stage fps / TTFF ms", f"{v['dense_fps']:.1f} / {v['render_stage_fps']:.1f} / "
            f"{v['ttff_ms']:.1f}", "-", f"{v['ratio_dense_fps']:.2f}x" if "ratio_dense_fps" in v else "-")
    fl = sec["flops_per_frame"]
    row("UNet + VAE decode GFLOP/frame", f"{fl['total_gflop']:.1f} (UNet {fl['unet_gflop']:.1f}, VAE {fl['vae_decode_gflop']:.1f}; "
        f"executed with phase upsampling: VAE {fl.get('vae_decode_phase_upsampling_gflop', float('nan')):.1f})")
    if "pct_of_peak" in o:
        row(f"% of {sec['peak_tflops']:.0f} TFLOP/s peak", f"{o['pct_of_peak']:.1f}", f"{r['pct_of_peak']:.1f}" if r else "-")
    print(f"engine load {sec['engine_load_s']:.1f} s, MuseTalk prebake {sec['musetalk_prebake_s']:.2f} s, layer upload "
          f"{sec['layer_upload_s']:.2f} s, latents fp16 rel. error {sec['prebake_meta']['latents_fp16_relerr']:.2e}"
          + (f", GPU peak memory {sec['gpu_peak_mem_gb']:.1f} GB" if "gpu_peak_mem_gb" in sec else ""))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1080x1920", help="avatar output size WxH (default 1080x1920)")
    ap.add_argument("--device", default=None, help="cuda, cuda:1, cpu (default: cuda if available)")
    ap.add_argument("--audio", default=None, help="speech file (default ../shared/media/speech.wav or .carry)")
    ap.add_argument("--seconds", type=float, default=6.6, help="audio length used (0 = whole file)")
    ap.add_argument("--fps", type=int, default=25)
    ap.add_argument("--chunk", type=int, default=32, help="frames per chunk for the dense runs")
    ap.add_argument("--ttff-chunk", type=int, default=4, help="frames per chunk for time to first frame")
    ap.add_argument("--ref-batch", type=int, default=20, help="reference batch size (official: 20)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--official-repeat", type=int, default=3, help="loads of the official avatar layout timed")
    ap.add_argument("--max-frames", type=int, default=750, help="avatar frames used")
    ap.add_argument("--compile", action="store_true", help="torch.compile the UNet and VAE decoder (our path)")
    add_engine_config_args(ap)
    ap.add_argument("--salt", type=int, default=0)
    ap.add_argument("--peak-tflops", type=float, default=None, help=f"GPU peak for the %% column (default {H200_PEAK_TFLOPS:g} on CUDA)")
    ap.add_argument("--skip-reference", action="store_true")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json", default=None, help="write all figures to this JSON file")
    ap.add_argument("--quick", action="store_true", help="CPU smoke test: 256x448, 4 avatar frames, 0.4 s audio, tiny networks")
    args = ap.parse_args(argv)
    if args.quick:
        args.size, args.seconds, args.repeat, args.max_frames = "256x448", 0.4, 1, 4
        args.official_repeat, args.chunk = 1, 4
        args.device = args.device or "cpu"
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    size = tuple(int(v) for v in args.size.split("x")) if args.size else None
    work = Path(args.workdir or tempfile.mkdtemp(prefix="musetalk-bench-"))
    out: dict[str, Any] = {"machine": machine(), "args": vars(args), "command": " ".join(["python -m benchmarks.musetalk_bench", *(argv if argv is not None else sys.argv[1:])])}
    print(f"[musetalk] workdir {work}; prebaking the yongen avatar at {args.size} ...", file=sys.stderr, flush=True)
    t = time.perf_counter()
    packet = avatar(media("yongen.mp4"), "yongen", size, work / "avatars", max_frames=args.max_frames)
    out["avatar_prebake_s"] = time.perf_counter() - t
    sec = run_section(packet, device, args.seconds or None, args.chunk, args.repeat, work, args.quick,
                      audio=Path(args.audio) if args.audio else None, fps=args.fps, compile=args.compile, salt=args.salt,
                      ttff_chunk=args.ttff_chunk, ref_batch=args.ref_batch, official_repeat=args.official_repeat,
                      peak_tflops=args.peak_tflops, skip_reference=args.skip_reference,
                      variants=variant_list(args.variants), mp4=args.mp4)
    out["musetalk"] = sec
    print_table(sec)
    write_json(args.json, out)
    if args.json:
        print(f"wrote {args.json}")
    return out


if __name__ == "__main__":
    main()
