"""Shared pieces of the benchmark scripts: media lookup, avatars from carried landmarks, timing."""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
CARRY = ROOT / ".carry"


def media(name: str) -> Path:
    """A real test file: ../shared/media when present, else the copy carried to a GPU machine."""
    for base in (ROOT.parent / "shared" / "media", CARRY / "media"):
        if (base / name).is_file():
            return base / name
    raise FileNotFoundError(f"{name} not found in ../shared/media or .carry/media (run benchmarks/prepare_carry.py)")


def carried_faces(stem: str) -> list | None:
    """Landmarks carried as .carry/<stem>.faces.npz (detected by prepare_carry on a machine with a
    detector, at the source's full size), or None when none were carried."""
    f = CARRY / f"{stem}.faces.npz"
    if not f.is_file():
        return None
    from newsstudio.avatar.landmarks_io import load_faces

    return load_faces(f)


def avatar(source: Path, avatar_id: str, size: tuple[int, int] | None, root: Path, max_frames: int = 750):
    """Prebake `source`, using landmarks carried as .carry/<stem>.faces.npz when the machine has no detector."""
    from newsstudio.avatar.prebake import prebake

    faces = carried_faces(source.stem)
    return prebake(source, avatar_id, root=root, size=size, progress=False,
                   faces=faces[:max_frames] if faces is not None else None, max_frames=max_frames)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device, repeat: int = 5, warmup: int = 1) -> list[float]:
    for _ in range(warmup):
        fn()
    sync(device)
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        sync(device)
        out.append(time.perf_counter() - t)
    return out


def speech_needed_s(engine, packet, mono, sr: int, fps: int, chunk: int, piece_s: float) -> float:
    """Seconds of speech (whole pieces) an engine must have received before its first `chunk` frames
    exist: its look-ahead / window, a property of the model, found by feeding pieces one by one."""
    import soxr

    from newsstudio.stream import StreamSession, background_for

    session = StreamSession(engine, engine.load_avatar(packet), background_for(engine, packet), fps)
    x = soxr.resample(mono, sr, engine.sample_rate).astype("float32") if sr != engine.sample_rate else mono
    step = max(1, int(round(engine.sample_rate * piece_s)))
    for k, s in enumerate(range(0, x.shape[0], step)):
        session.conditioner.push(x[s:s + step])
        session.pump()
        if session.driver.ready >= chunk:
            return (k + 1) * piece_s
    return x.shape[0] / engine.sample_rate


def live_ttff(engine, packet, audio, fps: int = 25, chunk: int = 4, piece_s: float = 0.02, repeat: int = 2) -> dict[str, Any]:
    """Time to first frame with the audio arriving live: `piece_s` mono pieces released in real time
    (each only once it has been "spoken"), frames streamed as soon as the engine can.

    Median of `repeat` runs of `ms` (first frame after the first sample was spoken); `audio_ms` is
    the speech the engine needs first (`speech_needed_s`, a model property) and `compute_ms` =
    ms - audio_ms, our processing latency after the needed speech has arrived."""
    from newsstudio.stream import stream_generator

    mono = audio.mono().samples[0]
    sr = audio.sample_rate
    step = max(1, int(round(sr * piece_s)))

    def one() -> float:
        t0 = time.perf_counter()

        def pieces():
            for k, s in enumerate(range(0, mono.shape[0], step)):
                due = t0 + (k + 1) * piece_s
                while (now := time.perf_counter()) < due:
                    time.sleep(min(0.002, due - now))
                yield mono[s:s + step]

        gen = stream_generator(engine, packet, pieces(), fps=fps, chunk_frames=chunk, output="nv12", sample_rate=sr)
        next(gen)
        t = time.perf_counter()
        gen.close()
        return (t - t0) * 1e3

    ms = median([one() for _ in range(max(1, repeat))])  # the engine is warm (dense runs came first)
    need = speech_needed_s(engine, packet, mono, sr, fps, chunk, piece_s) * 1e3
    return {"ms": ms, "audio_ms": need, "compute_ms": ms - need, "chunk": chunk, "piece_ms": piece_s * 1e3}


def call_times_ms(fn: Callable[..., Any], args: tuple[torch.Tensor, ...], iters: int, device: str) -> list[float]:
    """ms of each of ``iters`` calls ``fn(*args)``: CUDA events on a GPU (device time, launch
    included), the wall clock elsewhere."""
    out = []
    for _ in range(iters):
        if device == "cuda":
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn(*args)
            e.record()
            torch.cuda.synchronize()
            out.append(s.elapsed_time(e))
        else:
            t = time.perf_counter()
            fn(*args)
            out.append((time.perf_counter() - t) * 1e3)
    return out


def cuda_graphed(fn: Callable[..., Any], args: tuple[torch.Tensor, ...]) -> Callable[..., Any]:
    """``fn`` captured in a CUDA graph over static copies of ``args`` (their layouts kept), as the
    engines' runners replay it: the returned callable copies its inputs in, replays, and returns
    the graph's (static) output."""
    static = tuple(a.clone() for a in args)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*static)

    def replay(*inputs: torch.Tensor) -> Any:
        for st, a in zip(static, inputs):
            st.copy_(a)
        graph.replay()
        return out
    return replay


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__, "cpu_count": os.cpu_count()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    info["commit"] = os.environ.get("NEWSSTUDIO_COMMIT")  # a copy of the tree without its own git history says it
    if not info["commit"]:
        try:
            info["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip() or None
        except OSError:
            info["commit"] = None
    info["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    from .host_speed import host_speed

    info["host_speed"] = host_speed()  # hosts of one GPU model differ here (host_speed.py)
    return info


def write_json(path: str | os.PathLike[str] | None, data: dict[str, Any]) -> None:
    """The run's JSON, with ``runner_fallbacks``: runners that fell back to eager (then said on stderr
    too, since the figures are not the asked-for mode's)."""
    from newsstudio.accel.static import fallbacks

    said, data["runner_fallbacks"] = data.get("runner_fallbacks"), fallbacks()
    if data["runner_fallbacks"] and data["runner_fallbacks"] != said:
        print("WARNING: some runners fell back to eager; figures are not the asked-for mode's:\n  "
              + "\n  ".join(data["runner_fallbacks"]), file=sys.stderr)
    if path:
        Path(path).write_text(json.dumps(data, indent=1, default=str))


def fallback_count() -> int:
    """How many distinct runner fallbacks this process has had (`close_variant` takes the new ones)."""
    from newsstudio.accel.static import fallbacks

    return len(fallbacks())


def close_variant(engine, fig: dict[str, Any], fallbacks_before: int, more: bool) -> str:
    """After one engine configuration's figures: its runners that fell back to eager go into ``fig``
    (its figures are then not that mode's; returned as a remark for the progress line), and when
    more configurations follow, its graphs and compiled code are dropped first (each Ditto variant's
    graph pools hold ~44 GB at 1080x1920: the next one's capture ran out of memory on an H100)."""
    import gc

    from newsstudio.accel.static import fallbacks

    fig["runner_fallbacks"] = fallbacks()[fallbacks_before:]
    if more:
        engine.release_graphs()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return " (FELL BACK TO EAGER: not this mode's figures)" if fig["runner_fallbacks"] else ""


def add_engine_config_args(ap: argparse.ArgumentParser) -> None:
    """--variants and --mp4, the same in every engine benchmark."""
    ap.add_argument("--variants", default=None,
                    help=f"engine configurations to time, {VARIANT_SYNTAX},... (first = compared with the reference)")
    ap.add_argument("--mp4", default="veryfast", help="segment->MP4 encoding, PRESET[:WORKERS[/SEGMENT_FRAMES[/THREADS]]][~RAMP]; several "
                    "comma-separated are each timed (the first is the headline figure); ~RAMP: chunk sizes ramp up "
                    "from and down to RAMP frames")


def variant_list(spec: str | None) -> list[str] | None:
    """The comma-separated --variants, or None for the engine's default configuration."""
    return [v for v in (spec or "").split(",") if v] or None


TRITON_FLAGS = {"triton": "half", "triton8": "fp8", "triton8s": "fp8-static", "triton8m": "mixed"}  # flag -> triton_convs
VARIANT_FLAGS = ("nchw", "cl", "nobench", "norw", "nofold", "gn", "nogn", "tf32", "notf32", "static", "dynamic",
                 *TRITON_FLAGS)
VARIANT_SYNTAX = ("ACCEL[:nchw|:cl][:nobench][:norw][:nofold][:gn|:nogn][:tf32|:notf32][:triton|:triton8|:triton8s|"
                  ":triton8m][:rowsR][:static|:dynamic]")


def kernel_choices() -> dict[str, Any]:
    """What `TritonConv2d(kernel="auto")` picked per layer shape in this process (accel/kernel_choice.py):
    how many shapes each implementation won, per shape the winner and every candidate's ms, and the
    tile the Triton autotuner chose per shape."""
    from collections import Counter

    from newsstudio.accel.kernel_choice import choices
    from newsstudio.accel.triton_conv import tuned_tiles

    picked = choices()
    return {"wins": dict(Counter(w for w, _ in picked.values())),
            "by_shape": {repr(k): {"winner": w, "ms": t} for k, (w, t) in picked.items()}, "tiles": tuned_tiles()}


# keywords only one engine takes: a variant list shared by the engines (benchmarks.run) configures that one, and
# the other engine runs the same variant without them
ENGINE_ONLY_KEYWORDS = {"first_face_row": "musetalk", "static_shapes": "musetalk", "front_end_tf32": "ditto",
                        "decoder_folds": "ditto"}


def parse_variant(spec: str, engine: str | None = None) -> dict[str, Any]:
    """`VARIANT_SYNTAX` -> engine keywords: the accel
    mode, channels_last (':nchw' off, ':cl' on, else the engine's default), cudnn_benchmark
    (':nobench' off, else the default: on with CUDA), the engine's exact conv_rewrites (':norw' off;
    for Ditto ':nofold' keeps them but not the decoder folds of the thirty-seventh session),
    its norms by the NHWC kernels (':gn' on, ':nogn' off, else the engine's default; nhwc_norms,
    accel/group_norm_nhwc.py),
    for Ditto its front end graphed with TF32 matmuls (':tf32') or in float32 (':notf32'; else the
    engine's default, TF32), and the render convolutions on the Triton kernel in half precision
    (':triton') or FP8 with input scales per call (':triton8'), fixed at build (':triton8s') or on
    the network's FP8-safe convs only (':triton8m'; accel/igemm_conv.py), and for MuseTalk the VAE
    decoder for face rows R-255 only (':rows104': ``first_face_row``, engines/musetalk/lower_face_decoder.py;
    ':rows0' the whole face, which with a compile mode on CUDA is no longer the default)
    and its render compiled per batch bucket at a static shape (':static': ``static_shapes="all"``) or every
    bucket on one dynamic-batch compilation (':dynamic': "none"; the default compiles the largest bucket static).
    Each configuration gets its own copy of the weights (engines/model_cache.py). With ``engine``, the
    keywords of the other engine's flags (`ENGINE_ONLY_KEYWORDS`) are left out."""
    from newsstudio.accel import MODES

    accel, *flags = spec.split(":")
    rows = [f for f in flags if f.startswith("rows") and f[4:].isdigit()]
    if accel not in MODES or any(f not in VARIANT_FLAGS and f not in rows for f in flags):
        raise SystemExit(f"--variants: {spec!r} is not {VARIANT_SYNTAX} with ACCEL one of {MODES}")
    kw: dict[str, Any] = {"accel": accel}
    if "nchw" in flags or "cl" in flags:
        kw["channels_last"] = "cl" in flags
    if "nobench" in flags:
        kw["cudnn_benchmark"] = False
    if "norw" in flags:
        kw["conv_rewrites"] = False
    if "nofold" in flags:
        kw["decoder_folds"] = False
    if "gn" in flags or "nogn" in flags:
        kw["nhwc_norms"] = "gn" in flags
    if "tf32" in flags or "notf32" in flags:
        kw["front_end_tf32"] = "tf32" in flags
    triton = [TRITON_FLAGS[f] for f in flags if f in TRITON_FLAGS]
    if triton:
        kw["triton_convs"] = triton[-1]
    if rows:
        kw["first_face_row"] = int(rows[-1][4:])
    if "static" in flags or "dynamic" in flags:
        kw["static_shapes"] = "all" if "static" in flags else "none"
    if engine is not None:
        kw = {k: v for k, v in kw.items() if ENGINE_ONLY_KEYWORDS.get(k, engine) == engine}
    return kw


class official_cudnn_defaults:
    """cuDNN autotuning off (torch's default) while a reference-style pipeline runs: the official
    scripts do not turn it on, and our engines turn it on for the whole process."""

    def __enter__(self) -> None:
        self._saved = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = False

    def __exit__(self, *exc: object) -> None:
        torch.backends.cudnn.benchmark = self._saved


def weights_channels_last(module: torch.nn.Module) -> bool:
    """Whether the module's first 4-D weight is stored channels_last (what actually ran)."""
    w = next(p for p in module.parameters() if p.dim() == 4)
    return bool(w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous())


def mp4_options(spec: str) -> dict[str, Any]:
    """`PRESET[:WORKERS[/SEGMENT_FRAMES[/THREADS]]]` -> Mp4Writer keywords (workers > 1: parallel
    x264 segments; THREADS: sliced x264 threads per segment, default the cores shared out)."""
    preset, _, rest = spec.partition(":")
    workers, seg, threads, *_ = (rest or "1").split("/") + ["", ""]
    return {"preset": preset or "veryfast", "workers": int(workers), "segment_frames": int(seg or 32),
            "segment_threads": int(threads) if threads else None}


def segment_mp4_figures(engine, packet, audio, fps: int, chunk: int, out_path: Path, specs: str, repeat: int) -> dict[str, Any]:
    """The segment streamed straight into an MP4 with audio on disk, timed per x264 config in `specs`
    (comma-separated `mp4_options` specs, each optionally ``~RAMP``: chunk sizes ramped from RAMP frames
    up to `chunk` and back down at the end (`stream.chunk_size`), ``@MS``: Python's GIL switch
    interval in ms during that run, to see whether the render thread waits for the GIL behind the
    encoder threads, and a final ``+``: the writer is told the clip's length, so its last segments
    are shorter (`Mp4Writer(total_frames=)`); median of `repeat` runs each). The first config is the headline `segment_mp4_s`.

    Next to each: the file's size and x264 + AAC alone on the very frames this engine rendered
    (kept from the first run, written again from memory in the same chunks): how long the encoders
    need for this engine's pictures (seeded weights make noisy faces, which cost x264 more bits and
    time than an avatar's own frames), so total - encoder alone is what the render adds; and the
    same chunks rendered with nothing encoding, against the MP4 run's last chunk in hand: how much
    the encoder threads slow the render down."""
    from newsstudio.audio.source import frames_for_samples
    from newsstudio.media.mp4_writer import Mp4Writer, as_frame_rate
    from newsstudio.stream import stream_generator

    w, h = packet.size

    def spec_parts(spec: str) -> tuple[str, str, str]:
        """``X264~RAMP@MS[+]`` -> (x264 spec[+], ramp, switch interval ms); absent parts are ''."""
        told = spec.endswith("+")
        spec, _, switch_ms = spec.rstrip("+").partition("@")
        spec, _, ramp = spec.partition("~")
        return spec + "+" * told, ramp, switch_ms

    kept: list = []  # the first run's chunks (fresh arrays each), for the encoder-alone timing
    total = frames_for_samples(audio.num_samples, audio.sample_rate, as_frame_rate(fps))  # the clip's frames, as `render` counts them

    def writer(spec: str) -> Mp4Writer:
        told = spec.endswith("+")
        return Mp4Writer(out_path, w, h, fps, audio=audio, pixel_input="nv12", **mp4_options(spec.rstrip("+")),
                         total_frames=total if told else None)

    def chunks(ramp: str):
        """The segment's NV12 chunks as `render` streams them, ``ramp``: ramp frames or ''."""
        return stream_generator(engine, packet, audio, fps=fps, chunk_frames=chunk, output="nv12", ramp_frames=int(ramp or 0))

    def to_mp4(spec: str) -> tuple[float, float, float]:
        """(total s, first chunk in hand s, last chunk in hand s): the part after the last chunk is
        the encoder's tail, the span of the chunks is the render under the encoders' load."""
        spec, ramp, switch_ms = spec_parts(spec)
        before = sys.getswitchinterval()
        if switch_ms:
            sys.setswitchinterval(float(switch_ms) / 1e3)
        try:
            keep = not kept
            t0 = time.perf_counter()
            first = last = 0.0
            with writer(spec) as wr:
                for ch in chunks(ramp):
                    last = time.perf_counter() - t0
                    first = first or last
                    wr.write(ch["frames"], owned=True)  # fresh per chunk
                    if keep:
                        kept.append(ch["frames"])
            return time.perf_counter() - t0, first, last
        finally:
            sys.setswitchinterval(before)

    def render_alone(spec: str) -> float:
        """Seconds to the last chunk in hand with the same chunks and nothing encoding: against the
        MP4 run's last chunk, how much the encoder threads slow the render (they share the cores)."""
        t0 = time.perf_counter()
        for _ in chunks(spec_parts(spec)[1]):
            pass
        return time.perf_counter() - t0

    def encode_alone(spec: str) -> tuple[float, int]:
        """(seconds, file bytes) for x264 + AAC on the kept frames, no render."""
        spec = spec_parts(spec)[0]
        t0 = time.perf_counter()
        with writer(spec) as wr:
            for frames in kept:
                wr.write(frames, owned=True)
        return time.perf_counter() - t0, out_path.stat().st_size

    runs = {spec: [to_mp4(spec) for _ in range(max(1, repeat))] for spec in specs.split(",")}
    size: dict[str, int] = {}
    alone: dict[str, float] = {}
    rendered: dict[str, float] = {}
    for spec in runs:
        timings = [encode_alone(spec) for _ in range(max(1, repeat))]
        alone[spec] = median([t for t, _ in timings])
        size[spec] = timings[-1][1]
        rendered[spec] = median([render_alone(spec) for _ in range(max(1, repeat))])
    kept.clear()
    by = {spec: median([r[0] for r in rs]) for spec, rs in runs.items()}
    phases = {spec: {"first_chunk_s": median([r[1] for r in rs]), "last_chunk_s": median([r[2] for r in rs])}
              for spec, rs in runs.items()}
    first = next(iter(by))
    return {"segment_mp4_s": by[first], "segment_mp4_config": first, "segment_mp4_s_by_config": by,
            "segment_mp4_phases_by_config": phases, "segment_encode_alone_s_by_config": alone,
            "segment_render_alone_s_by_config": rendered,
            "segment_mp4_bytes_by_config": size}


def stream_rows(row: Callable[..., None], o: dict[str, Any]) -> None:
    """The table rows every engine benchmark prints for its streaming figures: live time to first
    frame (when measured) and the segment -> MP4 time per x264 config."""
    lv = o.get("live_ttff")
    if lv:
        row(f"live time to first frame, ms (speech arriving in {lv['piece_ms']:.0f} ms pieces)",
            f"{lv['ms']:.0f} = {lv['audio_ms']:.0f} of speech needed + {lv['compute_ms']:.1f} after it")
    phases = o.get("segment_mp4_phases_by_config", {})
    for spec, sec_s in o.get("segment_mp4_s_by_config", {o.get("segment_mp4_config", "-"): o["segment_mp4_s"]}).items():
        p = phases.get(spec)
        at = f" (chunks in hand {p['first_chunk_s']:.2f}-{p['last_chunk_s']:.2f} s)" if p else ""
        alone = o.get("segment_encode_alone_s_by_config", {}).get(spec)
        size = o.get("segment_mp4_bytes_by_config", {}).get(spec)
        if alone is not None:
            at += f"; x264 + AAC alone on these frames {alone:.2f} s, {size / 1e6:.1f} MB"
        rendered = o.get("segment_render_alone_s_by_config", {}).get(spec)
        if rendered is not None:
            at += f"; these chunks rendered alone {rendered:.2f} s"
        row(f"segment -> MP4 with audio, s (x264 {spec})", f"{sec_s:.2f}{at}")
