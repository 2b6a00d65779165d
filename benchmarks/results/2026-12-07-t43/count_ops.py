# run: PYTHONPATH=$PWD python benchmarks/results/2026-12-07-t43/count_ops.py (CPU, tiny seeded Ditto; counts aten ops)
"""Eager torch ops per render call outside the network runners (graphs on CUDA): stride vs dense."""
import sys, collections
sys.path.insert(0, "tests")
import numpy as np, torch
from torch.utils._python_dispatch import TorchDispatchMode
from conftest import shifted_video_packet
from newsstudio.engines.ditto.config import TINY_OPTIONS
from newsstudio.engines.ditto.engine import DittoEngine
from newsstudio.engines.base import pingpong_index
from newsstudio.avatar.prebake import prebake
from PIL import Image
from skimage import data
import tempfile, pathlib
OPTS = {**TINY_OPTIONS, "steps": 2, "smo_k_s": 1}
root = pathlib.Path(tempfile.mkdtemp())
Image.fromarray(data.astronaut()).resize((256, 256)).save(root / "a.png")
from conftest import carried_faces
pk = prebake(root / "a.png", "astronaut", root=root, progress=False, faces=carried_faces("astronaut", 0.5))
dense = DittoEngine("cpu", weights="random", **OPTS)
pk = dense.prebake(shifted_video_packet(pk, root / "loop", [(0, 0), (6, 2), (12, -4)]), progress=False)

class Count(TorchDispatchMode):
    def __init__(self): super().__init__(); self.n = 0; self.paused = False; self.by = collections.Counter()
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused: self.n += 1; self.by[str(func)] += 1
        return func(*args, **(kwargs or {}))

def run(k, n=64, chunk=32):
    e = DittoEngine("cpu", weights="random", stride=k, **OPTS) if k > 1 else dense
    layer = e.load_avatar(pk)
    drv = e.driver(layer); drv.push(torch.randn(n, 1024, generator=torch.Generator().manual_seed(1))); drv.close(); rows = drv.take(drv.ready)
    mode = Count()
    runners = [e._crop_runner] + ([e._strider._key_runner] if k > 1 else [])
    for r in runners:
        orig = r.__call__
    def wrap(r):
        f = type(r).__call__
        def g(self, *a, **kw):
            mode.paused = True
            try: return f(self, *a, **kw)
            finally: mode.paused = False
        return g
    cls = type(runners[0]); cls.__call__ = wrap(runners[0])
    counts = []
    with mode:
        for s in range(0, rows.shape[0], chunk):
            before = mode.n
            e.render(layer, rows[s:s+chunk], pingpong_index(torch.arange(s, s + min(chunk, rows.shape[0]-s)), layer.n_frames))
            counts.append(mode.n - before)
    return counts, mode.by.most_common(12)

for k in (1, 8):
    c, top = run(k)
    print(f"k={k}: eager ops per 32-frame render call outside the runners: {c}")
    print("   top:", top[:8])
