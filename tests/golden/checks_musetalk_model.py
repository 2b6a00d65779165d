"""Golden checks for the MuseTalk model side: audio windows, Whisper features, positional
encoding, VAE encode/decode, UNet. Every size, salt and length comes from the case itself."""
from __future__ import annotations

import json

import torch

from golden.golden_io import assert_close, assert_uint8_close
from newsstudio.engines.musetalk import audio_features as af
from newsstudio.engines.musetalk import unet as mt_unet
from newsstudio.engines.musetalk import vae as mt_vae
from newsstudio.engines.musetalk import weights as mt_weights
from newsstudio.weights.seeded import seeded_input

FLOAT_TOL = 1e-4

# Seeded networks are expensive (the UNet has 850M parameters): one build per (config, salt) per session.
_MODELS: dict[tuple[str, str, int], torch.nn.Module] = {}


def _cached(kind: str, config: dict, salt: int) -> torch.nn.Module:
    key = (kind, json.dumps(config, sort_keys=True), int(salt))
    if key not in _MODELS:
        build = {"unet": mt_weights.random_unet, "vae": mt_weights.random_vae,
                 "whisper": mt_weights.random_whisper_encoder}[kind]
        _MODELS[key] = build(int(salt), "cpu", torch.float32, config=config)
    return _MODELS[key]


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


def check_audio_end_to_end(t: dict, meta: dict) -> None:
    """1c: waveform -> log-mel -> seeded Whisper encoder -> stacked states -> prompts, rel 1e-4."""
    wave = t["in.waveform"]
    L, fps = int(meta["librosa_length"]), meta["fps"]
    assert wave.numel() == L
    enc = _cached("whisper", meta["whisper_config"], meta["weight_salt"])
    pieces = af.split_pieces(wave)
    feats = af.log_mel(torch.stack([torch.nn.functional.pad(p, (0, af.PIECE_SAMPLES - p.numel())) for p in pieces]))
    ref_feats = t["out.input_features"]
    assert_close("input_features", feats[: ref_feats.shape[0]], ref_feats, FLOAT_TOL)
    assert_close("input_features (HF extractor)", af.log_mel_hf(pieces[0]), ref_feats[:1], FLOAT_TOL)
    stacked = af.whisper_hidden_states(enc, wave)
    head = t["out.stacked_hidden_states_head"]
    assert_close("stacked_hidden_states_head", stacked[:, : head.shape[1]], head, FLOAT_TOL)
    prompts = af.window_prompts(stacked, L, fps)
    assert prompts.shape[0] == int(t["out.num_frames"][0]) == af.frame_count(L, fps)
    assert_close("audio_prompts", prompts, t["out.audio_prompts"], FLOAT_TOL)
    # the one-call API gives the same
    assert_close("audio_prompts (audio_prompts())", af.audio_prompts(enc, wave, fps), t["out.audio_prompts"], FLOAT_TOL)


def check_vae_encode_latents(t: dict, meta: dict) -> None:
    """3a: preprocessing (exact), posterior mean/std, sampled and mode latents (rel 1e-4)."""
    vae = _cached("vae", meta["vae_config"], meta["weight_salt"])
    sf = float(meta["scaling_factor"])
    crop = t["in.crop_bgr"]
    masked = mt_vae.preprocess(crop, half_mask=True)
    ref = mt_vae.preprocess(crop, half_mask=False)
    assert_close("masked_image", masked, t["out.masked_image"], 1e-6)
    assert_close("ref_image", ref, t["out.ref_image"], 1e-6)
    for name, x in (("masked", masked), ("ref", ref)):
        mean, std = mt_vae.posterior(vae, x)
        assert_close(f"{name}_mean", mean, t[f"out.{name}_mean"], FLOAT_TOL)
        assert_close(f"{name}_std", std, t[f"out.{name}_std"], FLOAT_TOL)
    lat = mt_vae.latents_for_unet(vae, crop, eps_masked=t["in.eps_masked"], eps_ref=t["in.eps_ref"],
                                  scaling_factor=sf)
    assert_close("latents_unet_input", lat, t["out.latents_unet_input"], FLOAT_TOL)
    mode = mt_vae.latents_for_unet(vae, crop, scaling_factor=sf)
    assert_close("latents_unet_input_mode", mode, t["out.latents_unet_input_mode"], FLOAT_TOL)


def check_vae_decode(t: dict, meta: dict) -> None:
    """3b: decoded sample (rel 1e-4) and the uint8 BGR image (<= 1 off on <= 1 % of values);
    post-processing the golden decoded sample must give the golden image exactly. The engine's
    decoder (upsampling as phase convolutions, accel/upsample_conv.py) meets the same bounds."""
    from newsstudio.accel.upsample_conv import with_phase_upsampling

    vae = _cached("vae", meta["vae_config"], meta["weight_salt"])
    sf = float(meta["scaling_factor"])
    decoded = mt_vae.decode(vae, t["in.latents"], scaling_factor=sf)
    assert_close("decoded_sample", decoded, t["out.decoded_sample"], FLOAT_TOL)
    assert torch.equal(mt_vae.postprocess_uint8(t["out.decoded_sample"]), t["out.image_bgr"]), \
        "post-processing of the golden decoded_sample must reproduce image_bgr exactly"
    assert_uint8_close("image_bgr", mt_vae.postprocess_uint8(decoded), t["out.image_bgr"], 1, 0.01)
    fast_decoder, replaced = with_phase_upsampling(vae.decoder)
    assert replaced == 3
    with torch.inference_mode():
        fast = fast_decoder(vae.post_quant_conv(t["in.latents"].float() * (1.0 / sf)))
    assert_close("decoded_sample (phase upsampling)", fast, t["out.decoded_sample"], FLOAT_TOL)
    assert_uint8_close("image_bgr (phase upsampling)", mt_vae.postprocess_uint8(fast), t["out.image_bgr"], 1, 0.01)


def check_unet_forward(t: dict, meta: dict) -> None:
    """3c: one UNet step at the stored timestep; encoder_hidden_states = PE(audio_prompts)."""
    ap = t["in.audio_prompts"]
    pe = af.PositionalEncoding(d_model=ap.shape[-1])
    assert_close("encoder_hidden_states", pe(ap), t["in.encoder_hidden_states"], 1e-6)
    unet = _cached("unet", meta["unet_config"], meta["weight_salt"])
    out = mt_unet.unet_step(unet, t["in.latents"], pe(ap), t["in.timesteps"])
    assert_close("sample", out, t["out.sample"], FLOAT_TOL)


CHECKS = {
    "audio_chunk": check_audio_chunk,
    "audio_chunk_two_segments": check_audio_chunk_two_segments,
    "audio_positional_encoding": check_audio_positional_encoding,
    "audio_end_to_end": check_audio_end_to_end,
    "vae_encode_latents": check_vae_encode_latents,
    "vae_decode": check_vae_decode,
    "unet_forward": check_unet_forward,
}
