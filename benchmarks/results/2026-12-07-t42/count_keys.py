"""Keyframe batches a 165-frame stride stream sends through the networks, per chunking (tiny Ditto, CPU).

    PYTHONPATH=$PWD python benchmarks/results/2026-12-07-t42/count_keys.py
"""
import sys, tempfile
from pathlib import Path
import numpy as np
from PIL import Image
from skimage import data
sys.path.insert(0, "tests")
from conftest import carried_faces
from newsstudio.avatar.prebake import prebake
from newsstudio.avatar.packet import open_packet
from newsstudio.engines.ditto.config import TINY_OPTIONS
from newsstudio.engines.ditto.engine import DittoEngine
from newsstudio.engines.ditto.stride import KEYFRAME_BUCKETS
from newsstudio.media.audio import Audio
from newsstudio.stream import stream_generator

root = Path(tempfile.mkdtemp())
src = root / "a.png"; Image.fromarray(data.astronaut()).resize((256, 256)).save(src)
pk = prebake(src, "a", root=root, progress=False, faces=carried_faces("astronaut", 256 / 512))
for k in (4, 8):
    eng = DittoEngine("cpu", weights="random", steps=2, stride=k, **TINY_OPTIONS)
    pk2 = eng.prebake(open_packet(pk.path), progress=False)
    eng.load_avatar(pk2)
    sizes = []
    run = eng.warp_decode
    eng.warp_decode = lambda f_s, x_s, x_d, **kw: (sizes.append(f_s.shape[0]), run(f_s, x_s, x_d, **kw))[1]
    rng = np.random.default_rng(0)
    audio = Audio((rng.standard_normal((1, int(6.6 * 16000))) * 0.1).astype(np.float32), 16000)
    for ramp in (0, 8):
        sizes.clear()
        n = sum(ch["frames"].shape[0] for ch in stream_generator(eng, pk2, audio, fps=25, chunk_frames=32, output="nv12", ramp_frames=ramp))
        # the runner pads each call to a bucket (sizes beyond the largest are split by it)
        pad = [next((b for b in KEYFRAME_BUCKETS if b >= s), s) for s in sizes]
        print(f"k={k} ramp={ramp}: {n} frames, keyframe calls {sizes} -> padded {pad}: {sum(sizes)} keyframes, {sum(pad)} through the networks")
