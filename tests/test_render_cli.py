"""`newsstudio render` with the default (classic) engine: a real MP4 a user can open."""
from __future__ import annotations

import math

import av
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from conftest import assert_user_error
from newsstudio.avatar.packet import iter_packets
from newsstudio.builtin import builtin_audio
from newsstudio.cli import app
from newsstudio.media.audio import load_audio


def test_render_writes_a_frame_exact_mp4_with_audio(tmp_path, astronaut_packet):
    out = tmp_path / "anchor.mp4"
    audio = builtin_audio("builtin:hello")
    r = CliRunner().invoke(app, ["render", "--avatar", str(astronaut_packet.path), "--audio", str(audio), "-o", str(out), "--fps", "30", "--device", "cpu"])
    assert r.exit_code == 0, r.output
    assert "engine classic" in r.output and "first frame" in r.output
    src = load_audio(audio)
    expected = math.ceil(src.num_samples * 30 / src.sample_rate)
    with av.open(str(out)) as c:
        v = c.streams.video[0]
        assert c.streams.audio, "the MP4 must carry the audio"
        assert (v.codec_context.name, v.format.name) == ("h264", "yuv420p")
        assert float(v.average_rate) == 30
        n = sum(1 for _ in c.decode(video=0))
    assert n == expected
    dur = load_audio(out).duration_s
    assert abs(dur - src.duration_s) <= 1 / 30 + 1e-3, (dur, src.duration_s)
    assert list(tmp_path.iterdir()) == [out], "no temp files may be left next to the output"


def test_bad_audio_fails_cleanly_and_writes_nothing(tmp_path, astronaut_packet):
    bad = tmp_path / "broken.wav"
    bad.write_bytes(b"RIFF\x00\x00\x00\x00WAVEgarbage")
    out = tmp_path / "x.mp4"
    r = CliRunner().invoke(app, ["render", "--avatar", str(astronaut_packet.path), "--audio", str(bad), "-o", str(out), "--device", "cpu"])
    assert r.exit_code == 2 and "error:" in r.output and "broken.wav" in r.output, r.output
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["broken.wav"]


def test_unknown_accel_mode_is_refused_before_any_work(tmp_path, astronaut_packet):
    out = tmp_path / "x.mp4"
    r = CliRunner().invoke(app, ["render", "--avatar", str(astronaut_packet.path), "--audio", "builtin:hello", "-o", str(out),
                                 "--engine", "musetalk", "--weights", "random", "--device", "cpu", "--accel", "turbo"])
    assert r.exit_code != 0
    assert "accel must be one of" in r.output and "compile+cudagraph" in r.output
    assert not out.exists()


def test_preset_is_used_and_an_unknown_one_is_refused_before_any_work(tmp_path, astronaut_packet):
    out = tmp_path / "fast.mp4"
    args = ["render", "--avatar", str(astronaut_packet.path), "--audio", "builtin:hello", "--device", "cpu"]
    r = CliRunner().invoke(app, [*args, "-o", str(out), "--preset", "ultrafast"])
    assert r.exit_code == 0, r.output
    with av.open(str(out)) as c:  # x264 writes its settings into the stream's SEI
        first = bytes(next(iter(c.demux(video=0))))
    assert b"x264" in first and b"subme=0" in first, "ultrafast runs subme=0"
    bad = tmp_path / "bad.mp4"
    r = CliRunner().invoke(app, [*args, "-o", str(bad), "--preset", "turbo"])
    assert r.exit_code == 2 and "--preset must be one of ultrafast" in r.output, r.output
    assert not bad.exists() and "engine" not in r.output


def test_engine_options_pick_compile_only_for_a_long_running_cuda_process():
    from newsstudio.engines.registry import engine_options

    assert engine_options("classic", "random", None, "compile") == {}
    assert "accel" not in engine_options("musetalk", "random", None, "auto", "cuda")  # render: engine default
    assert engine_options("musetalk", "random", None, "auto", "cuda", long_running=True)["accel"] == "compile+cudagraph"
    # TF32 front ends: Ditto's float32 HuBERT and LMDM only (MuseTalk's front end is half precision)
    assert engine_options("ditto", "random", None, front_end_tf32=True)["front_end_tf32"] is True
    assert engine_options("ditto", "random", None, front_end_tf32=False)["front_end_tf32"] is False
    assert "front_end_tf32" not in engine_options("ditto", "random", None)  # the engine's own default
    assert "front_end_tf32" not in engine_options("musetalk", "random", None, front_end_tf32=True)
    assert "accel" not in engine_options("ditto", "random", None, "auto", "cpu", long_running=True)  # CPU: eager
    assert engine_options("ditto", "random", None, "cudagraph", "cpu")["accel"] == "cudagraph"


def test_serve_refuses_an_unknown_compose_mode_before_starting():
    r = CliRunner().invoke(app, ["serve", "--compose", "gpu", "--port", "1"])
    assert r.exit_code == 2 and "--compose must be one of session, worker, stream, got 'gpu'" in r.output, r.output


def test_serve_warns_when_the_speech_prebuffer_cannot_fill_a_render_request():
    r = CliRunner().invoke(app, ["serve", "--render-ahead", "16", "--fps", "30", "--prebuffer-ms", "120", "--compose", "gpu", "--port", "1"])
    assert "--render-ahead 16 at 30 fps wants --prebuffer-ms >= 533" in r.output, r.output
    r = CliRunner().invoke(app, ["serve", "--render-ahead", "16", "--fps", "30", "--prebuffer-ms", "540", "--compose", "gpu", "--port", "1"])
    assert "wants --prebuffer-ms" not in r.output and r.exit_code == 2, r.output  # (the bad --compose stops it before it starts)
    r = CliRunner().invoke(app, ["serve", "--compose", "gpu", "--port", "1"])  # the low-latency defaults: no warning
    assert "wants --prebuffer-ms" not in r.output, r.output


@pytest.mark.parametrize("command", ["render", "serve"])
def test_a_frame_rate_above_the_maximum_is_refused_in_the_servers_words(tmp_path, astronaut_packet, command):
    """`render --fps 500` used to write 1000 frames for 2 s of speech while the server refused
    anything over 60: now one rule (frame_rate.py), whose maximum is Ditto's (the one engine with
    a ceiling), refuses it before any work with the words /clips, /ws and WebRTC use."""
    from newsstudio.frame_rate import MAX_FPS, frame_rate_error

    out = tmp_path / "x.mp4"
    if command == "render":
        args = ["render", "--avatar", str(astronaut_packet.path), "--audio", "builtin:hello", "-o", str(out), "--device", "cpu"]
    else:
        args = ["serve", "--port", "1"]  # (port 1: it must not get that far)
    r = CliRunner().invoke(app, [*args, "--fps", "500"])
    line = assert_user_error(r, frame_rate_error(500), f"at most {MAX_FPS}")
    assert "render classic" not in r.output and "warning" not in r.output, r.output
    assert line.endswith(frame_rate_error(500))
    assert list(tmp_path.iterdir()) == []


def test_sigterm_mid_render_leaves_no_partial_file(tmp_path, astronaut_packet):
    """`kill` / `timeout` / a supervisor's SIGTERM unwinds like Ctrl-C: exit status 143, and the
    partial MP4 beside the output is removed (neither a half file nor a stray temp is left)."""
    import signal
    import subprocess
    import sys
    import time

    import numpy as np
    from scipy.io import wavfile

    speech = tmp_path / "long.wav"
    t = np.arange(16000 * 120) / 16000
    wavfile.write(speech, 16000, (0.3 * np.sin(2 * np.pi * 220 * t) * 32767).astype(np.int16))
    out = tmp_path / "long.mp4"
    proc = subprocess.Popen([sys.executable, "-c", "from newsstudio.cli import app; app()", "render", "--avatar",
                             str(astronaut_packet.path), "--audio", str(speech), "-o", str(out), "--device", "cpu"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".long.*.partial.mp4")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the render ended before it could be interrupted: " + proc.stdout.read().decode()[-500:]
    time.sleep(0.5)  # some chunks encoded
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    assert sorted(p.name for p in tmp_path.iterdir()) == ["long.wav"]


def _wav(path, samples: np.ndarray, rate: int = 16000):
    from scipy.io import wavfile

    wavfile.write(path, rate, samples)
    return path


@pytest.fixture
def stream_error_cases(tmp_path):
    """`stream` arguments a new user gets wrong -> the words their error line must hold."""
    from PIL import Image

    Image.fromarray(np.full((128, 128, 3), 90, np.uint8)).save(tmp_path / "wall.png")
    (tmp_path / "broken.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEgarbage")
    (tmp_path / "models").mkdir()
    return {
        "no such avatar": (["--avatar", "nosuch"], ["no avatar 'nosuch'"]),
        "no face": (["--avatar", str(tmp_path / "wall.png")], ["no face found in wall.png"]),
        "missing audio": (["--audio", str(tmp_path / "nowhere.wav")], ["nowhere.wav", "no such file"]),
        "corrupt audio": (["--audio", str(tmp_path / "broken.wav")], ["broken.wav"]),
        "unknown engine": (["--engine", "bogus"], ["unknown engine 'bogus'"]),
        "bad output": (["--output", "yuv"], ["output must be 'nv12' or 'rgb'"]),
        "zero fps": (["--fps", "0"], ["fps must be positive"]),
        "fps above the maximum": (["--fps", "500"], ["fps must be at most 120 (the highest frame rate every engine renders), got 500"]),
        "zero chunk": (["--chunk", "0"], ["chunk_frames must be >= 1"]),
        "no weights": (["--engine", "musetalk", "--models", str(tmp_path / "models")], ["musetalk.json is missing"]),
    }


@pytest.mark.parametrize("case", ["no such avatar", "no face", "missing audio", "corrupt audio", "unknown engine",
                                  "bad output", "zero fps", "fps above the maximum", "zero chunk", "no weights"])
def test_stream_reports_user_errors_in_one_line_like_render(tmp_path, astronaut_packet, stream_error_cases, case):
    args, needles = stream_error_cases[case]
    base = {"--avatar": str(astronaut_packet.path), "--audio": "builtin:hello"}
    for flag in base.keys() & set(args):
        del base[flag]
    av = tmp_path / "av"
    r = CliRunner().invoke(app, ["stream", *(x for kv in base.items() for x in kv), *args, "--avatars", str(av), "--device", "cpu"])
    assert_user_error(r, *needles)
    assert not list(iter_packets(av)), "a failed stream must not leave an avatar behind"


def test_stream_options_have_help():
    r = CliRunner().invoke(app, ["stream", "--help"], terminal_width=200)
    text = " ".join(r.output.replace("│", " ").split())
    assert "builtin:astronaut" in text and "--allow-silence" in text
    for flag in ("--engine", "--fps", "--chunk", "--device", "--weights"):
        after = text.split(flag, 1)[1].split("--", 1)[0]  # the words between this option and the next
        assert len(after.split()) > 2, f"{flag} has no help text: {after!r}"


def test_render_to_a_folder_is_refused_before_rendering(tmp_path, astronaut_packet):
    out = tmp_path / "clips"
    out.mkdir()
    r = CliRunner().invoke(app, ["render", "--avatar", str(astronaut_packet.path), "--audio", "builtin:hello", "-o", str(out), "--device", "cpu"])
    assert_user_error(r, str(out), "is a folder")
    assert "render classic" not in r.output, "refused before rendering"
    assert [p.name for p in tmp_path.iterdir()] == ["clips"] and not list(out.iterdir())


def test_output_taken_by_a_folder_while_rendering_leaves_no_partial_file(tmp_path, astronaut_packet, monkeypatch):
    """The final rename fails (the name became a folder meanwhile): a clear error, exit 2, and the
    finished temp file is removed, not left as .NAME.*.partial.mp4 beside the output."""
    import newsstudio.stream

    out = tmp_path / "x.mp4"
    real = newsstudio.stream.stream_generator

    def racing(*args, **kwargs):
        yield from real(*args, **kwargs)
        out.mkdir()  # another program takes the name while the clip is finished

    monkeypatch.setattr(newsstudio.stream, "stream_generator", racing)
    r = CliRunner().invoke(app, ["render", "--avatar", str(astronaut_packet.path), "--audio", "builtin:hello", "-o", str(out), "--device", "cpu"])
    assert_user_error(r, str(out), "cannot move the finished file into place")
    assert [p.name for p in tmp_path.iterdir()] == ["x.mp4"] and out.is_dir() and not list(out.iterdir())


def test_an_error_mid_render_starts_on_a_fresh_line_after_the_progress_bar(tmp_path, astronaut_packet, monkeypatch):
    import newsstudio.stream

    real = newsstudio.stream.stream_generator

    def choking(*args, **kwargs):
        for ch in real(*args, **kwargs):
            yield ch
            raise ValueError("the engine choked")

    monkeypatch.setattr(newsstudio.stream, "stream_generator", choking)
    out = tmp_path / "x.mp4"
    r = CliRunner().invoke(app, ["render", "--avatar", str(astronaut_packet.path), "--audio", "builtin:hello", "-o", str(out), "--device", "cpu"])
    assert_user_error(r, "the engine choked")
    before = r.output[: r.output.index("error: ")]
    assert "render classic" in before and before.endswith("\n"), repr(before[-120:])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("port", ["99999", "0"])
def test_serve_refuses_a_port_out_of_range(port):
    r = CliRunner().invoke(app, ["serve", "--port", port, "--compose", "gpu"])  # (--compose gpu: never starts)
    assert r.exit_code == 2 and "--port" in r.output and "compose" not in r.output, r.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_serve_refuses_an_unavailable_device_before_it_starts():
    r = CliRunner().invoke(app, ["serve", "--device", "cuda", "--port", "1"])  # (port 1: it must not get that far)
    assert_user_error(r, "device 'cuda' is not available", "without CUDA")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("command", ["render", "stream"])
def test_an_unavailable_device_is_a_clear_error(tmp_path, astronaut_packet, command):
    out = tmp_path / "x.mp4"
    args = ["-o", str(out)] if command == "render" else []
    r = CliRunner().invoke(app, [command, "--avatar", str(astronaut_packet.path), "--audio", "builtin:hello", *args, "--device", "cuda"])
    assert_user_error(r, "device 'cuda' is not available", "without CUDA")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["render", "stream"])
def test_silent_audio_is_refused_unless_allowed(tmp_path, astronaut_packet, command):
    """Like the HTTP API (422 "no speech found"): a silent wav is almost always the wrong file."""
    silent = _wav(tmp_path / "silent.wav", np.zeros(8000, np.int16))
    out = tmp_path / "x.mp4"
    args = [command, "--avatar", str(astronaut_packet.path), "--audio", str(silent), "--device", "cpu"]
    args += ["-o", str(out)] if command == "render" else []
    r = CliRunner().invoke(app, args)
    assert_user_error(r, "silent.wav", "no speech found in the audio", "-45 dBFS", "--allow-silence")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["silent.wav"]
    r = CliRunner().invoke(app, [*args, "--allow-silence"])
    assert r.exit_code == 0, r.output
    assert out.is_file() if command == "render" else "13 frames" in r.output


def test_weights_check_help_says_it_exits_1_when_weights_are_missing():
    r = CliRunner().invoke(app, ["weights", "check", "--help"], terminal_width=200)
    assert "exit status 1 when any is missing" in " ".join(r.output.replace("│", " ").split()), r.output


def test_serve_refuses_a_musetalk_feature_step_off_the_whisper_row_grid():
    r = CliRunner().invoke(app, ["serve", "--musetalk-feature-step-ms", "30", "--port", "1"])
    assert r.exit_code == 2 and "--musetalk-feature-step-ms must be a multiple of 20 from 20 to 1000, got 30" in r.output, r.output


def test_static_shapes_reach_musetalk_only_and_a_typo_fails_before_anything_renders(tmp_path, astronaut_packet, media):
    from newsstudio.engines.registry import engine_options

    assert engine_options("musetalk", "random", None, static_shapes="none")["static_shapes"] == "none"
    assert "static_shapes" not in engine_options("musetalk", "random", None, static_shapes="default")  # its own default
    assert "static_shapes" not in engine_options("ditto", "random", None, static_shapes="all")
    r = CliRunner().invoke(app, ["serve", "--static-shapes", "larges", "--port", "1"])
    assert r.exit_code == 2 and "--static-shapes must be one of default, none, largest, all, got 'larges'" in r.output, r.output
    out = tmp_path / "x.mp4"
    r = CliRunner().invoke(app, ["render", "--avatar", str(astronaut_packet.path), "--audio", str(media("speech.wav")),
                                 "--device", "cpu", "--engine", "musetalk", "--weights", "random", "--static-shapes",
                                 "everything", "-o", str(out)])
    assert_user_error(r, "static-shapes must be one of default, none, largest, all, got 'everything'")
    assert not out.exists()


def test_musetalk_feature_step_reaches_musetalk_only():
    from newsstudio.engines.registry import engine_options

    assert engine_options("musetalk", "random", None, feature_step_ms=200)["feature_step_ms"] == 200
    assert "feature_step_ms" not in engine_options("musetalk", "random", None)  # the engine's default, 100 ms
    assert "feature_step_ms" not in engine_options("ditto", "random", None, feature_step_ms=200)
    with pytest.raises(ValueError, match="multiple of 20"):
        engine_options("classic", "random", None, feature_step_ms=0)  # checked for every engine: fails early
