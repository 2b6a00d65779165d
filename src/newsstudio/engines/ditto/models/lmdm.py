"""Ditto's LMDM denoiser: the guided motion-diffusion network around :class:`MotionDecoder`.

Guidance as the reference: ``x0 = uncond + (cond − uncond)·w`` (w = 2), no clipping, ε from x0; the
conditional and the unconditional branch run in one batched forward. The schedule buffers and the
shared DDIM programs (``ddim.py``) hang off the model, so every stream of one model shares them.
"""
from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor, nn

from ..ddim import N_TIMESTEPS, DDIMProgram, cosine_alphas_cumprod, ddim_plan
from .motion_decoder import MotionDecoder


GUIDANCE_WEIGHT = 2.0


class LMDM(nn.Module):
    """Guided LMDM denoiser: ``forward(x, cond_frame, cond, t) -> (pred_noise, x_start)``.

    Holds the :class:`MotionDecoder` as ``model`` (the official checkpoint's ``model_state_dict``
    loads strictly into it) and the schedule buffers of the reference wrapper (not in the
    checkpoint).
    """

    def __init__(
        self,
        motion_feat_dim: int = 265,
        audio_feat_dim: int = 1103,
        seq_frames: int = 80,
        guidance_weight: float = GUIDANCE_WEIGHT,
        clip_denoised: bool = False,
        multi_cond_frame: bool = False,
    ) -> None:
        super().__init__()
        self.motion_feat_dim = motion_feat_dim
        self.audio_feat_dim = audio_feat_dim
        self.seq_frames = seq_frames
        self.guidance_weight = guidance_weight
        self.clip_denoised = clip_denoised
        self.model = MotionDecoder(
            nfeats=motion_feat_dim,
            seq_len=seq_frames,
            latent_dim=512,
            ff_size=1024,
            num_layers=8,
            num_heads=8,
            dropout=0.1,
            cond_feature_dim=audio_feat_dim,
            multi_cond_frame=multi_cond_frame,
        )
        ac = cosine_alphas_cumprod(N_TIMESTEPS)
        self.register_buffer("alphas_cumprod", ac)
        self.register_buffer("sqrt_recipm1_alphas_cumprod", torch.sqrt(1.0 / ac - 1))
        self.register_buffer("sqrt_recip1m_alphas_cumprod", torch.sqrt(1.0 / (1.0 - ac)))
        self._programs: dict[tuple[int, float, str, bool], DDIMProgram] = {}
        self._programs_lock = threading.Lock()

    def __getstate__(self) -> dict:
        # copies (deepcopy, pickling) get their own programs: graphs and locks are not copyable
        return {**self.__dict__, "_programs": {}, "_programs_lock": None}

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._programs_lock = threading.Lock()

    def ddim_program(self, steps: int, eta: float = 1.0, mode: str = "eager", tf32: bool = False) -> DDIMProgram:
        """The shared DDIM program of this model for (steps, eta, mode, tf32), made on first use (its
        CUDA graphs are captured once per batch bucket, not once per stream)."""
        key = (int(steps), float(eta), mode, bool(tf32))
        with self._programs_lock:
            prog = self._programs.get(key)
            if prog is None:
                prog = self._programs[key] = DDIMProgram(self, ddim_plan(self.alphas_cumprod, steps, eta), mode, tf32=tf32)
            return prog

    def load_checkpoint(self, path: str | Path, map_location: str | torch.device = "cpu") -> "LMDM":
        """Load an official ``lmdm_v0.4_hubert.pth`` (its ``model_state_dict``) strictly."""
        ckpt = torch.load(str(path), map_location=map_location, weights_only=True)
        self.load_model_state_dict(ckpt)
        return self.eval()

    def load_model_state_dict(self, checkpoint: Mapping[str, object]) -> None:
        sd = checkpoint["model_state_dict"] if "model_state_dict" in checkpoint else checkpoint
        self.model.load_state_dict(sd, strict=True)  # type: ignore[arg-type]

    def _extract(self, buf: Tensor, t: Tensor, like: Tensor) -> Tensor:
        return buf.gather(0, t.to(buf.device)).to(like.dtype).reshape(-1, *([1] * (like.dim() - 1)))

    def predictions(
        self, x: Tensor, cond_frame: Tensor, cond: Tensor, time_cond: Tensor, encoded: tuple[Tensor, Tensor] | None = None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(pred_noise, x_start, model_out_cond, model_out_uncond) for one denoising step
        (``encoded``: the condition already encoded, ``model.encode_cond(cond)``)."""
        out_c, out_u = self.model.guided_branches(x, cond_frame, cond, time_cond, encoded)
        x_start = out_u + (out_c - out_u) * self.guidance_weight
        if self.clip_denoised:
            x_start = x_start.clamp(-1.0, 1.0)
        a = self._extract(self.sqrt_recip1m_alphas_cumprod, time_cond, x)
        b = self._extract(self.sqrt_recipm1_alphas_cumprod, time_cond, x)
        pred_noise = a * x - x_start / b
        return pred_noise, x_start, out_c, out_u

    def encode_condition(self, cond: Tensor) -> tuple[Tensor, Tensor]:
        """The audio condition through the condition encoder: once per DDIM loop, not per step."""
        return self.model.encode_cond(cond)

    def forward(self, x: Tensor, cond_frame: Tensor, cond: Tensor, time_cond: Tensor,
                encoded: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        pred_noise, x_start, _, _ = self.predictions(x, cond_frame, cond, time_cond, encoded)
        return pred_noise, x_start
