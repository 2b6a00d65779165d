"""Why a live session's compose through its graphs (compose/session_graphs.py) differed from its direct
compose by 1 in some bytes for 16-frame requests on an H100 (thirty-second session, call 1), not for 8.

For each request size: the rendered faces' dtype, layout and contiguity; direct vs direct (is the direct
compose deterministic?); graph vs direct on the same faces; direct on a contiguous float32 copy of the faces
vs direct on the faces (does layout change the bytes?); where the differing bytes lie (Y or UV rows).
    python benchmarks/results/2026-12-06-t32/compose_diff.py
"""
from __future__ import annotations

import tempfile
from fractions import Fraction
from pathlib import Path

import torch

from benchmarks.batch_dispatch import _batches
from benchmarks.common import avatar


def host(pair):
    out, done = pair
    if done is not None:
        done.synchronize()
    return out.clone()


def where(a: torch.Tensor, b: torch.Tensor, h: int) -> str:
    d = (a.int() - b.int()).abs()
    if not bool(d.any()):
        return "same"
    return (f"max {int(d.max())}, {int((d > 0).sum())} bytes differ ({int((d[:, :h] > 0).sum())} in Y, "
            f"{int((d[:, h:] > 0).sum())} in UV)")


def main() -> None:
    from PIL import Image
    from skimage import data

    from newsstudio.compose.session_graphs import ComposeGraphs
    from newsstudio.engines.musetalk.engine import MuseTalkEngine
    from newsstudio.stream import StreamSession, background_for

    import os
    dev = os.environ.get("DEVICE", "cuda")
    engine = MuseTalkEngine(dev, weights="random", accel="cudagraph" if dev == "cuda" else "eager", batch_graphs=dev == "cuda")
    engine.warm_up()
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "astronaut.png"
        Image.fromarray(data.astronaut()).save(src)
        packet = avatar(src, "diff", (1080, 1080), Path(d) / "avatars")
        layer = engine.load_avatar(engine.prebake(packet, progress=False))
        session = StreamSession(engine, layer, background_for(engine, layer.packet), Fraction(30))
    h = session.background.frame_hw[0]
    graphs = ComposeGraphs(session._compose, engine.device)
    print("avatar frames", layer.n_frames)
    for i, n in enumerate([16, 16, 8, 16, 8, 4]):
        (lay, driving, idx), = _batches(layer, [n], 1, 300 + i)[0]
        rois = engine.render(lay, driving, idx)
        print(f"--- {n} frames: rois {rois.dtype} shape {tuple(rois.shape)} stride {rois.stride()} "
              f"contiguous {rois.is_contiguous()}; idx unique {int(idx.unique().numel())}")
        got = host(graphs.to_host(rois, idx, "nv12"))
        want = host(session._compose_to_host(idx, "nv12", rois))
        again = host(session._compose_to_host(idx, "nv12", rois))
        dense = host(session._compose_to_host(idx, "nv12", rois.float().contiguous().clone()))
        print("  direct vs direct:          ", where(want, again, h))
        print("  graph vs direct:           ", where(got, want, h))
        print("  direct on a dense copy:    ", where(dense, want, h))
        print("  graph vs direct dense copy:", where(got, dense, h))


if __name__ == "__main__":
    main()
