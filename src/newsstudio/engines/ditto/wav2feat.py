"""Ditto audio features: HuBERT over fixed 6480-sample windows -> one 1024-d row per 25 fps frame.

Reference: ``core/atomic_components/wav2feat.py`` (``Wav2FeatHubert``) and the online chunk loop
of ``inference.py`` in antgroup/ditto-talkinghead. With ``chunksize = (a, b, c)`` (default
(3, 5, 2), in 40 ms frames) every window holds a frames of left context, b frames that are kept
and c frames of look-ahead, plus 80 samples: ``split_len = int((a+b+c)·0.04·16000) + 80``. The
encoder returns 2 rows per frame; rows ``[−2(b+c) : −2c]`` are averaged in pairs -> b frames.

* offline (:func:`wav2feat_offline`): pad ``split_len − int((b+c)·0.04·16000)`` zeros in front and
  ``split_len`` zeros behind, take a window every b frames starting at ``int(i·0.04·16000)``
  (float arithmetic kept: it is one sample short for some i ≥ 803), truncate to
  ``ceil(n/16000·25)`` frames;
* online (:class:`StreamingWav2Feat`): prepend ``a·640`` zeros, a window every ``b·640`` samples;
  a window is processed as soon as its samples have arrived (the last ones zero-padded on
  :meth:`StreamingWav2Feat.finish`), so PCM can be pushed in chunks of any size.

The encoder is pluggable: any callable mapping windows [B, split_len] float32 -> [B, T, D]
(:class:`HubertEncoder` wraps a transformers ``HubertModel``; :func:`single_window_encoder` adapts
an ONNX-style ``[1, n] -> [T, D]`` function such as Ditto's ``hubert_streaming_fix_kv.onnx``).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

SAMPLE_RATE = 16000
FPS = 25
SAMPLES_PER_FRAME = SAMPLE_RATE // FPS  # 640
DEFAULT_CHUNKSIZE = (3, 5, 2)

Encoder = Callable[[Tensor], Tensor]  # [B, split_len] -> [B, T, D]


def split_len(chunksize: Sequence[int] = DEFAULT_CHUNKSIZE) -> int:
    """Samples per encoder window (6480 for (3, 5, 2))."""
    return int(sum(chunksize) * 0.04 * SAMPLE_RATE) + 80


def num_frames(num_samples: int) -> int:
    """25 fps video frames covering ``num_samples`` at 16 kHz: ceil(n / 16000 · 25)."""
    return math.ceil(num_samples / SAMPLE_RATE * FPS)


def select_frames(encoding: Tensor, chunksize: Sequence[int] = DEFAULT_CHUNKSIZE) -> Tensor:
    """Encoder rows [..., T, D] of one window -> the window's kept frames [..., b, D]: rows
    [−2(b+c) : −2c] averaged in consecutive pairs."""
    _, b, c = chunksize
    rows = encoding[..., -2 * (b + c) : encoding.shape[-2] - 2 * c, :]
    return rows.unflatten(-2, (b, 2)).mean(dim=-2)


def _as_tensor(audio: Tensor | np.ndarray) -> Tensor:
    t = torch.as_tensor(audio)
    if t.dim() != 1:
        raise ValueError(f"audio must be 1-D mono samples, got shape {tuple(t.shape)}")
    return t.to(torch.float32)


def offline_windows(audio: Tensor | np.ndarray, chunksize: Sequence[int] = DEFAULT_CHUNKSIZE) -> tuple[Tensor, int]:
    """(windows [n_windows, split_len], num_frames) of the reference's offline path."""
    x = _as_tensor(audio)
    n_f = num_frames(x.shape[0])
    sl = split_len(chunksize)
    left = sl - int(sum(chunksize[1:]) * 0.04 * SAMPLE_RATE)
    padded = torch.cat([x.new_zeros(left), x, x.new_zeros(sl)])
    starts = [int(i * 0.04 * SAMPLE_RATE) for i in range(0, n_f, chunksize[1])]
    if not starts:
        return x.new_zeros((0, sl)), n_f
    return torch.stack([padded[s : s + sl] for s in starts]), n_f


def encode_windows(encoder: Encoder, windows: Tensor, chunksize: Sequence[int], batch_size: int = 1) -> Tensor:
    """Kept frames [n_windows·b, D] for windows [n, split_len], ``batch_size`` windows per call."""
    feats = []
    for s in range(0, windows.shape[0], max(1, batch_size)):
        feats.append(select_frames(encoder(windows[s : s + batch_size]), chunksize))
    return torch.cat(feats).flatten(0, 1) if feats else windows.new_zeros((0, 0))


def wav2feat_offline(
    audio: Tensor | np.ndarray, encoder: Encoder, chunksize: Sequence[int] = DEFAULT_CHUNKSIZE, batch_size: int = 1
) -> Tensor:
    """Per-frame features [ceil(n/640), D] of 16 kHz mono audio (``Wav2FeatHubert.wav2feat``)."""
    windows, n_f = offline_windows(audio, chunksize)
    dev = _encoder_device(encoder, windows)
    return encode_windows(encoder, windows.to(dev), chunksize, batch_size)[:n_f]


class StreamingWav2Feat:
    """Incremental online features: ``push`` PCM (16 kHz mono float32, any chunk size) and get
    the frames of every window that became complete; ``finish`` flushes the zero-padded tail.

    Frames come out in groups of b (5) per window; a window at start p (in the zero-prepended
    stream) needs samples up to p + split_len, i.e. c frames (80 ms) of look-ahead beyond its
    last kept frame. Concatenating every output equals the reference's online loop over the
    whole signal.
    """

    def __init__(self, encoder: Encoder, chunksize: Sequence[int] = DEFAULT_CHUNKSIZE, batch_size: int = 8) -> None:
        self.encoder = encoder
        self.chunksize = tuple(int(c) for c in chunksize)
        self.split_len = split_len(self.chunksize)
        self.hop = self.chunksize[1] * SAMPLES_PER_FRAME
        self.batch_size = batch_size
        self.reset()

    def reset(self) -> None:
        self._buf = torch.zeros(self.chunksize[0] * SAMPLES_PER_FRAME)  # the prepended zeros
        self._buf_start = 0  # absolute position of _buf[0] in the prepended stream
        self._total = self._buf.shape[0]
        self._next = 0  # absolute start of the next window
        self.windows_done = 0

    @property
    def frames_out(self) -> int:
        return self.windows_done * self.chunksize[1]

    def _take_windows(self, final: bool) -> Tensor:
        starts = []
        p = self._next
        while (p + self.split_len <= self._total) or (final and p < self._total):
            starts.append(p)
            p += self.hop
        if not starts:
            return self._buf.new_zeros((0, self.split_len))
        need_end = starts[-1] + self.split_len
        buf = self._buf
        if need_end > self._buf_start + buf.shape[0]:
            buf = torch.cat([buf, buf.new_zeros(need_end - self._buf_start - buf.shape[0])])
        wins = torch.stack([buf[s - self._buf_start : s - self._buf_start + self.split_len] for s in starts])
        self._next = p
        drop = min(self._next, self._total) - self._buf_start
        self._buf = self._buf[drop:]
        self._buf_start += drop
        self.windows_done += len(starts)
        return wins

    def _encode(self, wins: Tensor) -> Tensor:
        if wins.shape[0] == 0:
            return wins.new_zeros((0, 0))
        return encode_windows(self.encoder, wins.to(_encoder_device(self.encoder, wins)), self.chunksize, self.batch_size)

    def push(self, pcm: Tensor | np.ndarray) -> Tensor:
        """Append samples; returns features [m, D] (m a multiple of b, possibly 0)."""
        x = _as_tensor(pcm)
        if x.shape[0]:
            self._buf = torch.cat([self._buf, x.to(self._buf.device)])
            self._total += x.shape[0]
        return self._encode(self._take_windows(final=False))

    def finish(self) -> Tensor:
        """Process the remaining windows (zero-padded at the end) and return their features."""
        return self._encode(self._take_windows(final=True))

    def windows_for(self, audio: Tensor | np.ndarray) -> Tensor:
        """All windows [n, split_len] the online loop feeds for a whole signal (no encoding)."""
        self.reset()
        x = _as_tensor(audio)
        self._buf = torch.cat([self._buf, x])
        self._total += x.shape[0]
        wins = self._take_windows(final=True)
        self.reset()
        return wins


def wav2feat_online(
    audio: Tensor | np.ndarray, encoder: Encoder, chunksize: Sequence[int] = DEFAULT_CHUNKSIZE, batch_size: int = 8
) -> Tensor:
    """The whole signal through :class:`StreamingWav2Feat` (= the reference's online loop)."""
    s = StreamingWav2Feat(encoder, chunksize, batch_size)
    parts = [s.push(audio), s.finish()]
    parts = [p for p in parts if p.numel()]
    return torch.cat(parts) if parts else torch.zeros((0, 0))


# -- encoders ---------------------------------------------------------------------------------------


def _encoder_device(encoder: Encoder, like: Tensor) -> torch.device:
    if isinstance(encoder, nn.Module):
        p = next(encoder.parameters(), None)
        if p is not None:
            return p.device
    return like.device


def fold_weight_norm_(model: nn.Module) -> nn.Module:
    """Replace weight-norm parametrizations by the weights they compute, in place (inference only):
    HuBERT's positional convolution otherwise recomputes g * v / ||v|| on every call (0.7 ms of an
    H200 per call, replayed in every CUDA graph). Same weight values, so the same outputs."""
    from torch.nn.utils import parametrize

    for m in model.modules():
        if parametrize.is_parametrized(m):
            for name in list(m.parametrizations.keys()):
                parametrize.remove_parametrizations(m, name, leave_parametrized=True)
                if name in m._buffers:  # torch keeps a no-grad result as a buffer: it is a weight
                    m.register_parameter(name, nn.Parameter(m._buffers.pop(name), requires_grad=False))
    return model


class HubertEncoder(nn.Module):
    """transformers ``HubertModel`` as a window encoder: [B, n] raw 16 kHz audio (fed as-is, no
    normalisation) -> ``last_hidden_state`` [B, T, D]."""

    def __init__(self, model: nn.Module, fold: bool = True) -> None:
        """``fold``: fold weight norm now (the weights are final); pass False to fill weights
        later, then call ``fold_()``."""
        super().__init__()
        self.model = fold_weight_norm_(model) if fold else model

    def fold_(self) -> "HubertEncoder":
        fold_weight_norm_(self.model)
        return self

    @classmethod
    def from_config(cls, attn_implementation: str = "sdpa", **config_kwargs: object) -> "HubertEncoder":
        from transformers import HubertConfig, HubertModel

        cfg = HubertConfig(**config_kwargs)  # type: ignore[arg-type]
        cfg._attn_implementation = attn_implementation
        return cls(HubertModel(cfg), fold=False).eval()  # weights still to be filled: fold_() after

    @classmethod
    def from_pretrained(cls, path: str | Path, **kwargs: object) -> "HubertEncoder":
        from transformers import HubertModel

        return cls(HubertModel.from_pretrained(str(path), **kwargs)).eval()  # type: ignore[arg-type]

    @torch.no_grad()
    def forward(self, windows: Tensor) -> Tensor:
        p = next(self.model.parameters())
        return self.model(windows.to(p.device, p.dtype)).last_hidden_state


def single_window_encoder(fn: Callable[[Tensor], Tensor]) -> Encoder:
    """Adapt an ONNX-style encoder ``[1, n] -> [T, D]`` (one window per call) to [B, n] -> [B, T, D]."""

    def encode(windows: Tensor) -> Tensor:
        return torch.stack([torch.as_tensor(fn(w[None])) for w in windows])

    return encode


def onnx_hubert_encoder(path: str | Path, providers: Sequence[str] | None = None) -> Encoder:
    """Ditto's released ``hubert_streaming_fix_kv.onnx`` (input ``input_values`` [1, 6480],
    output ``encoding_out`` [T, 1024]) through onnxruntime."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=list(providers) if providers else ort.get_available_providers())

    def run(window: Tensor) -> Tensor:
        out = sess.run(None, {"input_values": window.detach().cpu().numpy().astype(np.float32)})[0]
        return torch.from_numpy(out)

    return single_window_encoder(run)
