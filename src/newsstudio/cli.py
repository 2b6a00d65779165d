"""`newsstudio` command line: prebake avatars, render clips, stream, manage weights, serve."""
from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from .frame_rate import MAX_FPS

if TYPE_CHECKING:
    import torch

    from .media.audio import Audio

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Lip-synced talking-head video from an avatar and speech.")
avatar_app = typer.Typer(no_args_is_help=True, help="Inspect and check avatar packets.")
weights_app = typer.Typer(no_args_is_help=True, help="Official model weights: check what is present, fetch what is missing.")
app.add_typer(avatar_app, name="avatar")
app.add_typer(weights_app, name="weights")

AvatarsOpt = typer.Option(None, "--avatars", help="Avatars folder (default $NEWSSTUDIO_AVATARS or ./avatars).")
ModelsOpt = typer.Option(None, "--models", help="Models folder in the official layout (default $NEWSSTUDIO_MODELS or ./models).")


def _size(value: Optional[str]) -> Optional[tuple[int, int]]:
    if not value:
        return None
    try:
        w, h = (int(v) for v in value.lower().split("x"))
    except ValueError:
        raise typer.BadParameter(f"size must look like 1080x1920, got {value!r}") from None
    return w, h


def _unwind_on_sigterm() -> None:
    """SIGTERM (``kill``, ``timeout``, a supervisor) unwinds the command like Ctrl-C would, exit
    status 143: writers then remove their partial files instead of leaving them behind."""
    import signal
    import threading

    def unwind(signum, frame):  # noqa: ARG001
        raise SystemExit(128 + signum)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, unwind)


def _close_progress_bars() -> None:
    """End every live tqdm bar (prebake stages, engine prebake, render): a bar's last redraw ends
    in '\r', not a newline, so text printed after it would be glued onto the bar's line."""
    tqdm_std = sys.modules.get("tqdm.std")  # not imported: no bar was ever shown
    if tqdm_std is not None:
        for bar in list(tqdm_std.tqdm._instances):
            bar.close()


def _fail(msg: str) -> None:
    _close_progress_bars()
    typer.secho(f"error: {msg}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


#: What a user's mistake raises: ValueError covers PacketError (no such avatar), MediaError
#: (missing, corrupt or silent audio; an output that cannot be written), NoFaceError and bad
#: engine options; FileNotFoundError covers missing sources and missing model weights (the
#: engines' *WeightsMissing errors). Anything else is a bug and keeps its traceback.
USER_ERRORS = (ValueError, FileNotFoundError)


@contextmanager
def _user_errors() -> Iterator[None]:
    """Turn a user mistake inside the block into one `error: ...` line and exit status 2, the
    way every command reports it (not a traceback and exit status 1)."""
    try:
        yield
    except USER_ERRORS as e:
        _fail(str(e))


@app.command()
def prebake(
    source: str = typer.Argument(..., help="Presenter video loop or portrait photo (or builtin:astronaut)."),
    id: str = typer.Option(..., "--id", help="Avatar id (letters, digits, _ and -)."),
    size: Optional[str] = typer.Option(None, help="Output WxH, e.g. 1080x1920 (default: source size)."),
    fit: str = typer.Option("cover", help="cover: fill and crop; contain: fit inside with bars."),
    max_frames: int = typer.Option(750, help="Use at most this many frames of a video loop."),
    engines: str = typer.Option("", help="Also precompute engine tensors, e.g. musetalk,ditto."),
    weights: str = typer.Option("official", help="Weights for engine tensors: official or random."),
    replace: bool = typer.Option(False, "--replace", help="Rebuild the avatar if one of that id exists (else refused)."),
    models: Optional[Path] = ModelsOpt,
    avatars: Optional[Path] = AvatarsOpt,
) -> None:
    """Build an avatar packet (atomic, and nothing is left behind on failure; progress on stderr)."""
    _unwind_on_sigterm()
    from .avatar.prebake import prebake as run
    from .avatar.store import avatars_root, packet_dir
    from .builtin import builtin_image, is_builtin

    t0 = time.perf_counter()
    with _user_errors():
        if packet_dir(id, avatars).exists() and not replace:
            _fail(f"avatar {id!r} already exists under {avatars_root(avatars)}; pass --replace to rebuild it")
        src = builtin_image(source, avatars_root(avatars) / ".sources") if is_builtin(source) else Path(source)
        eng = [e.strip() for e in engines.split(",") if e.strip()]
        packet = run(src, id, root=avatars, size=_size(size), fit=fit, max_frames=max_frames, engines=eng, engine_kwargs={"weights": weights, "models": models})
    typer.echo(f"avatar {packet.id}: {packet.n_frames} frames {packet.size[0]}x{packet.size[1]} -> {packet.path} ({time.perf_counter() - t0:.1f} s)")


@avatar_app.command("info")
def avatar_info(ref: str, avatars: Optional[Path] = AvatarsOpt, as_json: bool = typer.Option(False, "--json")) -> None:
    """Print an avatar's geometry and stored arrays."""
    from .avatar.packet import PacketError
    from .avatar.store import resolve_avatar

    try:
        p = resolve_avatar(ref, avatars) if not Path(ref).is_file() else None
    except (PacketError, ValueError) as e:
        _fail(str(e))
    if p is None:
        _fail(f"{ref} is a media file, not an avatar; prebake it first")
    if as_json:
        typer.echo(json.dumps(p.manifest, indent=1))
        return
    m = p.meta
    roi = m.get("roi", {}).get("size")
    typer.echo(f"id        {p.id}\npath      {p.path}\nkind      {m.get('kind')} ({m.get('source', {}).get('name')})")
    typer.echo(f"frames    {p.n_frames} @ {p.fps:g} fps, {m.get('cycle')} loop\nsize      {p.size[0]}x{p.size[1]} ({m.get('colour', {}).get('layout')}, {m.get('colour', {}).get('matrix')} {m.get('colour', {}).get('range')})")
    typer.echo(f"roi       {roi[0]}x{roi[1]}" if roi else "roi       -")
    typer.echo(f"engines   {', '.join(sorted(p.manifest.get('engines', {}))) or '-'}")
    total = 0
    for name in p.names():
        s = p.specs[name]
        total += s.nbytes
        typer.echo(f"  {name:<28} {str(tuple(s.shape)):<24} {s.dtype:<5} {s.nbytes / 1e6:10.2f} MB")
    typer.echo(f"total     {total / 1e6:.1f} MB")


@avatar_app.command("verify")
def avatar_verify(ref: str, avatars: Optional[Path] = AvatarsOpt) -> None:
    """Check every file of a packet against its manifest checksums."""
    from .avatar.packet import PacketError
    from .avatar.store import resolve_avatar

    t0 = time.perf_counter()
    try:
        p = resolve_avatar(ref, avatars)
        p.verify()
    except (PacketError, ValueError) as e:
        _fail(str(e))
    typer.echo(f"avatar {p.id}: OK ({len(p.specs)} files, {sum(s.nbytes for s in p.specs.values()) / 1e6:.1f} MB, {time.perf_counter() - t0:.2f} s)")


@avatar_app.command("list")
def avatar_list(avatars: Optional[Path] = AvatarsOpt) -> None:
    """List the avatars under the avatars folder."""
    from .avatar.packet import PacketError, iter_packets, open_packet
    from .avatar.store import avatars_root

    root = avatars_root(avatars)
    found = False
    for d in iter_packets(root):
        found = True
        try:
            p = open_packet(d)
            typer.echo(f"{p.id:<24} {p.meta.get('kind'):<6} {p.n_frames:5d} frames {p.size[0]}x{p.size[1]}  engines: {', '.join(sorted(p.manifest.get('engines', {}))) or '-'}")
        except PacketError as e:
            typer.echo(f"{d.name:<24} BROKEN: {e}")
    if not found:
        typer.echo(f"no avatars under {root}")


TritonConvsOpt = typer.Option("off", help="MuseTalk/Ditto render convolutions on the Triton implicit-GEMM kernel: off "
                              "(cuDNN), half (per layer the fastest of Triton and cuDNN), fp8 (Hopper+, FP8 operands, input "
                              "scales per call), fp8-static (input scales fixed once on the built-in portrait) or mixed (fp8-static on "
                              "the convs where FP8 stays accurate, MuseTalk's full-resolution decoder block; half elsewhere); CUDA only.")
FirstFaceRowOpt = typer.Option("default", help="MuseTalk: the face rows its VAE decoder makes. default: auto on CUDA "
                               "with a compile mode, the whole face elsewhere; auto: rows 104-255, the rows the blend shows "
                               "(+25 % frames/s on an H100; an approximation, 36.9 dB over the blended pixels with seeded "
                               "weights), the whole face for an avatar whose blend reaches higher; 0: the whole face; R: rows "
                               "R-255, refusing an avatar whose blend reaches higher.")
StaticShapesOpt = typer.Option("default", help="MuseTalk with a compile --accel: which render batch sizes compile at "
                                "their own static size. default: largest on CUDA (batch 32: 639.7 instead of 590.8 "
                                "frames/s on an H100, ~50 s more compilation on a cold cache), none elsewhere; none: one "
                                "dynamic-batch compilation (quickest start); largest; all (six compilations).")
StrideOpt = typer.Option(1, help="Ditto stride mode: warp + decode every K-th frame only, the frames between "
                         "interpolated along the motion (stride-mode); 1 renders every frame. Faster by up to ~K on the "
                         "networks' share; costs image quality (benchmarks/RESULTS.md).")
StrideModeOpt = typer.Option("mask", help="How Ditto's stride mode makes the frames between keyframes: mask (warped by "
                             "the warp network's own motion mask), heatmap (keypoint heatmaps), blend (cross-fade) or "
                             "nearest (repeat the nearer keyframe).")
AccelOpt = typer.Option("auto", help="How neural networks run on CUDA: auto (render: cudagraph; serve: compile+cudagraph), "
                        "eager, cudagraph, compile, compile+cudagraph (about 2x faster; compiles ~1.5 min once, cached on disk).")


AvatarOpt = typer.Option(..., help="Avatar id, packet folder, source video/photo, or builtin:astronaut.")
AudioOpt = typer.Option(..., help="Speech file (wav/mp3/m4a/flac/...), or builtin:hello.")
EngineOpt = typer.Option("auto", help="classic, musetalk, ditto, or auto (first neural engine with weights, else classic).")
FpsOpt = typer.Option(25.0, help=f"Output frame rate, above 0 and at most {MAX_FPS}.")
DeviceOpt = typer.Option(None, help="cpu, cuda, cuda:1 ... (default: cuda if available).")
WeightsOpt = typer.Option("official", help="official (from --models) or random (seeded; benchmarks only).")
AllowSilenceOpt = typer.Option(False, "--allow-silence", help="Render audio without speech (a silent presenter) "
                               "instead of refusing it as the wrong file.")


def _load_speech(audio: str, allow_silence: bool) -> Audio:
    """The audio to render (a file or builtin:NAME). Audio without speech is refused, as the HTTP
    API refuses it, unless --allow-silence: a silent presenter is almost always the wrong file."""
    from .audio.speech import NoSpeechError, require_speech
    from .builtin import builtin_audio, is_builtin
    from .media.audio import load_audio

    path = builtin_audio(audio) if is_builtin(audio) else Path(audio)
    sound = load_audio(path)
    if not allow_silence:
        try:
            require_speech(sound, path)
        except NoSpeechError as e:
            raise NoSpeechError(path, f"{e.reason}; pass --allow-silence to render it anyway") from None
    return sound


def _check_stride(engine: str, models: Optional[Path], stride: int, stride_mode: str) -> None:
    """Refuse a stride the chosen engine cannot use before any work: a user asking for speed must
    not silently get every frame rendered."""
    from .engines.ditto.stride import check_stride
    from .engines.registry import default_engine

    check_stride(stride, stride_mode)
    name = default_engine(models) if engine == "auto" else engine
    if stride != 1 and name != "ditto":
        chosen = " (--engine auto chose it: no Ditto weights found)" if engine == "auto" else ""
        raise ValueError(f"--stride is Ditto's stride mode; the {name} engine{chosen} renders every frame")


def _engine(engine: str, device: torch.device, weights: str, models: Optional[Path], accel: str = "auto",
            triton_convs: str = "off", first_face_row: str = "default", static_shapes: str = "default",
            stride: int = 1, stride_mode: str = "mask"):
    """The engine the options name (raises ValueError / FileNotFoundError: run it in _user_errors)."""
    from .engines.registry import create_engine, default_engine, engine_options

    name = default_engine(models) if engine == "auto" else engine
    kw = engine_options(name, weights, models, accel, device, triton_convs=triton_convs, first_face_row=first_face_row,
                        static_shapes=static_shapes, stride=stride, stride_mode=stride_mode)
    eng = create_engine(name, device=device, **kw)
    if eng.random_weights:
        typer.secho("WARNING: rendering with SEEDED RANDOM WEIGHTS (benchmark mode); the video is marked and is not a real model's output.", fg=typer.colors.YELLOW, err=True)
    return eng


@app.command()
def render(
    avatar: str = AvatarOpt,
    audio: str = AudioOpt,
    output: Path = typer.Option(..., "-o", "--output", help="Output .mp4 (written atomically)."),
    engine: str = EngineOpt,
    fps: float = FpsOpt,
    size: Optional[str] = typer.Option(None, help="Output WxH when the avatar is prebaked on the fly."),
    device: Optional[str] = DeviceOpt,
    weights: str = WeightsOpt,
    models: Optional[Path] = ModelsOpt,
    avatars: Optional[Path] = AvatarsOpt,
    chunk: int = typer.Option(16, help="Frames per batch."),
    crf: int = typer.Option(18, help="H.264 quality (lower is better)."),
    preset: str = typer.Option("veryfast", help="x264 speed preset, ultrafast ... veryslow (faster = larger file at the "
                                                "same --crf; the benchmarks time ultrafast)."),
    encode_workers: int = typer.Option(0, help="Parallel x264 segment encoders (0 = auto: half the CPU cores, at most 8; "
                                              "1 = one encoder, smallest file)."),
    accel: str = AccelOpt,
    triton_convs: str = TritonConvsOpt,
    first_face_row: str = FirstFaceRowOpt,
    static_shapes: str = StaticShapesOpt,
    stride: int = StrideOpt,
    stride_mode: str = StrideModeOpt,
    allow_silence: bool = AllowSilenceOpt,
) -> None:
    """Render a lip-synced MP4 (H.264 + AAC) of the avatar speaking the audio."""
    _unwind_on_sigterm()
    from tqdm import tqdm

    from .avatar.store import resolve_avatar
    from .audio.source import frames_for_samples
    from .cpus import usable_cpus
    from .media.mp4_writer import X264_PRESETS, Mp4Writer
    from .stream import check_device, check_stream_options, stream_generator

    if preset not in X264_PRESETS:  # before the engine loads (minutes on a GPU)
        _fail(f"--preset must be one of {', '.join(X264_PRESETS)}, got {preset!r}")
    if output.is_dir():  # before minutes of rendering: the finished clip could not be moved there
        _fail(f"--output {output} is a folder; give a file name, e.g. {output / 'anchor.mp4'}")
    t0 = time.perf_counter()
    with _user_errors():
        rate = check_stream_options(fps, chunk, "nv12")
        _check_stride(engine, models, stride, stride_mode)
        dev = check_device(device)
        sound = _load_speech(audio, allow_silence)
        packet = resolve_avatar(avatar, avatars, size=_size(size))
        t_avatar = time.perf_counter()
        eng = _engine(engine, dev, weights, models, accel, triton_convs, first_face_row, static_shapes, stride, stride_mode)
        t_engine = time.perf_counter()
        w, h = packet.size
        total = frames_for_samples(sound.num_samples, sound.sample_rate, rate)  # what the stream will make
        n = 0
        first = None
        workers = encode_workers or max(1, min(8, usable_cpus() // 2))
        with Mp4Writer(output, w, h, fps, audio=sound, crf=crf, preset=preset, pixel_input="nv12", workers=workers) as writer:
            bar = tqdm(total=total, unit="f", desc=f"render {eng.name}", file=sys.stderr)
            t_start = time.perf_counter()
            for ch in stream_generator(eng, packet, sound, fps=fps, chunk_frames=chunk, output="nv12"):
                if first is None:
                    first = time.perf_counter() - t_start
                writer.write(ch["frames"], owned=True)  # fresh per chunk
                n += ch["num_frames"]
                bar.update(ch["num_frames"])
            bar.close()
            t_render = time.perf_counter() - t_start
    t_all = time.perf_counter() - t0
    typer.echo(
        f"wrote {output}: {n} frames {w}x{h} @ {fps:g} fps, {sound.duration_s:.2f} s audio | engine {eng.name}"
        f"{f' (stride {eng.stride}, {eng.stride_mode})' if getattr(eng, 'stride', 1) > 1 else ''} on {eng.device} | "
        f"avatar {t_avatar - t0:.2f} s, engine load {t_engine - t_avatar:.2f} s, first frame {first * 1000 if first else 0:.0f} ms, "
        f"render+encode {t_render:.2f} s ({n / max(t_render, 1e-9):.1f} fps), total {t_all:.2f} s"
    )


@app.command()
def stream(
    avatar: str = AvatarOpt,
    audio: str = AudioOpt,
    engine: str = EngineOpt,
    fps: float = FpsOpt,
    chunk: int = typer.Option(8, help="Frames per chunk: smaller chunks come out sooner, larger ones render faster."),
    device: Optional[str] = DeviceOpt,
    weights: str = WeightsOpt,
    models: Optional[Path] = ModelsOpt,
    avatars: Optional[Path] = AvatarsOpt,
    live: bool = typer.Option(False, help="Feed the audio in real time (20 ms chunks) like a live source."),
    output: str = typer.Option("nv12", help="Frame format the generator yields: nv12 or rgb."),
    accel: str = AccelOpt,
    triton_convs: str = TritonConvsOpt,
    first_face_row: str = FirstFaceRowOpt,
    static_shapes: str = StaticShapesOpt,
    stride: int = StrideOpt,
    stride_mode: str = StrideModeOpt,
    allow_silence: bool = AllowSilenceOpt,
) -> None:
    """Run the streaming generator and print per-chunk timing (time to first frame, fps)."""
    _unwind_on_sigterm()
    from .avatar.store import resolve_avatar
    from .stream import check_device, check_stream_options, stream_generator

    with _user_errors():
        check_stream_options(fps, chunk, output)
        _check_stride(engine, models, stride, stride_mode)
        dev = check_device(device)
        sound = _load_speech(audio, allow_silence)
        packet = resolve_avatar(avatar, avatars)
        eng = _engine(engine, dev, weights, models, accel, triton_convs, first_face_row, static_shapes, stride, stride_mode)
        src = _paced(sound) if live else sound
        t0 = time.perf_counter()
        n = 0
        for ch in stream_generator(eng, packet, src, fps=fps, chunk_frames=chunk, output=output):
            now = time.perf_counter() - t0
            n += ch["num_frames"]
            tag = "first" if ch["chunk_idx"] == 0 else ""
            typer.echo(f"chunk {ch['chunk_idx']:4d} frames {ch['frame_start']:5d}+{ch['num_frames']:<3d} t={now * 1000:8.1f} ms  {n / now:7.1f} fps {tag}")
    typer.echo(f"{n} frames in {time.perf_counter() - t0:.2f} s")


def _paced(sound: Audio) -> Iterator[Audio]:
    """`sound` in 20 ms pieces, each handed over when it would arrive from a live source."""
    import numpy as np

    from .media.audio import Audio

    step = sound.sample_rate // 50
    t = time.perf_counter()
    for i in range(0, sound.samples.shape[1], step):
        delay = t + i / sound.sample_rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        yield Audio(np.ascontiguousarray(sound.samples[:, i : i + step]), sound.sample_rate, finite_checked=True)


@weights_app.command("check")
def weights_check(models: Optional[Path] = ModelsOpt) -> None:
    """Say which official weight files are present or missing; exit status 1 when any is missing (for scripts)."""
    from .weights.catalog import check_all

    ok = check_all(models, echo=typer.echo)
    raise typer.Exit(0 if ok else 1)


@weights_app.command("fetch")
def weights_fetch(engine: str = typer.Argument(..., help="musetalk or ditto"), models: Optional[Path] = ModelsOpt) -> None:
    """Download exactly the official files an engine needs (huggingface_hub)."""
    from .weights.catalog import fetch

    try:
        fetch(engine, models, echo=typer.echo)
    except (RuntimeError, ValueError) as e:
        _fail(str(e))


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1"),
    port: int = typer.Option(8000, min=1, max=65535, help="TCP port to listen on (1-65535)."),
    engine: str = typer.Option("auto", help="Default engine for sessions and jobs."),
    device: Optional[str] = typer.Option(None),
    weights: str = typer.Option("official"),
    models: Optional[Path] = ModelsOpt,
    avatars: Optional[Path] = AvatarsOpt,
    max_sessions: int = typer.Option(8, help="Live sessions at once; more are refused (503, Retry-After)."),
    max_render_fps: Optional[str] = typer.Option(None, help="Frames/s this GPU renders, for all engines (420) or per "
                                                 "engine (musetalk=420,ditto=240): sessions that would not fit are "
                                                 "refused (503, Retry-After) instead of making every session late."),
    fps: float = typer.Option(25.0, help=f"Frame rate of live sessions whose client names none (at most {MAX_FPS})."),
    clips: Optional[Path] = typer.Option(None, help="Folder for rendered clips (default clips/ beside the avatars, or $NEWSSTUDIO_CLIPS)."),
    max_upload_mb: int = typer.Option(200, help="Largest accepted upload (audio or avatar source), MB."),
    accel: str = AccelOpt,
    triton_convs: str = TritonConvsOpt,
    first_face_row: str = FirstFaceRowOpt,
    static_shapes: str = StaticShapesOpt,
    render_ahead: int = typer.Option(4, min=1, help="Frames a live session renders per request: more means larger shared "
                                     "GPU batches (more streams per GPU); pair it with --prebuffer-ms >= frames / fps."),
    prebuffer_ms: float = typer.Option(120.0, min=0.0, help="Streamed speech goes on air once this much is ready (live latency)."),
    render_lead_ms: float = typer.Option(0.0, min=0.0, help="WebSocket chunks are rendered this long before they are "
                                         "due and sent when due, so a busy GPU's render time does not reach clients "
                                         "as jitter (adds as much latency; 150 with --render-ahead 8 --prebuffer-ms "
                                         "270 kept 8 Ditto streams at 30 fps on time on an H200)."),
    speech_push_interval_ms: float = typer.Option(0.0, min=0.0, help="Streamed speech is pushed into a session at most "
                                                  "this often, what arrived meanwhile at once (fewer event-loop round "
                                                  "trips; speech reaches the engine up to this much later; 0: at once)."),
    render_in_flight: int = typer.Option(2, min=0, help="Shared render batches on the GPU at once "
                                         "(0: no bound); a bound makes batches form at the GPU's pace."),
    front_end_streams: bool = typer.Option(True, "--front-end-streams/--no-front-end-streams",
                                           help="Run the shared audio-encoder and LMDM batchers on CUDA streams of "
                                           "their own (8 of 8 Ditto sessions on time with them on an H200; see "
                                           "benchmarks/RESULTS.md)."),
    front_end_tf32: bool = typer.Option(True, "--front-end-tf32/--no-front-end-tf32",
                                        help="Ditto: capture the HuBERT and LMDM graphs with TF32 matmuls (H200: dense "
                                        "280 -> 304 fps, first frame 55 -> 38 ms, ~9e-4 relative error of those "
                                        "networks vs float32)."),
    compose: str = typer.Option("stream", help="Where live sessions splice their frames and start the copy-out on "
                                "CUDA: stream (a high-priority side stream), session (the shared stream) or worker "
                                "(the render batcher's thread)."),
    spread_render_phases: bool = typer.Option(True, "--spread-render-phases/--no-spread-render-phases",
                                              help="Give each live session its own render phase so sessions that "
                                              "start together do not ask for frames together (many streams per GPU)."),
    fill_render_batches: bool = typer.Option(False, "--fill-render-batches/--no-fill-render-batches",
                                             help="Under load, split a live render request to fill the shared batch "
                                             "up to the CUDA-graph bucket it runs as (its other frames come one batch "
                                             "later): part of the 16-stream settings (benchmarks/RESULTS.md)."),
    batch_graphs: Optional[bool] = typer.Option(
        None, "--batch-graphs/--no-batch-graphs",
        help="MuseTalk: render one-avatar batches through CUDA graphs of their own (the same bytes in ~10 torch "
        "calls instead of ~50). Default: on where the engine replays CUDA graphs (CUDA with a graph --accel)."),
    gc_freeze: bool = typer.Option(True, "--gc-freeze/--no-gc-freeze",
                                   help="Freeze the objects alive after each engine's warm-up so Python's full garbage "
                                   "collections (which stop every session) no longer walk them."),
    compose_graphs: Optional[bool] = typer.Option(
        None, "--compose-graphs/--no-compose-graphs",
        help="Live sessions splice and copy out their frames through CUDA graphs of their own (the same bytes in "
        "~7 torch calls instead of ~36). Default: on where the engine replays CUDA graphs."),
    musetalk_feature_step_ms: Optional[int] = typer.Option(
        None, help="How often a live MuseTalk stream re-encodes its speech (multiple of 20 ms; default 100). 200 "
        "halves the Whisper runs at up to 100 ms more wait for features: the 16- and 20-stream H100 runs' setting."),
    ditto_stride: int = typer.Option(1, help="Ditto sessions and jobs in stride mode: warp + decode every K-th "
                                     "frame, the frames between interpolated (a live session holds up to K - 1 "
                                     "frames back); 1 renders every frame."),
    ditto_stride_mode: str = typer.Option("mask", help="Ditto stride mode's in-between frames: mask, heatmap, blend "
                                          "or nearest (see render --help)."),
    compile_artifacts: Optional[Path] = typer.Option(
        None, help="A file of compiled kernels: loaded before the engines compile (if it exists), written once they "
        "are warm, so the next server on a fresh machine skips most of its compile. Load only files your servers wrote."),
) -> None:
    """Start the HTTP/WebSocket/WebRTC server with the web page at /."""
    from .accel.static import check_static_shapes
    from .engines.batching import check_compose
    from .engines.ditto.stride import check_stride
    from .engines.musetalk.frame_queues import feature_step_rows
    from .engines.registry import ENGINES, check_triton_convs
    from .frame_rate import check_frame_rate
    from .render_budget import RenderBudget
    from .server.state import ServerConfig
    from .stream import check_device

    try:
        check_frame_rate(fps)  # every session's rate unless a client asks for another
        needed_ms = 1000 * render_ahead / fps
        if render_ahead > ServerConfig.render_ahead and prebuffer_ms < needed_ms:  # raised for density, not paired
            typer.secho(f"warning: --render-ahead {render_ahead} at {fps:g} fps wants --prebuffer-ms >= {needed_ms:.0f} "
                        f"(a live request renders only frames whose speech has arrived: with {prebuffer_ms:g} ms its "
                        "requests come up short, so GPU batches are smaller and fewer streams fit)",
                        fg=typer.colors.YELLOW, err=True)
        check_device(device)  # before any engine loads
        check_compose(compose)
        check_triton_convs(triton_convs)
        check_static_shapes(static_shapes)
        if musetalk_feature_step_ms is not None:
            feature_step_rows(musetalk_feature_step_ms)
        if max_render_fps is not None:
            RenderBudget.parse(max_render_fps, ENGINES)
    except ValueError as e:
        _fail(f"--{e}")
    try:
        check_stride(ditto_stride, ditto_stride_mode)
    except ValueError as e:
        _fail(f"--ditto-{e}")
    import uvicorn

    from .server.app import create_app
    from .server.serve import uvicorn_config

    cfg = ServerConfig(engine=engine, device=device, weights=weights, models=models, avatars=avatars, max_sessions=max_sessions,
                       fps=fps, clips=clips, max_upload_bytes=max_upload_mb << 20, accel=accel,
                       render_ahead=render_ahead, prebuffer_s=prebuffer_ms / 1000, front_end_streams=front_end_streams,
                       front_end_tf32=front_end_tf32, triton_convs=triton_convs,
                       render_in_flight=render_in_flight, render_lead_s=render_lead_ms / 1000, compose=compose,
                       speech_push_interval_s=speech_push_interval_ms / 1000, spread_render_phases=spread_render_phases, max_render_fps=max_render_fps,
                       fill_render_batches=fill_render_batches, first_face_row=first_face_row, static_shapes=static_shapes,
                       musetalk_feature_step_ms=musetalk_feature_step_ms, batch_graphs=batch_graphs,
                       compose_graphs=compose_graphs, gc_freeze=gc_freeze, compile_artifacts=compile_artifacts,
                       ditto_stride=ditto_stride, ditto_stride_mode=ditto_stride_mode)
    uvicorn.Server(uvicorn_config(create_app(cfg), host=host, port=port, log_level="info")).run()


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
