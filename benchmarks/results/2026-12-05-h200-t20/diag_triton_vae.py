"""Why is the VAE decoder slower with Triton half convs (levers: 445 vs 691 fps) when each layer
shape alone is as fast or faster (triton_conv_bench)? Eager fp16 channels_last decoder with phase
rewrites, batch 32: cuDNN vs TritonConv2d(half, auto); kernel choices; profiler top kernels."""
import json, sys, time
import torch
from newsstudio.accel.igemm_conv import convert_convs_to_triton_
from newsstudio.accel.kernel_choice import choices
from newsstudio.accel.precision import to_channels_last_
from newsstudio.accel.upsample_conv import with_phase_upsampling
from newsstudio.accel.shared_copy import shared_copy
from newsstudio.engines.musetalk.weights import random_vae

torch.backends.cudnn.benchmark = True
dev = torch.device("cuda")
vae = random_vae(0, dev, torch.float16)
dec = with_phase_upsampling(vae.decoder)[0]
to_channels_last_(dec)
tri = shared_copy(dec)
n = convert_convs_to_triton_(tri, "half")
print("converted", n, flush=True)
z = torch.randn(32, 4, 32, 32, device=dev, dtype=torch.float16).contiguous(memory_format=torch.channels_last)

def timeit(m, reps=10):
    with torch.inference_mode():
        for _ in range(3):
            m(z)
        torch.cuda.synchronize(); t = time.perf_counter()
        for _ in range(reps):
            m(z)
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps * 1e3

print("cudnn eager ms/batch", round(timeit(dec), 2), flush=True)
print("triton eager ms/batch", round(timeit(tri), 2), flush=True)
wins = {}
for k, (w, t) in choices().items():
    wins[w] = wins.get(w, 0) + 1
    print("choice", k[1], k[3], k[5], w, {a: round(b, 3) for a, b in t.items()})
print("wins", wins, flush=True)
from torch.profiler import profile, ProfilerActivity
for name, m in (("cudnn", dec), ("triton", tri)):
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        m(z); torch.cuda.synchronize()
    print(f"--- {name}")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=70))
