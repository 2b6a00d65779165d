"""Ditto with this commit's defaults (compile+cudagraph): dense fps, TTFF (file input pushed in
first-window blocks), live TTFF, segment -> MP4, as benchmarks.run measures them."""
import sys, time, tempfile, json
from pathlib import Path
import torch
sys.path.insert(0, ".")
from benchmarks.common import avatar, media
from benchmarks.run import engine_figures
from newsstudio.engines.ditto.engine import DittoEngine

dev = torch.device("cuda")
work = Path(tempfile.mkdtemp())
t = time.perf_counter()
eng = DittoEngine(dev, weights="random", accel="compile+cudagraph")
packet = eng.prebake(avatar(media("yongen.mp4"), "yongen", (1080, 1920), work / "avatars", max_frames=750), progress=False)
print(f"setup {time.perf_counter() - t:.1f} s; file_block_s {eng.file_block_s}", flush=True)
t = time.perf_counter()
fig = engine_figures(eng, packet, 6.6, 32, 3, work, mp4="ultrafast:16/16/4,ultrafast:8/8/2")
print(f"engine_figures {time.perf_counter() - t:.1f} s", flush=True)
print(json.dumps({k: fig[k] for k in ("dense_fps", "dense_fps_all", "ttff_ms", "segment_mp4_s_by_config", "live_ttff")}, indent=1), flush=True)
