"""Same-run A/B: phase convs as cuDNN 2x2 convs vs one matmul (PhaseUpsampleConv.gemm), on the
MuseTalk VAE decoder and the Ditto warp + decoder with the engines' rewrites, fp16 channels_last,
batch 32, CUDA graph and compile + CUDA graph; error vs the fp32 plain network."""
import copy, statistics, sys, time
import torch
sys.path.insert(0, ".")
from benchmarks.levers import ditto_net, vae_net, rel_l2
from newsstudio.accel.precision import channels_last, to_channels_last_
from newsstudio.accel.upsample_conv import set_phase_gemm_

dev = torch.device("cuda")
torch.backends.cudnn.benchmark = True
B = 32

def timeit(fn, iters=20):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for s, e in evs:
        s.record(); fn(); e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in evs)

for net in (vae_net(False), ditto_net(False)):
    base = net.build(dev)
    g = torch.Generator(dev).manual_seed(0)
    inp = net.inputs(B, g, dev)
    call = net.make_fn(base)
    with torch.inference_mode():
        ref = call(*inp).float()
    if net.specialise: net.specialise(base)
    net.rewrite(base)
    x = tuple(channels_last(t.half()) if t.dim() in (4, 5) else t.half() for t in inp)
    for mode in ("cudagraph", "compile+cudagraph"):
        for gemm in (False, True):
            try:
                m = copy.deepcopy(base).half()
                to_channels_last_(m)
                n = set_phase_gemm_(m, gemm)
                fn = net.make_fn(m)
                t0 = time.perf_counter()
                if mode.startswith("compile"):
                    fn = torch.compile(fn, dynamic=False)
                with torch.inference_mode():
                    for _ in range(2): fn(*x)
                    torch.cuda.synchronize()
                    sin = tuple(t.clone() for t in x)
                    gph = torch.cuda.CUDAGraph()
                    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(s):
                        fn(*sin)
                    torch.cuda.current_stream().wait_stream(s)
                    with torch.cuda.graph(gph):
                        out = fn(*sin)
                    prep = time.perf_counter() - t0
                    ms = timeit(gph.replay)
                    err = rel_l2(out.float(), ref)
                print(f"{net.name:6s} {mode:18s} phase convs as {'matmul' if gemm else 'cuDNN 2x2'} ({n}): {ms:7.2f} ms/batch {B * 1e3 / ms:7.1f} fps  rel.err vs fp32 {err:.3e}  prep {prep:.0f} s", flush=True)
                del m, fn, gph, out
                torch.cuda.empty_cache()
            except Exception as e:
                print(f"{net.name} {mode} gemm={gemm}: ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
    del base
    torch.cuda.empty_cache()
