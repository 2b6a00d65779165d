"""MuseTalk audio conditioning: waveform -> Whisper-tiny hidden states -> per-frame prompts.

Reproduces the official v1.5 path (`musetalk/utils/audio_processor.py`, `AudioProcessor`) and
`PositionalEncoding` (`musetalk/models/unet.py`) bit for bit where the reference is
deterministic, and adds an incremental extractor for streaming.

The official computation, in short:

1. 16 kHz mono audio of `L` samples is cut into 30 s pieces (480 000 samples, the last one
   shorter). Each piece is zero-padded to 30 s and turned into an HF-Whisper log-mel `[80, 3000]`
   (`log_mel` here is a torch re-implementation of `WhisperFeatureExtractor` that also runs on the
   GPU; `log_mel_hf` calls the HF extractor itself).
2. The Whisper-tiny encoder runs on every piece; its 5 hidden states (input embedding, outputs of
   layers 0-2, output of layer 3 after the final LayerNorm) are stacked -> `[1500, 5, 384]` per
   piece (50 rows per second), pieces concatenated in time.
3. `fps` is truncated with `int()`, `m = 50 / fps`. The first `floor(L/16000*50)` rows are kept,
   `ceil(m)*left` zero rows are prepended, and video frame `i` (of `floor(L/16000*fps)`) takes the
   10 padded rows starting at `floor(i*m)` (double precision), flattened time-major -> `[50, 384]`.
   With the default padding 2/2 that is the audio of frames `i-2 ... i+2`.
4. A fixed sinusoidal table (`PositionalEncoding`) is added before the UNet.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import lru_cache

import numpy as np
import torch
from torch import nn

from ...accel.constants import device_constant
from ...accel.host_copy import to_device

SAMPLE_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160
N_MELS = 80
PIECE_SECONDS = 30
PIECE_SAMPLES = PIECE_SECONDS * SAMPLE_RATE  # 480 000
MEL_FRAMES = PIECE_SAMPLES // HOP_LENGTH  # 3000
ROWS_PER_SECOND = 50  # encoder rows (after the stride-2 conv) per second of audio
ROWS_PER_PIECE = PIECE_SECONDS * ROWS_PER_SECOND  # 1500
N_HIDDEN_STATES = 5  # embedding + 4 encoder layers (last one after the final LayerNorm)


# --------------------------------------------------------------------------------------------
# Log-mel spectrogram (HF WhisperFeatureExtractor defaults)
# --------------------------------------------------------------------------------------------

def _hz_to_mel_slaney(f: np.ndarray) -> np.ndarray:
    """Slaney mel scale: linear below 1 kHz, logarithmic above (as librosa/HF `slaney`)."""
    f = np.asarray(f, dtype=np.float64)
    mel = 3.0 * f / 200.0
    log_region = f >= 1000.0
    mel = np.where(log_region, 15.0 + np.log(np.maximum(f, 1e-300) / 1000.0) * (27.0 / np.log(6.4)), mel)
    return mel


def _mel_to_hz_slaney(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    f = 200.0 * mel / 3.0
    log_region = mel >= 15.0
    return np.where(log_region, 1000.0 * np.exp((np.log(6.4) / 27.0) * (mel - 15.0)), f)


@lru_cache(maxsize=8)
def mel_filter_bank(n_mels: int = N_MELS, n_fft: int = N_FFT, sampling_rate: int = SAMPLE_RATE,
                    f_min: float = 0.0, f_max: float = 8000.0) -> np.ndarray:
    """Triangular Slaney-scale filters with Slaney area normalisation, `[n_fft//2+1, n_mels]` float64.

    Same construction as `transformers.audio_utils.mel_filter_bank(norm="slaney",
    mel_scale="slaney")`, which WhisperFeatureExtractor uses: filter edges evenly spaced on the
    mel scale, FFT bin frequencies `linspace(0, sr//2, n_fft//2+1)`, each filter scaled by
    `2 / (f_right - f_left)`.
    """
    n_freq = 1 + n_fft // 2
    mel_pts = np.linspace(_hz_to_mel_slaney(np.array(f_min)), _hz_to_mel_slaney(np.array(f_max)), n_mels + 2)
    edges = _mel_to_hz_slaney(mel_pts)
    fft_freqs = np.linspace(0, sampling_rate // 2, n_freq)
    diff = np.diff(edges)
    slopes = edges[None, :] - fft_freqs[:, None]
    down = -slopes[:, :-2] / diff[:-1]
    up = slopes[:, 2:] / diff[1:]
    filters = np.maximum(0.0, np.minimum(down, up))
    filters *= (2.0 / (edges[2:n_mels + 2] - edges[:n_mels]))[None, :]
    filters.setflags(write=False)
    return filters


def _filters_on(device: torch.device) -> torch.Tensor:
    return device_constant("mel filters", device,
                           lambda d: torch.from_numpy(np.array(mel_filter_bank())).to(device=d, dtype=torch.float32))


def _as_waveform(wave: np.ndarray | torch.Tensor | Sequence[float], device: torch.device | str | None) -> torch.Tensor:
    if isinstance(wave, torch.Tensor):
        t = wave
    else:
        t = torch.from_numpy(np.ascontiguousarray(np.asarray(wave, dtype=np.float32)))
    return to_device(t, device if device is not None else t.device, torch.float32)


@torch.no_grad()
def log_mel(waveform: np.ndarray | torch.Tensor, *, device: torch.device | str | None = None) -> torch.Tensor:
    """Whisper log-mel of one or several 30 s pieces: `[N]` or `[B, N]` samples -> `[B, 80, 3000]`.

    Each row is zero-padded at the end (or truncated) to 480 000 samples, then: centred STFT
    (n_fft 400, hop 160, periodic Hann, reflect padding), power spectrum, last frame dropped,
    Slaney mel filters, `log10(max(., 1e-10))`, floor at (per-piece maximum - 8), `(x + 4) / 4`.
    Same operations in the same order as the torch path of HF `WhisperFeatureExtractor`, so it
    agrees with it to float32 rounding on CPU; it runs wherever `device` (default: the input's
    device) is.
    """
    x = _as_waveform(waveform, device)
    if x.dim() == 1:
        x = x[None]
    if x.dim() != 2:
        raise ValueError(f"waveform must be [N] or [B, N], got {tuple(x.shape)}")
    n = x.shape[1]
    if n < PIECE_SAMPLES:
        x = torch.nn.functional.pad(x, (0, PIECE_SAMPLES - n))
    elif n > PIECE_SAMPLES:
        x = x[:, :PIECE_SAMPLES]
    window = torch.hann_window(N_FFT, device=x.device)
    spec = torch.stft(x, N_FFT, HOP_LENGTH, window=window, return_complex=True)
    power = (spec[..., :-1].abs() ** 2).contiguous()
    mel = _filters_on(x.device).T @ power
    logspec = torch.clamp(mel, min=1e-10).log10()
    peak = logspec.amax(dim=(1, 2), keepdim=True)
    logspec = torch.maximum(logspec, peak - 8.0)
    return (logspec + 4.0) / 4.0


def log_mel_hf(waveform: np.ndarray | torch.Tensor) -> torch.Tensor:
    """The same features from HF `WhisperFeatureExtractor()` itself (CPU, `[1, 80, 3000]`).

    This is exactly what the reference calls; kept as the cross-check for `log_mel`.
    """
    from transformers import WhisperFeatureExtractor

    w = waveform.detach().cpu().numpy() if isinstance(waveform, torch.Tensor) else np.asarray(waveform)
    fe = _hf_extractor()
    return fe(w.astype(np.float32), sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features


@lru_cache(maxsize=1)
def _hf_extractor():
    from transformers import WhisperFeatureExtractor

    return WhisperFeatureExtractor()


def split_pieces(waveform: np.ndarray | torch.Tensor) -> list:
    """Consecutive 30 s pieces of a 1-D signal (the last one shorter), as the reference cuts them."""
    n = int(waveform.shape[0])
    return [waveform[i:i + PIECE_SAMPLES] for i in range(0, n, PIECE_SAMPLES)]


# --------------------------------------------------------------------------------------------
# Whisper encoder hidden states
# --------------------------------------------------------------------------------------------

def _module_device_dtype(module: nn.Module) -> tuple[torch.device, torch.dtype]:
    p = next(module.parameters())
    return p.device, p.dtype


StatesFn = Callable[[torch.Tensor], torch.Tensor]  # padded 30 s pieces [B, 480 000] -> states [B, 1500, 5, D]


@torch.no_grad()
def encoder_hidden_states(encoder: nn.Module, features: torch.Tensor) -> torch.Tensor:
    """All 5 hidden states of the Whisper encoder, stacked: `[B, 80, 3000]` -> `[B, 1500, 5, 384]`.

    `encoder` is a transformers `WhisperEncoder` (e.g. `WhisperModel.encoder`). The features are
    cast to the encoder's device and dtype, as the reference casts them to the weight dtype.
    State 4 is the last layer's output after the final LayerNorm (transformers' definition, the
    one MuseTalk was trained with).
    """
    device, dtype = _module_device_dtype(encoder)
    out = encoder(features.to(device=device, dtype=dtype), output_hidden_states=True)
    states = out.hidden_states
    if len(states) != N_HIDDEN_STATES:
        raise ValueError(f"expected {N_HIDDEN_STATES} hidden states from the encoder, got {len(states)}")
    return torch.stack(states, dim=2)


@torch.no_grad()
def piece_hidden_states(encoder: nn.Module, pieces: torch.Tensor) -> torch.Tensor:
    """Hidden states of 30 s pieces of 16 kHz audio, each zero-padded to 480 000 samples:
    `[B, 480000]` -> `[B, 1500, 5, 384]` (`log_mel`, then `encoder_hidden_states`). What a
    `StatesFn` computes: the MuseTalk engine runs it as one CUDA graph per batch size, the log-mel's
    ~15 kernels included, so a live stream's update launches none of them itself."""
    return encoder_hidden_states(encoder, log_mel(pieces))


@torch.no_grad()
def whisper_hidden_states(encoder: nn.Module, waveform: np.ndarray | torch.Tensor, *,
                          mel: str = "torch", pieces_per_batch: int = 4) -> torch.Tensor:
    """Stacked hidden states of a whole 16 kHz waveform: `[1, 1500 * n_pieces, 5, 384]`.

    `mel="torch"` computes the log-mel with `log_mel` on the encoder's device, `mel="hf"` with
    the HF extractor on the CPU (the reference's exact call). Pieces go through the encoder in
    batches of `pieces_per_batch` (batching changes nothing but float rounding).
    """
    device, _ = _module_device_dtype(encoder)
    wave = waveform if isinstance(waveform, torch.Tensor) else torch.from_numpy(np.asarray(waveform, np.float32))
    wave = wave.reshape(-1)
    pieces = split_pieces(wave)
    if not pieces:
        raise ValueError("empty waveform")
    out = []
    for s in range(0, len(pieces), pieces_per_batch):
        batch = pieces[s:s + pieces_per_batch]
        if mel == "hf":
            out.append(encoder_hidden_states(encoder, torch.cat([log_mel_hf(p) for p in batch])))
        elif mel == "torch":
            rows = torch.zeros(len(batch), PIECE_SAMPLES, dtype=torch.float32, device=device)
            for j, p in enumerate(batch):
                rows[j, :p.shape[0]] = to_device(p, device, torch.float32)
            out.append(piece_hidden_states(encoder, rows))
        else:
            raise ValueError(f"mel must be 'torch' or 'hf', got {mel!r}")
    stacked = torch.cat(out, dim=0)  # [P, 1500, 5, D]
    return stacked.reshape(1, -1, *stacked.shape[2:])


# --------------------------------------------------------------------------------------------
# Per-frame windows (pure indexing)
# --------------------------------------------------------------------------------------------

def frame_count(num_samples: int, fps: float, sampling_rate: int = SAMPLE_RATE) -> int:
    """Number of video frames the reference makes for `num_samples` of audio: floor(L/sr*int(fps))."""
    return math.floor((num_samples / sampling_rate) * int(fps))


def row_count(num_samples: int, sampling_rate: int = SAMPLE_RATE) -> int:
    """Encoder rows kept for `num_samples` of audio (`actual_length`): floor(L/sr*50)."""
    return math.floor((num_samples / sampling_rate) * ROWS_PER_SECOND)


class FrameWindowing:
    """Where each video frame's 10-row window lies, for one fps and padding.

    `start(i)` is the first *original* row of frame `i`'s window (may be negative: those rows are
    the zero left padding); the window spans `length` rows.
    """

    def __init__(self, fps: float, left: int = 2, right: int = 2) -> None:
        self.fps = int(fps)
        if self.fps <= 0:
            raise ValueError(f"fps must be >= 1 after int(), got {fps!r}")
        self.multiplier = ROWS_PER_SECOND / self.fps  # Python float division, as the reference
        self.pad = math.ceil(self.multiplier)
        self.pad_left = self.pad * left
        self.length = 2 * (left + right + 1)

    def starts(self, frames: torch.Tensor) -> torch.Tensor:
        """First original row of each frame: floor(i * m) in float64 minus the left padding."""
        a = torch.floor(frames.to(torch.float64) * self.multiplier).to(torch.int64)
        return a - self.pad_left

    def start(self, i: int) -> int:
        return math.floor(i * self.multiplier) - self.pad_left


def _padded_rows(rows: torch.Tensor, row_offset: int, valid_rows: int, lo: int, hi: int) -> torch.Tensor:
    """Original rows ``lo .. hi-1`` from a block holding ``row_offset ..``: rows below 0 or at or
    above ``valid_rows`` as exact zeros; the others must lie in the block."""
    buf = rows.new_zeros((hi - lo, rows.shape[1], rows.shape[2]))
    src_lo, src_hi = max(lo, 0), min(hi, valid_rows)
    if src_hi > src_lo:
        if src_lo < row_offset or src_hi > row_offset + rows.shape[0]:
            raise ValueError(f"rows {src_lo}..{src_hi - 1} needed but the block holds "
                             f"{row_offset}..{row_offset + rows.shape[0] - 1}")
        buf[src_lo - lo:src_hi - lo] = rows[src_lo - row_offset:src_hi - row_offset]
    return buf


def gather_windows(rows: torch.Tensor, row_offset: int, valid_rows: int, frames: torch.Tensor,
                   windowing: FrameWindowing) -> torch.Tensor:
    """Windows of the given frames from a block of stacked hidden states.

    rows: `[R, H, D]` holding original rows `row_offset ... row_offset+R-1`. Rows below 0 or at or
    above `valid_rows` read as exact zeros (the reference's padding / trimming). Every window row
    that is needed, valid and non-negative must lie inside the block. Returns `[F, length*H, D]`,
    row `t*H + h` = window row t, hidden state h.
    """
    frames = frames.to(torch.int64).reshape(-1)
    h, d = rows.shape[1], rows.shape[2]
    if frames.numel() == 0:
        return rows.new_zeros((0, windowing.length * h, d))
    starts = windowing.starts(frames)
    lo = int(starts.min())
    hi = int(starts.max()) + windowing.length
    buf = _padded_rows(rows, row_offset, valid_rows, lo, hi)
    idx = to_device(starts - lo, rows.device)[:, None] + torch.arange(windowing.length, device=rows.device)[None, :]
    return buf[idx].reshape(frames.numel(), windowing.length * h, d)


def gather_window_range(rows: torch.Tensor, row_offset: int, valid_rows: int, first: int, stop: int,
                        windowing: FrameWindowing) -> torch.Tensor:
    """`gather_windows` of the consecutive frames ``first .. stop-1``, the same values, with the
    window starts computed as Python ints and each window sliced out of the block: ~5 torch calls
    instead of ~20 (a live stream gathers ~10 times a second, and under many streams each torch
    call waits for the GIL)."""
    h, d = rows.shape[1], rows.shape[2]
    length = windowing.length
    if stop <= first:
        return rows.new_zeros((0, length * h, d))
    starts = [windowing.start(i) for i in range(first, stop)]  # nondecreasing in i
    lo, hi = starts[0], starts[-1] + length
    if 0 <= lo and hi <= valid_rows and row_offset <= lo and hi <= row_offset + rows.shape[0]:
        src, base = rows, row_offset  # every window row is a real row of the block: no padding needed
    else:  # windows reaching into the zero padding (or past the valid rows)
        src, base = _padded_rows(rows, row_offset, valid_rows, lo, hi), lo
    windows = torch.stack([src[s - base:s - base + length] for s in starts])
    return windows.reshape(stop - first, length * h, d)


def window_prompts(stacked: torch.Tensor, num_samples: int, fps: float, *, left: int = 2, right: int = 2,
                   frames: torch.Tensor | None = None) -> torch.Tensor:
    """`get_whisper_chunk`'s indexing: stacked hidden states -> `[num_frames, 50, 384]` prompts.

    stacked: `[1, T, 5, D]` or `[T, 5, D]` with at least `row_count(num_samples)` rows.
    `frames` selects a subset of frame indices (default: all `frame_count(num_samples, fps)`).
    Values are copied, never computed: the result equals the reference exactly. Where the
    reference would crash (windows running past its fixed right padding, fps >= 50) the missing
    rows are zeros, continuing its own padding.
    """
    rows = stacked[0] if stacked.dim() == 4 else stacked
    actual = row_count(num_samples)
    if rows.shape[0] < actual:
        raise ValueError(f"{rows.shape[0]} hidden-state rows given, {actual} needed for {num_samples} samples")
    w = FrameWindowing(fps, left, right)
    n = frame_count(num_samples, fps)
    if frames is None:
        frames = torch.arange(n)
    elif frames.numel() and (int(frames.min()) < 0 or int(frames.max()) >= n):
        raise IndexError(f"frame indices must lie in 0..{n - 1}")
    return gather_windows(rows, 0, actual, frames, w)


@torch.no_grad()
def audio_prompts(encoder: nn.Module, waveform: np.ndarray | torch.Tensor, fps: float, *, left: int = 2,
                  right: int = 2, mel: str = "torch") -> torch.Tensor:
    """Whole-file conditioning, the reference's `get_audio_feature` + `get_whisper_chunk`:
    16 kHz mono waveform -> `[num_frames, 50, 384]` (before the positional encoding), on the
    encoder's device and dtype."""
    n = int(waveform.shape[-1])
    stacked = whisper_hidden_states(encoder, waveform, mel=mel)
    return window_prompts(stacked, n, fps, left=left, right=right)


# --------------------------------------------------------------------------------------------
# Positional encoding
# --------------------------------------------------------------------------------------------

def positional_encoding_table(d_model: int = 384, max_len: int = 5000) -> torch.Tensor:
    """The reference's sinusoid table `[max_len, d_model]`, computed on the CPU in float32 the same way:
    pe[pos, 2j] = sin(pos * d_j), pe[pos, 2j+1] = cos(pos * d_j), d_j = exp(2j * (-ln(10000)/d))."""
    position = torch.arange(0, max_len, dtype=torch.float32).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe


class PositionalEncoding(nn.Module):
    """Adds the fixed sinusoid table to audio prompts `[B, T, d]` (MuseTalk's `PositionalEncoding`).

    The table is built on the CPU (so CUDA's sin/cos cannot change it) and kept as buffer `pe`
    `[1, max_len, d]`; `.to(dtype)` casts it like the reference's `pe.half()`.
    """

    def __init__(self, d_model: int = 384, max_len: int = 5000) -> None:
        super().__init__()
        self.register_buffer("pe", positional_encoding_table(d_model, max_len).unsqueeze(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq_len = x.shape[1]
        return x + self.pe[:, :seq_len].to(device=x.device, dtype=x.dtype)


# --------------------------------------------------------------------------------------------
# Streaming
# --------------------------------------------------------------------------------------------

# Measured upper bound of `streaming_error` (see StreamingAudioFeatures): relative L2 error over all
# frames, and of the worst single frame, with seeded random weights on real speech.
STREAMING_ERROR_BOUND = {"overall": 0.40, "worst_frame": 0.75}


class StreamingAudioFeatures:
    """Incremental per-frame prompts from 16 kHz float32 PCM chunks.

    `push(pcm)` returns the prompts `[k, 50, 384]` of every frame whose window (+-2 frames of
    context, i.e. 2 frames of look-ahead) is now covered by received audio, plus
    `extra_lookahead_rows` more 20 ms rows if asked; `finish()` returns the rest, computed exactly
    as the whole-file reference would (same length, same zero padding at the end).
    `min_frames_per_update` > 1 batches frames (one encoder run per batch, more latency).

    How it differs from the whole-file computation: Whisper attends over a whole 30 s piece and the
    log-mel floor depends on the piece's maximum, so a row's value depends on audio after it. Rows
    of completed 30 s pieces are exact. Rows of the piece still being received are recomputed
    (log-mel + encoder over the received part of the piece, zero-padded to 30 s as usual) whenever
    new frames are due, so frames emitted before their piece is complete are approximations:
    pushing everything at once and calling `finish()` reproduces the reference (float rounding
    only), and frames emitted by `finish()` are exact.

    Measured difference from the whole-file prompts (`streaming_error`; real speech: media/speech.wav
    15.8 s and media/yongen.wav 8 s, resampled to 16 kHz with soxr; whisper-tiny with seeded random
    weights, salt 0; fps 25 and 30; chunks of 20, 40, 100, 320 and 1000 ms; extra look-ahead 0-25
    rows; float32, H200 and CPU): relative L2 error over all frames 0.13-0.37 (speech.wav:
    0.32-0.37), worst single frame 0.32-0.70. `STREAMING_ERROR_BOUND` (0.40 overall, 0.75 per
    frame) covers all of them and tests/test_musetalk_manifests.py asserts it on speech.wav.
    Nearly all of it comes from the encoder's global self-attention, not from the log-mel
    (with the received part's log-mel replaced by the whole file's, the error is unchanged; the
    embedding state 0 alone differs by only 0.3-4 %), and extra look-ahead barely helps (25 rows =
    0.5 s lowers 0.37 to 0.34): random weights attend almost uniformly over the 30 s piece, so each
    row mixes in the whole future. With the trained checkpoint the figure will differ (its
    attention is content-dependent); it cannot be measured without the real weights.
    Cost: one log-mel + encoder run over a 30 s piece per update (about 6 ms per update on an H200
    in float32 with 20-40 ms chunks, `recomputations` counts them). The piece being received is
    kept twice: on the host, where pushes write their samples (no torch call per push), and
    zero-padded where the log-mel runs (the encoder's device with ``mel="torch"``), where an update
    copies only the samples that arrived since the last one and reads the piece in place: two torch
    calls and a few KB instead of copying up to 1.9 MB of received audio into a fresh padded buffer
    each time (a live server's speech threads update ~10 times a second per stream, and under many
    streams each torch call waits for the GIL).
    """

    def __init__(self, encoder: nn.Module, fps: float, *, left: int = 2, right: int = 2,
                 extra_lookahead_rows: int = 0, min_frames_per_update: int = 1, mel: str = "torch",
                 states_fn: StatesFn | None = None) -> None:
        self.encoder = encoder
        self.states_fn = states_fn
        self.min_frames_per_update = max(1, int(min_frames_per_update))
        self.windowing = FrameWindowing(fps, left, right)
        self.extra_lookahead_rows = int(extra_lookahead_rows)
        if self.extra_lookahead_rows < 0:
            raise ValueError("extra_lookahead_rows must be >= 0")
        if mel not in ("torch", "hf"):
            raise ValueError(f"mel must be 'torch' or 'hf', got {mel!r}")
        if mel == "hf" and states_fn is not None:
            raise ValueError("states_fn takes waveform pieces (its log-mel included); mel='hf' computes the log-mel "
                             "with the HF extractor on the CPU: use one or the other")
        self.mel = mel
        self.samples_received = 0
        self.frames_emitted = 0
        self.recomputations = 0  # encoder runs over a partial piece (for benchmarks)
        self._device, self._dtype = _module_device_dtype(encoder)
        self._piece = np.zeros(PIECE_SAMPLES, dtype=np.float32)  # the piece being received: [:_piece_len]
        self._piece_len = 0
        self._padded = (torch.zeros(PIECE_SAMPLES, dtype=torch.float32, device=self._device)
                        if mel == "torch" else None)  # the same piece where the log-mel runs, zero past [:_padded_len]
        self._padded_len = 0
        self._no_frames: torch.Tensor | None = None
        self._pieces_done = 0
        self._final: torch.Tensor | None = None  # rows of completed pieces still needed
        self._final_offset = 0
        self._finished = False

    # -- helpers ---------------------------------------------------------------------------
    def _encode_piece(self) -> torch.Tensor:
        """Hidden states ``[1500, 5, D]`` of the piece's received samples, zero-padded to 30 s:
        what `whisper_hidden_states` gives for those samples alone."""
        if self._padded is None:
            return whisper_hidden_states(self.encoder, torch.from_numpy(self._piece[:self._piece_len].copy()),
                                         mel=self.mel)[0]
        lo, hi = self._padded_len, self._piece_len
        if hi > lo:  # the samples that arrived since the last update
            new, dest = torch.from_numpy(self._piece[lo:hi]), self._padded[lo:hi]
            if dest.is_cuda:  # staged in pinned memory first, so the next push may overwrite the host piece
                dest.copy_(new.pin_memory(), non_blocking=True)
            else:
                dest.copy_(new)
            self._padded_len = hi
        pieces = self._padded[None]  # zero past the received samples, as Whisper pads
        states = self.states_fn(pieces) if self.states_fn is not None else piece_hidden_states(self.encoder, pieces)
        return states[0]

    def _piece_done(self) -> None:
        """The next piece starts from zeros (zeroed after this piece's queued reads, on the same stream)."""
        if self._padded is not None:
            self._padded.zero_()
        self._piece_len = self._padded_len = 0

    def _append_final(self, rows: torch.Tensor, offset: int) -> None:
        if self._final is None or self._final.shape[0] == 0:
            self._final, self._final_offset = rows, offset
        else:
            assert self._final_offset + self._final.shape[0] == offset
            self._final = torch.cat([self._final, rows])

    def _drop_before(self, row: int) -> None:
        if self._final is not None and row > self._final_offset:
            k = min(row - self._final_offset, self._final.shape[0])
            self._final = self._final[k:]
            self._final_offset += k

    def _rows_block(self, need_hi: int) -> tuple[torch.Tensor | None, int]:
        """Rows from the first kept final row up to at least `need_hi` (exclusive), recomputing
        the current partial piece if the range reaches into it."""
        piece_start_row = self._pieces_done * ROWS_PER_PIECE
        final = self._final
        if need_hi <= piece_start_row or self._piece_len == 0:
            return final, self._final_offset if final is not None else piece_start_row
        partial = self._encode_piece()
        self.recomputations += 1
        if final is None or final.shape[0] == 0:
            return partial, piece_start_row
        return torch.cat([final, partial]), self._final_offset

    def _emit(self, final: bool) -> torch.Tensor:
        w = self.windowing
        n = self.samples_received
        valid = row_count(n)
        n_frames = frame_count(n, w.fps)
        i = self.frames_emitted
        if final:
            j = n_frames
        else:
            j = i
            while j < n_frames and w.start(j) + w.length + self.extra_lookahead_rows <= valid:
                j += 1
            if j - i < self.min_frames_per_update:
                j = i
        if j <= i:  # most pushes: no frame ready yet (one shared empty result, no torch call)
            if self._no_frames is None:
                self._no_frames = torch.zeros((0, w.length * N_HIDDEN_STATES, self.encoder.config.d_model),
                                              device=self._device, dtype=self._dtype)
            return self._no_frames
        need_hi = min(w.start(j - 1) + w.length, valid)
        block, offset = self._rows_block(need_hi)
        if block is None:  # no rows at all (only possible when every needed row is padding)
            block = torch.zeros((0, N_HIDDEN_STATES, self.encoder.config.d_model), device=self._device, dtype=self._dtype)
            offset = 0
        out = gather_window_range(block, offset, valid, i, j, w)
        self.frames_emitted = j
        self._drop_before(w.start(j))
        return out

    # -- public API ------------------------------------------------------------------------
    @torch.no_grad()
    def push(self, pcm: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Add 16 kHz mono float32 samples; returns the prompts of the frames that became ready."""
        if self._finished:
            raise RuntimeError("push() after finish()")
        a = pcm.detach().to("cpu", torch.float32).numpy() if isinstance(pcm, torch.Tensor) else np.asarray(pcm, np.float32)
        a = a.reshape(-1)
        pos = 0
        while pos < a.shape[0]:
            take = min(PIECE_SAMPLES - self._piece_len, a.shape[0] - pos)
            self._piece[self._piece_len:self._piece_len + take] = a[pos:pos + take]
            self._piece_len += take
            pos += take
            if self._piece_len == PIECE_SAMPLES:
                self._append_final(self._encode_piece(), self._pieces_done * ROWS_PER_PIECE)
                self._pieces_done += 1
                self._piece_done()
        self.samples_received += a.shape[0]
        return self._emit(final=False)

    @torch.no_grad()
    def finish(self) -> torch.Tensor:
        """End of audio: the remaining frames, exactly as the whole-file computation gives them."""
        if self._finished:
            raise RuntimeError("finish() called twice")
        self._finished = True
        if self._piece_len:
            self._append_final(self._encode_piece(), self._pieces_done * ROWS_PER_PIECE)
            self._pieces_done += 1
            self._piece_done()
        return self._emit(final=True)


@torch.no_grad()
def streaming_error(encoder: nn.Module, waveform: np.ndarray | torch.Tensor, fps: float, chunk_samples: int, *,
                    extra_lookahead_rows: int = 0, left: int = 2, right: int = 2) -> dict[str, float]:
    """How far `StreamingAudioFeatures` fed `chunk_samples`-sample chunks lands from the whole-file
    prompts: relative L2 error over all frames (`overall`), the worst single frame (`worst_frame`),
    the share of frames that are exact up to float rounding (`exact_share`, rel. error <= 1e-5),
    and the number of partial-piece recomputations."""
    wave = (waveform.detach().cpu().numpy() if isinstance(waveform, torch.Tensor) else np.asarray(waveform))
    wave = wave.astype(np.float32).reshape(-1)
    offline = audio_prompts(encoder, torch.from_numpy(wave), fps, left=left, right=right).double().cpu()
    s = StreamingAudioFeatures(encoder, fps, left=left, right=right, extra_lookahead_rows=extra_lookahead_rows)
    parts = [s.push(wave[i:i + chunk_samples]) for i in range(0, wave.shape[0], chunk_samples)]
    parts.append(s.finish())
    streamed = torch.cat([p.double().cpu() for p in parts])
    if streamed.shape != offline.shape:
        raise AssertionError(f"streamed {tuple(streamed.shape)} vs offline {tuple(offline.shape)}")
    diff = (streamed - offline).flatten(1).norm(dim=1)
    ref = offline.flatten(1).norm(dim=1).clamp_min(1e-30)
    per_frame = diff / ref
    return {
        "overall": float((streamed - offline).norm() / offline.norm()),
        "worst_frame": float(per_frame.max()),
        "exact_share": float((per_frame <= 1e-5).double().mean()),
        "frames": int(offline.shape[0]),
        "recomputations": int(s.recomputations),
    }
