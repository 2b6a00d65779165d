"""Compile the Triton convolution's kernels (and the GroupNorm statistics kernel) for Hopper (sm_90) on a machine without a GPU.

Why: every tile the autotuner may pick for the engines' layer shapes has to compile for the GPU it
runs on (FP8 tensor cores take K steps of 32; TMA boxes; shared memory within the H200's 227 KiB per
block), and CI has no GPU. Given a target, Triton compiles to a cubin with the ptxas it ships; the
launch-time specialisation (16-byte aligned pointers, integers that 16 divides) is restated here so
the kernel compiled is the one a launch would build. The compiled IR also says whether the loads
are pipelined and where the tensor cores read their operands.

Run where ``TRITON_INTERPRET`` is unset (the tests' own process runs kernels in the interpreter):

    python tests/triton_sm90_compile.py    # one JSON line per kernel compiled, then a summary line
"""
from __future__ import annotations

import inspect
import json
import multiprocessing
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import torch

SM90_SHARED_BYTES = 232448  # the most shared memory one block may take on an H100/H200
_TYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float8_e4m3fn: "fp8e4nv", torch.float32: "fp32"}


@dataclass(frozen=True)
class LayerShape:
    """One convolution call: input [batch, c_in, h, w] channels-last, a kh x kw kernel, zero padding."""

    c_in: int
    c_out: int
    kh: int
    kw: int
    ph: int
    pw: int
    h: int
    w: int
    batch: int = 32
    residual: bool = False

    @property
    def out_hw(self) -> tuple[int, int]:
        return self.h + 2 * self.ph - self.kh + 1, self.w + 2 * self.pw - self.kw + 1


#: The shapes that exercise each branch: MuseTalk's VAE decoder levels (512 channels at 32 and 64 wide,
#: 128 at 256: no TMA, 64- and 128-pixel TMA rows; a 1x1 shortcut with the residual fused; a 2x2 phase
#: conv, 65 wide: no TMA), and
#: channel counts that leave a tap's last K step partly masked (Ditto's 16-, 48- and 144-channel layers).
SHAPES = (
    LayerShape(512, 512, 3, 3, 1, 1, 32, 32),
    LayerShape(512, 512, 3, 3, 1, 1, 64, 64),
    LayerShape(128, 128, 3, 3, 1, 1, 256, 256),
    LayerShape(512, 256, 1, 1, 0, 0, 128, 128, residual=True),
    LayerShape(512, 256, 2, 2, 1, 1, 64, 64),
    LayerShape(16, 64, 3, 3, 1, 1, 64, 64),
    LayerShape(48, 96, 3, 3, 1, 1, 64, 64),
    LayerShape(144, 168, 7, 7, 3, 3, 64, 64, batch=8),
)


def _spec(value: int) -> list:
    return [["tt.divisibility", 16]] if value % 16 == 0 else []


def compile_layer(shape: LayerShape, dtype: torch.dtype, kernel: str, target_arch: int = 90) -> list[dict]:
    """Compile every tile the autotuner would try for this call (after its pruning); one record each."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from newsstudio.accel import triton_conv as tc

    tc.triton_available()
    plain, _ = tc._kernels()[kernel]
    oh, ow = shape.out_hw
    scaled = dtype == torch.float8_e4m3fn
    flags = dict(C_IN=shape.c_in, C_OUT=shape.c_out, KH=shape.kh, KW=shape.kw, PH=shape.ph, PW=shape.pw,
                 HAS_BIAS=True, HAS_RES=shape.residual, SCALED=scaled)
    x = torch.empty(1, 1, 1, shape.c_in, dtype=dtype)  # stands for the input in the pruning rules
    out_type = "fp16"
    if kernel == "tma":
        bw = tc.tma_width(ow)
        if bw is None:
            return []
        flags["BW"] = bw
        from triton.tools.tensor_descriptor import TensorDescriptor

        desc = TensorDescriptor(x, [1, 1, 1, shape.c_in], [shape.c_in] * 3 + [1], [1, 1, 1, 8])
        configs = tc._prune_tma(tc._tma_configs(), {"x_desc": desc}, **flags)
        ints = {"NB": shape.batch, "OH": oh, "OW": ow}
    else:
        configs = tc._prune(tc._configs(), {"x_ptr": x}, **flags)
        ints = {"M": shape.batch * oh * ow, "H": shape.h, "W": shape.w, "OH": oh, "OW": ow}
    params = list(inspect.signature(plain.fn).parameters)
    records = []
    for config in configs:
        meta = {**flags, **config.kwargs}
        sig = {"bias_ptr": f"*{out_type}", "res_ptr": f"*{out_type}" if shape.residual else "*fp32",
               "y_ptr": f"*{out_type}", "xs_ptr": "*fp32", "ws_ptr": "*fp32"}
        if kernel == "tma":
            bk, bm = meta["BLOCK_K"], meta["BLOCK_M"]
            sig["x_desc"] = f"tensordesc<{_TYPES[dtype]}[1,{bm // bw},{bw},{bk}]>"
            sig["w_desc"] = f"tensordesc<{_TYPES[dtype]}[{meta['BLOCK_N']},{bk}]>"
        else:
            sig["x_ptr"] = sig["w_ptr"] = f"*{_TYPES[dtype]}"
        sig.update({name: "i32" for name in ints})
        sig.update({name: "constexpr" for name in meta})
        sig = {p: sig[p] for p in params}
        attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(params) if sig[p].startswith("*")}
        attrs.update({(params.index(name),): _spec(value) for name, value in ints.items() if _spec(value)})
        src = ASTSource(fn=plain, signature=sig, constexprs={(params.index(k),): v for k, v in meta.items()},
                        attrs=attrs)
        record = {"shape": [shape.c_in, shape.c_out, shape.kh, shape.kw, shape.h, shape.w], "dtype": _TYPES[dtype],
                  "kernel": kernel, "tile": [meta["BLOCK_M"], meta["BLOCK_N"], meta["BLOCK_K"]],
                  "warps": config.num_warps, "stages": config.num_stages}
        try:
            compiled = triton.compile(src, target=GPUTarget("cuda", target_arch, 32),
                                      options={"num_warps": config.num_warps, "num_stages": config.num_stages})
        except Exception as exc:  # noqa: BLE001 - reported per tile, the caller decides
            record["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            records.append(record)
            continue
        ttgir = compiled.asm["ttgir"]
        loop = ttgir[ttgir.find("scf.for"):]
        record.update(
            shared=compiled.metadata.shared,
            async_loads=len(re.findall(r"async_copy_global_to_local|async_tma_copy_global_to_local", loop)),
            tensor_core_ops=len(re.findall(r"warp_group_dot ", loop)),
            operand_a_from_registers="dot_op<{opIdx = 0" in loop,
        )
        records.append(record)
    return records


#: GroupNorm statistics (accel/group_norm_nhwc.py), per channel: the decoders' channel counts and
#: the UNet's (not powers of two: masked channels).
NORM_CHANNELS = (64, 128, 256, 512, 320, 640, 1280)


def compile_group_norm(channels: int, dtype: torch.dtype, which: str = "chunked", target_arch: int = 90) -> dict:
    """Compile a statistics kernel ("chunked", "streaming"), the apply kernel (with SiLU) or the SPADE
    modulation kernel (with LeakyReLU) as a launch of it would: its chunk of pixels, 4 warps."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from newsstudio.accel import group_norm_nhwc as gn

    kernel = gn._kernels()[which]
    params = list(inspect.signature(kernel.fn).parameters)
    block_p = {"modulate": gn._modulate_pixels, "apply": gn._chunk_pixels}.get(  # as each launch sizes its block
        which, lambda c: gn._layout(c, 1 << 16, which)[0])(channels)
    meta = {"C": channels, "BLOCK_C": gn._block_c(channels), "BLOCK_P": block_p}
    x, y = f"*{_TYPES[dtype]}", f"*{_TYPES[dtype]}"
    if which in gn.STATISTICS_KERNELS:
        sig = {"x_ptr": x, "out_ptr": "*fp32", "HW": "i32", "STRIDE_N": "i32", "CHUNKS": "i32", "SPLITS": "i32"}
    elif which == "apply":
        meta["SILU"] = True
        sig = {"x_ptr": x, "scale_ptr": "*fp32", "shift_ptr": "*fp32", "y_ptr": y, "HW": "i32"}
    else:
        meta["ACT"] = True
        sig = {"x_ptr": x, "scale_ptr": "*fp32", "shift_ptr": "*fp32", "gb_ptr": x, "y_ptr": y, "HW": "i32", "slope": "fp32"}
    sig.update({k: "constexpr" for k in meta})
    attrs = {(params.index(p),): [["tt.divisibility", 16]] for p in params if sig[p].startswith("*") or p in ("HW", "STRIDE_N")}
    src = ASTSource(fn=kernel, signature={p: sig[p] for p in params},
                    constexprs={(params.index(k),): v for k, v in meta.items()}, attrs=attrs)
    record = {"kernel": which, "dtype": _TYPES[dtype],
              "shape": [channels]}
    try:
        compiled = triton.compile(src, target=GPUTarget("cuda", target_arch, 32), options={"num_warps": 4})
    except Exception as exc:  # noqa: BLE001 - reported per shape, the caller decides
        record["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return record
    loads = re.findall(r"ld\.global(?:\.[a-z0-9]+)*", compiled.asm["ptx"])
    record.update(shared=compiled.metadata.shared, loads=len(loads), vector_loads=sum(".v4" in x or ".v2" in x for x in loads))
    return record


def main() -> int:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("unset TRITON_INTERPRET: this compiles for the GPU", file=sys.stderr)
        return 2
    layer_jobs = [(shape, dtype, kernel) for shape in SHAPES for dtype in (torch.float16, torch.float8_e4m3fn)
                  for kernel in ("pointer", "tma")]
    norm_jobs = [(channels, dtype, which) for channels in NORM_CHANNELS
                 for dtype, which in ((torch.float16, "chunked"), (torch.float32, "chunked"), (torch.float16, "streaming"),
                                      (torch.float32, "streaming"), (torch.float16, "apply"), (torch.float16, "modulate"))]
    failures = 0
    count = 0
    # each compile is one CPU's work (Triton's passes, then ptxas): one worker per CPU, records in order
    workers = max(1, min(len(os.sched_getaffinity(0)), 8))
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for records in pool.map(compile_layer, *zip(*layer_jobs)):
            for record in records:
                count += 1
                bad = "error" in record or record["shared"] > SM90_SHARED_BYTES or not record["async_loads"]
                failures += bad
                print(json.dumps(record), flush=True)
        for record in pool.map(compile_group_norm, *zip(*norm_jobs)):
            count += 1
            failures += "error" in record or record["shared"] > SM90_SHARED_BYTES
            print(json.dumps(record), flush=True)
    print(json.dumps({"compiled": count, "failures": failures}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
