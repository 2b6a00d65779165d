"""The classic engine's audio -> mouth model and warp, in isolation."""
from __future__ import annotations

import numpy as np
import torch

from newsstudio.engines.classic.mouth import MouthConditioner
from newsstudio.engines.classic.warp import target_landmarks, warp_mouth


def _bursts(sr=16000, seconds=2.0):
    t = np.arange(int(seconds * sr)) / sr
    on = ((t % 0.5) < 0.25).astype(np.float32)  # 250 ms voiced, 250 ms silent
    return (0.2 * on * np.sin(2 * np.pi * 220 * t) * (1 + 0.6 * np.sin(2 * np.pi * 1100 * t))).astype(np.float32), on


def _run(pcm, chunks, fps=25):
    c = MouthConditioner(fps)
    for part in np.array_split(pcm, chunks):
        c.push(part)
    c.close()
    return c.take(c.ready)


def test_silence_gives_a_closed_mouth():
    out = _run(np.zeros(16000, np.float32), 1)
    assert out.shape == (25, 3)
    assert torch.count_nonzero(out[:, 0]) == 0


def test_opening_follows_bursts_and_chunking_does_not_matter():
    pcm, on = _bursts()
    whole = _run(pcm, 1)
    pieces = _run(pcm, 37)
    assert torch.equal(whole, pieces), "incremental input must give the same frames"
    frame_on = on[((np.arange(whole.shape[0]) + 0.5) / 25 * 16000).astype(int)]
    assert whole[frame_on > 0, 0].mean() > 0.4
    assert whole[frame_on == 0, 0].mean() < whole[frame_on > 0, 0].mean() / 3


def test_frames_are_emitted_with_bounded_lookahead():
    pcm, _ = _bursts()
    c = MouthConditioner(25)
    c.push(pcm[:8000])  # 0.5 s
    assert 11 <= c.ready <= 12, c.ready  # frame i needs audio up to (i + 0.5) / fps + 20 ms


def test_warp_is_identity_for_a_resting_closed_mouth_and_opens_otherwise():
    g = torch.Generator().manual_seed(0)
    roi = (torch.rand(1, 64, 64, 3, generator=g) * 255).repeat(2, 1, 1, 1)
    lm = torch.zeros(68, 2)
    lm[:17, 0] = torch.linspace(8, 56, 17)
    lm[:17, 1] = 20 + 30 * torch.sin(torch.linspace(0, 3.1416, 17))
    lm[17:27] = torch.tensor([[16.0 + 3 * i, 6.0] for i in range(10)])
    lm[27:36] = torch.tensor([[32.0, 10 + 2 * i] for i in range(9)])
    lm[36:48] = torch.tensor([[18.0 + 2.5 * i, 12.0] for i in range(12)])
    lm[48:60] = torch.stack([24 + 8 * torch.cos(torch.linspace(0, 6.28, 12)), 36 + 3 * torch.sin(torch.linspace(0, 6.28, 12))], 1)
    lm[60:68] = torch.stack([24 + 6 * torch.cos(torch.linspace(0, 6.28, 9)[:8]), 36 + 0.2 * torch.sin(torch.linspace(0, 6.28, 9)[:8])], 1)
    lms = lm.expand(2, 68, 2)
    params = torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 1.0]])
    out = warp_mouth(roi, lms, params)
    assert (out[0] - roi[0]).abs().max() < 1e-3, "closed target on a resting mouth must not move pixels"
    assert (out[1] - roi[1]).abs().max() > 20
    dst = target_landmarks(lms, params)
    assert dst[1, 66, 1] > lms[1, 66, 1] + 1 and dst[1, 8, 1] > lms[1, 8, 1]
