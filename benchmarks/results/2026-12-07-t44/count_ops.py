# run: PYTHONPATH=$PWD:$PWD/src python benchmarks/results/2026-12-07-t44/count_ops.py (CPU, tiny seeded Ditto; counts aten ops,
# then times DittoEngine.keypoints)
"""Eager torch ops per 32-frame render call outside the network runners (graphs on CUDA), dense vs stride 8:
all ops, and those that are not views (each of which is a kernel launch on CUDA), by the function that made them. Then the wall time of DittoEngine.keypoints (one render call's motion stitching) for
32 rows on the video avatar, median of 300 calls after 30 warm-up calls, one torch thread: mostly per-op dispatch."""
import collections
import statistics
import pathlib
import sys
import tempfile
import time
import traceback

sys.path.insert(0, "tests")
import torch
from PIL import Image
from skimage import data
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import carried_faces, shifted_video_packet
from newsstudio.avatar.prebake import prebake
from newsstudio.engines.base import pingpong_index
from newsstudio.engines.ditto.config import TINY_OPTIONS
from newsstudio.engines.ditto.engine import DittoEngine

VIEWS = {"view", "_unsafe_view", "reshape", "slice", "select", "expand", "unsqueeze", "squeeze", "transpose", "t",
         "permute", "alias", "detach", "split", "split_with_sizes", "unbind", "as_strided", "chunk", "lift_fresh",
         "_reshape_alias", "narrow", "view_as"}
OPTS = {**TINY_OPTIONS, "steps": 2, "smo_k_s": 1}
root = pathlib.Path(tempfile.mkdtemp())
Image.fromarray(data.astronaut()).resize((256, 256)).save(root / "a.png")
pk = prebake(root / "a.png", "astronaut", root=root, progress=False, faces=carried_faces("astronaut", 0.5))
dense = DittoEngine("cpu", weights="random", **OPTS)
pk = dense.prebake(shifted_video_packet(pk, root / "loop", [(0, 0), (6, 2), (12, -4)]), progress=False)


class Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = self.kernels = 0
        self.paused = False
        self.where = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused:
            self.n += 1
            if func.overloadpacket.__name__ not in VIEWS:
                self.kernels += 1
                st = [f for f in traceback.extract_stack() if "/newsstudio/" in f.filename]
                self.where[(st[-1].filename.split("/newsstudio/")[1] + ":" + st[-1].name) if st else "?"] += 1
        return func(*args, **(kwargs or {}))


def paused(mode, cls):
    f = cls.__call__

    def g(self, *a, **kw):
        mode.paused = True
        try:
            return f(self, *a, **kw)
        finally:
            mode.paused = False
    cls.__call__ = g


def run(k, n=64, chunk=32):
    e = DittoEngine("cpu", weights="random", stride=k, **OPTS) if k > 1 else dense
    layer = e.load_avatar(pk)
    drv = e.driver(layer)
    drv.push(torch.randn(n, 1024, generator=torch.Generator().manual_seed(1)))
    drv.close()
    rows = drv.take(drv.ready)
    mode = Count()
    paused(mode, type(e._crop_runner))  # the runners (BucketedRunner: graphs on CUDA) are not counted
    counts = []
    with mode:
        for s in range(0, rows.shape[0], chunk):
            n0, k0 = mode.n, mode.kernels
            m = min(chunk, rows.shape[0] - s)
            e.render(layer, rows[s:s + m], pingpong_index(torch.arange(s, s + m), layer.n_frames))
            counts.append((mode.n - n0, mode.kernels - k0))
    return counts, mode.where.most_common(14)


for k in (1, 8):
    c, top = run(k)
    print(f"k={k}: per 32-frame render call outside the runners, (all ops, non-view ops): {c}")
    for w, m in top:
        print(f"    {m:4d}  {w}")


torch.set_num_threads(1)
e = dense
layer = e.load_avatar(pk)
drv = e.driver(layer)
drv.push(torch.randn(40, 1024, generator=torch.Generator().manual_seed(1)))
drv.close()
rows = drv.take(drv.ready)[:32]
idx = pingpong_index(torch.arange(32), layer.n_frames)
times = []
with torch.inference_mode():
    for i in range(330):
        t0 = time.perf_counter()
        e.keypoints(layer, rows, idx)
        if i >= 30:
            times.append(time.perf_counter() - t0)
print(f"keypoints, 32 rows: median {statistics.median(times) * 1e3:.3f} ms, p10 {sorted(times)[30] * 1e3:.3f} ms")
