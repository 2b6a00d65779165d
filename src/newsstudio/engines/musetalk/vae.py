"""MuseTalk's use of the SD VAE (`musetalk/models/vae.py`, class `VAE`), batched and device-agnostic.

* `preprocess`: 256x256 uint8 crops -> `[B, 3, H, W]` in [-1, 1] (RGB), lower half set to -1 when
  `half_mask` (the reference multiplies by a 0/1 mask *before* `(x - 0.5) / 0.5`).
* `latents_for_unet`: `0.18215 * latent(masked crop)` then `0.18215 * latent(full crop)` on the
  channel axis -> `[B, 8, 32, 32]`. The latent is the posterior mean (`.mode()`) by default;
  the reference *samples* from torch's global RNG, which makes it non-deterministic, so here
  sampling needs an explicit `eps` or `torch.Generator`.
* `decode`: `vae.decode(latents * (1 / 0.18215)).sample` (multiplication by the float32-rounded
  reciprocal, as the reference) and `postprocess_uint8`: `(x / 2 + 0.5).clamp(0, 1)`, `* 255`,
  round half to even, uint8, RGB -> BGR.

The VAE itself is a diffusers `AutoencoderKL` (`build_vae` makes one from a config without
running its random initialisation).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...accel.constants import device_constant

SCALING_FACTOR = 0.18215  # diffusers' default; sd-vae-ft-mse's config does not set one


def load_vae_config(path: str | Path) -> dict[str, Any]:
    """An AutoencoderKL config.json without its bookkeeping keys (`_class_name`, ...)."""
    cfg = json.loads(Path(path).read_text())
    return {k: v for k, v in cfg.items() if not k.startswith("_")}


def build_vae(config: dict[str, Any], device: torch.device | str = "cpu",
              dtype: torch.dtype = torch.float32):
    """An `AutoencoderKL(**config)` with *uninitialised* storage on `device` (fill or load it next).

    Construction happens on the meta device: the module has no buffers outside its state_dict,
    so a strict load or `fill_seeded_` defines every value.
    """
    from diffusers import AutoencoderKL

    cfg = {k: v for k, v in config.items() if not k.startswith("_")}
    with torch.device("meta"):
        vae = AutoencoderKL(**cfg)
    vae = vae.to_empty(device=device)
    if dtype != torch.float32:  # plain nn.Module.to: diffusers' override only adds warnings here
        torch.nn.Module.to(vae, dtype=dtype)
    return vae.eval().requires_grad_(False)


def scaling_factor_of(vae) -> float:
    sf = getattr(getattr(vae, "config", None), "scaling_factor", None)
    return float(sf) if sf is not None else SCALING_FACTOR


# --------------------------------------------------------------------------------------------
# Pre-processing
# --------------------------------------------------------------------------------------------

def _uint8_lut(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """value k -> ((k / 255 in float64 -> float32) - 0.5) / 0.5, the reference's exact chain
    (numpy `/ 255.` then `FloatTensor`, then torchvision Normalize in float32), as a 256-entry table."""

    def make(d: torch.device) -> torch.Tensor:
        x = torch.from_numpy((np.arange(256, dtype=np.float64) / 255.0).astype(np.float32))
        return ((x - 0.5) / 0.5).to(device=d, dtype=dtype)

    return device_constant("uint8 lut", device, make, dtype)


def _as_uint8_nhwc(images: np.ndarray | torch.Tensor, device: torch.device | str | None) -> torch.Tensor:
    t = images if isinstance(images, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(images))
    if t.dtype != torch.uint8:
        raise TypeError(f"images must be uint8, got {t.dtype}")
    if t.dim() == 3:
        t = t[None]
    if t.dim() != 4 or t.shape[-1] != 3:
        raise ValueError(f"images must be [H, W, 3] or [B, H, W, 3], got {tuple(t.shape)}")
    return t.to(device) if device is not None else t


def preprocess(images: np.ndarray | torch.Tensor, *, half_mask: bool, channel_order: str = "bgr",
               device: torch.device | str | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 crops `[H, W, 3]` / `[B, H, W, 3]` (BGR as cv2 reads them, or RGB) -> `[B, 3, H, W]`.

    Identical to the reference's `preprocess_img` for arrays (no resize): RGB, /255, optional
    lower-half mask (rows >= H//2 become exactly -1), `(x - 0.5) / 0.5`. Computed as a table
    lookup of the float32 values, so it is exact on any device; `dtype` casts the result.
    """
    if channel_order not in ("bgr", "rgb"):
        raise ValueError("channel_order must be 'bgr' or 'rgb'")
    x = _as_uint8_nhwc(images, device)
    if channel_order == "bgr":
        x = x.flip(-1)
    lut = _uint8_lut(x.device, torch.float32)
    out = lut[x.permute(0, 3, 1, 2).long()]
    if half_mask:
        out[:, :, out.shape[2] // 2:, :] = lut[0]  # masked pixels are 0 before normalising: exactly -1
    return out.to(dtype)


# --------------------------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------------------------

def _vae_device_dtype(vae) -> tuple[torch.device, torch.dtype]:
    p = next(vae.parameters())
    return p.device, p.dtype


@torch.no_grad()
def posterior(vae, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unscaled posterior `(mean, std)` of `[B, 3, H, W]` images: encoder -> quant_conv -> split,
    `std = exp(0.5 * clamp(logvar, -30, 20))` (diffusers' DiagonalGaussianDistribution)."""
    device, dtype = _vae_device_dtype(vae)
    dist = vae.encode(x.to(device=device, dtype=dtype)).latent_dist
    return dist.mean, dist.std


@torch.no_grad()
def latents_for_unet(vae, images: np.ndarray | torch.Tensor, *, channel_order: str = "bgr",
                     sample: bool = False, eps_masked: torch.Tensor | None = None,
                     eps_ref: torch.Tensor | None = None, generator: torch.Generator | None = None,
                     scaling_factor: float | None = None) -> torch.Tensor:
    """uint8 crops -> the UNet's 8-channel conditioning `[B, 8, h, w]`: masked latent first, then ref.

    Deterministic by default (posterior mean, like `.mode()` in the training code). With
    `sample=True` (or when an `eps_*` is given) the latent is `mean + std * eps`; eps comes from
    `eps_masked` / `eps_ref` if given, else from `generator` (masked drawn first, then ref, like
    the reference's call order), else an error: never from the global RNG.
    """
    sf = scaling_factor_of(vae) if scaling_factor is None else float(scaling_factor)
    device, dtype = _vae_device_dtype(vae)
    sample = sample or eps_masked is not None or eps_ref is not None
    lat = []
    for half, eps in ((True, eps_masked), (False, eps_ref)):
        x = preprocess(images, half_mask=half, channel_order=channel_order, device=device, dtype=dtype)
        mean, std = posterior(vae, x)
        if sample:
            if eps is None:
                if generator is None:
                    raise ValueError("sampling needs eps_masked/eps_ref or a torch.Generator")
                eps = torch.randn(mean.shape, generator=generator, device=generator.device, dtype=mean.dtype)
            z = mean + std * eps.to(device=mean.device, dtype=mean.dtype)
        else:
            z = mean
        lat.append(sf * z)
    return torch.cat(lat, dim=1)


# --------------------------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------------------------

@torch.no_grad()
def decode(vae, latents: torch.Tensor, *, scaling_factor: float | None = None) -> torch.Tensor:
    """UNet-scale latents `[B, 4, h, w]` -> decoded images `[B, 3, H, W]` in about [-1, 1].

    `latents * (1 / sf)`: a Python-float reciprocal times the tensor, i.e. multiplication by the
    reciprocal rounded to the tensor's compute type, exactly as the reference writes it.
    """
    sf = scaling_factor_of(vae) if scaling_factor is None else float(scaling_factor)
    device, dtype = _vae_device_dtype(vae)
    z = latents.to(device=device, dtype=dtype)
    return vae.decode((1 / sf) * z).sample


def decoded_levels(decoded: torch.Tensor) -> torch.Tensor:
    """Decoded `[B, 3, H, W]` -> float32 0-255 levels, as `decode_latents` rounds them:
    `(x / 2 + 0.5).clamp(0, 1)` in the decoder's dtype, then float32 `* 255`, round half to even."""
    return torch.round((decoded / 2 + 0.5).clamp(0, 1).float() * 255.0)


def postprocess_uint8(decoded: torch.Tensor, *, channel_order: str = "bgr") -> torch.Tensor:
    """Decoded `[B, 3, H, W]` -> uint8 `[B, H, W, 3]` on the same device, as `decode_latents`:
    `(x / 2 + 0.5).clamp(0, 1)` in the decoder's dtype, then float32 `* 255`, round half to even,
    uint8; channels reversed to BGR unless `channel_order="rgb"`."""
    if channel_order not in ("bgr", "rgb"):
        raise ValueError("channel_order must be 'bgr' or 'rgb'")
    x = decoded_levels(decoded).permute(0, 2, 3, 1).to(torch.uint8)
    return x.flip(-1) if channel_order == "bgr" else x


@torch.no_grad()
def decode_to_uint8(vae, latents: torch.Tensor, *, channel_order: str = "bgr",
                    scaling_factor: float | None = None) -> torch.Tensor:
    """`decode` + `postprocess_uint8`: the reference's `decode_latents`, kept on the VAE's device."""
    return postprocess_uint8(decode(vae, latents, scaling_factor=scaling_factor), channel_order=channel_order)
