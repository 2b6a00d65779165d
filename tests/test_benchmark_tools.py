"""The benchmark helpers whose arithmetic the GPU reports rely on."""
from __future__ import annotations

import gc
import shutil

import pytest
import torch

from benchmarks.gpu_timeline import summarize_trace
from benchmarks.load_summary import level_line


def _x(cat: str, name: str, ts: float, dur: float, stream: int | None = None) -> dict:
    e = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}
    if stream is not None:
        e["args"] = {"stream": stream}
    return e


def test_gpu_busy_share_counts_overlapping_kernels_once_and_idle_gaps_not_at_all():
    trace = {"traceEvents": [
        _x("kernel", "gemm", 0, 400_000, stream=7),          # 0.0-0.4 s
        _x("kernel", "splice", 300_000, 200_000, stream=13),  # 0.3-0.5 s, overlaps on another stream
        _x("gpu_memcpy", "Memcpy DtoH", 800_000, 200_000, stream=7),  # 0.8-1.0 s
        _x("cuda_runtime", "cudaGraphLaunch", 0, 50),
        _x("cuda_runtime", "cudaStreamSynchronize", 10, 30_000),
        _x("cuda_runtime", "cudaStreamSynchronize", 90, 10_000),
        {"ph": "i", "cat": "kernel", "name": "marker", "ts": 0},  # not a duration event
    ]}
    s = summarize_trace(trace, seconds=1.0)
    assert s["gpu_busy_share"] == pytest.approx(0.7)
    assert s["device_ms_total"] == pytest.approx(800.0)
    assert [k["name"] for k in s["top_kernels"]] == ["gemm", "splice", "Memcpy DtoH"]
    sync = next(c for c in s["runtime"] if c["name"] == "cudaStreamSynchronize")
    assert (sync["count"], sync["ms"], sync["max_ms"]) == (2, 40.0, 30.0)
    assert [(st["stream"], st["ms"], st["count"], st["busy_share"]) for st in s["streams"]] == [
        ("7", 600.0, 2, pytest.approx(0.6)), ("13", 200.0, 1, pytest.approx(0.2))]


def test_each_thread_shows_its_share_in_cuda_calls_and_its_longest_call():
    """Tells a render thread that blocks in a launch or copy from the others (CUPTI sees every thread)."""
    def ev(name: str, ts: float, dur: float, tid: int) -> dict:
        return {"ph": "X", "cat": "cuda_runtime", "name": name, "ts": ts, "dur": dur, "tid": tid}

    trace = {"traceEvents": [
        ev("cudaGraphLaunch", 400_000, 200_000, 11),
        ev("cudaMemcpyAsync", 500_000, 200_000, 11),  # overlaps the launch on the timeline: counted once
        ev("cudaLaunchKernel", 0, 50_000, 22),
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 0, "dur": 1_000_000},
    ]}
    s = summarize_trace(trace, seconds=1.0, thread_names={11: "render-batcher-musetalk"})
    render, other = s["threads"]
    assert render["thread"] == "render-batcher-musetalk" and other["thread"] == "22"
    assert render["runtime_share"] == pytest.approx(0.3) and render["runtime_calls"] == 2
    assert render["longest_call"] == {"name": "cudaGraphLaunch", "ms": 200.0}
    assert other["runtime_share"] == pytest.approx(0.05)


def test_stack_samples_show_where_each_thread_spends_its_time():
    import threading
    import time

    from benchmarks.gpu_timeline import sample_stacks

    stop = threading.Event()

    def spin_in_here():
        while not stop.is_set():
            sum(range(2000))

    def wait_here():
        stop.wait()

    threads = [threading.Thread(target=spin_in_here, name="busy-worker"), threading.Thread(target=wait_here, name="idle-worker")]
    for t in threads:
        t.start()
    try:
        time.sleep(0.05)
        s = sample_stacks(0.3, interval_s=0.005)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert s["samples"] >= 10
    busy, idle = s["threads"]["busy-worker"], s["threads"]["idle-worker"]
    assert busy["top"][0]["where"].endswith("spin_in_here") and busy["top"][0]["share"] > 0.9
    assert "threading.py" in idle["top"][0]["where"]  # blocked in Event.wait


def test_the_load_test_sweeps_server_settings_on_one_running_server(tmp_path):
    """The tool the stream counts come from: a real server on loopback, a live client per level,
    and each level run under its own combination of the swept settings (recorded in its row)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "rows.json"
    cmd = [sys.executable, "-m", "benchmarks.load_test", "--engine", "classic", "--device", "cpu", "--size", "256",
           "--sessions", "1", "--duration", "2", "--render-in-flight", "0,2", "--front-end-streams", "off,on",
           "--compose-graphs", "on", "--json", str(out)]
    done = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert [(r["render_in_flight"], r["front_end_streams"]) for r in rows] == [(0, False), (0, True), (2, False), (2, True)]
    for r in rows:
        assert r["errors"] == 0 and r["fps_median"] > 0, r
        assert r["speaking_share"] > 0.5, r  # the clients' speech reached the sessions
        assert r["active_after"] == 0  # every session closed before the next level
        assert len(r["server_fps_timeline"]) >= 1 and max(r["server_fps_timeline"]) > 0
        # beside it each second: the server's memory and its compile/capture tallies (none on the CPU's classic engine)
        assert len(r["memory_timeline_mb"]) == len(r["server_fps_timeline"]) and r["memory_timeline_mb"][0][0] > 0
        assert r["graph_captures_during"] == r["compiled_frames_during"] == 0, r
        # the GIL probe woke every ~2 ms of the level in the server's process; the classic engine has no batch graphs
        assert r["gil_wakes"] > 200 and 0 <= r["gil_wait_p50_ms"] <= r["gil_wait_p95_ms"] <= r["gil_wait_max_ms"], r
        assert r["batch_graphs"] is None and r["compose_graphs"] is True  # switched on (used on CUDA only)
        # the server's garbage collections over the level: counted, the warm engine's objects frozen out of them
        assert r["gc_full_collections"] >= 0 and r["gc_pause_ms_total"] >= 0 and r["gc_frozen_objects"] > 0, r
        line = level_line(r)  # what the results scripts print per level
        assert f"on time {r['sustained']} of {r['sessions']}" in line and "compose graphs True" in line, line
        # the server's threads' CPU over the level, by thread group: its live sessions' threads worked
        assert any(k.startswith("newsstudio-") and v > 0 for k, v in r["thread_cpu"].items()), r["thread_cpu"]
    # a session counts as sustained only if it spoke: asking for more speech than any session can have
    # (a stand-in for a broken speech path, where idle frames stream on time) leaves none sustained;
    # a warm-up level runs first and is not recorded
    cmd = cmd[: cmd.index("--render-in-flight")] + ["--min-speaking", "1.01", "--warm-up-s", "1", "--json", str(out)]
    done = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "warm-up: 1 sessions for 1 s" in done.stderr
    (row,) = json.loads(out.read_text())
    assert row["errors"] == 0 and row["fps_median"] > 0 and row["sustained"] == 0, row
    # the clients' stream format is swept too (h264 chunks decoded by nothing but still counted), with the
    # server spreading its sessions' render phases and the two sessions' starts spread over half a second;
    # the clients run in two child processes, started once: each level's first second already has frames
    cmd = [sys.executable, "-m", "benchmarks.load_test", "--engine", "classic", "--device", "cpu", "--size", "256",
           "--sessions", "2", "--duration", "2", "--format", "nv12,h264", "--spread-render-phases", "on",
           "--stagger-s", "0.5", "--client-processes", "2", "--fill-render-batches", "off,on", "--json", str(out)]
    done = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert [(r["sessions"], r["format"], r["spread_render_phases"], r["fill_render_batches"]) for r in rows] == [
        (2, "nv12", True, False), (2, "nv12", True, True), (2, "h264", True, False), (2, "h264", True, True)]
    assert all(r["bucket_fill"] == 0 and r["split_requests"] == 0 for r in rows)  # the classic engine has no buckets
    assert all(r["errors"] == 0 and r["fps_median"] > 0 for r in rows), rows
    assert all(r["server_fps_timeline"][0] > 0 for r in rows), [r["server_fps_timeline"] for r in rows]
    # a render budget on the server: the sessions past it are refused and counted apart, not as late
    cmd = [sys.executable, "-m", "benchmarks.load_test", "--engine", "classic", "--device", "cpu", "--size", "256",
           "--fps", "25", "--sessions", "3", "--duration", "2", "--max-render-fps", "classic=50", "--json", str(out)]
    done = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = json.loads(out.read_text())
    assert (row["refused"], row["errors"]) == (1, 0) and row["fps_median"] > 0, row
    assert "1 refused (render capacity)" in done.stderr


def test_a_level_against_a_server_elsewhere_records_its_settings_as_unknown_not_as_zero():
    """`--url`: the server's settings are not known here; a row saying 0 ms of speech spacing or no render ahead
    would be read as a measured setting."""
    from benchmarks.load_test import server_settings_row, table_cell
    from newsstudio.server.state import ServerConfig

    unknown = server_settings_row(None, None)
    assert unknown and all(v is None for v in unknown.values()), unknown
    known = server_settings_row(ServerConfig(render_ahead=16, speech_push_interval_s=0.1), None)
    assert set(known) == set(unknown)
    assert known["render_ahead"] == 16 and known["speech_push_interval_ms"] == 100.0 and known["batch_graphs"] is None
    assert table_cell(None, 5, ".1f") == "    -" and table_cell(2.25, 5, ".1f") == "  2.2"


def test_the_load_test_runs_ditto_stride_levels_and_refuses_a_stride_it_would_not_apply():
    """`--ditto-stride K` starts the server's Ditto sessions in stride mode, its rows and summary lines say so;
    a bad stride, or one with another engine's sessions, ends before any server starts."""
    import subprocess
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    from benchmarks.load_summary import level_line
    from benchmarks.load_test import check_ditto_stride, server_settings_row
    from newsstudio.server.state import ServerConfig

    row = server_settings_row(ServerConfig(ditto_stride=4), None)
    assert row["ditto_stride"] == 4 and row["stride_rows_on_host"] is True
    assert server_settings_row(ServerConfig(), None)["stride_rows_on_host"] is None
    check_ditto_stride(SimpleNamespace(ditto_stride=4, ditto_stride_mode="mask", engine="ditto", url=None))
    for bad in (dict(ditto_stride=0), dict(ditto_stride_mode="warp"), dict(engine="musetalk"), dict(url="http://x")):
        args = dict(ditto_stride=4, ditto_stride_mode="mask", engine="ditto", url=None) | bad
        with pytest.raises(SystemExit, match="--ditto-stride"):
            check_ditto_stride(SimpleNamespace(**args))
    level = dict(sessions=8, sustained=8, errors=0, server_fps=240.0, fps_min=30.0, render_busy_share=0.3, ditto_stride=4,
                 gpu_before_mb=1.0, gpu_peak_mb=3.0, gpu_after_mb=1.5)
    line = level_line(level)
    assert line.startswith("8 sessions | Ditto stride 4 |") and "GPU MB before/peak/after 1.0/3.0/1.5" in line, line
    assert "stride" not in level_line(level | dict(ditto_stride=1))
    for on_host, words in ((True, "rows on the host"), (False, "rows on the device")):  # the A/B's two halves
        assert level_line(level | dict(stride_rows_on_host=on_host)).startswith(f"8 sessions | Ditto stride 4, {words} |")
    cmd = [sys.executable, "-m", "benchmarks.load_test", "--engine", "classic", "--ditto-stride", "2", "--sessions", "1"]
    done = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "--ditto-stride needs --engine ditto" in done.stderr, done.stderr[-500:]
    assert "ready after" not in done.stderr  # refused before a server started


def test_the_load_test_clients_start_without_torch():
    """--client-processes children import the load test module; with torch (and Triton) behind it, four
    of them took seconds to start on a busy GPU machine, which a level's clock counted as 0 frames/s."""
    import subprocess
    import sys
    from pathlib import Path

    probe = "import sys, benchmarks.load_test; print(sorted(m for m in ('torch', 'triton') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], cwd=Path(__file__).resolve().parents[1], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_bucket_timing_times_the_render_runner_per_batch_size(tmp_path):
    """benchmarks.bucket_timing (the live-vs-dense batch question): one row per size, each run in
    the bucket a live batch of that size would use, with its time per call."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "buckets.json"
    cmd = [sys.executable, "-m", "benchmarks.bucket_timing", "--engine", "musetalk", "--device", "cpu", "--quick",
           "--sizes", "1,5", "--json", str(out)]
    done = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["frames"], r["bucket"]) for r in rows] == [(1, 4), (5, 8)]
    assert all(r["wall_ms"] > 0 and r["fps"] == pytest.approx(r["frames"] * 1e3 / r["wall_ms"]) for r in rows)
    assert "| 5 | 8 |" in done.stdout
    bad = subprocess.run([sys.executable, "-m", "benchmarks.bucket_timing", "--sizes", "0"], cwd=Path(__file__).resolve().parents[1],
                         capture_output=True, text=True, timeout=120, check=False)
    assert bad.returncode != 0 and "--sizes" in bad.stderr


def test_pyspy_summary_groups_threads_and_finds_where_ours_were(tmp_path):
    """py-spy's raw `--threads` lines: samples per thread (pool threads as one row), the share of
    the samples possible, and the innermost frame of our own code for the threads asked about."""
    from benchmarks.pyspy_summary import parse, summarize

    raw = tmp_path / "gil.txt"
    raw.write_text(
        "thread (11): render-batcher-musetalk;Thread.run (threading.py:1010);Batcher._loop (newsstudio/engines/batching.py:257);"
        "MuseTalkEngine.render_many (newsstudio/engines/musetalk/engine.py:423);wrapped (torch/_tensor.py:47) 30\n"
        "thread (12): newsstudio-live_0;_worker (thread.py:89);_pack (newsstudio/server/ws.py:78) 20\n"
        "thread (13): newsstudio-live_1;_worker (thread.py:89);_pack (newsstudio/server/ws.py:78) 10\n"
        "a line that is not a sample\n")
    threads = parse(raw)
    assert sum(threads["newsstudio-live_0"].values()) == 20 and sum(threads["render-batcher-musetalk"].values()) == 30
    text = summarize(raw, rate=100, seconds=1, only=["render-batcher"])
    assert "60 samples (0.60 of one thread's 100 possible)" in text
    assert "30 ( 0.30)  newsstudio-live" in text  # the pool's two threads in one row
    assert "MuseTalkEngine.render_many (engine.py:423) > wrapped (_tensor.py:47)" in text


def test_thread_cpu_sees_a_busy_thread_of_a_running_process(tmp_path):
    """/proc sampling of a real process: a thread spinning for a second shows ~one core, by tid."""
    import subprocess
    import sys

    from benchmarks.thread_cpu import summarize, watch

    busy = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 4: pass"])
    try:
        out = tmp_path / "cpu.jsonl"
        watch(busy.pid, seconds=2.0, interval=0.5, out=out)
    finally:
        busy.kill()
        busy.wait()
    s = summarize(out, {str(busy.pid): "spinner"}, 0.0, float("inf"))
    assert s["samples"] >= 3
    assert s["threads"][0][0] == "spinner" and s["threads"][0][1] > 0.5


def test_launch_count_splits_a_live_requests_kernels_by_where_they_run():
    """benchmarks.launch_count on the classic engine: the session's own kernels (splice, copy) and
    the render's are counted apart, and a splice's gathers and scatters are among the session's."""
    from benchmarks.launch_count import count

    parts = count("classic", frames=4, size=128)
    session, render = parts["session"], parts["render thread"]
    assert session.get("gather", 0) == 2 and session.get("scatter_.src", 0) == 2
    assert sum(render.values()) > 0 and "networks" not in parts  # classic has no graphed networks


def test_launch_count_of_a_musetalk_streams_speech_path_keeps_the_encoder_apart():
    """benchmarks.launch_count --speech-s: the speech thread's own kernels (the new samples' copy,
    windows) and the Whisper graph's (log-mel and encoder, one CUDA graph on a GPU) are counted apart;
    each update runs one STFT, inside the graph, and pushes between updates launch nothing."""
    from benchmarks.launch_count import count_speech

    parts = count_speech(1.0)
    speech, encoder = parts["speech thread"], parts["networks"]
    updates = encoder["_fft_r2c"]
    assert 5 <= updates <= 12  # ~every 100 ms of the second's speech, once enough had arrived
    assert "_fft_r2c" not in speech and speech.get("zeros", 0) <= 1  # no log-mel, no empty result per push
    assert sum(speech.values()) <= 12 * updates


def test_the_benchmark_command_runs_an_engine_and_its_load_test_with_per_engine_flags(tmp_path):
    """benchmarks.run, the one benchmark command, on the CPU (--quick): the classic engine's dense,
    first-frame and MP4 figures, then its load test with the flags given for it by --load-args
    (each level's row records the server settings it ran under). A malformed --load-args stops the
    command before anything is measured."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "benchmarks.run", "--engines", "classic", "--quick", "--load", "classic=1",
           "--load-duration", "2", "--load-size", "256", "--load-args", "classic=--render-aheads 8 --stagger-s 0.2",
           "--json", str(out), "--workdir", str(tmp_path / "work")]
    done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    d = json.loads(out.read_text())
    assert d["runner_fallbacks"] == []  # every runner ran the mode it was asked for
    ours = d["engines"]["classic"]["ours"]
    assert ours["dense_fps"] > 0 and ours["ttff_ms"] > 0 and ours["segment_mp4_s"] > 0, ours
    config = ours["segment_mp4_config"]  # next to it: x264 + AAC alone on the frames the engine made
    assert ours["segment_encode_alone_s_by_config"][config] > 0 and ours["segment_mp4_bytes_by_config"][config] > 1000
    assert "x264 + AAC alone on these frames" in done.stdout
    # and the same chunks rendered with nothing encoding: what the encoder's load costs the render
    assert 0 < ours["segment_render_alone_s_by_config"][config] < 10 * ours["segment_mp4_s"], ours
    assert f"| {ours['segment_render_alone_s_by_config'][config]:.2f} |" in done.stdout  # its column in the table
    load = d["concurrency"]["classic"]
    assert "--render-aheads 8 --stagger-s 0.2" in load["command"]
    assert [(r["sessions"], r["render_ahead"], r["errors"]) for r in load["rows"]] == [(1, 8, 0)], load["rows"]
    bad = subprocess.run([sys.executable, "-m", "benchmarks.run", "--load-args", "nosuch=--render-aheads 8"], cwd=root,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "--load-args: 'nosuch=--render-aheads 8' is not ENGINE=FLAGS" in bad.stderr


def test_triton_conv_bench_groups_layer_shapes_and_sums_the_per_shape_choice():
    """benchmarks/triton_conv_bench.py: one row per distinct conv shape with its count (the GPU times
    them); the totals take each variant where it ran (cuDNN elsewhere) and the per-shape fastest."""
    import torch

    from benchmarks.triton_conv_bench import conv_shapes, table, totals
    from newsstudio.accel.upsample_conv import with_phase_upsampling
    from newsstudio.engines.musetalk.engine import TINY_VAE_CONFIG
    from newsstudio.engines.musetalk.weights import random_vae

    vae = random_vae(1, "cpu", config=TINY_VAE_CONFIG)
    dec = with_phase_upsampling(vae.decoder)[0]
    z = vae.post_quant_conv(torch.randn(2, 4, 4, 4))
    mods = {m: f"vae.{n}" for n, m in dec.named_modules() if isinstance(m, torch.nn.Conv2d) or type(m).__name__ == "PhaseUpsampleConv"}
    shapes = conv_shapes(mods, lambda: dec(z))
    assert sum(len(e["names"]) for e in shapes) == 2 + 4 + 16 + 1 + 3  # conv_in/out, mid, up blocks, shortcut, phase convs
    assert len({(e["x_shape"], tuple(e["weight"].shape)) for e in shapes}) == len(shapes)
    rows = [{"layers": ["a"], "count": 2, "x": [1], "w": [1], "gflop": 1.0, "ms": {"cudnn": 1.0, "fp16 pointer": 0.5, "fp8 tma": 0.4},
             "tflops": {"cudnn": 1.0, "fp16 pointer": 2.0, "fp8 tma": 2.5}, "err": {"cudnn": 1e-3}, "failed": {"fp16 tma": "x"}},
            {"layers": ["b"], "count": 1, "x": [1], "w": [1], "gflop": 1.0, "ms": {"cudnn": 1.0}, "tflops": {"cudnn": 1.0},
             "err": {}, "failed": {}}]
    t = totals(rows)
    assert t["cudnn"] == 3.0 and t["fp16 pointer"] == 2.0 and t["auto fp16"] == 2.0 and t["auto fp8"] == 1.8
    assert "failed" in table(rows) and "0.500 (2)" in table(rows)


@pytest.mark.skipif(shutil.which("g++") is None and not torch.cuda.is_available(), reason="Inductor on a CPU needs a C++ compiler")
def test_group_norm_bench_compares_both_norms_per_shape(tmp_path):
    """benchmarks.group_norm_bench: one row per shape with the three implementations' times, the
    same result from each (compiled), channels-last out."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "gn.json"
    cmd = [sys.executable, "-m", "benchmarks.group_norm_bench", "--quick", "--batch", "2", "--iters", "1", "--json", str(out)]
    done = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["channels"], r["groups"]) for r in rows] == [(64, 32), (40, 4)]
    kinds = ("nhwc", "nhwc_apply", "streaming_apply")
    assert all(r["inductor_ms"] > 0 and all(r[f"{k}_ms"] > 0 for k in kinds) for r in rows)
    assert all(r["max_abs_diff"][k] < 1e-4 for r in rows for k in kinds)
    assert all(r["out_channels_last"] == dict.fromkeys(("inductor", *kinds), True) for r in rows)
    assert "| quick | 64 x 16^2 (32) |" in done.stdout


@pytest.mark.skipif(shutil.which("g++") is None and not torch.cuda.is_available(), reason="Inductor on a CPU needs a C++ compiler")
def test_group_norm_bench_times_the_spade_norms(tmp_path):
    """benchmarks.group_norm_bench --spade: per SPADE shape Inductor's norm + modulation + LeakyReLU
    against the NHWC kernels, compiled, the same result, and the decoder-weighted total."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "spade.json"
    cmd = [sys.executable, "-m", "benchmarks.group_norm_bench", "--spade", "--quick", "--batch", "2", "--iters", "1",
           "--json", str(out)]
    done = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(out.read_text())
    (row,) = got["spade_rows"]
    assert (row["channels"], row["side"], row["norms"]) == (32, 16, 1)
    assert row["inductor_ms"] > 0 and row["nhwc_ms"] > 0 and row["streaming_ms"] > 0 and row["max_abs_diff"] < 1e-4
    assert got["total"]["nhwc_ms"] == row["nhwc_ms"] and got["total"]["streaming_ms"] == row["streaming_ms"]
    assert "| quick | 32 x 16^2 | 1 |" in done.stdout


def test_a_shared_variant_configures_only_the_engine_each_flag_belongs_to():
    """`benchmarks.run --variants compile+cudagraph:static:tf32` reaches both engines: MuseTalk's flags
    (rows, static shapes) must not reach Ditto, which refuses unknown options, nor Ditto's TF32 MuseTalk."""
    from benchmarks.common import parse_variant

    spec = "compile+cudagraph:rows104:static:tf32:nogn"
    assert parse_variant(spec) == {"accel": "compile+cudagraph", "first_face_row": 104, "static_shapes": "all",
                                   "front_end_tf32": True, "nhwc_norms": False}
    assert parse_variant(spec, "musetalk") == {"accel": "compile+cudagraph", "first_face_row": 104,
                                               "static_shapes": "all", "nhwc_norms": False}
    assert parse_variant(spec, "ditto") == {"accel": "compile+cudagraph", "front_end_tf32": True, "nhwc_norms": False}
    assert parse_variant("cudagraph:dynamic", "musetalk")["static_shapes"] == "none"
    with pytest.raises(SystemExit, match="is not"):
        parse_variant("compile+cudagraph:fast")


def test_gc_cost_reports_the_objects_a_full_collection_walks_before_and_after_the_freeze(tmp_path):
    from benchmarks.gc_cost import main as gc_cost

    out = gc_cost(["--engines", "classic", "--device", "cpu", "--accel", "eager", "--repeat", "1",
                   "--json", str(tmp_path / "gc.json")])
    stages = [r["stage"] for r in out["rows"]]
    assert stages[0] == "imports" and stages[1].startswith("+ classic warm") and stages[-1].startswith("frozen")
    warm, frozen = out["rows"][-2], out["rows"][-1]
    assert warm["objects"] > 100_000 and frozen["objects"] < warm["objects"] // 100  # what the freeze takes out
    assert gc.get_freeze_count() == 0  # unfrozen again
    assert (tmp_path / "gc.json").is_file()


def test_the_chunk_pack_benchmark_packs_the_same_bytes_both_ways(capsys):
    """benchmarks/chunk_pack_cost.py: both packings give one message, byte for byte (it asserts so),
    and each variant's row is printed."""
    from benchmarks.chunk_pack_cost import main

    main(["--messages", "20", "--repeat", "1", "--size", "64"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 1 |")]
    assert len(rows) == 2 and all(line.count(" ms |") == 2 for line in rows), rows


def test_stride_quality_scores_each_stride_and_mode_on_the_stand_in():
    """benchmarks/stride_quality.py on the developer architecture: one row per stride and mode, the
    keyframe counts a stride implies, and motion compensation well above a cross-fade (the stand-in
    moves pixels with the warp network's own motion model)."""
    from benchmarks.stride_quality import run

    out = run([2, 4], ["mask", "blend", "nearest"], 9, quick=True)
    rows = {(r["stride"], r["mode"]): r for r in out["rows"]}
    assert sorted(rows) == [(2, "blend"), (2, "mask"), (2, "nearest"), (4, "blend"), (4, "mask"), (4, "nearest")]
    assert rows[(2, "mask")]["keyframes"] == 5 and rows[(4, "mask")]["keyframes"] == 3
    assert 25 < out["consecutive_dense_psnr"] < 45  # the frames really move, like a talking head's
    for k in (2, 4):
        r = {m: rows[(k, m)] for m in ("mask", "blend", "nearest")}
        assert r["mask"]["psnr_in_between"] > r["blend"]["psnr_in_between"] + 5
        assert all(x["psnr_all"] > x["psnr_in_between"] for x in r.values())  # keyframes are exact
