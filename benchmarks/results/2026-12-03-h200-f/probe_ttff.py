"""Ditto time-to-first-frame: where the time goes (synchronised stage timers) and how the file
read block size changes it; plus the engine's dense fps / TTFF as benchmarks.run measures them."""
import sys, time, statistics, tempfile, functools
from pathlib import Path
import torch
sys.path.insert(0, ".")
from benchmarks.common import avatar, media
from benchmarks.run import segment_audio, engine_figures
from newsstudio.engines.ditto.engine import DittoEngine, DittoConditioner, DittoDriver
from newsstudio.stream import stream_generator, StreamSession
from newsstudio.audio.source import AudioSource

dev = torch.device("cuda")
accel = sys.argv[1] if len(sys.argv) > 1 else "compile+cudagraph"
work = Path(tempfile.mkdtemp())
t = time.perf_counter()
eng = DittoEngine(dev, weights="random", accel=accel)
packet = avatar(media("yongen.mp4"), "yongen", (1080, 1920), work / "avatars", max_frames=750)
packet = eng.prebake(packet, progress=False)
print(f"setup {time.perf_counter() - t:.1f} s", flush=True)
audio = segment_audio(6.6)

def ttff(chunk=4):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    gen = stream_generator(eng, packet, audio, fps=25, chunk_frames=chunk, output="nv12")
    next(gen)
    dt = time.perf_counter() - t0
    gen.close()
    return dt * 1e3

t = time.perf_counter()
fig = engine_figures(eng, packet, 6.6, 32, 3, work)
print(f"engine_figures ({time.perf_counter() - t:.1f} s): dense {fig['dense_fps']:.1f} fps, TTFF {fig['ttff_ms']:.1f} ms, mp4 {fig.get('segment_mp4_s')}", flush=True)

for block in (0.5, 1.0, 2.0, 3.2, 30.0):
    eng.file_block_s = block
    ttff()
    v = [ttff() for _ in range(5)]
    print(f"file_block_s {block:4.1f}: TTFF median {statistics.median(v):6.1f} ms  all {[round(x, 1) for x in v]}", flush=True)

# synchronised stage timers (block 0.5 s, the default, then the best one above)
stats = {}
def wrap(cls, name, label):
    f = getattr(cls, name)
    @functools.wraps(f)
    def g(*a, **k):
        torch.cuda.synchronize(); t = time.perf_counter()
        r = f(*a, **k)
        torch.cuda.synchronize()
        stats.setdefault(label, []).append((time.perf_counter() - t) * 1e3)
        return r
    setattr(cls, name, g)
wrap(DittoConditioner, "push", "conditioner.push (HuBERT)")
wrap(DittoConditioner, "close", "conditioner.close")
wrap(DittoDriver, "push", "driver.push (LMDM)")
wrap(DittoDriver, "close", "driver.close")
wrap(StreamSession, "render_frames", "render_frames (warp+decode+splice)")
wrap(AudioSource, "pull", "audio pull")
wrap(type(eng), "load_avatar", "load_avatar")
for block in (0.5, 3.2):
    eng.file_block_s = block
    ttff()
    stats.clear()
    total = ttff()
    print(f"block {block}: instrumented TTFF {total:.1f} ms", flush=True)
    for k, v in stats.items():
        print(f"   {k:38s} calls {len(v):3d}  total {sum(v):7.2f} ms  each {[round(x, 2) for x in v][:12]}", flush=True)
