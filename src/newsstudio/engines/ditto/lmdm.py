"""Ditto LMDM: audio-conditioned motion diffusion (schedule, guided denoiser, DDIM sampler) and
the streaming 80-frame window fusion of ``Audio2Motion``.

Reference: ``core/models/modules/LMDM.py`` and ``core/atomic_components/audio2motion.py`` of
antgroup/ditto-talkinghead. Behaviour kept from the reference:

* 1000-step cosine schedule, betas made in float64, ᾱ in float32 (golden-exact);
* guidance ``x0 = uncond + (cond − uncond)·w`` (w = 2), no clipping, ε from x0;
* DDIM with eta (1 in the pipeline); the S−1 per-step noises are drawn once per ``setup`` and
  reused for every window, only x_T is drawn per window (README S5). Randomness comes from an
  explicit ``torch.Generator``, never the global RNG;
* windows of ``seq_frames`` (80) advancing by ``seq_frames − overlap``, cross-faded over the
  overlap, moving-average smoothing of the first 202 columns (scale, pose logits, t), the
  reference frame ``kp_cond`` carried from window to window.

Deviations (documented): σ and c of the DDIM schedule are computed in float64 from the float32 ᾱ
and the argument of the square root is clamped at 0 — the reference's float32 arithmetic yields
NaN for S = 5 (README S4); elsewhere the difference is at the 1e-6 level. The conditional and the
unconditional branch run in one batched forward.
"""
from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from ...accel.static import BucketedRunner
from ..batching import Batcher
from .models.motion_decoder import MotionDecoder

N_TIMESTEPS = 1000
GUIDANCE_WEIGHT = 2.0
SMOOTH_COLUMNS = 202  # scale-1 | pitch 66 | yaw 66 | roll 66 | t 3


def cosine_alphas_cumprod(n_timestep: int = N_TIMESTEPS, cosine_s: float = 8e-3) -> Tensor:
    """ᾱ [n] float32 exactly as the reference: cosine betas in float64, clipped to [0, 0.999],
    cast to float32, then α = 1 − β and the cumulative product in float32."""
    steps = torch.arange(n_timestep + 1, dtype=torch.float64) / n_timestep + cosine_s
    f = torch.cos(steps / (1 + cosine_s) * math.pi / 2).pow(2)
    f = f / f[0]
    betas = (1 - f[1:] / f[:-1]).clamp(0.0, 0.999).to(torch.float32)
    return torch.cumprod(1.0 - betas, dim=0)


@dataclass(frozen=True)
class DDIMPlan:
    """Time pairs and per-step coefficients of one DDIM run with S steps.

    ``times[i]`` is the model time of step i; for steps with ``time_pairs[i][1] >= 0`` (all but
    the last) ``x ← x0·alpha_next_sqrt[i] + c[i]·ε + sigma[i]·noise[i]``; the last step returns x0.
    Coefficients are Python floats holding float32 values (no device tensors, so the sampling loop
    never synchronises and can be captured in a CUDA graph).
    """

    time_pairs: tuple[tuple[int, int], ...]
    alpha_next_sqrt: tuple[float, ...]
    sigma: tuple[float, ...]
    c: tuple[float, ...]

    @property
    def steps(self) -> int:
        return len(self.time_pairs)

    @property
    def times(self) -> tuple[int, ...]:
        return tuple(t for t, _ in self.time_pairs)


def ddim_time_pairs(steps: int, n_timestep: int = N_TIMESTEPS) -> tuple[tuple[int, int], ...]:
    """(t, t_next) pairs: linspace(−1, n−1, S+1) in float32, truncated to int, reversed."""
    if steps < 1:
        raise ValueError(f"sampling steps must be >= 1, got {steps}")
    times = torch.linspace(-1, n_timestep - 1, steps=steps + 1).int().tolist()[::-1]
    return tuple(zip(times[:-1], times[1:]))


def ddim_plan(alphas_cumprod: Tensor, steps: int, eta: float = 1.0) -> DDIMPlan:
    """DDIM coefficients for ``steps`` steps; σ = eta·sqrt((1 − a/a_n)(1 − a_n)/(1 − a)),
    c = sqrt(max(1 − a_n − σ², 0)), computed in float64 from float32 ᾱ (never NaN)."""
    ac = alphas_cumprod.detach().to("cpu", torch.float64)
    pairs = ddim_time_pairs(steps, ac.shape[0])
    an_sqrt, sig, cs = [], [], []
    for t, t_next in pairs:
        if t_next < 0:
            continue
        a, a_n = ac[t], ac[t_next]
        sigma = eta * ((1 - a / a_n) * (1 - a_n) / (1 - a)).clamp_min(0).sqrt()
        c = (1 - a_n - sigma**2).clamp_min(0).sqrt()
        an_sqrt.append(float(a_n.sqrt().to(torch.float32)))
        sig.append(float(sigma.to(torch.float32)))
        cs.append(float(c.to(torch.float32)))
    return DDIMPlan(pairs, tuple(an_sqrt), tuple(sig), tuple(cs))


class DDIMProgram:
    """The whole DDIM loop of one plan as one callable over batch buckets of windows, shared by
    every stream of a model (``LMDM.ddim_program``): under CUDA graphs a 4-step window is one
    replay instead of ~1,600 kernel launches (measured on an H200: eager 58 ms, graphed 12 ms
    per window; 256 windows in one replay 1.1 ms each).

    ``__call__(kp_cond [B, F], aud_cond [B, L, C], x_T [B, L, F], step_noise [S−1, B, L, F])``.
    """

    def __init__(self, lmdm: "LMDM", plan: DDIMPlan, mode: str = "eager", max_windows: int = 256,
                 tf32: bool = False) -> None:
        self.lmdm, self.plan = lmdm, plan
        p = next(lmdm.parameters())
        self._time_conds = [torch.full((1,), t, dtype=torch.long, device=p.device) for t in plan.times]
        self.runner = BucketedRunner(self._loop, mode, min_bucket=1, max_bucket=max_windows, tf32=tf32)

    def _loop(self, kp_cond: Tensor, aud_cond: Tensor, x: Tensor, noise: Tensor,
              trace: "DDIMTrace | None" = None) -> Tensor:
        """noise [B, max(S−1, 1), L, F] (batch first, so the runner can bucket it)."""
        b, i = x.shape[0], 0
        encoded = self.lmdm.encode_condition(aud_cond)  # the condition is the same at every step
        for step, (_, t_next) in enumerate(self.plan.time_pairs):
            t = self._time_conds[step].to(x.device).expand(b)
            pred_noise, x_start = self.lmdm(x, kp_cond, aud_cond, t, encoded)
            if trace is not None:
                trace.x_in.append(x)
                trace.x_start.append(x_start)
                trace.pred_noise.append(pred_noise)
            if t_next < 0:
                x = x_start
                continue
            x = x_start * self.plan.alpha_next_sqrt[i] + self.plan.c[i] * pred_noise + self.plan.sigma[i] * noise[:, i]
            i += 1
        return x

    def __call__(self, kp_cond: Tensor, aud_cond: Tensor, x_T: Tensor, step_noise: Tensor,
                 trace: "DDIMTrace | None" = None) -> Tensor:
        noise = step_noise.transpose(0, 1) if step_noise.shape[0] else x_T[:, None]  # unused with 1 step
        if trace is not None:
            return self._loop(kp_cond, aud_cond, x_T, noise, trace)
        return self.runner(kp_cond, aud_cond, x_T, noise)

    def warm_up(self, kp_cond: Tensor, aud_cond: Tensor) -> float:
        """Capture every bucket now (from one window's shapes)."""
        x = torch.zeros((1, self.lmdm.seq_frames, self.lmdm.motion_feat_dim), device=aud_cond.device, dtype=aud_cond.dtype)
        noise = x[:, None].expand(-1, max(1, len(self.plan.sigma)), -1, -1)
        return self.runner.warm_up((kp_cond[:1], aud_cond[:1], x, noise))


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


@dataclass
class DDIMTrace:
    """Per-step intermediates of :meth:`DDIMSampler.sample` (for tests and debugging)."""

    x_in: list[Tensor]
    x_start: list[Tensor]
    pred_noise: list[Tensor]


class DDIMSampler:
    """DDIM over an :class:`LMDM` with the reference's noise handling.

    ``setup(steps)`` builds the plan and draws the S−1 step noises [1, L, F] from ``generator``
    (once: reused for every window until the step count changes); ``sample`` draws x_T per call
    (after the step noises, like the reference). Both can be overridden with explicit tensors.
    ``accel``: how the loop runs (the model's shared :class:`DDIMProgram`; "cudagraph" on CUDA);
    ``tf32``: its graphs captured with TF32 matmuls (graph modes only; ``accel.static``).
    """

    def __init__(self, lmdm: LMDM, steps: int = 50, eta: float = 1.0, generator: torch.Generator | None = None,
                 batcher: "MotionBatcher | None" = None, accel: str = "eager", tf32: bool = False) -> None:
        self.lmdm = lmdm
        self.eta = eta
        self.generator = generator
        self.batcher = batcher  # windows of several streams sampled in one batch (noise still drawn here)
        self.accel = accel
        self.tf32 = bool(tf32)
        self.plan: DDIMPlan | None = None
        self.program: DDIMProgram | None = None
        self.step_noise: list[Tensor] = []
        self.setup(steps)

    @property
    def steps(self) -> int:
        assert self.plan is not None
        return self.plan.steps

    def _param(self) -> Tensor:
        return next(self.lmdm.parameters())

    def _randn(self, shape: tuple[int, ...], like: Tensor) -> Tensor:
        gen = self.generator
        dev = gen.device if gen is not None else like.device
        return torch.randn(shape, generator=gen, device=dev, dtype=torch.float32).to(like.device, like.dtype)

    def setup(self, steps: int, step_noise: Tensor | None = None, force: bool = False) -> None:
        """(Re)build the plan for ``steps``; a no-op when unchanged unless ``force`` or explicit
        ``step_noise`` [S−1, 1, L, F] is given."""
        if self.plan is not None and self.plan.steps == steps and step_noise is None and not force:
            return
        p = self._param()
        shared = getattr(self.lmdm, "ddim_program", None)  # wrappers (the two-pass reference) get their own
        self.program = (shared(steps, self.eta, self.accel, self.tf32) if shared is not None
                        else DDIMProgram(self.lmdm, ddim_plan(self.lmdm.alphas_cumprod, steps, self.eta), self.accel,
                                         tf32=self.tf32))
        self.plan = self.program.plan
        shape = (1, self.lmdm.seq_frames, self.lmdm.motion_feat_dim)
        n = len(self.plan.sigma)
        if step_noise is not None:
            if step_noise.shape[0] != n:
                raise ValueError(f"step_noise has {step_noise.shape[0]} entries, plan needs {n}")
            self.step_noise = [s.to(p.device, p.dtype).reshape(shape) for s in step_noise]
        else:
            self.step_noise = [self._randn(shape, p) for _ in range(n)]

    @torch.no_grad()
    def sample(
        self,
        kp_cond: Tensor,
        aud_cond: Tensor,
        x_T: Tensor | None = None,
        trace: DDIMTrace | None = None,
        step_noise: Tensor | None = None,
    ) -> Tensor:
        """Motion [B, L, F] for reference frames kp_cond [B, F] and conditions aud_cond [B, L, C].

        ``step_noise`` [S−1, B, L, F]: per-row step noises (rows of different streams batched
        together), instead of this sampler's own. With a ``batcher`` the call is queued with
        the noises drawn here, so the result equals sampling alone."""
        assert self.program is not None
        b = aud_cond.shape[0]
        shape = (b, self.lmdm.seq_frames, self.lmdm.motion_feat_dim)
        x = self._randn(shape, aud_cond) if x_T is None else x_T.to(aud_cond.device, aud_cond.dtype)
        if step_noise is None:
            step_noise = torch.stack(self.step_noise).expand(-1, b, -1, -1) if self.step_noise else x.new_zeros((0, *shape))
            if self.batcher is not None and trace is None:
                return self.batcher.wait(self.batcher.submit((kp_cond, aud_cond, x, step_noise)))
        return self.program(kp_cond, aud_cond, x, step_noise.to(x.device, x.dtype), trace=trace)


class MotionBatcher(Batcher):
    """LMDM windows of many streams in one batched DDIM run (the server's Ditto streams share one).

    Items are ``(kp_cond [b, F], aud_cond [b, L, C], x_T [b, L, F], step_noise [S−1, b, L, F])``
    with the noises drawn by each stream's own sampler, so every stream's motion equals what it
    would sample alone. ``max_windows`` caps a batch."""

    def __init__(self, lmdm: LMDM, steps: int, eta: float = 1.0, max_windows: int = 256, autostart: bool = True,
                 accel: str = "eager", own_stream: bool = False, tf32: bool = False):
        self.sampler = DDIMSampler(lmdm, steps=steps, eta=eta, accel=accel, tf32=tf32)
        super().__init__(self._sample_many, lambda item: int(item[1].shape[0]), max_frames=max_windows,
                         autostart=autostart, name="motion-batcher", device=next(lmdm.parameters()).device,
                         own_stream=own_stream)

    def _sample_many(self, items: list[tuple[Tensor, Tensor, Tensor, Tensor]]) -> list[Tensor]:
        kp, aud, x_T, noise = (torch.cat([it[k] for it in items], dim=1 if k == 3 else 0) for k in range(4))
        out = self.sampler.sample(kp, aud, x_T=x_T, step_noise=noise)
        return list(torch.split(out, [int(it[1].shape[0]) for it in items]))


class MotionWindowStream:
    """Streaming Audio2Motion: per-frame condition vectors in, fused motion frames out.

    Windows of ``L = seq_frames`` frames start every ``L − overlap`` frames; each new window is
    cross-faded with the previous result over ``fuse = min(overlap, L − overlap)`` frames and a
    centred moving average (``smooth_k``) runs over the first 202 columns, exactly as the
    reference's offline path (``_audio2motion_offline``) does, including its final smoothing pass
    and the padding of the last window with its last condition row.

    ``push(cond)`` accepts any number of condition rows [n, C] and returns the motion frames
    [m, F] that can no longer change (m may be 0); ``finish()`` returns the rest. The
    concatenation of everything returned equals the offline result for the concatenated input.
    The reference frame of the first window is ``kp_cond`` (the source's motion row, see
    ``motion_stitch.source_kp_cond``); later windows use the frame ``overlap`` before the end of
    the previous result (``fix_kp_cond`` > 0 resets it to the source every n windows).
    """

    def __init__(
        self,
        sampler: DDIMSampler,
        kp_cond: Tensor,
        overlap: int = 10,
        smooth_k: int = 3,
        fix_kp_cond: int = 0,
        fix_kp_cond_dim: tuple[int, int] | None = None,
    ) -> None:
        self.sampler = sampler
        self.seq = sampler.lmdm.seq_frames
        if not 0 <= overlap < self.seq:
            raise ValueError(f"overlap must be in [0, {self.seq}), got {overlap}")
        self.overlap = overlap
        self.valid = self.seq - overlap
        self.fuse = min(overlap, self.valid)
        self.half_k = smooth_k // 2 if smooth_k > 1 else 0
        self.fix_kp_cond = fix_kp_cond
        self.fix_kp_cond_dim = fix_kp_cond_dim
        self.s_kp_cond = kp_cond.reshape(1, -1)
        self.kp_cond = self.s_kp_cond
        self._cond: list[Tensor] = []  # pending condition rows not yet consumed (from self._start)
        self._cond_len = 0
        self._start = 0  # absolute frame index of the next window's first row
        self._res: Tensor | None = None  # fused result [n, F], absolute frames [self._base, ...)
        self._base = 0
        self._emitted = 0
        self._n_in = 0
        self.windows = 0

    # -- helpers --------------------------------------------------------------------------------

    def _smooth(self, seq: Tensor, s: int, e: int) -> Tensor:
        """Centred moving average over the first 202 columns for rows [s, e) of ``seq``, reading
        the unsmoothed neighbours (windows clamped at the ends), as the reference's ``_smo``."""
        n = seq.shape[0]
        s, e = max(s, 0), min(e, n)
        if self.half_k == 0 or e <= s:
            return seq
        h = self.half_k
        cols = min(SMOOTH_COLUMNS, seq.shape[1])
        rows = torch.arange(s, e, device=seq.device)
        src = seq[:, :cols]
        acc = torch.zeros((e - s, cols), device=seq.device, dtype=seq.dtype)
        for d in range(-h, h + 1):  # summed in row order, like numpy's mean over the window
            j = rows + d
            ok = ((j >= 0) & (j < n))[:, None]
            acc = acc + torch.where(ok, src[j.clamp(0, n - 1)], 0.0)
        count = (torch.clamp(rows + h + 1, max=n) - torch.clamp(rows - h, min=0)).to(seq.dtype)[:, None]
        out = seq.clone()
        out[s:e, :cols] = acc / count
        return out

    def _cond_window(self, final: bool) -> Tensor | None:
        """The next window's conditions [L, C] (padded with the last row when final), or None."""
        if self._cond_len == 0:
            return None
        if self._cond_len < self.seq and not final:
            return None
        buf = torch.cat(self._cond, dim=0) if len(self._cond) > 1 else self._cond[0]
        self._cond = [buf]
        win = buf[: self.seq]
        if win.shape[0] < self.seq:
            win = torch.cat([win, win[-1:].expand(self.seq - win.shape[0], -1)], dim=0)
        return win

    def _advance_cond(self) -> None:
        buf = self._cond[0][self.valid :]
        self._cond = [buf] if buf.shape[0] else []
        self._cond_len = buf.shape[0]
        self._start += self.valid

    def _run_window(self, win: Tensor) -> None:
        pred = self.sampler.sample(self.kp_cond.to(win.device, win.dtype), win[None])[0]
        if self._res is None:
            res = self._smooth(pred, 0, pred.shape[0])
            self._res, self._base = res, 0
        else:
            res = self._res
            n = res.shape[0]
            fuse = self.fuse
            alpha = (torch.arange(fuse, device=res.device, dtype=torch.float32) / fuse).to(res.dtype)[:, None]
            r1 = res[n - fuse :]
            r2 = pred[self.seq - self.valid - fuse : self.seq - self.valid]
            fused = r1 * (1 - alpha) + r2 * alpha
            res = torch.cat([res[: n - fuse], fused, pred[self.seq - self.valid :]], dim=0)
            m = res.shape[0]
            res = self._smooth(res, m - self.valid - fuse, m - self.valid + 1)
            self._res = res
        self.windows += 1
        self._update_kp_cond()

    def _update_kp_cond(self) -> None:
        assert self._res is not None
        last = self._res[self._res.shape[0] - self.overlap - 1][None]
        if self.fix_kp_cond > 0 and self.windows % self.fix_kp_cond == 0:
            kp = self.s_kp_cond.to(last.device, last.dtype).clone()
            if self.fix_kp_cond_dim is not None:
                ds, de = self.fix_kp_cond_dim
                kp[:, ds:de] = last[:, ds:de]
            self.kp_cond = kp
        else:
            self.kp_cond = last

    def _take(self, upto: int, total: int | None) -> Tensor:
        """Emit absolute frames [emitted, upto) after the final smoothing pass."""
        assert self._res is not None
        res = self._res
        if total is not None:
            res = res[: total - self._base]
            self._res = res
        upto = min(upto, self._base + res.shape[0])
        if upto <= self._emitted:
            return res[:0]
        s, e = self._emitted - self._base, upto - self._base
        lo, hi = max(0, s - self.half_k), min(res.shape[0], e + self.half_k)
        part = self._smooth(res[lo:hi], s - lo, e - lo)[s - lo : e - lo]
        self._emitted = upto
        # drop rows no later frame needs (fuse region and smoothing context stay)
        keep_from = max(0, min(upto - self.half_k, self._base + res.shape[0] - self.seq) - self._base)
        if keep_from > 0:
            self._res = res[keep_from:]
            self._base += keep_from
        return part

    # -- public API ---------------------------------------------------------------------------

    @property
    def frames_in(self) -> int:
        return self._n_in

    @property
    def frames_out(self) -> int:
        return self._emitted

    def push(self, cond: Tensor) -> Tensor:
        """Add condition rows [n, C]; returns the motion frames [m, F] that became final."""
        if cond.dim() != 2:
            raise ValueError(f"cond must be [n, C], got {tuple(cond.shape)}")
        if cond.shape[0]:
            self._cond.append(cond)
            self._cond_len += cond.shape[0]
            self._n_in += cond.shape[0]
        while (win := self._cond_window(final=False)) is not None:
            self._run_window(win)
            self._advance_cond()
        if self._res is None:
            return cond.new_zeros((0, self.sampler.lmdm.motion_feat_dim))
        end = self._base + self._res.shape[0]
        # rows before the next fuse region are final; their smoothing needs half_k more rows
        return self._take(end - self.fuse - self.half_k, None)

    def finish(self) -> Tensor:
        """Run the remaining (padded) windows and return every frame not yet emitted."""
        while self._start < self._n_in:
            win = self._cond_window(final=True)
            assert win is not None
            self._run_window(win)
            self._advance_cond()
        if self._res is None:
            return torch.zeros((0, self.sampler.lmdm.motion_feat_dim))
        return self._take(self._n_in, self._n_in)


@torch.no_grad()
def generate_motion(
    sampler: DDIMSampler, kp_cond: Tensor, cond: Tensor, overlap: int = 10, smooth_k: int = 3, fix_kp_cond: int = 0
) -> Tensor:
    """Offline Audio2Motion: motion [N, F] for condition rows [N, C] (one pass of the stream)."""
    stream = MotionWindowStream(sampler, kp_cond, overlap=overlap, smooth_k=smooth_k, fix_kp_cond=fix_kp_cond)
    return torch.cat([stream.push(cond), stream.finish()], dim=0)
