"""Decoding only the rows MuseTalk's blend uses: exact given the skipped rows' statistics, fewer FLOPs."""
from __future__ import annotations

import json

import pytest
import torch
from diffusers import AutoencoderKL

from newsstudio.accel.upsample_conv import with_phase_upsampling
from newsstudio.engines.musetalk.engine import TINY_VAE_CONFIG
from newsstudio.engines.musetalk.lower_face_decoder import LowerFaceDecoder, combine_group_stats, plan_rows
from newsstudio.engines.musetalk.weights import VAE_CONFIG, random_vae


@pytest.fixture(autouse=True)
def _norms_in_pytorch(monkeypatch):
    """The row logic is what is tested here; the statistics kernel's rows (`group_stats(first_row=)`)
    are tested in test_group_norm_nhwc.py. Without this, channels-last maps would go through Triton's
    CPU interpreter (conftest.py): ~30 s a test instead of ~1."""
    from newsstudio.accel import group_norm_nhwc

    monkeypatch.setattr(group_norm_nhwc, "kernel_fits", lambda x, groups: False)


@pytest.fixture(scope="module")
def tiny_decoder():
    return random_vae(salt=3, config=TINY_VAE_CONFIG).decoder


@pytest.mark.parametrize("phase", [False, True], ids=["upsample2d", "phase-upsampling"])
@pytest.mark.parametrize("first_row", [3, 57, 104, 255])
def test_lower_rows_equal_the_full_decode_given_the_skipped_rows_statistics(tiny_decoder, phase, first_row):
    dec = with_phase_upsampling(tiny_decoder)[0] if phase else tiny_decoder
    z = torch.randn(2, 4, 32, 32, generator=torch.Generator().manual_seed(first_row))
    lower = LowerFaceDecoder(dec, first_row)
    with torch.no_grad():
        full = dec(z)
        recorded, stats = lower.record_upper_stats(z)
        out = lower(z, stats)
        no_stats = lower(z, torch.zeros_like(stats))
    assert torch.equal(recorded, full)  # recording does not change the decode
    assert out.shape == (2, 3, 256 - first_row, 256)
    torch.testing.assert_close(out, full[:, :, first_row:], rtol=0, atol=2e-4)
    if lower.plan.norm_starts:  # the statistics are what makes it exact: without them the rows come out wrong
        assert (no_stats - full[:, :, first_row:]).abs().max() > 1e-3
    else:  # rows near the top: nothing is cut, no statistics needed
        assert first_row < 8 and stats.shape[1] == 0


def test_channels_last_decoder_gives_the_same_rows(tiny_decoder):
    dec = with_phase_upsampling(tiny_decoder)[0].to(memory_format=torch.channels_last)
    z = torch.randn(2, 4, 32, 32, generator=torch.Generator().manual_seed(0)).contiguous(memory_format=torch.channels_last)
    lower = LowerFaceDecoder(dec, 104)
    with torch.no_grad():
        full, stats = lower.record_upper_stats(z)
        torch.testing.assert_close(lower(z, stats), full[:, :, 104:], rtol=0, atol=2e-4)


def test_a_channels_last_decoder_keeps_every_cut_map_channels_last(tiny_decoder, monkeypatch):
    """A row slice of a channels-last map is not channels-last *contiguous*: the phase upsampler then
    interleaved in NCHW and the NHWC norms after it fell back to PyTorch's reductions (the engine gained
    1 % of the 15 % the lower decoder saves). Every map the norms' kernels and the upsamplers see must
    stay channels-last contiguous."""
    from newsstudio.engines.musetalk import lower_face_decoder as module

    dec = with_phase_upsampling(tiny_decoder)[0].to(memory_format=torch.channels_last)
    z = torch.randn(2, 4, 32, 32, generator=torch.Generator().manual_seed(2)).contiguous(memory_format=torch.channels_last)
    lower = LowerFaceDecoder(dec, 104)
    with torch.no_grad():
        _, stats = lower.record_upper_stats(z)
    seen: list[tuple[str, bool]] = []
    real_group_stats = module.group_stats

    def recording_group_stats(x, *args, **kwargs):
        seen.append(("norm input", x.is_contiguous(memory_format=torch.channels_last)))
        return real_group_stats(x, *args, **kwargs)

    monkeypatch.setattr(module, "group_stats", recording_group_stats)
    hooks = [m.register_forward_hook(lambda m, i, o, name=name: seen.append(
        (name, i[0].is_contiguous(memory_format=torch.channels_last) and o.is_contiguous(memory_format=torch.channels_last))))
        for name, m in dec.named_modules() if name.endswith("upsamplers.0")]
    try:
        with torch.no_grad():
            lower(z, stats)
    finally:
        for h in hooks:
            h.remove()
    assert len(hooks) == 3 and sum(1 for n, _ in seen if n == "norm input") == len(lower.plan.norm_starts)
    assert [n for n, ok in seen if not ok] == []


def test_group_statistics_combine_exactly():
    x = torch.randn(3, 5, 400, dtype=torch.float64) * 3 + 7
    up, live = x[..., :150], x[..., 150:]
    uv, um = torch.var_mean(up, dim=-1, correction=0)
    lv, lm = torch.var_mean(live, dim=-1, correction=0)
    mean, var = combine_group_stats(torch.stack([um, uv], -1), 150, lm, lv, 250)
    tv, tm = torch.var_mean(x, dim=-1, correction=0)
    torch.testing.assert_close(mean, tm)
    torch.testing.assert_close(var, tv)


def test_bad_statistics_and_rows_are_refused(tiny_decoder):
    lower = LowerFaceDecoder(tiny_decoder, 104)
    z = torch.zeros(2, 4, 32, 32)
    with pytest.raises(ValueError, match="upper_stats must be"):
        lower(z, torch.zeros(2, 3, 32, 2))
    for bad in (0, 256):
        with pytest.raises(ValueError, match="first_row"):
            LowerFaceDecoder(tiny_decoder, bad)


def test_the_full_size_decoder_does_under_three_quarters_of_the_work():
    """On MuseTalk's real VAE architecture (meta tensors: no weights, no compute) rows 104-255 take
    ~73 % of the decoder's FLOPs: the 32x32 stage and the mid block's attention stay whole."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        vae = AutoencoderKL(**VAE_CONFIG)
    dec = with_phase_upsampling(vae.decoder)[0]
    z = torch.empty(1, 4, 32, 32, device="meta")
    lower = LowerFaceDecoder(dec, 104)
    counts = []
    for fn, args in ((dec, (z,)), (lower, (z, torch.empty(1, len(lower.plan.norm_starts), 32, 2, device="meta")))):
        with FlopCounterMode(display=False) as fc, torch.no_grad():
            fn(*args)
        counts.append(fc.get_total_flops())
    assert 0.6 < counts[1] / counts[0] < 0.75
    cuts = {name: cut for name, cut in plan_rows(dec, 104).steps if cut}
    # each stage is cut once, at its upsampler's smaller input: the 256x256 stage starts 7 rows above the output
    assert cuts == {"up_blocks.0.upsamplers.0": 6, "up_blocks.1.upsamplers.0": 20, "up_blocks.2.upsamplers.0": 48}


def test_the_benchmark_reports_error_and_flops(tmp_path, astronaut_packet):
    import shutil

    from benchmarks import lower_face_decoder as bench

    avatar = tmp_path / "astronaut"
    shutil.copytree(astronaut_packet.path, avatar)  # MuseTalk's arrays are added to it
    out = tmp_path / "lfd.json"
    assert bench.main(["--device", "cpu", "--tiny", "--skip-speed", "--faces", "2", "--first-rows", "104,250",
                       "--avatar", str(avatar), "--avatar-frames", "1", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    acc, _ = data["accuracy"]
    assert acc["psnr_db_own_stats"] > 70  # rounding only
    assert 20 < acc["psnr_db_silence_stats"] < acc["psnr_db_own_stats"]
    assert data["gflop_per_face"]["lower 104"] < 0.75 * data["gflop_per_face"]["full"]
    blended, refused = data["blended"]
    assert blended["frames"] == 1 and 20 < blended["psnr_db_blended"] < 80
    assert "uses face rows from" in refused["refused"]  # the blend shows rows above 250: refused, reported


def test_a_decoder_with_nhwc_norms_that_took_their_silu_gives_the_same_rows(tiny_decoder):
    """The engine's CUDA decoder: NHWC GroupNorms that apply the following SiLU themselves."""
    from newsstudio.accel.group_norm_nhwc import fuse_following_silu_, with_nhwc_group_norms

    dec = with_nhwc_group_norms(with_phase_upsampling(tiny_decoder)[0])[0]
    assert fuse_following_silu_(dec) > 0
    z = torch.randn(2, 4, 32, 32, generator=torch.Generator().manual_seed(1))
    lower = LowerFaceDecoder(dec, 104)
    with torch.no_grad():
        reference = tiny_decoder(z)
        full, stats = lower.record_upper_stats(z)
        torch.testing.assert_close(full, reference, rtol=0, atol=2e-4)
        torch.testing.assert_close(lower(z, stats), reference[:, :, 104:], rtol=0, atol=2e-4)


def test_the_setting_reaches_musetalk_only_from_the_cli_server_and_load_test_settings():
    from newsstudio.engines.registry import engine_options
    from newsstudio.server.state import ServerConfig

    assert engine_options("musetalk", "random", None, first_face_row=104)["first_face_row"] == 104
    assert "first_face_row" not in engine_options("musetalk", "random", None)  # the engine's default
    assert engine_options("musetalk", "random", None, first_face_row="auto")["first_face_row"] == "auto"
    assert engine_options("musetalk", "random", None, first_face_row="0")["first_face_row"] == 0  # the whole face
    with pytest.raises(ValueError, match="first_face_row"):
        engine_options("classic", "random", None, first_face_row="top")
    assert "first_face_row" not in engine_options("ditto", "random", None, first_face_row=104)
    assert engine_options("classic", "random", None, first_face_row=104) == {}
    assert ServerConfig().first_face_row is None  # the engine's default (face_rows.py)


def test_first_blended_face_row_follows_the_box_resize():
    from newsstudio.engines.musetalk.prebake import first_blended_face_rows

    masks = torch.zeros(3, 100, 100)
    masks[0, 50:, 20:80] = 0.5  # alpha from ROI row 50; box rows 10-89 (80 rows for the face's 256)
    masks[1, 90:, :] = 1.0  # from the box's last row: the face's bottom rows
    boxes = torch.tensor([[10, 10, 90, 90], [0, 10, 100, 91], [10, 10, 90, 90]])
    first = first_blended_face_rows(masks, boxes).tolist()
    assert first[0] == 129  # (50 + 0.5 - 10) * 256 / 80 - 0.5 = 129.1: the bilinear resize's upper tap
    assert first[1] == 253  # (90 + 0.5 - 10) * 256 / 81 - 0.5 = 253.9
    assert first[2] == 256  # no alpha anywhere: the frame needs no face row
