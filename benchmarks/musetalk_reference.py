"""What a user of MuseTalk's official realtime script gets: the reference-style pipeline, re-created.

`scripts/realtime_inference.py` (TMElyralab/MuseTalk), as it runs for an avatar that was prepared
before (``preparation=False``):

* the avatar is a folder: ``full_imgs/%08d.png``, ``mask/%08d.png``, ``coords.pkl``,
  ``mask_coords.pkl``, ``latents.pt`` (built and loaded with benchmarks/cold_start.py's
  ``build_official_layout`` / ``load_official``; here the latents, boxes and masks are replaced by
  the packet's MuseTalk arrays so both pipelines work on the same faces);
* Whisper features for the WHOLE audio file first (HF feature extractor on the CPU, encoder on the
  GPU), cut into per-frame windows;
* eager fp16, batches of 20 (``datagen``): positional encoding -> UNet at t=0 -> VAE decode ->
  ``decode_latents`` (to the CPU, uint8 BGR);
* a blending thread (``process_frames``) that, per frame, resizes the face to its box with
  cv2 INTER_LINEAR and pastes it back with PIL (``get_image_blending`` = blend.composite_pil),
  optionally writing each frame as a PNG (``--skip_save_images`` off).

Unlike the script, every frame is blended (its thread drops the last one); that changes nothing
measurable. Frames come back as BGR uint8 arrays.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch

from newsstudio.engines.musetalk.audio_features import SAMPLE_RATE, whisper_hidden_states, window_prompts
from newsstudio.engines.musetalk.blend import composite_pil, expanded_crop_box
from newsstudio.engines.musetalk.frame_mapping import batch_slices
from newsstudio.engines.musetalk.vae import decode

from .cold_start import build_official_layout, load_official, save_official_index

OFFICIAL_BATCH = 20


def write_musetalk_material(packet, folder: Path) -> None:
    """Overwrite the layout's latents, boxes and masks with the packet's MuseTalk arrays, in the
    official formats (list of [1, 8, 32, 32] tensors; box lists; 2s x 2s mask PNGs), ping-pong
    cycled like the script saves them."""
    lat = packet.array("musetalk/latents")
    boxes = packet.array("musetalk/crop_boxes")
    rel = packet.array("musetalk/boxes")
    alpha = packet.array("musetalk/mask")
    n = packet.n_frames
    coords, mask_coords, latents = [], [], []
    mdir = folder / "mask"
    for old in mdir.glob("*.png"):
        old.unlink()
    for i in range(n):
        x1, y1, x2, y2 = (int(v) for v in boxes[i])
        cbox, s = expanded_crop_box((x1, y1, x2, y2))
        m = np.zeros((2 * s, 2 * s), np.uint8)
        rx1, ry1, rx2, ry2 = (int(v) for v in rel[i])
        a = alpha[i, ry1:ry2, rx1:rx2]
        # the face box inside the crop box (the crop box may stick out of the frame)
        ox, oy = x1 - cbox[0], y1 - cbox[1]
        sy0, sx0 = max(0, -oy), max(0, -ox)
        sy1, sx1 = min(a.shape[0], 2 * s - oy), min(a.shape[1], 2 * s - ox)
        if sy1 > sy0 and sx1 > sx0:
            m[oy + sy0 : oy + sy1, ox + sx0 : ox + sx1] = a[sy0:sy1, sx0:sx1]
        cv2.imwrite(str(mdir / f"{i:08d}.png"), m)
        coords.append((x1, y1, x2, y2))
        mask_coords.append(list(cbox))
        latents.append(torch.from_numpy(np.array(lat[i], np.float32))[None])
    save_official_index(folder, coords, mask_coords, latents)


def build_reference_avatar(packet, folder: Path) -> Path:
    """The official avatar folder for `packet` (which must hold MuseTalk arrays); reused if present."""
    folder = Path(folder)
    if not (folder / "latents.pt").is_file():
        build_official_layout(packet, folder)
        write_musetalk_material(packet, folder)
    return folder


def load_audio_16k(path: str | Path) -> np.ndarray:
    """``librosa.load(path, sr=16000)``: mono (channel mean), resampled with soxr (librosa's default)."""
    import soxr

    from newsstudio.media.audio import load_audio

    a = load_audio(path)
    mono = a.samples.mean(axis=0).astype(np.float32)
    if a.sample_rate != SAMPLE_RATE:
        mono = soxr.resample(mono, a.sample_rate, SAMPLE_RATE, quality="HQ").astype(np.float32)
    return mono


def decode_latents(vae, latents: torch.Tensor) -> np.ndarray:
    """The script's ``vae.decode_latents``: decode, ``(x/2 + 0.5).clamp(0, 1)`` on the GPU, then to
    the CPU as float32 NHWC, ``* 255``, round, uint8 and RGB -> BGR in numpy."""
    image = (decode(vae, latents) / 2 + 0.5).clamp(0, 1)
    image = image.detach().cpu().permute(0, 2, 3, 1).float().numpy()
    image = (image * 255).round().astype("uint8")
    return image[..., ::-1]


@dataclass
class ReferenceResult:
    frames: int
    total_s: float  # audio file -> last frame blended
    first_frame_s: float  # audio file -> first frame blended
    features_s: float  # whole-file Whisper features
    gpu_s: float  # UNet + VAE decode + copy to CPU, summed over batches (main thread)
    last_frame: np.ndarray | None = None
    kept: list[np.ndarray] = field(default_factory=list)

    @property
    def fps(self) -> float:
        return self.frames / self.total_s

    def to_json(self) -> dict[str, Any]:
        return {"frames": self.frames, "dense_fps": self.fps, "ttff_ms": self.first_frame_s * 1e3,
                "total_s": self.total_s, "features_s": self.features_s, "gpu_s": self.gpu_s}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def run_reference(models, avatar_folder: Path, audio_path: str | Path, fps: int = 25, *,
                  batch_size: int = OFFICIAL_BATCH, avatar: tuple | None = None, save_dir: Path | None = None,
                  keep_frames: bool = False) -> ReferenceResult:
    """One realtime-script inference over a prepared avatar; returns timings (and frames on request).

    models: a `MuseTalkModels` (eager; the script casts everything to fp16 on CUDA).
    avatar: the result of `load_official(avatar_folder)` if already loaded (the script loads the
    avatar once, before inference); loaded here otherwise (not timed).
    """
    device = models.device
    if avatar is None:
        avatar = load_official(Path(avatar_folder))
    latents, coords, frames, mask_coords, masks = avatar
    cycle = len(latents)
    if save_dir is not None:
        Path(save_dir).mkdir(parents=True, exist_ok=True)

    _sync(device)
    t0 = time.perf_counter()
    wave = load_audio_16k(audio_path)
    stacked = whisper_hidden_states(models.whisper_encoder, torch.from_numpy(wave), mel="hf")
    prompts = window_prompts(stacked, wave.shape[0], fps)  # [n, 50, 384] on the encoder's device
    _sync(device)
    t_feat = time.perf_counter() - t0
    n = int(prompts.shape[0])

    q: queue.Queue = queue.Queue()
    stamps: dict[str, float] = {}
    out = ReferenceResult(frames=0, total_s=0.0, first_frame_s=0.0, features_s=t_feat, gpu_s=0.0)
    errors: list[BaseException] = []

    def process_frames() -> None:  # the script's blending thread
        try:
            for i in range(n):
                res = q.get()
                if res is None:
                    return
                x1, y1, x2, y2 = coords[i % cycle]
                ori = frames[i % cycle].copy()
                face = cv2.resize(res.astype(np.uint8), (x2 - x1, y2 - y1))
                mask = masks[i % cycle]
                combined = composite_pil(ori, face, (x1, y1, x2, y2), mask, mask_coords[i % cycle])
                if save_dir is not None:
                    cv2.imwrite(str(Path(save_dir) / f"{i:08d}.png"), combined)
                if i == 0:
                    stamps["first"] = time.perf_counter()
                out.frames += 1
                out.last_frame = combined
                if keep_frames:
                    out.kept.append(combined)
        except BaseException as e:  # surfaced after join
            errors.append(e)

    worker = threading.Thread(target=process_frames, daemon=True)
    worker.start()
    timestep = torch.tensor([0], device=device)
    p = next(models.unet.parameters())
    gpu = 0.0
    for sl in batch_slices(n, batch_size):  # datagen: full batches, then the rest
        t_b = time.perf_counter()
        idx = [i % cycle for i in range(sl.start, sl.stop)]
        latent_batch = torch.cat([latents[i] for i in idx], dim=0).to(device=device, dtype=p.dtype)
        audio_batch = models.pe(prompts[sl].to(device=device, dtype=p.dtype))
        pred = models.unet(latent_batch, timestep, encoder_hidden_states=audio_batch).sample
        recon = decode_latents(models.vae, pred)
        gpu += time.perf_counter() - t_b
        for r in recon:
            q.put(r)
        if errors:
            break
    worker.join()
    if errors:
        raise errors[0]
    out.total_s = time.perf_counter() - t0
    out.first_frame_s = stamps.get("first", time.perf_counter()) - t0
    out.gpu_s = gpu
    return out
