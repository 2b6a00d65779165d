"""Is there speech in this audio? One check for every entry point (CLI, HTTP uploads, live).

Why here: silent or empty audio would render a clip of a presenter who never opens the mouth,
which is almost always a mistake (wrong file, muted recording). The HTTP API and the CLI refuse
it with the same words, so the check and its message live in one neutral place.
"""
from __future__ import annotations

import numpy as np

from ..media.audio import Audio
from ..media.errors import MediaError

__all__ = ["MIN_SPEECH_S", "SPEECH_THRESHOLD_DBFS", "NoSpeechError", "require_speech", "speech_seconds"]

#: Speech-band level (dBFS) above which a 20 ms window counts as speech.
SPEECH_THRESHOLD_DBFS = -45.0
#: Audio with less speech than this (seconds) is refused as silent.
MIN_SPEECH_S = 0.1


class NoSpeechError(MediaError):
    """The audio decodes but holds no samples or no speech (an `Audio` never holds NaN/inf: media/audio.py)."""


def speech_seconds(samples: np.ndarray, sample_rate: int, threshold_dbfs: float = SPEECH_THRESHOLD_DBFS) -> float:
    """Seconds of audio whose speech band (300-3400 Hz) is louder than `threshold_dbfs`.

    Cheap and deterministic: 20 ms windows, band energy from an FFT. Used to refuse uploads
    that hold no speech (silence, DC, rumble) with a clear message instead of a silent clip."""
    x = np.asarray(samples, np.float32)
    if x.ndim == 2:
        x = x.mean(axis=0)
    win = max(16, int(sample_rate * 0.02))
    n = x.size // win
    if n == 0:
        return 0.0
    frames = x[: n * win].reshape(n, win)
    spec = np.abs(np.fft.rfft(frames * np.hanning(win).astype(np.float32), axis=1)) ** 2
    freqs = np.fft.rfftfreq(win, 1.0 / sample_rate)
    band = (freqs >= 300) & (freqs <= 3400)
    norm = float(np.sum(np.hanning(win) ** 2)) * win / 2
    level = 10 * np.log10(spec[:, band].sum(axis=1) / norm + 1e-12)
    return float((level > threshold_dbfs).sum() * win / sample_rate)


def require_speech(audio: Audio, source: object) -> float:
    """Seconds of speech in `audio`; :class:`NoSpeechError` naming `source` when it has no
    samples or less than MIN_SPEECH_S of speech."""
    if audio.num_samples == 0:
        raise NoSpeechError(source, "the audio holds no samples")
    speech = speech_seconds(audio.samples, audio.sample_rate)
    if speech < MIN_SPEECH_S:
        raise NoSpeechError(source, f"no speech found in the audio ({audio.duration_s:.2f} s of silence or noise below "
                                    f"{SPEECH_THRESHOLD_DBFS:.0f} dBFS in the speech band)")
    return speech
