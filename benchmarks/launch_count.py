"""Kernels a live render request launches outside the networks, counted on any device.

A live session's request is: its avatar frame indices, the shared render batch (the networks,
CUDA graphs on a GPU, plus the render thread's own small ops: gathers, prompts, the resize into
the avatar's boxes), then on the session's thread the splice into the background frames and the
copy-out. Each non-view ATen op outside the networks is one kernel launch on a GPU. Why count
them: at 12 live MuseTalk sessions on an H200 the launches of a dozen threads wait for each other
(`cudaLaunchKernel` up to 23 ms, sixteenth session), so launches per request are latency.

    python -m benchmarks.launch_count --engine musetalk --frames 8
    python -m benchmarks.launch_count --engine musetalk --speech-s 6

``--speech-s S`` counts a live MuseTalk stream's speech path instead: S seconds of real speech
pushed as 20 ms messages (16 kHz) into the engine's live conditioner (log-mel, windows, frame
queue on the speech thread; the Whisper encoder, one CUDA graph on a GPU, counted apart).
"""
from __future__ import annotations

import argparse
import collections
import json
import tempfile
from fractions import Fraction
from pathlib import Path

import numpy as np
from torch.utils._python_dispatch import TorchDispatchMode

NO_KERNEL = {"aten.lift_fresh.default", "aten._local_scalar_dense.default"}


class LaunchCounter(TorchDispatchMode):
    """Counts non-view ATen ops by the label in force (`label` is set around the networks)."""

    def __init__(self) -> None:
        super().__init__()
        self.label = "session"
        self.ops: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        if not func.is_view and str(func) not in NO_KERNEL:
            self.ops[self.label][str(func).removeprefix("aten.").removesuffix(".default")] += 1
        return func(*args, **(kwargs or {}))


def labelled(counter: LaunchCounter, label: str, fn):  # noqa: ANN001, ANN201
    """`fn` with `counter.label` set to `label` while it runs."""
    def run(*args, **kw):  # noqa: ANN002, ANN003, ANN202
        before, counter.label = counter.label, label
        try:
            return fn(*args, **kw)
        finally:
            counter.label = before
    return run


def count(engine_name: str, frames: int, size: int) -> dict[str, dict[str, int]]:
    """{part: {op: count}} for one request of `frames` frames (the second of two: caches warm)."""
    from newsstudio.engines.registry import create_engine
    from newsstudio.stream import StreamSession, background_for

    from .common import avatar

    kw = {"weights": "random"} if engine_name != "classic" else {}
    engine = create_engine(engine_name, device="cpu", **kw)
    with tempfile.TemporaryDirectory() as d:
        from PIL import Image
        from skimage import data

        src = Path(d) / "astronaut.png"  # the load test's avatar
        Image.fromarray(data.astronaut()).save(src)
        packet = avatar(src, "launches", (size, size), Path(d) / "avatars")
        layer = engine.load_avatar(packet)
        counter = LaunchCounter()
        for name in ("_face_runner", "_crop_runner"):  # MuseTalk's, Ditto's networks: one CUDA graph on a GPU
            runner = getattr(engine, name, None)
            if runner is not None:
                setattr(engine, name, labelled(counter, "networks", runner))
        session = StreamSession(engine, layer, background_for(engine, packet), Fraction(25),
                                renderer=labelled(counter, "render thread", engine.render))
        driving = engine.idle_driving(frames)
        if driving is None:
            raise SystemExit(f"{engine_name} has no idle driving to render with")
        for k in range(2):
            counter.ops.clear()
            with counter:
                session.render_frames(37 + 40 * k, driving, "nv12")
        return {part: dict(c) for part, c in counter.ops.items()}


def count_speech(seconds: float, fps: int = 30) -> dict[str, dict[str, int]]:
    """{part: {op: count}} for ``seconds`` of speech through MuseTalk's live conditioner."""
    from newsstudio.builtin import builtin_audio
    from newsstudio.engines.registry import create_engine
    from newsstudio.media.audio import load_audio

    engine = create_engine("musetalk", device="cpu", weights="random")
    counter = LaunchCounter()
    engine.whisper_states = labelled(counter, "networks", engine.whisper_states)
    cond = engine.conditioner(fps)
    pcm = load_audio(builtin_audio("builtin:hello")).mono().resampled(16000).samples[0]
    pcm = np.tile(pcm, int(np.ceil(seconds * 16000 / pcm.size)))[: int(seconds * 16000)].astype(np.float32)
    counter.label = "speech thread"
    with counter:
        for i in range(0, pcm.size, 320):
            cond.push(pcm[i:i + 320])
    return {part: dict(c) for part, c in counter.ops.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", default="musetalk", choices=("classic", "musetalk", "ditto"))
    ap.add_argument("--frames", type=int, default=8, help="frames per request (the server's render_ahead)")
    ap.add_argument("--size", type=int, default=512, help="avatar size (square)")
    ap.add_argument("--speech-s", type=float, default=0.0, help="count a MuseTalk stream's speech path for this long instead")
    ap.add_argument("--json", help="also write the counts here")
    args = ap.parse_args()
    parts = count_speech(args.speech_s) if args.speech_s else count(args.engine, args.frames, args.size)
    for part in ("speech thread",) if args.speech_s else ("session", "render thread", "networks"):
        ops = parts.get(part, {})
        print(f"{part:>13}: {sum(ops.values()):5d} kernels  " + ", ".join(f"{k} {v}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1])[:12]))
    if args.json:
        Path(args.json).write_text(json.dumps(parts, indent=1))


if __name__ == "__main__":
    main()
