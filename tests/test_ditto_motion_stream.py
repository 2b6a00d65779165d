"""LMDM window streaming and DDIM plan: no golden covers Audio2Motion's window fusion, so the
stream is checked against an independent numpy restatement of the reference's offline loop
(``stream_pipeline_offline._audio2motion_offline`` + ``Audio2Motion``), with a deterministic
stand-in denoiser whose x0 depends only on the window's conditions and reference frame."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from newsstudio.engines.ditto.ddim import DDIMSampler, cosine_alphas_cumprod, ddim_plan

from newsstudio.engines.ditto.lmdm import MotionWindowStream, generate_motion

F, C, L = 265, 12, 80


class FakeLMDM(nn.Module):
    """x0 = tanh(cond @ W + kp @ V): deterministic, independent of x and t."""

    def __init__(self, seq: int = L) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.W = nn.Parameter(torch.randn(C, F, generator=g) * 0.5, requires_grad=False)
        self.V = nn.Parameter(torch.randn(F, F, generator=g) * 0.05, requires_grad=False)
        self.seq_frames, self.motion_feat_dim = seq, F
        self.register_buffer("alphas_cumprod", cosine_alphas_cumprod())

    def x0(self, kp: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        return torch.tanh(cond @ self.W + (kp @ self.V)[:, None, :])

    def encode_condition(self, cond):
        return None

    def forward(self, x, kp, cond, t, encoded=None):
        return x * 0.5, self.x0(kp, cond)


def reference_offline(model: FakeLMDM, kp0: np.ndarray, cond: np.ndarray, overlap: int, smo_k: int, fix_kp_cond: int = 0) -> np.ndarray:
    seq, valid = model.seq_frames, model.seq_frames - overlap
    fuse = overlap
    alpha = (np.arange(fuse, dtype=np.float32) / fuse)[:, None]

    def smo(res: np.ndarray, s: int, e: int) -> np.ndarray:
        if smo_k <= 1:
            return res
        src, h, n = res.copy(), smo_k // 2, res.shape[0]
        for i in range(s, e):
            res[i, :202] = np.mean(src[max(0, i - h) : min(n, i + h + 1), :202], axis=0)
        return res

    def pred(kp: np.ndarray, win: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return model.x0(torch.from_numpy(kp).reshape(1, -1), torch.from_numpy(win)[None])[0].numpy()

    n, idx, res, kp, clip = cond.shape[0], 0, None, kp0.copy(), 0
    while idx < n:
        win = cond[idx : idx + seq]
        if win.shape[0] < seq:
            win = np.concatenate([win, np.repeat(win[-1:], seq - win.shape[0], 0)])
        p = pred(kp, win)
        if res is None:
            res = smo(p.copy(), 0, seq)
        else:
            res[-fuse:] = res[-fuse:] * (1 - alpha) + p[seq - valid - fuse : seq - valid] * alpha
            res = np.concatenate([res, p[seq - valid :]])
            res = smo(res, len(res) - valid - fuse, len(res) - valid + 1)
        clip += 1
        last = res[len(res) - overlap - 1].copy()
        kp = kp0.copy() if fix_kp_cond > 0 and clip % fix_kp_cond == 0 else last
        idx += valid
    return smo(res[:n].copy(), 0, n)


def _stream(model: FakeLMDM, kp0: torch.Tensor, overlap: int, smo_k: int, fix: int = 0) -> MotionWindowStream:
    sampler = DDIMSampler(model, steps=3, generator=torch.Generator().manual_seed(0))  # type: ignore[arg-type]
    return MotionWindowStream(sampler, kp0, overlap=overlap, smooth_k=smo_k, fix_kp_cond=fix)


@pytest.mark.parametrize("n,overlap,smo_k,fix", [(1, 10, 3, 0), (75, 10, 3, 0), (80, 10, 3, 0), (231, 10, 3, 0), (300, 20, 5, 0), (163, 10, 1, 2)])
@torch.no_grad()
def test_stream_equals_reference_offline(n: int, overlap: int, smo_k: int, fix: int) -> None:
    model = FakeLMDM().eval()
    g = torch.Generator().manual_seed(n)
    cond = torch.randn(n, C, generator=g)
    kp0 = torch.randn(1, F, generator=g) * 0.1
    ref = reference_offline(model, kp0.numpy(), cond.numpy(), overlap, smo_k, fix)

    one_shot = generate_motion(_stream(model, kp0, overlap, smo_k, fix).sampler, kp0, cond, overlap=overlap, smooth_k=smo_k, fix_kp_cond=fix)
    np.testing.assert_allclose(one_shot.numpy(), ref, atol=2e-6, rtol=0)

    stream = _stream(model, kp0, overlap, smo_k, fix)
    outs, pos, k = [], 0, 0
    sizes = [1, 37, 5, 90, 13, 71, 2]
    while pos < n:
        step = sizes[k % len(sizes)]
        outs.append(stream.push(cond[pos : pos + step]))
        pos, k = pos + step, k + 1
    outs.append(stream.finish())
    got = torch.cat(outs)
    assert got.shape == (n, F)
    np.testing.assert_allclose(got.numpy(), ref, atol=2e-6, rtol=0)


@torch.no_grad()
def test_stream_emits_frames_as_soon_as_final() -> None:
    model = FakeLMDM().eval()
    stream = _stream(model, torch.zeros(1, F), overlap=10, smo_k=3)
    assert stream.push(torch.randn(79, C)).shape[0] == 0  # no full window yet
    first = stream.push(torch.randn(1, C)).shape[0]
    assert first == 80 - 10 - 1  # all but the fuse region and one smoothing neighbour
    assert stream.push(torch.randn(69, C)).shape[0] == 0
    assert stream.push(torch.randn(1, C)).shape[0] == 70
    assert stream.frames_out == 150 - 11
    assert stream.finish().shape[0] == 11


def test_ddim_plan_finite_for_all_step_counts() -> None:
    ac = cosine_alphas_cumprod()
    assert ac.dtype == torch.float32 and ac.shape == (1000,)
    for s in range(1, 201):
        plan = ddim_plan(ac, s)
        assert plan.steps == s and plan.time_pairs[0][0] == 999 and plan.time_pairs[-1][1] == -1
        vals = plan.sigma + plan.c + plan.alpha_next_sqrt
        assert all(math.isfinite(v) and v >= 0 for v in vals), s
    five = ddim_plan(ac, 5)
    assert [p[0] for p in five.time_pairs] == [999, 799, 599, 399, 199]


@torch.no_grad()
def test_sampler_reuses_step_noise_and_draws_x_T_per_call() -> None:
    model = FakeLMDM().eval()
    s = DDIMSampler(model, steps=4, generator=torch.Generator().manual_seed(3))  # type: ignore[arg-type]
    noise = list(s.step_noise)
    assert len(noise) == 3
    s.setup(4)
    assert all(a is b for a, b in zip(noise, s.step_noise))  # unchanged step count: no redraw
    s.setup(6)
    assert len(s.step_noise) == 5
    # same generator seed -> same draws (explicit generator, no global RNG)
    torch.manual_seed(123)
    a = DDIMSampler(model, steps=4, generator=torch.Generator().manual_seed(9)).step_noise  # type: ignore[arg-type]
    torch.manual_seed(456)
    b = DDIMSampler(model, steps=4, generator=torch.Generator().manual_seed(9)).step_noise  # type: ignore[arg-type]
    assert all(torch.equal(x, y) for x, y in zip(a, b))
