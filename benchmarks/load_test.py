"""Load test: N concurrent WebSocket live sessions on loopback for a fixed time.

Each client opens a session over /ws, streams speech into it in real time (20 ms PCM
messages, looping the clip, so every session is speaking and rendering lip-sync all the
time) and reads the chunks. A session counts as *sustained* when it received at least 97%
of the frames the media clock owes it and its chunks arrived on time for a client with a
playout buffer of --playout-ms (default 100 ms, at least one chunk): the 95th percentile of its
chunks' lateness, measured from the stream's own steady delay (its 5th-percentile lateness, so
one early first chunk does not set the clock), stays under the buffer. A server that falls
behind shows lateness growing over the level and fails this. The table also shows errors,
raw lateness against the first chunk, the server's frames/s, and the
server's memory before, at peak, and after every session closed (RSS, and CUDA memory when
the server has a GPU). A session that spoke in less than --min-speaking of its frames is not
sustained whatever its timing: idle frames cost the server little, so a broken speech path
(a stalled batcher on an H200, tenth session) must not read as a server keeping up.

    python -m benchmarks.load_test --sessions 1,2,4,8 --duration 15 --size 256
    python -m benchmarks.load_test --url http://host:8000 --avatar anchor --sessions 16
    python -m benchmarks.load_test --engine musetalk --weights random --fps 30 --size 1080 --sessions 4,8,16,24

Without --url it starts its own server in this process (uvicorn on a free loopback port)
with a prebaked astronaut avatar of --size.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from newsstudio.render_budget import FULL as REFUSED

from .gil_probe import GilProbe
from .host_speed import host_speed
from .thread_cpu import own_threads_cpu

ROOT = Path(__file__).resolve().parents[1]


def start_server(args) -> tuple[str, object, object, object]:
    import uvicorn
    from PIL import Image
    from skimage import data

    from newsstudio.server.app import ServerConfig, create_app
    from newsstudio.server.serve import uvicorn_config

    from .common import avatar

    d = Path(tempfile.mkdtemp(prefix="ns-load-"))
    Image.fromarray(data.astronaut()).save(d / "astronaut.png")
    # landmarks carried as .carry/astronaut.faces.npz where no detector can be installed (GPU machines)
    avatar(d / "astronaut.png", args.avatar, (args.size, args.size), d / "avatars")
    defaults = {"front_end_streams": args.front_end_streams[0]} if args.front_end_streams else {}
    if args.prebuffer_ms is not None:  # the base; --render-aheads raise it to cover a request's frames
        defaults["prebuffer_s"] = args.prebuffer_ms / 1e3
    if args.front_end_tf32 is not None:  # absent: the server's default for both
        defaults["front_end_tf32"] = args.front_end_tf32
    if args.max_render_fps is not None:
        defaults["max_render_fps"] = args.max_render_fps
    if args.triton_convs != "off":
        defaults["triton_convs"] = args.triton_convs
    if args.first_face_row is not None:
        defaults["first_face_row"] = args.first_face_row
    if args.compile_artifacts is not None:
        defaults["compile_artifacts"] = Path(args.compile_artifacts)
    if args.ditto_stride > 1:  # Ditto sessions in stride mode (the server's --ditto-stride)
        defaults.update(ditto_stride=args.ditto_stride, ditto_stride_mode=args.ditto_stride_mode)
    cfg = ServerConfig(engine=args.engine, device=args.device, avatars=d / "avatars", clips=d / "clips",
                       max_sessions=max(args.sessions) + 2, weights=args.weights, fps=args.fps, accel=args.accel,
                       batch_sessions=not args.no_batch, **defaults)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    app = create_app(cfg)
    server = uvicorn.Server(uvicorn_config(app, log_level="warning"))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{sock.getsockname()[1]}", server, cfg, app.state.ns


def on_off_list(spec: str | None, flag: str = "--front-end-streams") -> list[bool]:
    """An on/off flag (``--front-end-streams``, ``--send-on-clock``): absent -> [], "on" -> [True],
    "off,on" -> [False, True]; `flag` names it in the error."""
    words = spec.split(",") if spec else []
    bad = [w for w in words if w not in ("on", "off")]
    if bad:
        raise SystemExit(f"{flag} takes on, off or a comma-separated list of them, got {bad[0]!r}")
    return [w == "on" for w in words]


def compose_list(spec: str | None) -> list[str]:
    """``--compose``: absent -> [], else the modes named (checked before a server starts)."""
    from newsstudio.engines.batching import COMPOSE_MODES

    modes = spec.split(",") if spec else []
    bad = [m for m in modes if m not in COMPOSE_MODES]
    if bad:
        raise SystemExit(f"--compose takes {', '.join(COMPOSE_MODES)} or a comma-separated list of them, got {bad[0]!r}")
    return modes


def check_ditto_stride(args) -> None:
    """``--ditto-stride``: checked before a server starts, and only with Ditto sessions (another engine
    would ignore it and the level would read as a stride figure)."""
    from newsstudio.engines.ditto.stride import check_stride

    try:
        check_stride(args.ditto_stride, args.ditto_stride_mode)
    except ValueError as e:
        raise SystemExit(f"--ditto-stride: {e}") from None
    if args.ditto_stride > 1 and (args.engine != "ditto" or args.url):
        raise SystemExit("--ditto-stride needs --engine ditto and a server started here (not --url)")


def format_list(spec: str) -> list[str]:
    """``--format``: the stream formats to sweep, in order (checked before a server starts)."""
    from newsstudio.server.ws import STREAM_FORMATS

    formats = spec.split(",")
    bad = [f for f in formats if f not in STREAM_FORMATS]
    if bad:
        raise SystemExit(f"--format takes {', '.join(STREAM_FORMATS)} or a comma-separated list of them, got {bad[0]!r}")
    return formats


def server_settings(args, cfg, state) -> list[tuple[str, Callable[[], None]]]:
    """Every combination of the swept server settings, as (label, apply): each session count runs
    once under each. Settings other than the switch interval need the server started here."""
    def values(spec: str | None, kind: Callable, local: bool = True) -> list:
        return [kind(x) for x in spec.split(",")] if spec and (cfg is not None or not local) else [None]

    # one --front-end-streams value is the server's start setting; a list is swept on the running server
    front_end = args.front_end_streams if len(args.front_end_streams) > 1 and cfg is not None else [None]
    base_prebuffer = getattr(cfg, "prebuffer_s", 0.0)
    out = []
    on_clock = args.send_on_clock if cfg is not None and args.send_on_clock else [None]
    spread = args.spread_render_phases if cfg is not None and args.spread_render_phases else [None]
    fill = args.fill_render_batches if cfg is not None and args.fill_render_batches else [None]
    graphs = args.batch_graphs if cfg is not None and args.batch_graphs else [None]
    composed = args.compose_graphs if cfg is not None and args.compose_graphs else [None]
    frozen = args.gc_freeze if cfg is not None and args.gc_freeze else [None]
    socket_writes = args.ws_socket_writes if cfg is not None and args.ws_socket_writes else [None]
    compose = args.compose if cfg is not None and args.compose else [None]
    formats = args.formats if len(getattr(args, "formats", [])) > 1 else [None]  # the clients' choice: any server
    for si, lead, paced, ahead, in_flight, own, rows, mode, fmt, phases, filled, graphed, cgraphed, freeze, spaced, direct in itertools.product(
            values(args.switch_intervals, float, local=False), values(args.render_leads, float), on_clock,
            values(args.render_aheads, int), values(args.render_in_flight, int), front_end,
            values(args.live_update_rows, int), compose, formats, spread, fill, graphs, composed, frozen,
            values(args.speech_push_intervals_ms, float), socket_writes):
        def apply(si=si, lead=lead, paced=paced, ahead=ahead, in_flight=in_flight, own=own, rows=rows,
                  mode=mode, fmt=fmt, phases=phases, filled=filled, graphed=graphed, cgraphed=cgraphed,
                  freeze=freeze, spaced=spaced, direct=direct) -> None:
            if direct is not None:  # read as each new WebSocket session opens
                cfg.ws_socket_writes = direct
            if spaced is not None:  # read as each new session's speech intake is made
                cfg.speech_push_interval_s = spaced / 1000
            if freeze is not None:  # freeze what is alive now, or unfreeze it
                cfg.gc_freeze = freeze
                state.engines.set_gc_freeze(freeze)
            if cgraphed is not None:  # the sessions' next requests
                state.engines.set_compose_graphs(cgraphed)
            if graphed is not None:  # the loaded engines' next batches (the engine is loaded before the first level)
                state.engines.set_batch_graphs(graphed)
            if filled is not None:  # the render batchers' next batches
                cfg.fill_render_batches = filled
                state.engines.set_fill_render_batches(filled)
            if phases is not None:
                cfg.spread_render_phases = phases  # read as each new session opens
            if fmt is not None:
                args.format = fmt  # what the next level's clients ask for
            if si is not None:
                sys.setswitchinterval(si)  # the server's GIL hand-off (it runs in this process)
            if lead is not None:
                cfg.render_lead_s = lead  # read by each new session (prebuffer) and its WebSocket pump
            if paced is not None:
                cfg.send_on_clock = paced  # read by each new WebSocket session
            if ahead is not None:  # read by each new session; a request renders only frames whose speech is in
                cfg.render_ahead = ahead
                cfg.prebuffer_s = max(base_prebuffer, ahead / args.fps)
            if in_flight is not None:
                cfg.render_in_flight = in_flight
                state.engines.set_render_in_flight(in_flight)
            if own is not None:
                cfg.front_end_streams = own
                state.engines.set_front_end_streams(own)
            if mode is not None:  # the render batcher's mode, read at each render
                cfg.compose = mode
                state.engines.set_compose(mode)
            if rows is not None:  # read by each new MuseTalk conditioner (one per utterance)
                from newsstudio.engines.musetalk import frame_queues as musetalk_queues

                musetalk_queues.LIVE_UPDATE_ROWS = rows

        label = ", ".join(part for part in (
            f"switch interval {(si if si is not None else sys.getswitchinterval()) * 1e3:g} ms",
            None if lead is None else f"render lead {lead * 1e3:g} ms",
            None if paced is None else f"sent {'on the clock' if paced else 'when ready'}",
            None if ahead is None else f"render ahead {ahead} frames",
            None if in_flight is None else f"render batches in flight {in_flight or 'unbounded'}",
            None if own is None else f"front-end streams {'on' if own else 'off'}",
            None if rows is None else f"MuseTalk features every {rows * 20} ms",
            None if mode is None else f"compose: {mode}",
            None if fmt is None else f"{fmt} chunks",
            None if phases is None else f"render phases {'spread' if phases else 'as started'}",
            None if filled is None else f"render batches {'filled to their buckets' if filled else 'as queued'}",
            None if graphed is None else f"one-avatar batches {'by batch graphs' if graphed else 'by the general path'}",
            None if cgraphed is None else f"sessions compose {'through their graphs' if cgraphed else 'directly'}",
            None if freeze is None else f"warm objects {'frozen out of' if freeze else 'walked by'} garbage collections",
            None if spaced is None else f"speech pushed {f'every {spaced:g} ms at most' if spaced else 'as it comes'}",
            None if direct is None else f"chunks {'written to the socket without the GIL' if direct else 'through the transport'}") if part)
        out.append((label, apply))
    return out


def live_update_rows() -> int | None:
    """MuseTalk's live feature step in force in this process (None where MuseTalk cannot load)."""
    try:
        from newsstudio.engines.musetalk import frame_queues as musetalk_queues
    except ImportError:
        return None
    return musetalk_queues.LIVE_UPDATE_ROWS


def load_speech(path: str | None) -> tuple[np.ndarray, int]:
    from newsstudio.builtin import builtin_audio
    from newsstudio.media.audio import load_audio

    a = load_audio(path or builtin_audio("builtin:hello")).mono().resampled(16000)
    return np.clip(np.rint(a.samples[0] * 32767), -32768, 32767).astype("<i2"), 16000


def start_delays(n: int, stagger_s: float) -> list[float]:
    """When each of a level's ``n`` sessions connects: all at once (0), or spread evenly over
    ``stagger_s`` as sessions arriving one by one would be."""
    return [i * stagger_s / n for i in range(n)]


async def client(url: str, args, pcm: np.ndarray, sr: int, stats: dict, stop: asyncio.Event, delay: float = 0.0) -> None:
    from websockets.asyncio.client import connect

    await asyncio.sleep(delay)

    ws_url = url.replace("http", "ws", 1) + "/ws"
    st = stats
    try:
        async with connect(ws_url, max_size=None, open_timeout=30) as ws:
            await ws.send(json.dumps({"type": "start", "avatar": args.avatar, "engine": args.engine, "format": args.format, "chunk_frames": args.chunk_frames, "sample_rate": sr}))
            started = json.loads(await ws.recv())
            if started.get("type") != "started":
                st["errors"].append(started.get("message", str(started)))
                return
            fps = started["fps"]

            async def feed() -> None:
                step = sr // 50
                t0 = time.monotonic()
                i = 0
                while not stop.is_set():
                    a = (i * step) % max(1, pcm.size - step)
                    await ws.send(pcm[a : a + step].tobytes())
                    i += 1
                    delay = t0 + i * 0.02 - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)

            feeder = asyncio.ensure_future(feed())
            first = None
            try:
                while not stop.is_set():
                    try:
                        msg = await asyncio.wait_for(ws.recv(), timeout=5)
                    except asyncio.TimeoutError:
                        st["errors"].append("no chunk for 5 s")
                        break
                    if isinstance(msg, str):
                        continue
                    now = time.monotonic()
                    (n,) = struct.unpack(">I", msg[:4])
                    h = json.loads(msg[4 : 4 + n])
                    if first is None:
                        first = (now, h["frame_start"])
                    due = first[0] + (h["frame_start"] - first[1]) / fps
                    st["late"].append(now - due)
                    st["frames"] += h["num_frames"]
                    st["speaking"] += h["num_frames"] if h["state"] == "speaking" else 0
                    st["span"] = (now - first[0]) + h["num_frames"] / fps
            finally:
                feeder.cancel()
                st["expected"] = st.get("span", 0) * fps
            await ws.send(json.dumps({"type": "close"}))
    except Exception as e:  # noqa: BLE001 - counted, the run goes on
        st["errors"].append(f"{type(e).__name__}: {e}")


def watch_syncs() -> dict[tuple, tuple[str, str, int]]:
    """Make every synchronising CUDA call in this process (the server's threads) warn, and
    collect the distinct call sites: {stack key: (thread, stack text, count)}. For finding
    what makes live sessions wait on the device; costs a warning per sync while on."""
    import traceback
    import warnings

    import torch

    sites: dict[tuple, tuple[str, str, int]] = {}
    lock = threading.Lock()

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if "synchroniz" not in str(message):
            return
        stack = [f for f in traceback.extract_stack()[:-2] if "/warnings.py" not in f.filename]
        key = tuple((f.filename, f.lineno) for f in stack[-5:])
        with lock:
            name, text, n = sites.get(key) or (threading.current_thread().name, "".join(traceback.format_list(stack[-7:])), 0)
            sites[key] = (name, text, n + 1)

    warnings.showwarning = show
    warnings.simplefilter("always")
    if torch.cuda.is_available():
        torch.cuda.set_sync_debug_mode(1)
    return sites


def _new_stats() -> dict:
    return {"frames": 0, "speaking": 0, "late": [], "errors": []}


def client_group(url: str, n: int, args_dict: dict, pcm: np.ndarray, sr: int, duration: float,
                 delays: list[float] | None = None) -> list[dict]:
    """`n` clients for `duration` seconds in this process (run in a child process by --client-processes,
    so receiving and parsing the clients' frames does not take CPU from a server started here)."""
    args = argparse.Namespace(**args_dict)

    async def main() -> list[dict]:
        stop = asyncio.Event()
        stats = [_new_stats() for _ in range(n)]
        tasks = [asyncio.ensure_future(client(url, args, pcm, sr, s, stop, d)) for s, d in zip(stats, delays or [0.0] * n)]
        await asyncio.sleep(duration)
        stop.set()
        await asyncio.gather(*tasks)
        return stats

    return asyncio.run(main())


class ClientPool:
    """The child processes that run the clients (--client-processes), started once per run and warmed.

    Why: spawned children import this module (numpy, httpx, newsstudio) before their first client
    connects; pools spawned per level made every level's first seconds count 0 frames/s while they
    started (4 children on a busy H100 machine, twenty-sixth session)."""

    def __init__(self, processes: int) -> None:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        self.processes = processes
        # spawned: no copy of this process's threads or GPU state
        self.executor = ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn"))
        pids: set[int] = set()
        for _ in range(10):  # the executor starts workers as tasks queue up: overlap the tasks until all run
            pids |= {f.result() for f in [self.executor.submit(_child_ready, 0.3) for _ in range(processes)]}
            if len(pids) >= processes:
                break

    def close(self) -> None:
        self.executor.shutdown()


def _child_ready(hold_s: float) -> int:
    time.sleep(hold_s)
    return os.getpid()


def _cpu_shares(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """Cores each thread group used over a level (1.0 = one core busy all the time), busiest first."""
    shares = {k: (v - before.get(k, 0.0)) / max(seconds, 1e-9) for k, v in after.items()}
    return {k: round(v, 3) for k, v in sorted(shares.items(), key=lambda kv: -kv[1]) if v > 0.005}


def gpu_allocated(metrics: dict) -> int:
    """CUDA memory allocated on all the server's GPUs, from a /metrics snapshot (0 without CUDA)."""
    return sum(g["allocated_bytes"] for g in (metrics["gpu"] or []))


async def run_level(url: str, n: int, args, pcm, sr, clients: ClientPool | None = None) -> dict:
    stop = asyncio.Event()
    stats = [_new_stats() for _ in range(n)]
    groups = min(clients.processes, n) if clients is not None else 1
    delays = start_delays(n, getattr(args, "stagger_s", 0.0))
    async with httpx.AsyncClient(base_url=url, timeout=30) as c:
        before = (await c.get("/metrics")).json()
        if groups > 1:
            loop = asyncio.get_running_loop()
            sizes = [n // groups + (1 if k < n % groups else 0) for k in range(groups)]
            firsts = [sum(sizes[:k]) for k in range(groups)]
            tasks = [loop.run_in_executor(clients.executor, client_group, url, m, vars(args), pcm, sr, args.duration,
                                          delays[f:f + m]) for m, f in zip(sizes, firsts)]
        else:
            tasks = [asyncio.ensure_future(client(url, args, pcm, sr, s, stop, d)) for s, d in zip(stats, delays)]
        peak_rss, peak_gpu, fps_seen, lag_p95, lag_max = before["rss_bytes"] or 0, 0, [], [], 0.0
        memory_seen, work_seen = [], []  # once a second beside the frame rate: what grew when, if the rate sagged
        live: list[dict] = []  # the sessions' own figures, last sample of the level
        t_end = time.monotonic() + args.duration
        probe = GilProbe() if args.url is None else None  # the server runs in this process: its GIL's queue
        cpu_before = own_threads_cpu() if probe is not None else None  # and its threads' CPU
        if probe is not None:
            probe.__enter__()
        timeline = None
        if args.profile_s and args.url is None:  # the server runs in this process: profile its GPU and threads
            from .gpu_timeline import profile_window

            async def profiled() -> dict:
                await asyncio.sleep(max(0.0, (args.duration - args.profile_s) / 2))  # mid-level, sessions warm
                return await asyncio.to_thread(profile_window, args.profile_s)

            timeline = asyncio.ensure_future(profiled())
        while time.monotonic() < t_end:
            await asyncio.sleep(1.0)
            m = (await c.get("/metrics")).json()
            peak_rss = max(peak_rss, m["rss_bytes"] or 0)
            allocated = gpu_allocated(m)
            peak_gpu = max(peak_gpu, allocated)
            fps_seen.append(m["fps"])
            memory_seen.append([round((m["rss_bytes"] or 0) / 1e6), round(allocated / 1e6)])
            work = m.get("compile_work")
            if work:
                work_seen.append([work["graph_captures"], work["compiled_frames"]])
            lag = m.get("event_loop_lag") or {}
            lag_p95.append(lag.get("p95_ms", 0.0))
            lag_max = max(lag_max, lag.get("max_ms", 0.0))
            live = m.get("sessions") or live
        if probe is not None:
            probe.__exit__(None, None, None)
        thread_cpu = _cpu_shares(cpu_before, own_threads_cpu(), args.duration) if cpu_before is not None else None
        stop.set()
        results = await asyncio.gather(*tasks)
        profile = await timeline if timeline is not None else None
        if groups > 1:
            stats = [s for group in results for s in group]
        for _ in range(100):
            after = (await c.get("/metrics")).json()
            if after["active_sessions"] == 0:
                break
            await asyncio.sleep(0.1)
    buffer_s = max(args.chunk_frames / args.fps, args.playout_ms / 1000)
    sustained = 0
    lates, jitters = [], []
    rates = []
    refused, admitted = [], []  # turned away by --max-render-fps, or served
    for s in stats:
        (refused if any(REFUSED in e for e in s["errors"]) else admitted).append(s)
    for s in admitted:
        late = np.array(s["late"][5:] or [0.0])
        jitter = late - np.percentile(late, 5)
        lates.extend(late.tolist())
        jitters.extend(jitter.tolist())
        got = s["frames"] / max(1.0, s.get("expected", 1.0))
        rates.append(s["frames"] / max(1e-9, s.get("span", 1e-9)))
        spoke = s["speaking"] / max(1, s["frames"])
        if not s["errors"] and got >= 0.97 and np.percentile(jitter, 95) < buffer_s and spoke >= args.min_speaking:
            sustained += 1
    lat = np.array(lates or [0.0])
    # the shared batchers over this level: how big the render batches were, how long render requests
    # queued, and how busy each batcher's thread was (render; the streams' audio encoders; Ditto's LMDM)
    rb_before, rb_after = before.get("render_batching") or {}, after.get("render_batching") or {}

    def delta(stage: str | None) -> dict[str, float]:
        names = [e for e in rb_after if (e.split("/", 1)[1] if "/" in e else None) == stage]
        keys = ("requests", "batches", "frames", "wait_s_total", "busy_s_total", "bucket_frames", "split_requests")
        return {k: sum(rb_after[e].get(k, 0) - rb_before.get(e, {}).get(k, 0) for e in names) for k in keys} if names else {}

    d, audio, motion = delta(None), delta("audio"), delta("motion")
    renders = sum(s.get("renders", 0) for s in live)

    def per_render(key: str) -> float:  # over every session's render calls so far
        return sum(s.get(key, 0.0) * s.get("renders", 0) for s in live) / renders if renders else 0.0

    batching = {
        "batch_frames_mean": d["frames"] / d["batches"] if d.get("batches") else 0.0,
        "requests_per_batch": d["requests"] / d["batches"] if d.get("batches") else 0.0,
        "request_frames_mean": d["frames"] / d["requests"] if d.get("requests") else 0.0,
        # frames rendered / frames the batches ran as (their buckets): 1.0 = no padding (0 where unknown)
        "bucket_fill": d["frames"] / d["bucket_frames"] if d.get("bucket_frames") else 0.0,
        "split_requests": d.get("split_requests", 0),
        "render_wait_ms_mean": 1e3 * d["wait_s_total"] / d["requests"] if d.get("requests") else 0.0,
        "render_busy_share": d["busy_s_total"] / args.duration if d else 0.0,
        "audio_busy_share": audio["busy_s_total"] / args.duration if audio else 0.0,
        "audio_rows_per_call": audio["frames"] / audio["batches"] if audio.get("batches") else 0.0,
        "motion_busy_share": motion["busy_s_total"] / args.duration if motion else 0.0,
        # a session's render call, split: until its frames' GPU work is queued, then until they are on the host
        "session_render_call_ms": per_render("render_call_ms_mean"),
        "session_copy_out_ms": per_render("copy_out_ms_mean"),
        "session_render_wait_ms": per_render("render_wait_ms_mean"),
    }
    # why speech renders come up short of render_ahead frames: late driving, gaps (underruns), skips
    speech_renders = sum(s.get("speech_renders", 0) for s in live)
    batching["short_render_share"] = sum(s.get("short_renders", 0) for s in live) / speech_renders if speech_renders else 0.0
    batching["driving_ahead_frames"] = (sum(s.get("driving_ahead_frames_mean", 0.0) * s.get("speech_renders", 0) for s in live)
                                        / speech_renders if speech_renders else 0.0)
    batching["underrun_ms_per_session"] = statistics.mean([s.get("underrun_ms", 0.0) for s in live]) if live else 0.0
    batching["skipped_frames_per_session"] = statistics.mean([s.get("skipped_frames", 0) for s in live]) if live else 0.0
    return {
        **batching,
        "sessions": n, "sustained": sustained, "refused": len(refused), "errors": sum(len(s["errors"]) for s in admitted),
        "error_samples": sorted({e for s in admitted for e in s["errors"]})[:3],
        "fps_min": min(rates) if rates else 0.0, "fps_median": statistics.median(rates) if rates else 0.0,
        "jitter_p95_ms": float(np.percentile(jitters or [0.0], 95) * 1000),
        "late_p50_ms": float(np.percentile(lat, 50) * 1000), "late_p95_ms": float(np.percentile(lat, 95) * 1000), "late_max_ms": float(lat.max() * 1000),
        "server_fps": statistics.median(fps_seen[1:] or fps_seen or [0.0]),
        "server_fps_timeline": fps_seen,  # once a second over the level: when a late state set in, if it did
        "memory_timeline_mb": memory_seen,  # [RSS, GPU allocated] once a second
        "compile_work_timeline": work_seen,  # [graph captures, compiled frames] since start, once a second
        "loop_lag_p95_ms": statistics.median(lag_p95[1:] or lag_p95 or [0.0]), "loop_lag_max_ms": lag_max,
        "speaking_share": sum(s["speaking"] for s in stats) / max(1, sum(s["frames"] for s in stats)),
        "rss_before_mb": (before["rss_bytes"] or 0) / 1e6, "rss_peak_mb": peak_rss / 1e6, "rss_after_mb": (after["rss_bytes"] or 0) / 1e6,
        "gpu_before_mb": gpu_allocated(before) / 1e6, "gpu_peak_mb": peak_gpu / 1e6, "gpu_after_mb": gpu_allocated(after) / 1e6,
        "active_after": after["active_sessions"],
        **gc_level(before.get("gc"), after.get("gc")),
        **work_level(before.get("compile_work"), after.get("compile_work")),
        **(probe.summary() if probe is not None else {}),
        **({"thread_cpu": thread_cpu} if thread_cpu is not None else {}),
        **({"gpu_timeline": profile} if profile else {}),
    }


def work_level(before: dict | None, after: dict | None) -> dict:
    """The server's compile and capture work over a level (two /metrics snapshots): a level that
    captures or compiles more than the next one at the same settings met work its warm-up missed."""
    if not before or not after:
        return {}
    return {f"{k}_during": after[k] - before[k] for k in ("graph_captures", "compiled_frames", "fallbacks")}


def gc_level(before: dict | None, after: dict | None) -> dict:
    """The server's garbage collections over a level, from two /metrics snapshots: runs of the
    full (generation 2) collector, time in all collections, the longest run (each holds the GIL,
    so every session stops meanwhile), and how many objects were frozen out of them."""
    if not before or not after:
        return {}
    seen = max((p[0] for p in before["long_pauses"]), default=0)
    new_long = [p[1] for p in after["long_pauses"] if p[0] > seen]
    return {"gc_full_collections": after["collections"][2] - before["collections"][2],
            "gc_pause_ms_total": round(sum(after["pause_ms_total"]) - sum(before["pause_ms_total"]), 1),
            "gc_pause_max_ms": max(new_long, default=0.0), "gc_frozen_objects": after["frozen_objects"]}


def main() -> None:
    from newsstudio.accel.igemm_conv import TRITON_CONV_MODES  # here, not at the top: client children skip torch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="an already running server (default: start one here)")
    ap.add_argument("--sessions", default="1,2,4,8", help="comma-separated session counts to run in turn")
    ap.add_argument("--duration", type=float, default=15.0, help="seconds per level")
    ap.add_argument("--warm-up-s", type=float, default=0.0,
                    help="first, an unrecorded level of the first session count for this long, so the first measured "
                         "level does not pay the server's first-use costs (first levels were the weaker ones on the H200)")
    ap.add_argument("--size", type=int, default=256, help="avatar size (square) when starting a server here")
    ap.add_argument("--avatar", default="loadtest")
    ap.add_argument("--engine", default="classic")
    ap.add_argument("--weights", default="official")
    ap.add_argument("--device", default=None)
    ap.add_argument("--fps", type=float, default=25.0, help="frame rate of the sessions (the goal is stated at 30)")
    ap.add_argument("--accel", default="auto", help="neural engines on CUDA: auto (compile+cudagraph), cudagraph, ...")
    ap.add_argument("--no-batch", action="store_true", help="sessions render separately instead of through the shared RenderBatcher")
    ap.add_argument("--format", default="nv12",
                    help="what the clients ask for: nv12 (raw frames), h264 (encoded chunks), or a comma-separated list to sweep")
    ap.add_argument("--chunk-frames", type=int, default=2)
    ap.add_argument("--fill-render-batches", default=None,
                    help="ServerConfig.fill_render_batches: on, off, or off,on to sweep (server started here)")
    ap.add_argument("--batch-graphs", default=None,
                    help="the loaded engines' one-avatar render batches by their batch graphs "
                         "(engines/musetalk/batch_graphs.py) or the general path: on, off, or off,on to sweep (server started here)")
    ap.add_argument("--compose-graphs", default=None,
                    help="live sessions compose (splice + copy-out) through CUDA graphs of their own "
                         "(compose/session_graphs.py) or directly: on, off, or off,on to sweep (server started here)")
    ap.add_argument("--ws-socket-writes", default=None,
                    help="ServerConfig.ws_socket_writes (a WebSocket chunk written to the socket with the GIL released "
                         "where the transport has nothing queued): on, off, or off,on to sweep (server started here)")
    ap.add_argument("--gc-freeze", default=None,
                    help="ServerConfig.gc_freeze (objects alive after warm-up frozen out of garbage collections): "
                         "on, off, or off,on to sweep (server started here)")
    ap.add_argument("--spread-render-phases", default=None,
                    help="ServerConfig.spread_render_phases: on, off, or off,on to sweep (server started here)")
    ap.add_argument("--stagger-s", type=float, default=0.0,
                    help="spread the sessions' starts evenly over this many seconds (default: all at once)")
    ap.add_argument("--playout-ms", type=float, default=100.0,
                    help="the client's playout buffer: a chunk is on time within it (at least one chunk)")
    ap.add_argument("--min-speaking", type=float, default=0.3,
                    help="a sustained session spoke in at least this share of its frames (Ditto's first window needs "
                         "~3 s of speech, so ~0.7 of a 12 s level is normal there; 0 is a broken speech path)")
    ap.add_argument("--speech", default=None, help="speech file streamed by every client (default: builtin:hello)")
    ap.add_argument("--client-processes", type=int, default=1,
                    help="run the clients in this many child processes (the server here keeps its CPU)")
    ap.add_argument("--switch-intervals", default=None,
                    help="comma-separated sys.setswitchinterval values (s): each level runs under each, in this "
                         "process (the server's GIL hand-off; Python's default is 0.005)")
    ap.add_argument("--front-end-streams", nargs="?", const="on", default=None,
                    help="ServerConfig.front_end_streams (the audio encoders' and LMDM's batchers on CUDA streams of "
                         "their own; default: the server's, on): alone, on; a value, its setting; or comma-separated "
                         "off/on values: each level runs under each (server started here)")
    ap.add_argument("--triton-convs", default="off", choices=list(TRITON_CONV_MODES),
                    help="ServerConfig.triton_convs: the render convolutions on the Triton kernel (accel/igemm_conv.py)")
    ap.add_argument("--front-end-tf32", action=argparse.BooleanOptionalAction, default=None,
                    help="ServerConfig.front_end_tf32 (Ditto's HuBERT and LMDM graphs with TF32 matmuls; default: the "
                         "server's, on; server started here)")
    ap.add_argument("--speech-push-intervals-ms", default=None,
                    help="comma-separated ServerConfig.speech_push_interval_s values (ms): streamed speech pushed into "
                         "a session at most this often; each level runs under each (server started here)")
    ap.add_argument("--render-leads", default=None,
                    help="comma-separated ServerConfig.render_lead_s values (s): each level runs under each (server started here)")
    ap.add_argument("--send-on-clock", default=None,
                    help="ServerConfig.send_on_clock (with a render lead, chunks held until due): on, off or "
                         "comma-separated on/off values: each level runs under each (server started here)")
    ap.add_argument("--render-aheads", default=None,
                    help="comma-separated ServerConfig.render_ahead values (frames a session renders per request; "
                         "larger means larger shared GPU batches): each level runs under each (server started here); "
                         "the speech prebuffer is raised to cover them")
    ap.add_argument("--render-in-flight", default=None,
                    help="comma-separated ServerConfig.render_in_flight values (shared render batches on the GPU at "
                         "once; 0: no bound): each level runs under each (server started here)")
    ap.add_argument("--compose", default=None,
                    help="comma-separated modes for where live sessions splice and start their copy-out on CUDA "
                         "(ServerConfig.compose: session, worker, stream), each a level")
    ap.add_argument("--live-update-rows", default=None,
                    help="comma-separated MuseTalk live feature update steps in 20 ms Whisper rows, each a level "
                         "(the engine's LIVE_UPDATE_ROWS: one 30 s re-encode per step per stream)")
    ap.add_argument("--first-face-row", default=None,
                    help="ServerConfig.first_face_row: the face rows MuseTalk decodes ('auto', 0 = the whole face, or a "
                         "row; absent: the server's default, 'auto' on CUDA with a compile mode)")
    ap.add_argument("--max-render-fps", default=None,
                    help="ServerConfig.max_render_fps (N or ENGINE=N): sessions past it are refused, counted apart "
                         "from the admitted ones (server started here)")
    ap.add_argument("--prebuffer-ms", type=float, default=None,
                    help="ServerConfig.prebuffer_s (the speech a session holds before going on air, ms; "
                         "--render-aheads raise it to at least their frames' time; server started here)")
    ap.add_argument("--profile-s", type=float, default=0.0,
                    help="profile this many seconds in the middle of each level (server started here): GPU busy "
                         "share, kernels, and the CUDA runtime calls of every thread (gpu_timeline.py)")
    ap.add_argument("--profile-levels", default=None,
                    help="with --profile-s: profile only these levels (comma-separated, counted from 1 in run order); "
                         "the others run unobserved (the profiler slows the server)")
    ap.add_argument("--sync-debug", action="store_true",
                    help="after the server's warm-up, report every synchronising CUDA call site of its threads "
                         "(with counts) at the end of each level (server started here; slows it a little)")
    ap.add_argument("--compile-artifacts", default=None,
                    help="the server's compile-artifacts file (serve --compile-artifacts): loaded if it exists, "
                         "written once its engine is warm")
    ap.add_argument("--ditto-stride", type=int, default=1,
                    help="Ditto sessions in stride mode: warp + decode every K-th frame (server started here)")
    ap.add_argument("--ditto-stride-mode", default="mask", help="stride mode's in-between frames (mask, heatmap, blend, nearest)")
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args()
    args.front_end_streams = on_off_list(args.front_end_streams)  # checked before a server starts
    args.send_on_clock = on_off_list(args.send_on_clock, "--send-on-clock")
    args.spread_render_phases = on_off_list(args.spread_render_phases, "--spread-render-phases")
    args.fill_render_batches = on_off_list(args.fill_render_batches, "--fill-render-batches")
    args.batch_graphs = on_off_list(args.batch_graphs, "--batch-graphs")
    args.compose_graphs = on_off_list(args.compose_graphs, "--compose-graphs")
    args.gc_freeze = on_off_list(args.gc_freeze, "--gc-freeze")
    args.ws_socket_writes = on_off_list(args.ws_socket_writes, "--ws-socket-writes")
    args.compose = compose_list(args.compose)
    check_ditto_stride(args)
    args.formats = format_list(args.format)
    args.format = args.formats[0]
    args.host_speed = host_speed()  # before the server starts: this host's Python and launch speed (host_speed.py)
    t0 = time.monotonic()
    args.sessions = [int(x) for x in args.sessions.split(",") if x]
    pcm, sr = load_speech(args.speech)
    url = args.url
    server_cfg = server_state = None
    if url is None:
        url, _server, server_cfg, server_state = start_server(args)
    health = httpx.get(url + "/health", timeout=30).json()
    print(f"server {url} ready after {time.monotonic() - t0:.0f} s: device {health['device']}, default engine "
          f"{health['default_engine']}; {args.format} chunks of {args.chunk_frames} frames, {args.duration:.0f} s per level; host: "
          f"1M-step Python loop {args.host_speed['python_loop_1m_ms']} ms, CUDA launch {args.host_speed['cuda_launch_us']} us",
          file=sys.stderr)
    cols = [("sessions", "d"), ("switch_interval_ms", "g"), ("render_lead_ms", "g"), ("send_on_clock", "d"), ("render_ahead", "d"), ("prebuffer_ms", "g"), ("render_in_flight", "d"), ("front_end_streams", "d"), ("sustained", "d"), ("refused", "d"), ("errors", "d"), ("fps_min", ".1f"), ("fps_median", ".1f"), ("jitter_p95_ms", ".1f"), ("late_p50_ms", ".1f"),
            ("late_p95_ms", ".1f"), ("late_max_ms", ".1f"), ("server_fps", ".1f"), ("loop_lag_p95_ms", ".1f"), ("loop_lag_max_ms", ".0f"), ("gc_full_collections", ".0f"), ("gc_pause_max_ms", ".0f"), ("graph_captures_during", "d"), ("compiled_frames_during", "d"), ("gil_wait_p50_ms", ".2f"), ("gil_wait_p95_ms", ".2f"), ("speaking_share", ".2f"), ("rss_before_mb", ".0f"),
            ("rss_peak_mb", ".0f"), ("rss_after_mb", ".0f"), ("gpu_before_mb", ".0f"), ("gpu_peak_mb", ".0f"), ("gpu_after_mb", ".0f"),
            ("batch_frames_mean", ".1f"), ("requests_per_batch", ".2f"), ("request_frames_mean", ".1f"), ("bucket_fill", ".2f"), ("split_requests", "d"), ("render_wait_ms_mean", ".1f"), ("render_busy_share", ".2f"), ("audio_busy_share", ".2f"),
            ("audio_rows_per_call", ".1f"), ("motion_busy_share", ".2f"),
            ("session_render_call_ms", ".1f"), ("session_render_wait_ms", ".1f"), ("session_copy_out_ms", ".1f"), ("short_render_share", ".2f"),
            ("driving_ahead_frames", ".1f"), ("underrun_ms_per_session", ".0f"), ("skipped_frames_per_session", ".1f")]
    print(" | ".join(name for name, _ in cols), flush=True)
    levels = [(n, setting) for n in args.sessions for setting in server_settings(args, server_cfg, server_state)]
    syncs = watch_syncs() if args.sync_debug and args.url is None else None
    clients = ClientPool(args.client_processes) if args.client_processes > 1 else None
    try:
        run_levels(args, url, pcm, sr, levels, clients, server_cfg, syncs, cols, t0, server_state)
    finally:
        if clients is not None:
            clients.close()


# A level row's server settings: (column, how to read it from the ServerConfig and the ServerState).
SERVER_SETTINGS: tuple[tuple[str, Callable[[Any, Any], Any]], ...] = (
    ("switch_interval_ms", lambda cfg, state: sys.getswitchinterval() * 1e3),
    ("render_lead_ms", lambda cfg, state: cfg.render_lead_s * 1e3),
    ("send_on_clock", lambda cfg, state: bool(cfg.send_on_clock)),
    ("render_ahead", lambda cfg, state: cfg.render_ahead),
    ("prebuffer_ms", lambda cfg, state: cfg.prebuffer_s * 1e3),
    ("render_in_flight", lambda cfg, state: cfg.render_in_flight),
    ("front_end_streams", lambda cfg, state: bool(cfg.front_end_streams)),
    ("live_update_rows", lambda cfg, state: live_update_rows()),
    ("compose", lambda cfg, state: cfg.compose),
    ("spread_render_phases", lambda cfg, state: bool(cfg.spread_render_phases)),
    ("fill_render_batches", lambda cfg, state: bool(cfg.fill_render_batches)),
    ("batch_graphs", lambda cfg, state: state.engines.batch_graphs() if state is not None else None),
    ("compose_graphs", lambda cfg, state: state.engines.compose_graphs() if state is not None else None),
    ("first_face_row", lambda cfg, state: cfg.first_face_row),
    ("gc_freeze", lambda cfg, state: cfg.gc_freeze),
    ("ws_socket_writes", lambda cfg, state: cfg.ws_socket_writes),
    ("speech_push_interval_ms", lambda cfg, state: cfg.speech_push_interval_s * 1e3),
    ("ditto_stride", lambda cfg, state: cfg.ditto_stride),
    ("stride_rows_on_host", lambda cfg, state: stride_rows_on_host(cfg)),
)


def stride_rows_on_host(server_cfg) -> bool | None:
    """Where the server's stride-mode Ditto sessions hand their rows over (None without stride mode):
    the A/B of ``NEWSSTUDIO_STRIDE_ROWS`` (engines/ditto/engine.py)."""
    if (server_cfg.ditto_stride or 1) <= 1:
        return None
    from newsstudio.engines.ditto.engine import stride_rows_on_host as on_host

    return on_host()


def server_settings_row(server_cfg, server_state) -> dict:
    """The server's settings for a level's row; every one None when the server runs elsewhere (its settings unknown)."""
    if server_cfg is None:
        return dict.fromkeys(name for name, _ in SERVER_SETTINGS)
    return {name: read(server_cfg, server_state) for name, read in SERVER_SETTINGS}


def table_cell(value, width: int, fmt: str) -> str:
    """One cell of the printed table: '-' where the value is unknown (a server elsewhere, a figure not taken)."""
    if value is None:
        return f"{'-':>{width}}"
    return f"{value:>{width}{fmt}}"


def run_levels(args, url: str, pcm, sr, levels: list, clients: ClientPool | None, server_cfg, syncs, cols: list, t0: float,
               server_state=None) -> None:
    """The warm-up level, then every measured level; each row printed (and the JSON rewritten) as it lands."""
    rows = []
    if args.warm_up_s > 0 and levels:
        n, (label, apply) = levels[0]
        apply()
        print(f"[{time.monotonic() - t0:.0f} s] warm-up: {n} sessions for {args.warm_up_s:g} s ({label}), not recorded",
              file=sys.stderr, flush=True)
        asyncio.run(run_level(url, n, argparse.Namespace(**{**vars(args), "duration": args.warm_up_s, "profile_s": 0.0}), pcm, sr, clients))
    profiled = {int(x) for x in args.profile_levels.split(",")} if args.profile_levels else None
    for number, (n, (label, apply)) in enumerate(levels, 1):  # each level's row as soon as it is measured: a run cut short keeps them
        apply()
        print(f"[{time.monotonic() - t0:.0f} s] level of {n} sessions starts ({label})", file=sys.stderr, flush=True)
        level_args = args if profiled is None or number in profiled else argparse.Namespace(**{**vars(args), "profile_s": 0.0})
        rows.append({**asyncio.run(run_level(url, n, level_args, pcm, sr, clients)), "format": args.format,
                     "host_speed": getattr(args, "host_speed", None), **server_settings_row(server_cfg, server_state)})
        r = rows[-1]
        refused = f"{r['refused']} refused (render capacity), " if r["refused"] else ""
        print(f"[{time.monotonic() - t0:.0f} s] {n} sessions: {r['sustained']} sustained, {refused}{r['errors']} errors {r['error_samples'] or ''}",
              file=sys.stderr)
        if r.get("thread_cpu"):  # the server's threads, in cores over the level
            print("  server thread CPU (cores): " + ", ".join(f"{k} {v:.2f}" for k, v in list(r["thread_cpu"].items())[:8]),
                  file=sys.stderr)
        print(" | ".join(table_cell(r.get(name), len(name), fmt) for name, fmt in cols), flush=True)
        if syncs is not None:
            for name, text, count in sorted(syncs.values(), key=lambda v: -v[2]):
                print(f"sync x{count} [{name}]\n{text}", file=sys.stderr)
            syncs.clear()
        if r.get("gpu_timeline"):
            from .gpu_timeline import print_summary

            print_summary(r["gpu_timeline"])
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
