"""Golden checks for the MuseTalk model side: audio windows, Whisper features, positional
encoding, VAE encode/decode, UNet. Every size, salt and length comes from the case itself."""
from __future__ import annotations

import torch

from golden.golden_io import assert_close, assert_uint8_close
from newsstudio.engines.musetalk import audio_features as af
from newsstudio.weights.seeded import seeded_input

FLOAT_TOL = 1e-4


def _seeded_from_meta(spec: dict) -> torch.Tensor:
    return seeded_input(spec["name"], spec["shape"], spec.get("salt", 0), spec.get("scale", 1.0))


def _check_window_meta(meta: dict, num_frames_out: torch.Tensor) -> None:
    L, fps = int(meta["librosa_length"]), meta["fps"]
    assert af.frame_count(L, fps) == int(num_frames_out[0]), "num_frames"
    if "actual_length" in meta:
        assert af.row_count(L) == int(meta["actual_length"]), "actual_length"


def check_audio_chunk(t: dict, meta: dict) -> None:
    """1a: windowing of a stored head of the stacked hidden states; exact."""
    L = int(meta["librosa_length"])
    stacked = t["in.hidden_states_head"]
    out = af.window_prompts(stacked, L, meta["fps"], left=int(meta["audio_padding_length_left"]),
                            right=int(meta["audio_padding_length_right"]))
    _check_window_meta(meta, t["out.num_frames"])
    assert out.shape[0] == int(t["out.num_frames"][0])
    assert torch.equal(out, t["out.audio_prompts"]), "audio_prompts differ (must be exact)"


def check_audio_chunk_two_segments(t: dict, meta: dict) -> None:
    """1a': the stacked tensor is regenerated from its seeded_input spec; subset of frames; exact."""
    L = int(meta["librosa_length"])
    stacked = _seeded_from_meta(meta["seeded_input"])
    kw = dict(left=int(meta["audio_padding_length_left"]), right=int(meta["audio_padding_length_right"]))
    _check_window_meta(meta, t["out.num_frames"])
    idx = t["out.frame_index"]
    sub = af.window_prompts(stacked, L, meta["fps"], frames=idx, **kw)
    assert torch.equal(sub, t["out.audio_prompts_subset"]), "audio_prompts_subset differ (must be exact)"
    full = af.window_prompts(stacked, L, meta["fps"], **kw)  # the whole result, then the same rows
    assert full.shape[0] == int(t["out.num_frames"][0])
    assert torch.equal(full[idx], t["out.audio_prompts_subset"])


def check_audio_positional_encoding(t: dict, meta: dict) -> None:
    """1b: table and addition, relative 1e-6."""
    x = t["in.x"]
    ref_table = t["out.pe_table_first50"]
    pe = af.PositionalEncoding(d_model=x.shape[-1])
    assert_close("pe_table_first50", pe.pe[0, :ref_table.shape[0]], ref_table, 1e-6)
    assert_close("y", pe(x), t["out.y"], 1e-6)


CHECKS = {
    "audio_chunk": check_audio_chunk,
    "audio_chunk_two_segments": check_audio_chunk_two_segments,
    "audio_positional_encoding": check_audio_positional_encoding,
}
