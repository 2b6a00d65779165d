"""Ditto's Audio2Motion pipeline: the streaming 80-frame window fusion over the LMDM sampler.

Reference: ``core/atomic_components/audio2motion.py`` of antgroup/ditto-talkinghead. Windows of
``seq_frames`` (80) advance by ``seq_frames − overlap``, are cross-faded over the overlap, the first 202
columns (scale, pose logits, t) smoothed by a moving average, the reference frame ``kp_cond`` carried
from window to window. The network is ``models/lmdm.py``, the schedule and the sampler ``ddim.py``;
``MotionBatcher`` samples the windows of many streams in one batched DDIM run.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..batching import Batcher
from .ddim import DDIMSampler
from .models.lmdm import LMDM

SMOOTH_COLUMNS = 202  # scale-1 | pitch 66 | yaw 66 | roll 66 | t 3


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
