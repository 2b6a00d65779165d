"""MuseTalk model side beyond the golden cases: state-dict manifests, official-layout loading,
audio windowing for any fps, log-mel agreement with HF, VAE/UNet helpers, streaming features."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from golden.golden_io import GOLDEN_DIR
from newsstudio.engines.musetalk import audio_features as af
from newsstudio.engines.musetalk import unet as mt_unet
from newsstudio.engines.musetalk import vae as mt_vae
from newsstudio.engines.musetalk import weights as W

MT_GOLDEN = GOLDEN_DIR / "musetalk"


def _golden_json(name: str) -> dict:
    p = MT_GOLDEN / name
    if not p.exists():
        pytest.skip(f"{p} absent (golden folder ../shared/golden not present)")
    return json.loads(p.read_text())


def _manifest_matches(sd: dict[str, torch.Tensor], manifest: dict, prefix: str = "") -> None:
    ours = {prefix + k: v for k, v in sd.items()}
    assert sorted(ours) == sorted(manifest), (
        f"missing {sorted(set(manifest) - set(ours))[:5]}, unexpected {sorted(set(ours) - set(manifest))[:5]}")
    for k, spec in manifest.items():
        assert list(ours[k].shape) == spec["shape"], k
        assert str(ours[k].dtype).removeprefix("torch.") == spec["dtype"], k


# --------------------------------------------------------------------------------------------
# Manifests and configs
# --------------------------------------------------------------------------------------------

def test_unet_keys_and_shapes_equal_manifest():
    cfg = {k: v for k, v in _golden_json("musetalk.json").items() if not k.startswith("_")}
    assert cfg == W.UNET_CONFIG, "built-in UNet config differs from golden musetalk.json"
    unet = mt_unet.build_unet(cfg, device="meta")
    manifest = _golden_json("unet_state_dict_manifest.json")
    _manifest_matches(unet.state_dict(), manifest)
    assert sum(p.numel() for p in unet.parameters()) == 849_947_844


def test_vae_keys_and_shapes_equal_manifest():
    cfg = {k: v for k, v in _golden_json("sd-vae-config.json").items() if not k.startswith("_")}
    assert cfg == W.VAE_CONFIG
    vae = mt_vae.build_vae(cfg, device="meta")
    _manifest_matches(vae.state_dict(), _golden_json("sd_vae_state_dict_manifest.json"))
    assert mt_vae.scaling_factor_of(vae) == mt_vae.SCALING_FACTOR == 0.18215


def test_whisper_encoder_keys_and_shapes_equal_manifest():
    enc = W.build_whisper_encoder(None, device="meta")
    _manifest_matches(enc.state_dict(), _golden_json("whisper_tiny_encoder_state_dict_manifest.json"), "encoder.")


def test_seeded_whisper_encoder_equals_whole_whisper_model_fill():
    """Filling the encoder under `encoder.*` equals filling the whole WhisperModel (the golden way)."""
    from transformers import WhisperModel

    from newsstudio.weights.seeded import fill_seeded_

    cfg = dict(vocab_size=51865, num_mel_bins=80, d_model=16, encoder_layers=4, encoder_attention_heads=2,
               encoder_ffn_dim=32, decoder_layers=1, decoder_attention_heads=2, decoder_ffn_dim=32,
               max_source_positions=1500, max_target_positions=8)
    from transformers import WhisperConfig

    whole = fill_seeded_(WhisperModel(WhisperConfig(**cfg)), 3)
    enc = W.random_whisper_encoder(3, config=cfg)
    ref = whole.encoder.state_dict()
    for k, v in enc.state_dict().items():
        assert torch.equal(v, ref[k]), k


# --------------------------------------------------------------------------------------------
# Official layout: save tiny seeded models, load them back strictly
# --------------------------------------------------------------------------------------------

TINY_UNET = dict(W.UNET_CONFIG, block_out_channels=[32, 64], down_block_types=["CrossAttnDownBlock2D", "DownBlock2D"],
                 up_block_types=["UpBlock2D", "CrossAttnUpBlock2D"], layers_per_block=1, norm_num_groups=8,
                 cross_attention_dim=16, attention_head_dim=2, sample_size=8)
TINY_VAE = dict(W.VAE_CONFIG, block_out_channels=[8, 16], down_block_types=["DownEncoderBlock2D"] * 2,
                up_block_types=["UpDecoderBlock2D"] * 2, layers_per_block=1, norm_num_groups=4, sample_size=32)
TINY_WHISPER = dict(W.WHISPER_TINY_CONFIG, d_model=32, encoder_attention_heads=2, encoder_ffn_dim=64,
                    decoder_layers=1, decoder_attention_heads=2, decoder_ffn_dim=64, max_target_positions=16)


def _tiny_models(salt: int = 5, version: str = "v15") -> W.MuseTalkModels:
    return W.MuseTalkModels(
        unet=W.random_unet(salt, config=TINY_UNET), vae=W.random_vae(salt, config=TINY_VAE),
        whisper_encoder=W.random_whisper_encoder(salt, config=TINY_WHISPER),
        pe=af.PositionalEncoding(d_model=16), version=version, device=torch.device("cpu"),
        dtype=torch.float32, random_salt=salt)


def _same_state(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


@pytest.fixture(scope="module")
def tiny():
    return _tiny_models()


@pytest.mark.parametrize("version", ["v15", "v10"])
def test_official_layout_round_trip(tmp_path, tiny, version):
    tiny.version = version
    W.save_official_layout(tiny, tmp_path)
    cfg_path, w_path = W.unet_paths(tmp_path, version)
    assert cfg_path.is_file() and w_path.is_file()
    assert {f.local for f in W.missing_files(tmp_path, version)} == {"whisper/preprocessor_config.json"}
    assert {f.local for f in W.missing_files(tmp_path, version, include_optional=True)} == {
        "whisper/preprocessor_config.json", "face-parse-bisent/79999_iter.pth", "face-parse-bisent/resnet18-5c106cde.pth"}
    loaded = W.load_official(tmp_path, version)
    assert not loaded.is_random
    _same_state(loaded.unet, tiny.unet)
    _same_state(loaded.vae, tiny.vae)
    _same_state(loaded.whisper_encoder, tiny.whisper_encoder)
    # same outputs, not just same tensors
    x = torch.randn(1, 8, 8, 8, generator=torch.Generator().manual_seed(0))
    c = torch.randn(1, 50, 16, generator=torch.Generator().manual_seed(1))
    assert torch.equal(mt_unet.unet_step(loaded.unet, x, c), mt_unet.unet_step(tiny.unet, x, c))


def test_vae_legacy_attention_names_and_whisper_full_checkpoint(tmp_path, tiny):
    tiny.version = "v15"
    W.save_official_layout(tiny, tmp_path)
    vpath = tmp_path / "sd-vae" / "diffusion_pytorch_model.bin"
    sd = torch.load(vpath, weights_only=True)
    legacy = {}
    for k, v in sd.items():
        for new, old in (("to_q", "query"), ("to_k", "key"), ("to_v", "value"), ("to_out.0", "proj_attn")):
            if f".attentions.0.{new}." in k:
                k = k.replace(f".{new}.", f".{old}.")
                if old != "proj_attn" and v.dim() == 2:
                    v = v[:, :, None, None]  # the oldest files store 1x1 convolutions
        legacy[k] = v
    assert any(".query." in k for k in legacy) and any(".proj_attn." in k for k in legacy)
    torch.save(legacy, vpath)
    # the HF whisper file holds the decoder and proj_out too, all under model.* (except proj_out)
    wpath = tmp_path / "whisper" / "pytorch_model.bin"
    wsd = torch.load(wpath, weights_only=True)
    wsd["model.decoder.embed_tokens.weight"] = torch.zeros(64, 32)
    wsd["proj_out.weight"] = torch.zeros(64, 32)
    torch.save(wsd, wpath)
    _same_state(W.load_vae(tmp_path), tiny.vae)
    _same_state(W.load_whisper_encoder(tmp_path), tiny.whisper_encoder)


def test_missing_files_are_reported_with_path_and_fetch_command(tmp_path, tiny):
    with pytest.raises(W.MuseTalkWeightsMissing) as e:
        W.load_official(tmp_path / "nowhere")
    msg = str(e.value)
    assert str(tmp_path / "nowhere" / "musetalkV15" / "musetalk.json") in msg and W.FETCH_COMMAND in msg
    tiny.version = "v15"
    W.save_official_layout(tiny, tmp_path)
    (tmp_path / "whisper" / "pytorch_model.bin").unlink()
    with pytest.raises(FileNotFoundError, match="whisper/pytorch_model.bin.*newsstudio weights fetch musetalk"):
        W.load_whisper_encoder(tmp_path)
    (tmp_path / "musetalkV15" / "unet.pth").unlink()
    with pytest.raises(W.MuseTalkWeightsMissing, match="unet.pth"):
        W.load_unet(tmp_path, "v15")
    assert {f.local for f in W.missing_files(tmp_path)} >= {"musetalkV15/unet.pth", "whisper/pytorch_model.bin"}


def test_wrong_checkpoint_is_refused_naming_file_and_key(tmp_path, tiny):
    tiny.version = "v15"
    W.save_official_layout(tiny, tmp_path)
    _, wpath = W.unet_paths(tmp_path, "v15")
    sd = torch.load(wpath, weights_only=True)
    sd["conv_in.weight"] = torch.zeros(1, 2, 3, 3)
    del sd["conv_out.bias"]
    torch.save(sd, wpath)
    with pytest.raises(W.MuseTalkWeightsError) as e:
        W.load_unet(tmp_path, "v15")
    msg = str(e.value)
    assert str(wpath) in msg and "conv_in.weight" in msg and "conv_out.bias" in msg
    wpath.write_bytes(b"not a checkpoint")
    with pytest.raises(W.MuseTalkWeightsError, match="cannot read"):
        W.load_unet(tmp_path, "v15")


def test_model_files_description():
    repos = {f.repo_id for f in W.MODEL_FILES if f.repo_id}
    assert repos == {"TMElyralab/MuseTalk", "stabilityai/sd-vae-ft-mse", "openai/whisper-tiny"}
    v15 = {f.local for f in W.model_files("v15")}
    assert {"musetalkV15/unet.pth", "musetalkV15/musetalk.json", "sd-vae/config.json",
            "whisper/pytorch_model.bin"} <= v15 and "musetalk/pytorch_model.bin" not in v15
    for f in W.MODEL_FILES:
        if f.repo_id:
            assert (f.local_dir + "/" + f.repo_path).lstrip("/") == f.local
    with pytest.raises(ValueError):
        W.model_files("v2")


def test_fetch_offline_gives_clear_error(tmp_path, monkeypatch):
    import huggingface_hub

    def offline(*a, **k):
        raise huggingface_hub.errors.LocalEntryNotFoundError("offline: cannot reach the Hub")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    with pytest.raises(W.MuseTalkWeightsError, match="could not download TMElyralab/MuseTalk/musetalkV15/musetalk.json"):
        W.fetch(tmp_path)


# --------------------------------------------------------------------------------------------
# Windowing for any fps / length (against a literal restatement of get_whisper_chunk)
# --------------------------------------------------------------------------------------------

def _reference_windows(stacked: torch.Tensor, L: int, fps: float, left: int = 2, right: int = 2) -> torch.Tensor:
    """README 1 step 2, written as a plain loop with Python floats."""
    fps = int(fps)
    m = 50 / fps
    nf = math.floor((L / 16000) * fps)
    actual = math.floor((L / 16000) * 50)
    feats = stacked[:, :actual]
    p = math.ceil(m)
    padded = torch.cat([torch.zeros_like(feats[:, : p * left]), feats, torch.zeros_like(feats[:, : p * 3 * right])], 1)
    out = []
    for i in range(nf):
        a = math.floor(i * m)
        clip = padded[:, a:a + 2 * (left + right + 1)]
        assert clip.shape[1] == 2 * (left + right + 1)
        out.append(clip)
    return torch.cat(out).flatten(1, 2)


@pytest.mark.parametrize("fps,L", [(25, 36000), (30, 50123), (29.97, 47999), (24, 16000 * 3 + 7), (20, 33333),
                                   (12, 40000), (10, 30000), (48, 20000), (25, 16000 * 31 + 5)])
def test_window_prompts_equal_reference_loop(fps, L):
    rows = af.row_count(L) + 3
    stacked = torch.randn(1, rows, 5, 6, generator=torch.Generator().manual_seed(L))
    ref = _reference_windows(stacked, L, fps)
    out = af.window_prompts(stacked, L, fps)
    assert out.shape == ref.shape == (af.frame_count(L, fps), 50, 6)
    assert torch.equal(out, ref)
    idx = torch.tensor([0, out.shape[0] // 2, out.shape[0] - 1])
    assert torch.equal(af.window_prompts(stacked, L, fps, frames=idx), ref[idx])


def test_window_prompts_rejects_short_input():
    with pytest.raises(ValueError):
        af.window_prompts(torch.zeros(1, 10, 5, 4), 16000, 25)


# --------------------------------------------------------------------------------------------
# Log-mel and encoder
# --------------------------------------------------------------------------------------------

def test_mel_filter_bank_equals_transformers():
    from transformers.audio_utils import mel_filter_bank

    ref = mel_filter_bank(num_frequency_bins=201, num_mel_filters=80, min_frequency=0.0, max_frequency=8000.0,
                          sampling_rate=16000, norm="slaney", mel_scale="slaney")
    np.testing.assert_allclose(af.mel_filter_bank(), ref, rtol=1e-12, atol=1e-15)


def _speech16k(media) -> np.ndarray:
    import wave

    import soxr

    with wave.open(str(media("speech.wav"))) as w:
        x = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16).astype(np.float32) / 32768.0
        if w.getnchannels() > 1:
            x = x.reshape(-1, w.getnchannels()).mean(1)
        sr = w.getframerate()
    return soxr.resample(x, sr, 16000).astype(np.float32)


def test_torch_log_mel_matches_hf_extractor(media):
    y = _speech16k(media)
    ref = af.log_mel_hf(y)
    out = af.log_mel(torch.from_numpy(y))
    rel = float((out - ref).norm() / ref.norm())
    assert rel <= 1e-4, rel
    # batched rows are independent (own padding, own floor)
    noise = 0.05 * torch.randn(16000 * 2, generator=torch.Generator().manual_seed(0))
    both = af.log_mel(torch.stack([torch.from_numpy(y[:32000]), noise]))
    assert torch.allclose(both[1:], af.log_mel(noise), rtol=0, atol=1e-5)
    assert torch.allclose(both[:1], af.log_mel(torch.from_numpy(y[:32000])), rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def tiny_encoder():
    return W.random_whisper_encoder(7, config=TINY_WHISPER)


def test_hidden_state_definition(tiny_encoder):
    feats = af.log_mel(0.1 * torch.randn(20000, generator=torch.Generator().manual_seed(1)))
    st = af.encoder_hidden_states(tiny_encoder, feats)
    assert st.shape == (1, 1500, 5, 32)
    with torch.no_grad():
        out = tiny_encoder(feats, output_hidden_states=True)
        e = tiny_encoder
        emb = torch.nn.functional.gelu(e.conv2(torch.nn.functional.gelu(e.conv1(feats)))).permute(0, 2, 1)
        emb = emb + e.embed_positions.weight
    assert torch.allclose(st[:, :, 4], out.last_hidden_state)  # after the final LayerNorm
    assert torch.allclose(st[:, :, 0], emb, atol=1e-6)


def test_positional_encoding_dtype_and_device():
    pe = af.PositionalEncoding()
    x = torch.zeros(2, 50, 384, dtype=torch.float16)
    y = pe.to(torch.float16)(x)
    assert y.dtype == torch.float16
    assert torch.equal(y[0].float(), pe.pe[0, :50].float())
    assert af.PositionalEncoding().pe[0, 1, 0] == torch.sin(torch.tensor(1.0))
    assert af.PositionalEncoding().pe[0, 7, 1] == torch.cos(torch.tensor(7.0))


# --------------------------------------------------------------------------------------------
# VAE and UNet helpers
# --------------------------------------------------------------------------------------------

def test_vae_preprocess_channel_order_and_mask():
    img = torch.randint(0, 256, (2, 16, 16, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    bgr = mt_vae.preprocess(img, half_mask=False)
    rgb = mt_vae.preprocess(img.flip(-1), half_mask=False, channel_order="rgb")
    assert torch.equal(bgr, rgb)
    ref = ((img.flip(-1).permute(0, 3, 1, 2).double() / 255.0).float() - 0.5) / 0.5
    assert torch.equal(bgr, ref)
    m = mt_vae.preprocess(img, half_mask=True)
    assert torch.equal(m[:, :, :8], ref[:, :, :8]) and bool((m[:, :, 8:] == -1).all())


def test_vae_latents_batched_sampling_and_errors(tiny):
    vae = tiny.vae
    imgs = torch.randint(0, 256, (3, 32, 32, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    lat = mt_vae.latents_for_unet(vae, imgs)
    assert lat.shape == (3, 8, 16, 16)  # the tiny VAE downsamples by 2
    one = mt_vae.latents_for_unet(vae, imgs[1])
    assert torch.allclose(lat[1:2], one, atol=1e-5)
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    s1 = mt_vae.latents_for_unet(vae, imgs, sample=True, generator=g1)
    e_m = torch.randn(3, 4, 16, 16, generator=g2)
    e_r = torch.randn(3, 4, 16, 16, generator=g2)
    s2 = mt_vae.latents_for_unet(vae, imgs, eps_masked=e_m, eps_ref=e_r)
    assert torch.equal(s1, s2) and not torch.equal(s1, lat)
    mean, std = mt_vae.posterior(vae, mt_vae.preprocess(imgs, half_mask=True))
    assert torch.allclose(s2[:, :4], 0.18215 * (mean + std * e_m), atol=1e-6)
    with pytest.raises(ValueError, match="torch.Generator"):
        mt_vae.latents_for_unet(vae, imgs, sample=True)


def test_vae_decode_postprocess(tiny):
    z = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(3))
    dec = mt_vae.decode(tiny.vae, z)
    with torch.no_grad():
        ref = tiny.vae.decode(z * torch.tensor(1 / 0.18215, dtype=torch.float32)).sample
    assert torch.equal(dec, ref)
    bgr = mt_vae.decode_to_uint8(tiny.vae, z)
    rgb = mt_vae.decode_to_uint8(tiny.vae, z, channel_order="rgb")
    assert bgr.dtype == torch.uint8 and bgr.shape == (2, 16, 16, 3) and torch.equal(bgr, rgb.flip(-1))
    # post-processing = the reference's numpy chain (round half to even included)
    x = torch.cat([dec.flatten(), torch.tensor([-1.0, 1.0, 0.0, 2.0, -3.0]), (torch.arange(0, 256) + 0.5) / 127.5 - 1])
    x = x[: (x.numel() // 3) * 3].reshape(1, 3, 1, -1)
    ref_np = (np.clip(x.numpy() / 2 + 0.5, 0, 1).transpose(0, 2, 3, 1) * 255).round().astype(np.uint8)[..., ::-1]
    assert np.array_equal(mt_vae.postprocess_uint8(x).numpy(), ref_np)


def test_unet_step_batch_and_timestep(tiny):
    x = torch.randn(3, 8, 8, 8, generator=torch.Generator().manual_seed(4))
    c = torch.randn(3, 50, 16, generator=torch.Generator().manual_seed(5))
    out = mt_unet.unet_step(tiny.unet, x, c)
    assert out.shape == (3, 4, 8, 8)
    assert torch.allclose(out[2:], mt_unet.unet_step(tiny.unet, x[2:], c[2:]), atol=1e-5)
    assert torch.equal(out, mt_unet.unet_step(tiny.unet, x, c, torch.tensor([0])))
    assert not torch.allclose(out, mt_unet.unet_step(tiny.unet, x, c, 500))


# --------------------------------------------------------------------------------------------
# Streaming vs whole-file features
# --------------------------------------------------------------------------------------------

def _stream(enc, wave: np.ndarray, fps: float, chunks: list[int], **kw) -> tuple[torch.Tensor, list[int], af.StreamingAudioFeatures]:
    s = af.StreamingAudioFeatures(enc, fps, **kw)
    outs, pos, counts = [], 0, []
    for c in chunks:
        outs.append(s.push(wave[pos:pos + c]))
        counts.append(outs[-1].shape[0])
        pos += c
    assert pos == wave.shape[0]
    outs.append(s.finish())
    counts.append(outs[-1].shape[0])
    return torch.cat(outs), counts, s


def _noise_speech(n: int, seed: int) -> np.ndarray:
    g = np.random.default_rng(seed)
    t = np.arange(n) / 16000
    env = 0.5 + 0.5 * np.sin(2 * np.pi * 3 * t)
    return (0.1 * env * (g.standard_normal(n) + np.sin(2 * np.pi * 220 * t))).astype(np.float32)


@pytest.mark.parametrize("fps", [25, 29.97])
def test_streaming_single_push_equals_offline(tiny_encoder, fps):
    y = _noise_speech(16000 * 3 + 123, 0)
    offline = af.audio_prompts(tiny_encoder, torch.from_numpy(y), fps)
    streamed, counts, _ = _stream(tiny_encoder, y, fps, [y.shape[0]])
    assert streamed.shape == offline.shape and sum(counts) == af.frame_count(y.shape[0], fps)
    assert counts[0] > 0 and counts[1] > 0  # some frames right away, the last ones at finish()
    assert torch.allclose(streamed, offline, rtol=0, atol=1e-5)


@pytest.mark.parametrize("fps", [25, 30])
def test_window_ranges_equal_the_indexed_gather_at_every_edge(fps):
    """The live path's `gather_window_range` gives exactly `gather_windows`' values: windows in the
    left zero padding, inside a block that starts late, reaching past the valid rows, and a block
    that lacks rows the windows need (the same error)."""
    w = af.FrameWindowing(fps)
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(300, 5, 8, generator=g)
    for offset, valid, first, stop in [(0, 300, 0, 6), (0, 300, 10, 13), (40, 300, 30, 40), (0, 120, 40, 60),
                                       (0, 300, 5, 5), (0, 3, 0, 4)]:
        block = rows[: 300 - offset] if offset else rows
        expected = af.gather_windows(block, offset, valid, torch.arange(first, stop), w)
        got = af.gather_window_range(block, offset, valid, first, stop, w)
        assert got.shape == expected.shape and torch.equal(got, expected), (offset, valid, first, stop)
    with pytest.raises(ValueError, match="needed but the block holds"):
        af.gather_window_range(rows[:50], 100, 300, 100, 104, w)  # windows past the block's rows 100-149


def test_each_update_encodes_the_received_part_of_its_piece_zero_padded(tiny_encoder):
    """A push's frames come from the completed pieces' rows and the piece being received, encoded as
    if its received samples were the whole audio (zero-padded to 30 s): also after a piece
    completed mid-push, where the next piece's buffer must start from zeros again."""
    fps = 25
    y = _noise_speech(af.PIECE_SAMPLES + 16000 * 2, 2)
    n = af.PIECE_SAMPLES + 16000  # piece 0 complete, 1 s of piece 1
    s = af.StreamingAudioFeatures(tiny_encoder, fps)
    done = s.push(y[: af.PIECE_SAMPLES - 8000]).shape[0]
    done += s.push(y[af.PIECE_SAMPLES - 8000: n - 3200]).shape[0]  # completes piece 0, starts piece 1
    got = s.push(y[n - 3200: n])
    assert got.shape[0] > 0
    rows = torch.cat([af.whisper_hidden_states(tiny_encoder, torch.from_numpy(y[: af.PIECE_SAMPLES]))[0],
                      af.whisper_hidden_states(tiny_encoder, torch.from_numpy(y[af.PIECE_SAMPLES: n]))[0]])
    expected = af.gather_windows(rows, 0, af.row_count(n), torch.arange(done, done + got.shape[0]), af.FrameWindowing(fps))
    assert torch.allclose(got, expected, rtol=0, atol=1e-6)


def test_streaming_across_pieces_lookahead_and_memory(tiny_encoder):
    fps = 25
    y = _noise_speech(16000 * 31 + 4321, 1)
    offline = af.audio_prompts(tiny_encoder, torch.from_numpy(y), fps)
    first = af.PIECE_SAMPLES + 8000  # 30.5 s: piece 0 complete, 0.5 s of piece 1
    rest = y.shape[0] - first
    chunks = [first] + [4800] * (rest // 4800) + ([rest % 4800] if rest % 4800 else [])
    streamed, counts, s = _stream(tiny_encoder, y, fps, chunks)
    assert streamed.shape == offline.shape
    w = af.FrameWindowing(fps)
    # frames emitted by the first push whose window ends inside the completed piece 0: exact
    k0 = counts[0]
    exact0 = [i for i in range(k0) if w.start(i) + w.length <= af.ROWS_PER_PIECE]
    assert len(exact0) > 700
    assert torch.allclose(streamed[exact0], offline[exact0], rtol=0, atol=1e-5)
    # frames emitted at finish(): exact
    kf = counts[-1]
    assert kf > 0 and torch.allclose(streamed[-kf:], offline[-kf:], rtol=0, atol=1e-5)
    # each push emitted only frames whose 2-frame look-ahead had arrived, and held few rows
    n = 0
    done = 0
    for c, k in zip(chunks, counts[:-1]):
        n += c
        done += k
        if done:
            assert w.start(done - 1) + w.length <= af.row_count(n)
        assert done <= af.frame_count(n, fps)
    assert s._final is not None and s._final.shape[0] <= af.ROWS_PER_PIECE + w.length
    # extra look-ahead delays frames; batching reduces encoder runs
    _, counts_la, _ = _stream(tiny_encoder, y[:16000 * 2], fps, [1600] * 20, extra_lookahead_rows=10)
    _, counts_0, s0 = _stream(tiny_encoder, y[:16000 * 2], fps, [1600] * 20)
    assert np.cumsum(counts_la)[5] < np.cumsum(counts_0)[5] and sum(counts_la) == sum(counts_0)
    _, _, s4 = _stream(tiny_encoder, y[:16000 * 2], fps, [1600] * 20, min_frames_per_update=4)
    assert s4.recomputations < s0.recomputations


@pytest.mark.slow
def test_streaming_error_bound_on_real_speech(media):
    """The documented bound (StreamingAudioFeatures docstring), on real speech with the seeded
    whisper-tiny: 1 s chunks keep the CPU cost down (about 16 encoder runs); the bound was
    measured for 20 ms ... 1 s chunks and holds for all."""
    y = _speech16k(media)
    enc = W.random_whisper_encoder(0)
    r = af.streaming_error(enc, y, 25, 16000)
    assert r["frames"] == af.frame_count(y.shape[0], 25)
    assert r["overall"] <= af.STREAMING_ERROR_BOUND["overall"], r
    assert r["worst_frame"] <= af.STREAMING_ERROR_BOUND["worst_frame"], r
    assert 0 < r["exact_share"] < 1, r  # frames of finish() exact, earlier ones approximations


def test_fetch_places_files_in_official_layout(tmp_path, monkeypatch):
    """With the Hub and the URL download replaced by local writers, every file lands on its
    `local` path, and the Google-Drive-only BiSeNet file is reported by a warning."""
    import huggingface_hub
    from pathlib import Path

    calls = []

    def fake_hub(repo_id, filename, *, local_dir, **_):
        p = Path(local_dir) / filename
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x")
        calls.append((repo_id, filename))
        return str(p)

    def fake_url(url, dst, progress=False):
        Path(dst).write_bytes(b"x")
        calls.append((url, Path(dst).name))

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_hub)
    monkeypatch.setattr(torch.hub, "download_url_to_file", fake_url)
    with pytest.warns(UserWarning, match="79999_iter.pth"):
        got = W.fetch(tmp_path)
    assert {p.relative_to(tmp_path).as_posix() for p in got} == {
        f.local for f in W.model_files("v15") if "drive.google" not in (f.url or "")}
    assert W.missing_files(tmp_path) == []
    assert ("openai/whisper-tiny", "pytorch_model.bin") in calls
    assert W.fetch(tmp_path, include_optional=False) == []  # nothing left to do


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_whisper_graph_with_its_log_mel_captures_and_matches_eager_on_cuda():
    """The engine's Whisper runner graphs `piece_hidden_states`, the log-mel's STFT included: it
    must capture (no eager fallback) and give the eager values, for a full and a partial piece."""
    from functools import partial

    from newsstudio.accel.static import BucketedRunner, fallbacks

    dev = torch.device("cuda")
    enc = W.random_whisper_encoder(7, dev, config=TINY_WHISPER)
    runner = BucketedRunner(partial(af.piece_hidden_states, enc), "cudagraph", min_bucket=1, max_bucket=4)
    pieces = torch.from_numpy(np.stack([_noise_speech(af.PIECE_SAMPLES, k) for k in range(3)])).to(dev)
    pieces[1, 50_000:] = 0  # a piece still being received
    before = len(fallbacks())
    got = runner(pieces)
    assert len(fallbacks()) == before, fallbacks()
    expected = af.piece_hidden_states(enc, pieces)
    assert float((got - expected).norm() / expected.norm()) < 1e-5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu(tiny, tiny_encoder):
    """Same code on CUDA (TF32 off, as exactness needs): features, latents, UNet, decode."""
    prev = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        dev = torch.device("cuda")
        y = _noise_speech(16000 * 2, 3)
        enc_gpu = W.random_whisper_encoder(7, dev, config=TINY_WHISPER)
        cpu = af.audio_prompts(tiny_encoder, torch.from_numpy(y), 25)
        gpu = af.audio_prompts(enc_gpu, torch.from_numpy(y).to(dev), 25)
        assert gpu.device.type == "cuda" and float((gpu.cpu() - cpu).norm() / cpu.norm()) < 1e-5
        s = af.StreamingAudioFeatures(enc_gpu, 25)
        st = torch.cat([s.push(y[:16000]), s.push(y[16000:]), s.finish()])
        assert st.shape == cpu.shape and st.device.type == "cuda"
        imgs = torch.randint(0, 256, (2, 32, 32, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
        vae_gpu = W.random_vae(5, dev, config=TINY_VAE)
        assert torch.equal(mt_vae.preprocess(imgs.to(dev), half_mask=True).cpu(), mt_vae.preprocess(imgs, half_mask=True))
        lat_c, lat_g = mt_vae.latents_for_unet(tiny.vae, imgs), mt_vae.latents_for_unet(vae_gpu, imgs.to(dev))
        assert float((lat_g.cpu() - lat_c).norm() / lat_c.norm()) < 1e-5
        g = torch.Generator(dev).manual_seed(0)
        assert mt_vae.latents_for_unet(vae_gpu, imgs, sample=True, generator=g).device.type == "cuda"
        unet_gpu = W.random_unet(5, dev, config=TINY_UNET)
        c = torch.randn(2, 50, 16, generator=torch.Generator().manual_seed(1))
        o_c, o_g = mt_unet.unet_step(tiny.unet, lat_c, c), mt_unet.unet_step(unet_gpu, lat_g, c.to(dev))
        assert float((o_g.cpu() - o_c).norm() / o_c.norm()) < 1e-5
        img_c, img_g = mt_vae.decode_to_uint8(tiny.vae, o_c), mt_vae.decode_to_uint8(vae_gpu, o_g)
        assert img_g.device.type == "cuda" and (img_g.cpu().int() - img_c.int()).abs().max() <= 1
        # half precision runs end to end
        half = mt_unet.unet_step(W.random_unet(5, dev, torch.float16, config=TINY_UNET), lat_g, c.to(dev))
        assert half.dtype == torch.float16 and torch.isfinite(half).all()
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = prev
