"""Same-run A/B of Ditto render-network variants (fp16, channels_last, batch 32, CUDA graph; and
compile+cudagraph for two), error vs the fp32 plain network on the same inputs."""
import copy, statistics, sys, time
import torch
from torch import nn
sys.path.insert(0, ".")
from benchmarks.levers import ditto_net, rel_l2
from newsstudio.accel.precision import channels_last, to_channels_last_
from newsstudio.engines.ditto.models.regrouped import RegroupedSPADEDecoder, regrouped_warp

dev = torch.device("cuda")
torch.backends.cudnn.benchmark = True
net = ditto_net(False)
base = net.build(dev)
g = torch.Generator(dev).manual_seed(0)
B = int(sys.argv[1]) if len(sys.argv) > 1 else 32
inp = net.inputs(B, g, dev)
with torch.inference_mode():
    ref = base(*inp).float()
base.dec.fold_spectral_norm_()

class NCHWConv(nn.Module):
    def __init__(self, conv): super().__init__(); self.conv = conv
    def forward(self, x):
        return self.conv(x.contiguous()).contiguous(memory_format=torch.channels_last)

def variant(name):
    m = copy.deepcopy(base)
    plain_occ = m.warp.dense_motion_network.occlusion
    m.warp, m.dec = regrouped_warp(m.warp), RegroupedSPADEDecoder(m.dec)
    if "plainocc" in name:
        m.warp.dense_motion_network.occlusion = plain_occ
    if "nchw_up1" in name:
        m.dec.up_1.conv_0 = NCHWConv(m.dec.up_1.conv_0)
    m = m.half()
    to_channels_last_(m)
    return m

def timeit(fn, args, iters=20):
    for _ in range(3): fn(*args)
    torch.cuda.synchronize()
    evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for s, e in evs:
        s.record(); fn(*args); e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in evs)

x = tuple(channels_last(t.half()) if t.dim() in (4, 5) else t.half() for t in inp)
rows = []
for name, mode in [("rewrites", "cudagraph"), ("rewrites+plainocc", "cudagraph"), ("rewrites+nchw_up1", "cudagraph"),
                   ("rewrites", "compile+cudagraph"), ("rewrites+plainocc", "compile+cudagraph"), ("rewrites+nchw_up1", "compile+cudagraph")]:
    try:
        m = variant(name)
        fn = m.forward
        t0 = time.perf_counter()
        if mode.startswith("compile"):
            fn = torch.compile(m.forward, mode="max-autotune-no-cudagraphs", dynamic=False) if False else torch.compile(m.forward, dynamic=False)
        with torch.inference_mode():
            for _ in range(2): fn(*x)
            torch.cuda.synchronize()
            static_in = tuple(t.clone() for t in x)
            gph = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                fn(*static_in)
            torch.cuda.current_stream().wait_stream(s)
            with torch.cuda.graph(gph):
                static_out = fn(*static_in)
            prep = time.perf_counter() - t0
            ms = timeit(gph.replay, ())
            err = rel_l2(static_out.float(), ref)
        print(f"{name:22s} {mode:18s} {ms:8.2f} ms/batch {B * 1e3 / ms:7.1f} fps  rel.err vs fp32 {err:.3e}  prep {prep:.0f} s", flush=True)
        del m, fn, gph
        torch.cuda.empty_cache()
    except Exception as e:
        print(f"{name} {mode}: ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
