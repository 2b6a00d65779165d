"""MuseTalk render runner: GPU time per batch bucket (compile+cudagraph), and render_many's
cost for a shared batch of several sessions' items vs one item of the same frames."""
import statistics, sys, time, tempfile
from pathlib import Path
import torch
sys.path.insert(0, ".")
from newsstudio.engines.musetalk.engine import MuseTalkEngine

dev = torch.device("cuda")
t = time.perf_counter()
eng = MuseTalkEngine(dev, weights="random", accel="compile+cudagraph")
print(f"load {time.perf_counter() - t:.1f} s; buckets {eng._face_runner.buckets()}", flush=True)
t = time.perf_counter()
eng.warm_up()
print(f"warm_up {time.perf_counter() - t:.1f} s", flush=True)
g = torch.Generator(dev).manual_seed(0)
lat = torch.randn((32, 8, 32, 32), generator=g, device=dev).to(eng.dtype)
pr = eng.idle_prompt()[None].to(eng.dtype).expand(32, -1, -1).contiguous()

def gpu_ms(fn, iters=20):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    walls = []
    for s, e in ev:
        w = time.perf_counter(); s.record(); fn(); e.record(); torch.cuda.synchronize(); walls.append(time.perf_counter() - w)
    return statistics.median(s.elapsed_time(e) for s, e in ev), statistics.median(walls) * 1e3

with torch.inference_mode():
    for n in (4, 8, 9, 10, 12, 13, 16, 20, 24, 32):
        ms, wall = gpu_ms(lambda: eng._face_runner(lat[:n], pr[:n]))
        print(f"faces n={n:2d} bucket {eng._face_runner.bucket_for(n):2d}: GPU {ms:6.2f} ms  wall {wall:6.2f} ms  -> {n * 1e3 / wall:6.1f} fps", flush=True)

# render_many: a shared batch of k sessions' items (same avatar), 2 frames each, vs one item
from benchmarks.common import avatar
from PIL import Image
from skimage import data
d = Path(tempfile.mkdtemp())
Image.fromarray(data.astronaut()).save(d / "astronaut.png")
packet = avatar(d / "astronaut.png", "astro", (1080, 1080), d / "avatars")
packet = eng.prebake(packet, progress=False)
layer = eng.load_avatar(packet)
drv = pr[:2]
with torch.inference_mode():
    for k in (1, 4, 5, 8):
        items = [(layer, drv, torch.arange(2 * i, 2 * i + 2, device=dev)) for i in range(k)]
        ms, wall = gpu_ms(lambda: eng.render_many(items))
        one = [(layer, pr[: 2 * k], torch.arange(0, 2 * k, device=dev))]
        ms1, wall1 = gpu_ms(lambda: eng.render_many(one))
        print(f"render_many {k} items x 2 frames: GPU {ms:6.2f} wall {wall:6.2f} ms | one item of {2 * k}: GPU {ms1:6.2f} wall {wall1:6.2f} ms", flush=True)

# segment -> MP4 on the real 1080x1920 loop, several x264 layouts (the encoder alone: encode_bench)
from benchmarks.common import media, segment_mp4_figures
from benchmarks.run import segment_audio
yp = eng.prebake(avatar(media("yongen.mp4"), "yongen", (1080, 1920), d / "avatars", max_frames=750), progress=False)
fig = segment_mp4_figures(eng, yp, segment_audio(6.6), 25, 32, d / "seg.mp4", "ultrafast:16/16/4,ultrafast:8/8/2,ultrafast:16/8/2,ultrafast:12/12/2", 3)
print("segment -> MP4:", {k: round(v, 3) for k, v in fig["segment_mp4_s_by_config"].items()}, flush=True)
