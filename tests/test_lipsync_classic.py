"""Measured lip-sync of the classic engine on real media (../shared/media).

The mouth opening is measured on the OUTPUT frames with the landmark backend (inner-lip gap /
face height) and correlated with the audio's per-frame RMS envelope. Silent stretches (>= 6
frames whose RMS is below 10 % of the speech level) must show a closed mouth once the jaw has
had 2 frames (80 ms) to close: opening < 0.02. Why 0.02: MediaPipe reads a closed mouth at
<= 0.003 on these faces, speech frames average 0.07-0.09, and a visibly parted mouth starts
around 0.02-0.03.
"""
from __future__ import annotations

import numpy as np
import pytest

from conftest import media_path
from newsstudio.avatar.prebake import prebake
from newsstudio.media.audio import load_audio
from newsstudio.quality.lipsync import lipsync_report, mouth_openings, rms_envelope
from newsstudio.stream import stream_generator

CLOSED = 0.02


def _silent_settled(envelope: np.ndarray, thr: float, min_len: int = 6, settle: int = 2) -> np.ndarray:
    silent = envelope < thr
    keep = np.zeros_like(silent)
    i = 0
    while i < len(silent):
        if not silent[i]:
            i += 1
            continue
        j = i
        while j < len(silent) and silent[j]:
            j += 1
        if j - i >= min_len:
            keep[i + (settle if i > 0 else 0) : j] = True
        i = j
    return keep


@pytest.mark.slow
@pytest.mark.parametrize("source,speech,size,frames", [("portrait.png", "speech.wav", (512, 512), 1), ("yongen.mp4", "yongen.wav", (352, 608), 100)])
def test_mouth_follows_speech_and_closes_in_silence(tmp_path, source, speech, size, frames):
    src, wav = media_path(source), media_path(speech)
    packet = prebake(src, "lipsync", root=tmp_path, size=size, max_frames=frames, progress=False)
    audio = load_audio(wav)
    rgb = np.concatenate([c["frames"].numpy() for c in stream_generator("classic", packet, audio, fps=25, chunk_frames=16, output="rgb")])
    fb = packet.array("face_boxes")
    w, h = packet.size
    pad = 0.3 * float(fb[:, 2].max() - fb[:, 0].min())
    box = (int(max(0, fb[:, 0].min() - pad)), int(max(0, fb[:, 1].min() - pad)), int(min(w, fb[:, 2].max() + pad)), int(min(h, fb[:, 3].max() + pad)))
    opening = mouth_openings(rgb, box)
    env = rms_envelope(audio.samples, audio.sample_rate, 25, len(rgb))
    thr = 0.1 * float(np.percentile(env, 95))
    report = lipsync_report(opening, env, thr)
    assert report.missing_faces == 0
    assert report.correlation >= 0.6, report
    settled = _silent_settled(env, thr)
    assert settled.sum() >= 10, "the clip should contain silent stretches"
    assert np.nanmax(opening[settled]) < CLOSED, f"mouth open during silence: {np.nanmax(opening[settled]):.3f}"
    assert report.speech_mean_opening > 3 * CLOSED, report
