"""MuseTalk's UNet: a diffusers `UNet2DConditionModel(**musetalk.json)` run once at timestep 0.

MuseTalk is not a diffusion sampler at inference: the UNet maps the 8-channel latent
conditioning (masked crop | reference crop) plus the audio prompts (after the positional
encoding) to the 4-channel latent of the generated crop in a single forward pass.
State-dict keys equal `unet.pth` (v1.5) / `pytorch_model.bin` (v1.0), so those load strictly.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch


def load_unet_config(path: str | Path) -> dict[str, Any]:
    """`musetalk.json` as a kwargs dict. The reference passes the whole file to
    `UNet2DConditionModel(**cfg)`; diffusers ignores the `_`-prefixed bookkeeping keys, so they are
    dropped here."""
    cfg = json.loads(Path(path).read_text())
    return {k: v for k, v in cfg.items() if not k.startswith("_")}


def build_unet(config: dict[str, Any], device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
    """`UNet2DConditionModel(**config)` with *uninitialised* storage on `device`.

    Built on the meta device (skipping 850M random initialisations); the UNet has no buffers
    outside its state_dict, so a strict load or `fill_seeded_` then defines every value.
    """
    from diffusers import UNet2DConditionModel

    cfg = {k: v for k, v in config.items() if not k.startswith("_")}
    with torch.device("meta"):
        unet = UNet2DConditionModel(**cfg)
    unet = unet.to_empty(device=device)
    if dtype != torch.float32:  # plain nn.Module.to: diffusers' override only adds warnings here
        torch.nn.Module.to(unet, dtype=dtype)
    return unet.eval().requires_grad_(False)


@torch.no_grad()
def unet_step(unet, latents: torch.Tensor, encoder_hidden_states: torch.Tensor,
              timestep: int | torch.Tensor = 0) -> torch.Tensor:
    """One UNet forward: `[B, 8, h, w]` latents, `[B, 50, 384]` audio prompts *after* the positional
    encoding -> `[B, 4, h, w]` predicted latents (UNet scale, ready for `vae.decode`).

    Inputs are moved to the UNet's device and dtype (the reference casts them to the weight
    dtype). The timestep is the reference's `tensor([0])`, broadcast over the batch.
    """
    p = next(unet.parameters())
    t = timestep if isinstance(timestep, torch.Tensor) else torch.tensor([int(timestep)])
    return unet(
        latents.to(device=p.device, dtype=p.dtype),
        t.to(p.device),
        encoder_hidden_states=encoder_hidden_states.to(device=p.device, dtype=p.dtype),
    ).sample
