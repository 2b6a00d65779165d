"""Probe (thirty-eighth session): does cuDNN pick a Hopper (wgmma) kernel for Ditto's depth-sliced mask conv
at other channel paddings? The slices' 2-D conv is 7x7 over 512 images of 64x64 (32 frames x 16 depth slices),
144 -> 168 channels as padded now. Times each (C_in, C_out) padding, fp16, channels_last, cudnn.benchmark on,
median of 20 CUDA-event timings, and names the kernel that ran."""
import itertools
import json
import os

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

torch.backends.cudnn.benchmark = True
dev = "cuda"
N, H = int(os.environ.get("N", 512)), 64
rows = []
for cin, cout in itertools.product((144, 160, 192), (168, 176, 192, 224, 256)):
    x = torch.randn(N, cin, H, H, device=dev, dtype=torch.half).to(memory_format=torch.channels_last)
    w = (torch.randn(cout, cin, 7, 7, device=dev, dtype=torch.half) * 0.01).to(memory_format=torch.channels_last)
    for _ in range(3):
        F.conv2d(x, w, padding=3)
    torch.cuda.synchronize()
    ts = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); F.conv2d(x, w, padding=3); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    ms = ts[len(ts) // 2]
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        F.conv2d(x, w, padding=3); torch.cuda.synchronize()
    kernels = sorted(((e.device_time_total, e.key) for e in p.key_averages() if e.device_time_total > 0), reverse=True)
    useful = 2 * N * H * H * 168 * 144 * 49 / 1e12  # the real conv's FLOPs (zero padding is waste)
    flops = 2 * N * H * H * cout * cin * 49 / 1e12
    rows.append({"cin": cin, "cout": cout, "ms": ms, "tflops": flops / ms * 1e3, "useful_tflops": useful / ms * 1e3,
                 "kernel": kernels[0][1][:110] if kernels else "?"})
    r = rows[-1]
    print(f"{cin:4d} -> {cout:4d}: {ms:7.3f} ms  {r['tflops']:5.0f} TF/s (useful {r['useful_tflops']:5.0f})  {r['kernel']}", flush=True)
    del x, w
    torch.cuda.empty_cache()
out = os.environ.get("OUT")
if out:
    json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
               "N": N, "rows": rows}, open(os.path.join(out, "mask_conv_shapes.json"), "w"), indent=1)
