# run: PYTHONPATH=$PWD:$PWD/src python benchmarks/results/2026-12-07-t44/time_keypoints.py (CPU, tiny seeded Ditto)
"""Wall time of DittoEngine.keypoints (motion stitching of one render call) for 32 rows on a video avatar, median
of 300 calls after 30 warm-up calls, single-threaded torch: mostly per-op dispatch at this size."""
import pathlib
import statistics
import sys
import tempfile
import time

sys.path.insert(0, "tests")
import torch
from PIL import Image
from skimage import data

from conftest import carried_faces, shifted_video_packet
from newsstudio.avatar.prebake import prebake
from newsstudio.engines.base import pingpong_index
from newsstudio.engines.ditto.config import TINY_OPTIONS
from newsstudio.engines.ditto.engine import DittoEngine

torch.set_num_threads(1)
OPTS = {**TINY_OPTIONS, "steps": 2, "smo_k_s": 1}
root = pathlib.Path(tempfile.mkdtemp())
Image.fromarray(data.astronaut()).resize((256, 256)).save(root / "a.png")
pk = prebake(root / "a.png", "astronaut", root=root, progress=False, faces=carried_faces("astronaut", 0.5))
e = DittoEngine("cpu", weights="random", **OPTS)
pk = e.prebake(shifted_video_packet(pk, root / "loop", [(0, 0), (6, 2), (12, -4)]), progress=False)
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
