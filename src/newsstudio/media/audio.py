"""Audio as float32 ``[channels, n]`` arrays: loading any format, resampling, writing WAV.

The original rate and channel count are kept so the output MP4 carries the speech exactly as
given; the models take ``audio.mono().resampled(16000)``. Resampling is soxr (high quality),
not FFmpeg's swresample default, because the audio-feature models are sensitive to aliasing.
"""
from __future__ import annotations

import os
import uuid
import wave
from dataclasses import InitVar, dataclass
from pathlib import Path

import av
import av.container
import av.stream
import numpy as np
import soxr

from ._container import MediaSource, check_not_truncated, check_wav_complete, decode_error, open_input
from .errors import EmptyAudioError, NoAudioStreamError, NonFiniteAudioError

__all__ = ["Audio", "load_audio", "audio_from_array", "check_finite", "write_wav", "MAX_CHANNELS"]

#: Above this many channels an array axis is taken to be time, not channels.
MAX_CHANNELS = 64


@dataclass(frozen=True, eq=False)
class Audio:
    """PCM audio: ``samples`` float32 ``[channels, n]`` in [-1, 1], at ``sample_rate`` Hz.

    Values are not clipped (a decoder may overshoot slightly); writers clip. They are always
    finite: NaN or infinite samples raise :class:`NonFiniteAudioError` (see :func:`check_finite`).
    ``finite_checked=True`` skips that scan, for samples already checked where they entered (a
    loader naming its file) or derived from an ``Audio`` (a slice per stream chunk, the mean of
    channels, a resampling): one scan per sound, not one per chunk.
    """

    samples: np.ndarray
    sample_rate: int
    finite_checked: InitVar[bool] = False

    def __post_init__(self, finite_checked: bool) -> None:
        s = self.samples
        if not isinstance(s, np.ndarray) or s.ndim != 2 or s.dtype != np.float32:
            raise ValueError(
                "Audio.samples must be a float32 numpy array [channels, n]; "
                "use audio_from_array() to convert other layouts"
            )
        if not 1 <= s.shape[0] <= MAX_CHANNELS:
            raise ValueError(f"Audio must have 1..{MAX_CHANNELS} channels, got {s.shape[0]}")
        if not finite_checked:
            check_finite(s, "audio")
        if int(self.sample_rate) != self.sample_rate or self.sample_rate <= 0:
            raise ValueError(f"sample_rate must be a positive integer, got {self.sample_rate!r}")
        object.__setattr__(self, "sample_rate", int(self.sample_rate))

    @property
    def channels(self) -> int:
        return int(self.samples.shape[0])

    @property
    def num_samples(self) -> int:
        """Samples per channel."""
        return int(self.samples.shape[1])

    @property
    def duration_s(self) -> float:
        return self.num_samples / self.sample_rate

    def mono(self) -> "Audio":
        """Average of the channels (itself when already mono)."""
        if self.channels == 1:
            return self
        return Audio(self.samples.mean(axis=0, keepdims=True, dtype=np.float32), self.sample_rate, finite_checked=True)

    def resampled(self, rate: int) -> "Audio":
        """The same sound at ``rate`` Hz (soxr HQ); itself when the rate already matches.

        Output length is ``round(n * rate / sample_rate)`` (soxr's rule), so durations stay
        within one output sample.
        """
        rate = int(rate)
        if rate <= 0:
            raise ValueError(f"rate must be positive, got {rate}")
        if rate == self.sample_rate:
            return self
        if self.num_samples == 0:
            return Audio(np.zeros((self.channels, 0), np.float32), rate)
        out = soxr.resample(self.samples.T, self.sample_rate, rate, quality="HQ")
        return Audio(np.ascontiguousarray(np.asarray(out, dtype=np.float32).T), rate, finite_checked=True)

    def slice_samples(self, start: int, stop: int | None = None) -> "Audio":
        """Samples ``[start, stop)`` (a view, no copy)."""
        return Audio(self.samples[:, start:stop], self.sample_rate, finite_checked=True)

    def to_int16(self) -> np.ndarray:
        """Interleaved ``(n, channels)`` int16, clipped; inverse of the int16 rule of
        :func:`audio_from_array` (``x * 32768``, so int16 input round-trips exactly)."""
        scaled = np.clip(np.rint(self.samples.T * 32768.0), -32768, 32767)
        return np.ascontiguousarray(scaled.astype(np.int16))


def check_finite(samples: np.ndarray, source: object) -> None:
    """Raise :class:`NonFiniteAudioError` naming ``source`` when any sample is NaN or infinite.

    The one rule for every way audio comes in (files, arrays, streamed PCM): such samples would
    pass through resampling and the models untouched and reach players as noise or silence, so
    they are refused where they enter (~0.1 ms for 15 s of stereo 48 kHz)."""
    if samples.dtype.kind != "f" or np.isfinite(samples).all():
        return
    bad = int(samples.size - np.count_nonzero(np.isfinite(samples)))
    raise NonFiniteAudioError(source, f"{bad} of {samples.size} samples are NaN or infinite; only finite PCM can be used")


def audio_from_array(array, sample_rate: int) -> Audio:
    """Build :class:`Audio` from a numpy array (or anything ``np.asarray`` takes, e.g. a CPU
    torch tensor).

    Layout rule: 1-D is mono ``(n,)``. For 2-D, the **smaller axis is channels**, so both
    ``(n, c)`` (soundfile, scipy) and ``(c, n)`` (torchaudio, ours) work; it must hold at most
    ``MAX_CHANNELS``, and a square array is refused as ambiguous.

    Scaling rule: int16 / 32768, int32 / 2**31, uint8 (WAV 8-bit) (x - 128) / 128; float
    arrays are taken as already in [-1, 1] and only cast to float32 (NaN or infinite values
    raise :class:`NonFiniteAudioError`).
    """
    arr = np.asarray(array)
    if arr.ndim == 1:
        arr = arr[None, :]
    elif arr.ndim == 2:
        a, b = arr.shape
        if a == b and a > 1:
            raise ValueError(f"ambiguous audio array shape {arr.shape}: cannot tell channels from time")
        if a > b:
            arr = arr.T
    else:
        raise ValueError(f"audio array must be (n,), (n, c) or (c, n), got shape {arr.shape}")
    if arr.shape[0] > MAX_CHANNELS:
        raise ValueError(f"audio array {np.asarray(array).shape} would have {arr.shape[0]} channels (max {MAX_CHANNELS})")
    if arr.shape[1] == 0:
        raise EmptyAudioError("array", "audio array has zero samples")
    samples = _pcm_to_float32(arr)
    check_finite(samples, "audio array")
    return Audio(np.ascontiguousarray(samples), sample_rate, finite_checked=True)


def _pcm_to_float32(arr: np.ndarray) -> np.ndarray:
    """int16 / 32768, int32 / 2**31, uint8 (x - 128) / 128, float as is: FFmpeg's own scaling, so
    raw WAV samples read directly equal what its decoder + resampler give."""
    if arr.dtype == np.int16:
        return arr.astype(np.float32) / 32768.0
    if arr.dtype == np.int32:
        return (arr.astype(np.float64) / 2147483648.0).astype(np.float32)
    if arr.dtype == np.uint8:
        return (arr.astype(np.float32) - 128.0) / 128.0
    if np.issubdtype(arr.dtype, np.floating):
        return arr.astype(np.float32)
    raise TypeError(f"audio array dtype must be int16, int32, uint8 or float, got {arr.dtype}")


#: Little-endian interleaved PCM codecs whose packets are the samples themselves.
_RAW_PCM = {"pcm_s16le": "<i2", "pcm_s32le": "<i4", "pcm_u8": "u1", "pcm_f32le": "<f4", "pcm_f64le": "<f8"}


def _raw_pcm(container: av.container.InputContainer, stream: av.stream.Stream, channels: int) -> np.ndarray | None:
    """[channels, n] float32 of a raw-PCM stream by joining its packets (no per-frame decode and
    resample: 1 ms instead of 7 for 15 s of speech); None for any other codec."""
    dtype = _RAW_PCM.get(stream.codec_context.name)
    if dtype is None or channels < 1:
        return None
    data = b"".join(bytes(p) for p in container.demux(stream) if p.size)
    width = np.dtype(dtype).itemsize * channels
    usable = len(data) - len(data) % width  # a cut-off last sample frame is dropped, as the decoder does
    arr = np.frombuffer(data[:usable], dtype=dtype).reshape(-1, channels).T
    return _pcm_to_float32(arr)


def load_audio(source: MediaSource, *, stream_index: int = 0) -> Audio:
    """Decode the ``stream_index``-th audio stream of any file FFmpeg reads (wav, mp3, m4a,
    flac, ogg, or the audio track of a video) at its own rate and channel count.

    ``source`` may be a path, bytes, or a binary file object. Raises
    :class:`NoAudioStreamError`, :class:`EmptyAudioError`, :class:`NonFiniteAudioError` (a
    float file holding NaN/inf) or :class:`MediaDecodeError` (corrupt/truncated), each naming
    the source.
    """
    with open_input(source) as container:
        check_wav_complete(source)
        streams = container.streams.audio
        if len(streams) <= stream_index:
            kinds = ", ".join(s.type for s in container.streams) or "no streams"
            raise NoAudioStreamError(source, f"has no audio stream #{stream_index} (found: {kinds})")
        stream = streams[stream_index]
        check_not_truncated(source, stream)
        ctx = stream.codec_context
        rate = int(ctx.sample_rate or 0)
        if rate <= 0:
            raise NoAudioStreamError(source, "audio stream has no sample rate")
        channels = ctx.channels if hasattr(ctx, "channels") else ctx.layout.nb_channels
        try:
            raw = _raw_pcm(container, stream, int(channels or 0))
        except av.FFmpegError as exc:
            raise decode_error(source, exc, "audio") from exc
        if raw is not None:
            if raw.shape[1] == 0:
                raise EmptyAudioError(source, "audio stream holds zero samples")
            check_finite(raw, source)  # here, to name the file (Audio() would say "audio")
            return Audio(np.ascontiguousarray(raw), rate, finite_checked=True)
        # Resampler to planar float keeping rate and layout: one code path for every other format.
        resampler = av.AudioResampler(format="fltp", layout=ctx.layout, rate=rate)
        chunks: list[np.ndarray] = []
        # Decoders emit whole codec frames; the container's packet durations say how much of
        # the last one is real (AAC in mp4 pads its final frame to 1024 samples).
        declared = 0
        try:
            for frame in container.decode(stream):
                declared += _frame_samples(frame)
                for out in resampler.resample(frame):
                    chunks.append(out.to_ndarray())
            for out in resampler.resample(None):
                chunks.append(out.to_ndarray())
        except av.FFmpegError as exc:
            raise decode_error(source, exc, "audio") from exc
    if not chunks or sum(c.shape[1] for c in chunks) == 0:
        raise EmptyAudioError(source, "audio stream holds zero samples")
    samples = np.concatenate(chunks, axis=1).astype(np.float32, copy=False)
    if 0 < declared < samples.shape[1]:
        samples = samples[:, :declared]
    check_finite(samples, source)
    return Audio(np.ascontiguousarray(samples), rate, finite_checked=True)


def _frame_samples(frame: av.AudioFrame) -> int:
    """Samples of ``frame`` that are real audio: its duration when shorter than its size."""
    n = frame.samples
    duration, time_base = frame.duration, frame.time_base
    if duration and time_base and frame.sample_rate:
        real = int(round(duration * time_base * frame.sample_rate))
        if 0 < real < n:
            return real
    return n


def write_wav(path: str | os.PathLike, audio: Audio) -> Path:
    """Write 16-bit PCM WAV atomically (temp file in the same folder, then rename).

    A reader never sees a half-written file, and a failure leaves no file behind.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_name = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.partial")
    try:
        with open(tmp_name, "xb") as fh, wave.open(fh, "wb") as w:
            w.setnchannels(audio.channels)
            w.setsampwidth(2)
            w.setframerate(audio.sample_rate)
            w.writeframes(audio.to_int16().astype("<i2").tobytes())
        os.replace(tmp_name, path)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    return path
