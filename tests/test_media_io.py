"""Media I/O on PyAV: reading video/images/audio, writing MP4, and clear errors for bad files.

Every broken file here is real: cut-off copies of the shared media, random bytes, and
containers made with PyAV in tmp_path. Frame sizes are small so the file runs in seconds.
"""
from __future__ import annotations

import os
import wave
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from PIL import Image

from newsstudio.compose.colour import nv12_to_rgb, rgb_to_nv12
from newsstudio.media.audio import Audio, audio_from_array, load_audio, write_wav
from newsstudio.media.errors import (
    EmptyAudioError,
    MediaDecodeError,
    MediaEncodeError,
    MediaError,
    MediaNotFoundError,
    NoAudioStreamError,
    NonFiniteAudioError,
    NoVideoStreamError,
)
from newsstudio.media.image import is_image_path, read_image
from newsstudio.media.mp4_writer import Mp4Writer, _rgb_frame_to_nv12, as_frame_rate, encode_clip
from newsstudio.media.video import iter_video_frames, probe_video


# ----------------------------------------------------------------------------- helpers


def pattern_rgb(n: int, h: int = 48, w: int = 64) -> np.ndarray:
    """Smooth, moving colour pattern (B, H, W, 3): compressible, and every frame differs."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    out = np.empty((n, h, w, 3), np.uint8)
    for i in range(n):
        p = i * 0.3
        r = 128 + 80 * np.sin(xx / 33 + p)
        g = 128 + 80 * np.cos(yy / 27 - p)
        b = 128 + 70 * np.sin((xx + yy) / 45 + 2 * p)
        out[i] = np.clip(np.stack([r, g, b], -1), 0, 255).astype(np.uint8)
    return out


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float(10 * np.log10(255.0**2 / max(mse, 1e-12)))


def decode_all(path: Path) -> list[av.VideoFrame]:
    with av.open(str(path)) as c:
        return list(c.decode(video=0))


def encode_audio_file(path: Path, audio: Audio, codec: str, rate: int) -> Path:
    """Encode ``audio`` with PyAV into ``path`` (format from the suffix)."""
    layout = "mono" if audio.channels == 1 else "stereo"
    src = audio.resampled(rate)
    with av.open(str(path), "w") as c:
        s = c.add_stream(codec, rate=rate, layout=layout)
        resampler = av.AudioResampler(format=s.codec_context.format.name, layout=layout, rate=rate)
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(src.samples), format="fltp", layout=layout)
        frame.sample_rate, frame.pts = rate, 0
        for out in list(resampler.resample(frame)) + list(resampler.resample(None)):
            for p in s.encode(out):
                c.mux(p)
        for p in s.encode(None):
            c.mux(p)
    return path


def silent_mp4(path: Path, n: int = 5) -> Path:
    """A real H.264 mp4 with a video stream and no audio stream."""
    encode_clip(path, pattern_rgb(n), fps=25)
    return path


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".partial" in p.name)


@pytest.fixture
def speech2s(media) -> Audio:
    """The first 2 s of yongen.wav (48 kHz stereo): real speech, short enough to encode fast."""
    return load_audio(media("yongen.wav")).slice_samples(0, 96000)


# ----------------------------------------------------------------------------- errors


def test_error_hierarchy_names_file(tmp_path):
    missing = tmp_path / "nope.mp4"
    for reader in (probe_video, load_audio, read_image, lambda p: list(iter_video_frames(p))):
        with pytest.raises(MediaNotFoundError) as info:
            reader(missing)
        assert str(missing) in str(info.value)
        assert isinstance(info.value, (ValueError, FileNotFoundError))
    assert issubclass(MediaDecodeError, MediaError) and issubclass(MediaError, ValueError)


@pytest.mark.parametrize("suffix", [".mp4", ".wav", ".mp3"])
def test_garbage_bytes_are_a_decode_error(tmp_path, suffix):
    bad = tmp_path / f"garbage{suffix}"
    bad.write_bytes(np.random.default_rng(0).integers(0, 256, 20000, dtype=np.uint8).tobytes())
    for reader in (probe_video, load_audio, lambda p: next(iter_video_frames(p))):
        with pytest.raises(MediaDecodeError, match="garbage"):
            reader(bad)


def test_empty_file_is_a_decode_error(tmp_path):
    empty = tmp_path / "empty.wav"
    empty.write_bytes(b"")
    with pytest.raises(MediaDecodeError, match="empty"):
        load_audio(empty)
    with pytest.raises(MediaDecodeError, match="no data"):
        load_audio(b"")


def test_truncated_mp4_with_index_at_end(media, tmp_path):
    """yongen.mp4 has its 'moov' index after the media data: a cut copy cannot even open."""
    data = media("yongen.mp4").read_bytes()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(MediaDecodeError, match="cut.mp4"):
        probe_video(cut)
    with pytest.raises(MediaDecodeError, match="cut.mp4"):
        next(iter_video_frames(cut))


def test_truncated_faststart_mp4_is_refused(tmp_path, speech2s):
    """Our own faststart mp4 (index first) opens when cut, so the index check must catch it."""
    full = tmp_path / "full.mp4"
    encode_clip(full, pattern_rgb(20), fps=25, audio=speech2s.slice_samples(0, 38400))
    data = full.read_bytes()
    assert data[4:8] == b"ftyp" and b"moov" in data[:4096]  # index at the front
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(data[: len(data) * 2 // 3])
    for reader in (probe_video, load_audio, lambda p: list(iter_video_frames(p))):
        with pytest.raises(MediaDecodeError, match="truncated"):
            reader(cut)


def test_truncated_wav_is_refused(media, tmp_path):
    data = media("yongen.wav").read_bytes()
    cut = tmp_path / "cut.wav"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(MediaDecodeError, match="truncated"):
        load_audio(cut)
    with pytest.raises(MediaDecodeError, match="truncated"):
        load_audio(data[: len(data) // 2])


def test_truncated_flac_is_a_decode_error(tmp_path, speech2s):
    flac = encode_audio_file(tmp_path / "s.flac", speech2s, "flac", 48000)
    data = flac.read_bytes()
    cut = tmp_path / "cut.flac"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(MediaDecodeError, match="cut.flac"):
        load_audio(cut)


def test_mp4_without_audio(media, tmp_path):
    with pytest.raises(NoAudioStreamError, match="no audio stream"):
        load_audio(silent_mp4(tmp_path / "silent.mp4"))
    with pytest.raises(NoAudioStreamError, match="yongen.mp4"):
        load_audio(media("yongen.mp4"))  # the shared presenter clip carries no sound


@pytest.mark.parametrize("codec", ["pcm_s16le", "pcm_s32le", "pcm_u8", "pcm_f32le", "pcm_f64le", "pcm_s24le"])
def test_wav_read_directly_equals_ffmpeg_decode(tmp_path, speech2s, codec, monkeypatch):
    """Raw-PCM WAVs are read by joining their packets (no probing, no per-frame decode): the same
    samples, channels and rate as FFmpeg's decoder + resampler give, for every PCM width (24-bit
    goes through the decoder)."""
    import newsstudio.media.audio as audio_mod

    path = encode_audio_file(tmp_path / f"{codec}.wav", speech2s, codec, 22050)
    fast = load_audio(path)
    monkeypatch.setattr(audio_mod, "_raw_pcm", lambda *a: None)  # force the generic decode path
    slow = load_audio(path)
    assert (fast.channels, fast.sample_rate) == (slow.channels, slow.sample_rate) == (2, 22050)
    assert fast.samples.dtype == np.float32 and fast.num_samples == slow.num_samples == pytest.approx(44100, abs=2)
    np.testing.assert_array_equal(fast.samples, slow.samples)
    assert np.abs(fast.samples).max() > 0.05  # real sound, not silence

def test_zero_length_audio(tmp_path):
    path = tmp_path / "zero.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"")
    with pytest.raises(EmptyAudioError, match="zero.wav"):
        load_audio(path)
    with pytest.raises(EmptyAudioError):
        audio_from_array(np.zeros(0, np.int16), 16000)


def test_wav_is_not_a_video(media):
    with pytest.raises(NoVideoStreamError, match="no video stream"):
        probe_video(media("yongen.wav"))


def test_corrupt_images(media, tmp_path):
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"\x89PNG not really" * 100)
    with pytest.raises(MediaDecodeError, match="bad.png"):
        read_image(bad)
    data = media("portrait.png").read_bytes()
    cut = tmp_path / "cut.png"
    cut.write_bytes(data[: len(data) // 3])
    with pytest.raises(MediaDecodeError, match="truncated"):
        read_image(cut)


# ----------------------------------------------------------------------------- video reading


def test_probe_and_read_real_video(media):
    path = media("yongen.mp4")
    info = probe_video(path)
    assert (info.width, info.height, info.fps, info.frame_count) == (704, 1216, 25, 268)
    assert info.duration_s == pytest.approx(10.72, abs=0.01)
    assert info.rotation == 0 and info.codec == "h264" and not info.has_audio
    frames = list(iter_video_frames(path, limit=3))
    assert len(frames) == 3
    assert frames[0].shape == (1216, 704, 3) and frames[0].dtype == np.uint8
    later = next(iter_video_frames(path, start=2, limit=1))
    np.testing.assert_array_equal(later, frames[2])


def test_start_and_limit(tmp_path):
    path = tmp_path / "clip.mp4"
    encode_clip(path, pattern_rgb(12), fps=25)
    all_frames = list(iter_video_frames(path))
    assert len(all_frames) == 12
    part = list(iter_video_frames(path, start=4, limit=5))
    assert len(part) == 5
    for a, b in zip(part, all_frames[4:9]):
        np.testing.assert_array_equal(a, b)
    assert list(iter_video_frames(path, start=20)) == []
    assert list(iter_video_frames(path, limit=0)) == []
    with pytest.raises(ValueError):
        list(iter_video_frames(path, start=-1))


@pytest.mark.parametrize("degrees", [-90, 90, 180])
def test_display_rotation_is_applied(tmp_path, degrees):
    """A clip stored landscape with a display matrix (as phones write) reads upright."""
    src = pattern_rgb(3, 48, 80)
    src[:, :8, :16] = (255, 0, 0)  # an asymmetric marker in the stored top-left corner
    path = tmp_path / "rot.mp4"
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=25, options={"crf": "12"})
        s.width, s.height, s.pix_fmt = 80, 48, "yuv420p"
        s.set_display_rotation(degrees)
        for i, img in enumerate(src):
            f = av.VideoFrame.from_ndarray(img, format="rgb24")
            f.pts = i
            for p in s.encode(f):
                c.mux(p)
        for p in s.encode(None):
            c.mux(p)
    info = probe_video(path)
    assert info.rotation == degrees
    assert (info.width, info.height) == ((48, 80) if degrees % 180 else (80, 48))
    frames = list(iter_video_frames(path))
    expected = np.rot90(src[0], k=degrees // 90)  # FFmpeg: the angle is counter-clockwise
    assert frames[0].shape == expected.shape
    assert psnr(frames[0], expected) > 30


def test_other_container_and_codec(tmp_path):
    """MPEG-4 Part 2 in Matroska: no stored frame count, so probe counts packets."""
    path = tmp_path / "clip.mkv"
    src = pattern_rgb(9)
    with av.open(str(path), "w") as c:
        s = c.add_stream("mpeg4", rate=Fraction(30000, 1001), options={"qscale": "2"})
        s.width, s.height, s.pix_fmt = 64, 48, "yuv420p"
        for i, img in enumerate(src):
            f = av.VideoFrame.from_ndarray(img, format="rgb24").reformat(format="yuv420p")
            f.pts = i
            for p in s.encode(f):
                c.mux(p)
        for p in s.encode(None):
            c.mux(p)
    info = probe_video(path)
    assert info.frame_count == 9 and info.fps == Fraction(30000, 1001) and info.codec == "mpeg4"
    frames = list(iter_video_frames(path))
    assert len(frames) == 9 and psnr(frames[4], src[4]) > 28


def test_full_range_video_reads_correctly(tmp_path):
    """A stream tagged full range (JPEG levels) must not be read as limited (contrast would
    stretch and clip). Measured 44.9 dB vs the source."""
    src = pattern_rgb(2)
    src[:, :, :20] = 255
    src[:, :, 20:30] = 0
    nv12 = rgb_to_nv12(src, "bt709", full_range=True).numpy()
    path = tmp_path / "full.mp4"
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=25, options={"crf": "12"})
        s.width, s.height, s.pix_fmt = 64, 48, "nv12"
        s.codec_context.colorspace, s.codec_context.color_range = 1, 2
        for i, img in enumerate(nv12):
            f = av.VideoFrame.from_ndarray(img, format="nv12")
            f.pts = i
            for p in s.encode(f):
                c.mux(p)
        for p in s.encode(None):
            c.mux(p)
    out = list(iter_video_frames(path))
    assert psnr(out[0], src[0]) > 38  # misread as limited range, mid-tones stretch by 255/219
    assert out[0][:, 2:18].mean() > 251 and out[0][:, 22:28].mean() < 4


# ----------------------------------------------------------------------------- images


def test_read_real_image(media):
    img = read_image(media("portrait.png"))
    assert img.shape == (1432, 1432, 3) and img.dtype == np.uint8 and img.flags.c_contiguous
    assert read_image(media("portrait.png").read_bytes()).tobytes() == img.tobytes()


def test_exif_orientation_is_applied(tmp_path):
    src = pattern_rgb(1, 24, 40)[0]
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    path = tmp_path / "phone.png"
    Image.fromarray(src).save(path, exif=exif)
    out = read_image(path)
    np.testing.assert_array_equal(out, np.rot90(src, k=-1))


def test_alpha_grey_palette_and_16bit(tmp_path):
    rgba = np.zeros((4, 4, 4), np.uint8)
    rgba[..., :3] = (200, 10, 10)
    rgba[0, 0, 3] = 255  # opaque red
    rgba[0, 1, 3] = 128  # half
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.png")
    white = read_image(tmp_path / "a.png")
    assert white[0, 0].tolist() == [200, 10, 10]
    assert white[1, 1].tolist() == [255, 255, 255]  # fully transparent -> background
    assert white[0, 1].tolist() == pytest.approx([228, 132, 132], abs=2)
    black = read_image(tmp_path / "a.png", background=(0, 0, 0))
    assert black[1, 1].tolist() == [0, 0, 0]

    grey = np.arange(16, dtype=np.uint8).reshape(4, 4) * 16
    Image.fromarray(grey, "L").save(tmp_path / "g.png")
    g = read_image(tmp_path / "g.png")
    assert g.shape == (4, 4, 3) and (g == grey[..., None]).all()

    deep = (np.arange(16, dtype=np.uint16).reshape(4, 4) * 4369)  # 0..65535
    Image.fromarray(deep).save(tmp_path / "d.png")
    d = read_image(tmp_path / "d.png")
    np.testing.assert_array_equal(d[..., 0], (deep / 257).round().astype(np.uint8))

    Image.fromarray(rgba[..., :3]).convert("P").save(tmp_path / "p.gif")
    assert read_image(tmp_path / "p.gif").shape == (4, 4, 3)


def test_is_image_path():
    assert is_image_path("a/b/Portrait.PNG") and is_image_path("x.jpeg") and is_image_path(Path("y.webp"))
    assert not is_image_path("clip.mp4") and not is_image_path("anim.gif") and not is_image_path("noext")


# ----------------------------------------------------------------------------- audio


def test_load_wav_matches_raw_pcm(media):
    """PyAV decode of the shared WAVs equals the raw int16 samples / 32768 exactly."""
    for name, channels, rate in (("yongen.wav", 2, 48000), ("speech.wav", 1, 24000)):
        path = media(name)
        audio = load_audio(path)
        with wave.open(str(path)) as w:
            raw = np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, w.getnchannels())
        assert (audio.channels, audio.sample_rate) == (channels, rate)
        assert audio.samples.dtype == np.float32 and audio.samples.shape == (channels, raw.shape[0])
        np.testing.assert_array_equal(audio.samples, raw.T.astype(np.float32) / 32768)
        assert audio.duration_s == pytest.approx(raw.shape[0] / rate)
    assert load_audio(media("speech.wav").read_bytes()).num_samples == load_audio(media("speech.wav")).num_samples


@pytest.mark.parametrize(
    "suffix,codec,rate,lossless",
    [(".flac", "flac", 48000, True), (".mp3", "libmp3lame", 44100, False),
     (".m4a", "aac", 48000, False), (".ogg", "libopus", 48000, False)],
)
def test_load_compressed_formats(tmp_path, speech2s, suffix, codec, rate, lossless):
    path = encode_audio_file(tmp_path / f"s{suffix}", speech2s, codec, rate)
    out = load_audio(path)
    assert (out.channels, out.sample_rate) == (2, rate)
    assert out.duration_s == pytest.approx(2.0, abs=0.03)  # encoder delay/padding trimmed
    ref = speech2s.resampled(rate).samples
    n = min(ref.shape[1], out.num_samples)
    if lossless:
        assert np.abs(out.samples[:, :n] - ref[:, :n]).max() <= 1.0 / 32768 + 1e-6  # s16 rounding only
    else:
        corr = np.corrcoef(out.samples[0, :n], ref[0, :n])[0, 1]
        assert corr > 0.95  # aligned in time (no leftover delay) and the same sound


def test_audio_from_array_layouts():
    n = 1000
    stereo = np.stack([np.linspace(-1, 1, n), np.linspace(1, -1, n)]).astype(np.float32)  # (c, n)
    a = audio_from_array(stereo, 16000)
    b = audio_from_array(stereo.T.copy(), 16000)  # (n, c)
    assert a.samples.shape == b.samples.shape == (2, n)
    np.testing.assert_array_equal(a.samples, b.samples)
    m = audio_from_array(stereo[0], 16000)
    assert m.channels == 1 and m.num_samples == n
    pcm = np.array([-32768, -1, 0, 1, 32767], np.int16)
    got = audio_from_array(pcm, 8000)
    np.testing.assert_array_equal(got.samples[0], pcm / 32768.0)
    np.testing.assert_array_equal(got.to_int16()[:, 0], pcm)  # int16 round-trips exactly
    assert audio_from_array(torch.zeros(2, 10), 8000).samples.shape == (2, 10)
    np.testing.assert_allclose(audio_from_array(np.array([0, 128, 255], np.uint8), 8000).samples[0], [-1, 0, 127 / 128])
    with pytest.raises(ValueError, match="ambiguous"):
        audio_from_array(np.zeros((4, 4), np.float32), 8000)
    with pytest.raises(ValueError):
        audio_from_array(np.zeros((2, 3, 4), np.float32), 8000)
    with pytest.raises(TypeError):
        audio_from_array(np.zeros(10, bool), 8000)
    with pytest.raises(ValueError, match="sample_rate"):
        audio_from_array(np.zeros(10, np.float32), 0)


def _f32_wav(path: Path, x: np.ndarray, rate: int) -> Path:
    """Mono IEEE-float WAV (format 3; the wave module writes integer PCM only)."""
    import struct

    data = np.asarray(x, "<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, rate, rate * 4, 4, 32)
    path.write_bytes(b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt
                     + b"data" + struct.pack("<I", len(data)) + data)
    return path


def test_non_finite_samples_are_refused_wherever_audio_comes_in(tmp_path):
    """NaN/inf float PCM is refused with one error type by every way in: a float WAV (the file
    named: the CLI prints it), an array, an Audio, and the stream generator's audio source."""
    from newsstudio.audio.source import AudioSource

    x = np.sin(np.linspace(0, 200, 8000)).astype(np.float32)
    assert np.isfinite(load_audio(_f32_wav(tmp_path / "ok.wav", x, 8000)).samples).all()  # finite float WAVs load
    x[10] = np.nan
    x[20:23] = np.inf
    wav = _f32_wav(tmp_path / "nan.wav", x, 8000)
    with pytest.raises(NonFiniteAudioError, match=r"nan\.wav: 4 of 8000 samples are NaN or infinite") as e:
        load_audio(wav)
    assert isinstance(e.value, MediaError) and e.value.source == str(wav)
    with pytest.raises(NonFiniteAudioError, match="4 of 8000"):
        load_audio(wav.read_bytes())
    with pytest.raises(NonFiniteAudioError):
        audio_from_array(x, 8000)
    with pytest.raises(NonFiniteAudioError):
        Audio(x[None], 8000)
    for source in (wav, (x, 8000)):
        with pytest.raises(NonFiniteAudioError, match="NaN or infinite"):
            AudioSource(source, 16000)


def test_mono_and_resample_preserve_the_sound():
    rate = 48000
    t = np.arange(rate) / rate
    left, right = np.sin(2 * np.pi * 1000 * t), 0.5 * np.sin(2 * np.pi * 1000 * t)
    audio = audio_from_array(np.stack([left, right]).astype(np.float32), rate)
    mono = audio.mono()
    assert mono.channels == 1 and mono.mono() is mono
    np.testing.assert_allclose(mono.samples[0], 0.75 * left, atol=1e-6)
    down = mono.resampled(16000)
    assert down.sample_rate == 16000 and down.num_samples == 16000
    assert down.duration_s == pytest.approx(1.0)
    t16 = np.arange(16000) / 16000
    interior = slice(500, -500)
    np.testing.assert_allclose(down.samples[0, interior], 0.75 * np.sin(2 * np.pi * 1000 * t16)[interior], atol=2e-3)
    assert audio.resampled(rate) is audio


def test_write_wav_round_trip_and_atomic(tmp_path, speech2s):
    out = write_wav(tmp_path / "sub" / "o.wav", speech2s)
    back = load_audio(out)
    assert (back.channels, back.sample_rate, back.num_samples) == (2, 48000, 96000)
    np.testing.assert_array_equal(back.to_int16(), speech2s.to_int16())
    assert leftovers(out.parent) == []
    target = tmp_path / "is_a_dir.wav"
    target.mkdir()
    with pytest.raises(OSError):
        write_wav(target, speech2s)  # the final rename fails
    assert leftovers(tmp_path) == [] and target.is_dir()


# ----------------------------------------------------------------------------- MP4 writing


@pytest.mark.parametrize("fps", [25, 30, 29.97, Fraction(30000, 1001)])
@pytest.mark.parametrize("n", [1, 7, 31])
def test_frame_count_and_timestamps_exact(tmp_path, fps, n):
    path = tmp_path / "o.mp4"
    nv12 = rgb_to_nv12(torch.from_numpy(pattern_rgb(n)))
    with Mp4Writer(path, 64, 48, fps) as w:
        w.write(nv12[: n // 2])
        w.write(nv12[n // 2 :])
    rate = as_frame_rate(fps)
    info = probe_video(path)
    assert info.frame_count == n and info.fps == rate
    frames = decode_all(path)
    assert len(frames) == n
    times = [float(f.pts * f.time_base) for f in frames]
    np.testing.assert_allclose(times, np.arange(n) / float(rate), atol=1e-4)


def test_29_97_snaps_to_ntsc():
    assert as_frame_rate(29.97) == Fraction(30000, 1001)
    assert as_frame_rate(23.976) == Fraction(24000, 1001)
    assert as_frame_rate(12.5) == Fraction(25, 2)


@pytest.mark.parametrize("pixel_input", ["nv12", "rgb"])
def test_decoded_frames_match_written(tmp_path, pixel_input):
    """crf 18 on a smooth pattern. Measured: decoded YUV planes vs the NV12 written 47 dB
    (bound 40); RGB read back through iter_video_frames (which honours the BT.709 tag the
    writer sets) vs the source RGB 40 dB, 4:2:0 loss included (bound 35)."""
    src = pattern_rgb(10)
    nv12 = rgb_to_nv12(src).numpy()
    path = tmp_path / f"{pixel_input}.mp4"
    with Mp4Writer(path, 64, 48, 25, pixel_input=pixel_input, crf=18) as w:
        if pixel_input == "rgb":
            w.write(torch.from_numpy(src[:4]))
            for img in src[4:]:
                w.write(img)  # single numpy frames too
        else:
            w.write(nv12)
    with av.open(str(path)) as c:
        ctx = c.streams.video[0].codec_context
        assert (ctx.colorspace, ctx.color_range, ctx.color_primaries, ctx.color_trc) == (1, 1, 1, 1)
    planes = [f.reformat(format="nv12").to_ndarray() for f in decode_all(path)]
    assert len(planes) == 10
    assert min(psnr(a, b) for a, b in zip(planes, nv12)) > 40.0
    out = list(iter_video_frames(path))
    assert len(out) == 10
    assert min(psnr(a, b) for a, b in zip(out, src)) > 35.0
    # Decoding the planes ourselves with BT.709 agrees with FFmpeg's tagged decode (its fast
    # path is within a few code values of the exact maths, see test_colour.py).
    assert np.abs(nv12_to_rgb(planes[0]).numpy().astype(int) - out[0].astype(int)).max() <= 4  # 3; BT.601: 14


def test_audio_muxed_in_sync(tmp_path):
    """A click at 1.0 s in the audio must come out at 1.0 s (within one frame), the audio
    keeps its rate and channels, and its duration is within one frame of the input."""
    rate, fps = 44100, 25
    samples = np.zeros((2, int(1.6 * rate)), np.float32)
    click = int(1.0 * rate)
    samples[:, click : click + 200] = 0.9
    audio = Audio(samples, rate)
    path = tmp_path / "av.mp4"
    with Mp4Writer(path, 64, 48, fps, audio=audio) as w:
        for chunk in np.array_split(pattern_rgb(50), 7):  # 2.0 s of video, odd chunk sizes
            w.write(rgb_to_nv12(chunk))
    back = load_audio(path)
    assert (back.channels, back.sample_rate) == (2, rate)
    assert abs(back.duration_s - 1.6) <= 1 / fps
    found = np.argmax(np.abs(back.samples[0])) / rate
    assert abs(found - 1.0) <= 1 / fps
    assert probe_video(path).frame_count == 50


def test_long_audio_is_trimmed_and_odd_rate_resampled(tmp_path, media):
    speech = load_audio(media("speech.wav"))  # 24 kHz mono, 15.8 s
    path = tmp_path / "trim.mp4"
    with Mp4Writer(path, 64, 48, 30, audio=speech) as w:
        w.write(rgb_to_nv12(pattern_rgb(45)))  # 1.5 s
    back = load_audio(path)
    assert (back.channels, back.sample_rate) == (1, 24000)
    assert abs(back.duration_s - 1.5) <= 1 / 30
    odd = Audio(np.zeros((1, 50000), np.float32), 50000)  # not an AAC rate -> 64 kHz
    with Mp4Writer(tmp_path / "odd.mp4", 64, 48, 25, audio=odd) as w:
        w.write(rgb_to_nv12(pattern_rgb(25)))
    assert load_audio(tmp_path / "odd.mp4").sample_rate == 64000


def test_failure_mid_write_leaves_nothing(tmp_path, speech2s):
    path = tmp_path / "out.mp4"
    with pytest.raises(RuntimeError, match="boom"):
        with Mp4Writer(path, 64, 48, 25, audio=speech2s) as w:
            w.write(rgb_to_nv12(pattern_rgb(5)))
            assert leftovers(tmp_path)  # the temp file exists while writing
            raise RuntimeError("boom")
    assert not path.exists() and leftovers(tmp_path) == []
    with pytest.raises(ValueError, match="NV12 frames must be"):
        with Mp4Writer(path, 64, 48, 25) as w:
            w.write(rgb_to_nv12(pattern_rgb(5)))
            w.write(np.zeros((2, 48, 64), np.uint8))  # wrong shape mid-stream
    assert not path.exists() and leftovers(tmp_path) == []
    # An existing file is replaced only by a complete one.
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with Mp4Writer(path, 64, 48, 25) as w:
            w.write(rgb_to_nv12(pattern_rgb(2)))
            raise RuntimeError
    assert path.read_bytes() == b"old"
    with pytest.raises(MediaEncodeError, match="no frames"):
        with Mp4Writer(tmp_path / "none.mp4", 64, 48, 25):
            pass
    assert not (tmp_path / "none.mp4").exists() and leftovers(tmp_path) == []


def test_writer_argument_errors(tmp_path):
    with pytest.raises(ValueError, match="even"):
        Mp4Writer(tmp_path / "x.mp4", 63, 48, 25)
    with pytest.raises(ValueError, match="pixel_input"):
        Mp4Writer(tmp_path / "x.mp4", 64, 48, 25, pixel_input="bgr")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="preset must be one of ultrafast"):
        Mp4Writer(tmp_path / "x.mp4", 64, 48, 25, preset="turbo")
    with pytest.raises(TypeError, match="uint8"):
        with Mp4Writer(tmp_path / "x.mp4", 64, 48, 25) as w:
            w.write(np.zeros((1, 72, 64), np.float32))
    assert leftovers(tmp_path) == [] and not (tmp_path / "x.mp4").exists()


def test_encode_clip_with_metadata(tmp_path, speech2s):
    frames = (img for img in pattern_rgb(8))
    path = encode_clip(tmp_path / "c.mp4", frames, fps=25, audio=speech2s, metadata={"comment": "newsstudio test"})
    assert path == tmp_path / "c.mp4"
    with av.open(str(path)) as c:
        assert c.metadata.get("comment") == "newsstudio test"
        assert {s.type for s in c.streams} == {"video", "audio"}
    info = probe_video(path)
    assert (info.width, info.height, info.frame_count, info.has_audio) == (64, 48, 8, True)
    with pytest.raises(MediaEncodeError, match="no frames"):
        encode_clip(tmp_path / "e.mp4", [], fps=25)


@pytest.mark.parametrize("segment_threads", [None, 3])
def test_parallel_segments_make_one_valid_frame_exact_stream(tmp_path, speech2s, segment_threads):
    """Segments encoded by separate x264 instances (one thread each, or sliced threads) join into
    one stream: every frame decodes, in order, close to its source; an IDR starts every segment;
    audio is muxed as with one encoder."""
    n, w, h = 45, 160, 96
    g = np.random.default_rng(0)
    base = g.integers(0, 255, (h // 8, w // 8, 3), dtype=np.uint8)
    frames = np.stack([np.roll(np.kron(base, np.ones((8, 8, 1), np.uint8)), 3 * i, axis=1) for i in range(n)])
    nv12 = rgb_to_nv12(torch.from_numpy(frames)).numpy()
    one, par = tmp_path / "one.mp4", tmp_path / "par.mp4"
    with Mp4Writer(one, w, h, 25, audio=speech2s) as wr:
        wr.write(nv12)
    with Mp4Writer(par, w, h, 25, audio=speech2s, workers=3, segment_frames=16, segment_threads=segment_threads) as wr:
        for s in range(0, n, 7):  # batches that straddle segment boundaries; the buffer is reused
            buf = nv12[s:s + 7].copy()
            wr.write(buf)
            buf[:] = 0
    assert probe_video(par).frame_count == n and leftovers(tmp_path) == []
    with av.open(str(par)) as c:
        keys = [p.is_keyframe for p in c.demux(video=0) if p.size]
    assert [i for i, k in enumerate(keys) if k] == [0, 16, 32]

    def psnr(path):
        got = list(iter_video_frames(path))
        assert len(got) == n
        return np.array([10 * np.log10(255**2 / max(np.mean((a.astype(np.float64) - b) ** 2), 1e-9))
                         for a, b in zip(got, frames.astype(np.float64))])

    p_one, p_par = psnr(one), psnr(par)
    assert p_par.min() > p_one.min() - 2 and p_par.mean() > p_one.mean() - 1  # the same pictures, in order
    dur = {}
    for name in (one, par):
        with av.open(str(name)) as c:
            a = c.streams.audio[0]
            dur[name.name] = float(a.duration * a.time_base)
    assert abs(dur["par.mp4"] - dur["one.mp4"]) < 0.03 and abs(dur["par.mp4"] - n / 25) < 0.05


def test_a_clip_of_known_length_ends_in_short_segments_over_every_worker(tmp_path, speech2s):
    """total_frames: once fewer frames are left than a full segment for each worker, segments shrink
    (at least two frames) so the last frames, which arrive together, are encoded side by side; the
    file stays one frame-exact stream with an IDR at each segment start, and lossless stays lossless."""
    n, w, h = 61, 64, 48
    base = np.random.default_rng(7).integers(0, 255, (h // 8, w // 8, 3), dtype=np.uint8)
    frames = np.stack([np.roll(np.kron(base, np.ones((8, 8, 1), np.uint8)), 2 * i, axis=1) for i in range(n)])
    nv12 = rgb_to_nv12(torch.from_numpy(frames)).numpy()  # moving, not a scene cut per frame
    path = tmp_path / "told.mp4"
    with Mp4Writer(path, w, h, 25, audio=speech2s, workers=3, segment_frames=8, crf=0, total_frames=n) as wr:
        for s in range(0, 29, 7):
            wr.write(nv12[s:s + 7].copy())
        wr.write(nv12[35:].copy())  # the last 26 frames in one chunk, as a render's last chunk
    with av.open(str(path)) as c:
        keys = [i for i, p in enumerate(p for p in c.demux(video=0) if p.size) if p.is_keyframe]
    starts = np.diff(keys + [n]).tolist()  # frames per segment, from the IDR frames in the file
    assert sum(starts) == n and starts[:5] == [8] * 5  # full segments while much is left (24+ frames)
    assert all(b <= a for a, b in zip(starts, starts[1:])) and starts[-3:] == [2, 2, 2]  # then shrinking to 2
    assert len(starts) - 5 >= 3  # the last chunk's frames went to more segments than there are workers
    assert leftovers(tmp_path) == []
    planes = [f.reformat(format="nv12").to_ndarray() for f in decode_all(path)]
    assert len(planes) == n and all(np.array_equal(a, b) for a, b in zip(planes, nv12))
    with pytest.raises(ValueError, match="total_frames"):
        Mp4Writer(tmp_path / "bad.mp4", w, h, 25, total_frames=-1)


def test_owned_frames_are_kept_without_a_copy_and_encode_the_same(tmp_path):
    """write(..., owned=True): parallel segments keep the caller's arrays (no 3 MB copy per 1080p
    frame on the caller's thread) and the file is the same as with copies."""
    n, w, h = 20, 64, 48
    g = np.random.default_rng(3)
    frames = g.integers(0, 255, (n, h, w, 3), dtype=np.uint8)
    nv12 = rgb_to_nv12(torch.from_numpy(frames)).numpy()
    outs = {}
    for owned in (False, True):
        path = tmp_path / f"owned_{owned}.mp4"
        # lossless (crf 0): each file decodes to exactly its input, however the parallel x264 instances interleave
        with Mp4Writer(path, w, h, 25, workers=2, segment_frames=16, crf=0) as wr:
            batch = nv12[:8].copy()
            wr.write(batch, owned=owned)
            assert np.shares_memory(wr._pending[0][1], batch) is owned
            wr.write(nv12[8:].copy(), owned=owned)
        outs[owned] = [f.copy() for f in iter_video_frames(path)]
    assert len(outs[True]) == n and all(np.array_equal(a, b) for a, b in zip(outs[True], outs[False]))
    assert outs[True][0].shape == (h, w, 3)


@pytest.mark.parametrize("pixel_input", ["nv12", "rgb"])
def test_frames_are_read_in_place_and_the_caller_may_reuse_its_buffer_after_write(tmp_path, pixel_input):
    """The encoder reads the caller's array without copying it first (x264 copies its input when
    the frame is sent): once write() returns, overwriting the buffer changes nothing in the file."""
    n, w, h = 12, 64, 48
    g = np.random.default_rng(5)
    frames = g.integers(0, 255, (n, h, w, 3), dtype=np.uint8)
    nv12 = rgb_to_nv12(torch.from_numpy(frames)).numpy()
    src = nv12 if pixel_input == "nv12" else frames
    path = tmp_path / "reuse.mp4"
    with Mp4Writer(path, w, h, 25, pixel_input=pixel_input, crf=0) as wr:  # lossless, one encoder
        buf = np.empty_like(src[:2])
        for s in range(0, n, 2):
            buf[:] = src[s:s + 2]
            wr.write(buf)
            buf[:] = 255 - buf  # the caller's next use of its buffer
    planes = [f.reformat(format="nv12").to_ndarray() for f in decode_all(path)]
    want = nv12 if pixel_input == "nv12" else [_rgb_frame_to_nv12(f.copy()).to_ndarray() for f in frames]  # swscale's rule
    assert len(planes) == n and all(np.array_equal(a, b) for a, b in zip(planes, want))
