"""`newsstudio render` with the default (classic) engine: a real MP4 a user can open."""
from __future__ import annotations

import math

import av
from typer.testing import CliRunner

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
