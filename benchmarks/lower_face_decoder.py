"""Decoding only the face rows MuseTalk's blend uses: speed and error next to the full decoder.

    python -m benchmarks.lower_face_decoder [--batch 32] [--first-rows 96,104,112] [--json out.json]

Rows (one process, seeded weights, the engine's dtype):

* ``engine``: the decoder exactly as the engine runs it on CUDA (phase upsampling, channels-last,
  the NHWC norms with their SiLU), compiled like the engine and replayed from a CUDA graph;
* ``full``: the same without the NHWC norms (PyTorch's GroupNorm, as the cropped decoder uses);
* ``lower R``: `LowerFaceDecoder` for output rows ``[R, 256)`` over that decoder, the skipped rows'
  GroupNorm statistics an input of the graph; ``engine lower R`` (CUDA): the same over the engine's
  decoder (NHWC norms: the row-offset statistics kernel and ``normalise_groups``), what the engine runs.

Error (per first row): faces of the built-in portrait rendered with speech prompts, decoded whole
and by the lower decoder with the upper statistics recorded from the same face rendered with the
silence prompt (what an avatar's prebake would store); PSNR over the rows kept, on the 0-255 scale
the engine rounds to, and the same with the statistics of the same latent (rounding only). Seeded
weights are a hard case: their upper face changes with the audio (real MuseTalk regenerates it from
the unmasked reference), so a third column stands in for a model that keeps the upper face: the
speech latent's lower half under the silence latent's upper half. ``--avatar PACKET``: also what a
viewer sees, the change to a real avatar's blended frames (alpha x face difference) over the pixels
the blend touches. ``--device cpu --tiny`` is a smoke run of the script.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from typing import Any

import torch

from .common import call_times_ms, cuda_graphed, machine, write_json
from .levers import psnr


def build(device: str, tiny: bool, nhwc_norms: bool, first_face_row: int = 0):
    from newsstudio.engines.musetalk.engine import TINY_UNET_CONFIG, TINY_VAE_CONFIG, MuseTalkEngine

    kw: dict[str, Any] = dict(weights="random", accel="eager", channels_last=device == "cuda", nhwc_norms=nhwc_norms,
                              first_face_row=first_face_row)
    if tiny:
        kw.update(unet_config=TINY_UNET_CONFIG, vae_config=TINY_VAE_CONFIG)
    return MuseTalkEngine(device, **kw)


def decoder_inputs(eng, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(speech, silence) decoder inputs ``[n, 4, 32, 32]`` of the built-in portrait's faces: the
    same faces with prompts of the built-in speech and with the silence prompt."""
    latents, prompts = eng.calibration_batch(n + 1)
    latents, prompts = latents[1:], prompts[1:]  # the calibration batch's first prompt is silence
    idle = eng.idle_prompt()[None].to(prompts.device, prompts.dtype).expand_as(prompts)
    with torch.inference_mode():
        def z(p):
            pred = eng.models.unet(latents, eng._t0, encoder_hidden_states=eng.models.pe(p)).sample
            return eng._post_quant_conv(pred * eng._scale)
        return z(prompts), z(idle)


def accuracy(eng, first_rows: list[int], n: int) -> list[dict[str, Any]]:
    from newsstudio.engines.musetalk.lower_face_decoder import LowerFaceDecoder
    from newsstudio.engines.musetalk.vae import decoded_levels

    speech, silence = decoder_inputs(eng, n)
    rows = []
    with torch.inference_mode():
        for r in first_rows:
            lower = LowerFaceDecoder(eng._vae_decoder, r)
            full, own_stats = lower.record_upper_stats(speech)
            _, idle_stats = lower.record_upper_stats(silence)
            ref = decoded_levels(full)[:, :, r:]
            # A model that keeps the upper face, as a trained MuseTalk does: the speech latent's
            # lower half under the silence latent's upper half (latent row h/2 = face row 128).
            kept = speech.clone()
            kept[:, :, : kept.shape[2] // 2] = silence[:, :, : kept.shape[2] // 2]
            kept_ref = decoded_levels(lower.record_upper_stats(kept)[0])[:, :, r:]
            # where the error comes from: the full-resolution stage's norms with their own statistics
            last_stage = [i for i, v in enumerate(lower.plan.norm_starts) if v >= lower.plan.norm_starts[-1] // 2 + 1]
            mixed_stats = idle_stats.clone()
            mixed_stats[:, last_stage] = own_stats[:, last_stage]
            rows.append({"first_row": r, "norms_with_stats": len(lower.plan.norm_starts),
                         "psnr_db_own_stats_in_last_stage": round(psnr(decoded_levels(lower(speech, mixed_stats)), ref), 2),
                         "psnr_db_silence_stats": round(psnr(decoded_levels(lower(speech, idle_stats)), ref), 2),
                         "psnr_db_own_stats": round(psnr(decoded_levels(lower(speech, own_stats)), ref), 2),
                         "psnr_db_upper_latent_kept": round(psnr(decoded_levels(lower(kept, idle_stats)), kept_ref), 2)})
    return rows


def blended_error(args, first_rows: list[int]) -> list[dict[str, Any]]:
    """What a viewer sees: frames of a real avatar rendered whole and with rows R-255 decoded, with
    prompts of the built-in speech; PSNR of the change each makes to the frame (alpha x face) over
    the pixels the blend touches."""
    from newsstudio.avatar.packet import PacketError, open_packet
    from newsstudio.builtin import builtin_audio
    from newsstudio.engines.musetalk.audio_features import SAMPLE_RATE, audio_prompts
    from newsstudio.media.audio import load_audio

    whole = build(args.device, args.tiny, nhwc_norms=False)
    packet = whole.load_avatar(open_packet(args.avatar)).packet  # prebakes MuseTalk's arrays if they are missing
    layer = whole.load_avatar(packet)
    n = min(args.avatar_frames, layer.n_frames)
    idx = torch.linspace(0, layer.n_frames - 1, n).round().long()
    speech = load_audio(builtin_audio("builtin:hello")).mono().resampled(SAMPLE_RATE).samples[0]
    with torch.inference_mode():
        spoken = audio_prompts(whole.models.whisper_encoder, speech, 25)
    prompts = spoken.index_select(0, torch.linspace(0, spoken.shape[0] - 1, n).round().long().to(spoken.device))
    alpha = layer.masks.index_select(0, idx.to(layer.masks.device))[..., None]
    ref = whole.render(layer, prompts, idx)
    rows = []
    for r in first_rows:
        lower = build(args.device, args.tiny, nhwc_norms=False, first_face_row=r)
        try:
            lower_layer = lower.load_avatar(packet)
        except PacketError as e:  # the avatar's blend shows rows above r: the engine refuses it
            rows.append({"first_row": r, "avatar": str(args.avatar), "refused": str(e)})
            continue
        got = lower.render(lower_layer, prompts, idx)
        change = (alpha * (got - ref)).double()
        shown = (alpha > 0).expand_as(change)
        mse = float((change[shown] ** 2).mean())
        rows.append({"first_row": r, "avatar": str(args.avatar), "frames": n,
                     "psnr_db_blended": round(10 * math.log10(255.0 ** 2 / mse), 2) if mse > 0 else float("inf"),
                     "max_level_change": round(float(change.abs().max()), 1)})
    return rows


def flops(eng, first_rows: list[int]) -> dict[str, float]:
    from torch.utils.flop_counter import FlopCounterMode

    from newsstudio.engines.musetalk.lower_face_decoder import LowerFaceDecoder

    dec = eng._vae_decoder
    z = torch.zeros((1, dec.conv_in.in_channels, 32, 32), device=eng.device, dtype=eng.dtype)
    out = {}
    with torch.inference_mode():
        for r in [0] + first_rows:
            fn = dec if r == 0 else LowerFaceDecoder(dec, r)
            args = (z,) if r == 0 else (z, torch.zeros((1, len(fn.plan.norm_starts), fn.groups, 2), device=z.device))
            with FlopCounterMode(display=False) as fc:
                fn(*args)
            out["full" if r == 0 else f"lower {r}"] = round(fc.get_total_flops() / 1e9, 1)
    return out


def speed(name: str, fn, args: tuple[torch.Tensor, ...], device: str, iters: int, compile_mode: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    compiled = torch.compile(fn, mode=compile_mode if device == "cuda" else None, dynamic=False)
    with torch.inference_mode():
        compiled(*args)
        row: dict[str, Any] = {"variant": name, "compile_s": round(time.perf_counter() - t0, 1),
                               "ms_no_graph": round(statistics.median(call_times_ms(compiled, args, iters, device)), 3)}
        if device == "cuda":
            row["ms_graphed"] = round(statistics.median(call_times_ms(cuda_graphed(compiled, args), args, iters, device)), 3)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--first-rows", default="96,104,112")
    ap.add_argument("--faces", type=int, default=8, help="faces in the error measurement")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--compile-mode", default="max-autotune-no-cudagraphs")
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--avatar", default=None, help="an avatar packet: also the error in its blended frames")
    ap.add_argument("--avatar-frames", type=int, default=6, help="avatar frames rendered for that")
    ap.add_argument("--tiny", action="store_true", help="the test-size architecture (a smoke run of the script)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.device == "cuda":
        torch.backends.cudnn.benchmark = True
    from newsstudio.engines.musetalk.lower_face_decoder import LowerFaceDecoder

    first_rows = [int(r) for r in args.first_rows.split(",")]
    plain = build(args.device, args.tiny, nhwc_norms=False)
    result: dict[str, Any] = {"machine": machine(), "args": vars(args),
                              "command": "python -m benchmarks.lower_face_decoder " + " ".join(argv or sys.argv[1:])}
    result["gflop_per_face"] = flops(plain, first_rows)
    print("GFLOP per face:", result["gflop_per_face"], flush=True)
    result["accuracy"] = accuracy(plain, first_rows, args.faces)
    for a in result["accuracy"]:
        print(f"first row {a['first_row']}: PSNR {a['psnr_db_silence_stats']} dB with the silence face's statistics, "
              f"{a['psnr_db_own_stats']} dB with its own, {a['psnr_db_upper_latent_kept']} dB with the silence face's "
              f"statistics when the upper half of the latent is the silence face's; "
              f"{a['psnr_db_own_stats_in_last_stage']} dB with the silence face's except in the full-resolution stage "
              f"({a['norms_with_stats']} norms)", flush=True)
    if args.avatar:
        result["blended"] = blended_error(args, first_rows)
        for b in result["blended"]:
            if "refused" in b:
                print(f"first row {b['first_row']}: {b['refused']}", flush=True)
                continue
            print(f"first row {b['first_row']}: PSNR {b['psnr_db_blended']} dB of the blended change over the pixels "
                  f"the blend touches, {b['frames']} frames of {b['avatar']} (largest change {b['max_level_change']} levels)",
                  flush=True)
    rows = []
    if not args.skip_speed:
        dec = plain._vae_decoder
        g = torch.Generator(args.device).manual_seed(0)
        z = torch.randn((args.batch, dec.conv_in.in_channels, 32, 32), generator=g, device=args.device, dtype=plain.dtype)
        if args.device == "cuda":
            z = z.contiguous(memory_format=torch.channels_last)
            engine_dec = build(args.device, args.tiny, nhwc_norms=True)._vae_decoder
            variants = [("engine", engine_dec, (z,))]
        else:
            variants = []
        variants.append(("full", dec, (z,)))
        for r in first_rows:
            lower = LowerFaceDecoder(dec, r)
            with torch.inference_mode():
                _, stats = lower.record_upper_stats(z)
            variants.append((f"lower {r}", lower, (z, stats)))
            if args.device == "cuda":  # as the engine runs it: over the NHWC-norm decoder
                variants.append((f"engine lower {r}", LowerFaceDecoder(engine_dec, r), (z, stats)))
        for name, fn, fargs in variants:
            try:
                row = speed(name, fn, fargs, args.device, args.iters, args.compile_mode)
            except Exception as e:  # one variant failing still reports the others
                row = {"variant": name, "error": f"{type(e).__name__}: {e}"[:300]}
            rows.append(row)
            print("---", ", ".join(f"{k} {v}" for k, v in row.items()), flush=True)
    result["speed"] = rows
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
