"""Which of MuseTalk's decoder norms take the NHWC kernels under torch.compile, and which fall back
to PyTorch's reductions, as Dynamo traces ``engine._faces`` (the graph Inductor then compiles).

    python -m benchmarks.norm_paths [--variants compile+cudagraph,compile+cudagraph:rows104]

The kernels need a channels-last *contiguous* map; a map that is not (a row slice, an NCHW
interleave, an op whose output layout differs on CUDA) silently takes the fallback, which costs
a copy to NCHW and a reduction per norm. Dynamo is run with a backend that only reads the graph
(no Inductor compile: seconds per variant), at a dynamic batch as `BucketedRunner` compiles it.
Per variant: the count of kernel and fallback norms, and each fallback's input shape, strides and
source line.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

import torch

from .common import machine, parse_variant, variant_list, write_json

KERNEL_OPS = ("group_norm_partials",)
FALLBACK_OPS = ("native_group_norm", "var_mean", "group_norm")
DECODER_FILES = ("autoencoders/vae.py", "lower_face_decoder.py")


def norm_nodes(gm: torch.fx.GraphModule) -> list[dict[str, Any]]:
    out = []
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        target = str(n.target)
        path = "kernel" if any(k in target for k in KERNEL_OPS) else (
            "fallback" if any(k in target for k in FALLBACK_OPS) else None)
        stack = n.meta.get("stack_trace") or ""
        if path is None or not any(f in stack for f in DECODER_FILES):  # the UNet's norms are PyTorch's by design
            continue
        arg = n.args[0] if n.args else None
        v = arg.meta.get("example_value") if isinstance(arg, torch.fx.Node) else None
        lines = [ln.strip() for ln in stack.strip().splitlines()]
        where = next((lines[i] for i in range(len(lines) - 1, -1, -1) if lines[i].startswith("File")), "")
        out.append({"path": path, "op": getattr(n.target, "__name__", target),
                    "shape": [str(s) for s in v.shape] if v is not None else None,
                    "stride": [str(s) for s in v.stride()] if v is not None else None,
                    "channels_last": bool(v.is_contiguous(memory_format=torch.channels_last)) if v is not None else None,
                    "where": where.split("/")[-1][:120]})
    return out


def trace(engine, batch: int) -> list[dict[str, Any]]:
    """The norms of one Dynamo trace of ``engine._faces`` at a dynamic batch dimension."""
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    fn = torch.compile(engine._faces, backend=backend, dynamic=None)
    with torch.inference_mode():
        inputs = engine.example_face_inputs(batch)
        for x in inputs:  # marked dynamic: the dynamic-batch graph the runner's buckets share
            torch._dynamo.maybe_mark_dynamic(x, 0)
        fn(*inputs)
    torch._dynamo.reset()
    return [n for gm in graphs[-1:] for n in norm_nodes(gm)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--variants", default="compile+cudagraph,compile+cudagraph:rows104")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--tiny", action="store_true", help="the test-size architecture")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from newsstudio.engines.musetalk.engine import TINY_UNET_CONFIG, TINY_VAE_CONFIG, MuseTalkEngine

    tiny = {"unet_config": TINY_UNET_CONFIG, "vae_config": TINY_VAE_CONFIG} if args.tiny else {}
    result: dict[str, Any] = {"machine": machine(), "args": vars(args), "variants": {},
                              "command": "python -m benchmarks.norm_paths " + " ".join(argv or sys.argv[1:])}
    for spec in variant_list(args.variants) or []:
        kw = parse_variant(spec, "musetalk")
        if args.device == "cpu":  # no compile on the CPU; the layouts are what matters here
            kw.update(accel="eager", channels_last=True, nhwc_norms=True)
        engine = MuseTalkEngine(args.device, weights="random", **kw, **tiny)
        nodes = trace(engine, args.batch)
        counts = {p: sum(1 for n in nodes if n["path"] == p) for p in ("kernel", "fallback")}
        result["variants"][spec] = {"counts": counts, "norms": nodes}
        print(f"== {spec}: {counts['kernel']} norms on the NHWC kernels, {counts['fallback']} on PyTorch's", flush=True)
        for n in nodes:
            if n["path"] == "fallback":
                print(f"  fallback {n['op']} {n['shape']} strides {n['stride']} channels-last {n['channels_last']}"
                      f"  {n['where']}", flush=True)
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
