"""After moving the channels-last conversion out of the Triton conv op into the traced graph: does
the compiled (no cudagraph, to see kernels) fp16 decoder with Triton half convs still spend its
time in copies? cuDNN vs Triton(auto), batch 32, top CUDA kernels of one call each, and ms/batch."""
import time
import torch
from torch.profiler import profile, ProfilerActivity
from newsstudio.accel.igemm_conv import convert_convs_to_triton_
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
print("converted", convert_convs_to_triton_(tri, "half"), flush=True)
z = torch.randn(32, 4, 32, 32, device=dev, dtype=torch.float16).contiguous(memory_format=torch.channels_last)
for name, m in (("cudnn", dec), ("triton", tri)):
    f = torch.compile(m)
    with torch.inference_mode():
        for _ in range(3):
            f(z)
        torch.cuda.synchronize(); t = time.perf_counter()
        for _ in range(10):
            f(z)
        torch.cuda.synchronize()
        print(f"{name} compiled ms/batch {(time.perf_counter() - t) * 100:.2f}", flush=True)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            f(z); torch.cuda.synchronize()
    print(f"--- {name}")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=90))
    sums: dict[str, float] = {}
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        k = ("triton conv" if "_conv_kernel" in e.key else "cudnn conv" if "xmma" in e.key or "implicit_gemm" in e.key
             else "group norm" if "group_norm" in e.key else "other")
        sums[k] = sums.get(k, 0.0) + t / 1e3
    print(f"{name} ms by kind:", {k: round(v, 2) for k, v in sorted(sums.items())}, flush=True)
