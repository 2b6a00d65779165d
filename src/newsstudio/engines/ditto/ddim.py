"""DDIM for Ditto's LMDM: the reference's cosine schedule, the per-step plan, the whole loop as one
graphable program shared by every stream of a model, and the sampler with the reference's noise handling.

Behaviour kept from ``core/models/modules/LMDM.py`` (antgroup/ditto-talkinghead): 1000-step cosine
schedule, betas made in float64, ᾱ in float32 (golden-exact); DDIM with eta (1 in the pipeline); the
S−1 per-step noises drawn once per ``setup`` and reused for every window, only x_T drawn per window
(README S5); randomness from an explicit ``torch.Generator``, never the global RNG. Deviation: σ and c
are computed in float64 from the float32 ᾱ and the square root's argument is clamped at 0 (the
reference's float32 arithmetic yields NaN for S = 5, README S4); elsewhere the difference is ~1e-6.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ...accel.static import BucketedRunner

if TYPE_CHECKING:
    from .lmdm import MotionBatcher
    from .models.lmdm import LMDM

N_TIMESTEPS = 1000


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
