"""An implicit-GEMM convolution in Triton for channels-last (NHWC) activations, fp16/bf16 or FP8.

Why: MuseTalk's VAE decoder is 78 % of its render FLOPs, and cuDNN runs its 128-channel convs at
256x256 at ~30 % of the H200's bf16 peak (benchmarks/RESULTS.md, "where the time goes"); PyTorch
exposes no FP8 convolution at all. This kernel does the convolution as one GEMM over output pixels
(M = B*OH*OW) x output channels (N) x taps-times-input-channels (K = KH*KW*C_in) without writing
the im2col matrix: each K step loads one tap's BLOCK_K input channels for BLOCK_M output pixels
straight from the NHWC input (zero where the tap falls in the padding), and the weight tile from a
[C_out, KH*KW*C_in] K-contiguous matrix (the operand layout FP8 tensor cores want). Bias and a
residual add (a resnet block's skip) are fused into the epilogue. Two loaders: ``pointer`` gathers
each row of the A tile (any shape; masked in the padding and past C_in when BLOCK_K does not
divide it) and ``tma`` (Hopper) loads each tap's input patch as one box of the 4-D [B, H, W, C]
tensor, whose out-of-bounds part the hardware fills with zeros — the padding for free.

FP8: the caller hands in ``float8_e4m3fn`` input and weight and their scales, ``x ≈ x_q * s_x``
(one scale for the tensor) and ``w[o] ≈ w_q[o] * s_w[o]`` (one per output channel); the kernel
multiplies on the FP8 tensor cores, accumulates in float32 and rescales in the epilogue.

The launcher (`conv2d_nhwc`) autotunes tile shapes per layer shape on CUDA. Triton's interpreter
(``TRITON_INTERPRET=1``) runs the same kernel on CPU tensors, which is how the tests check it.
"""
from __future__ import annotations

import functools
import inspect
import os

import torch

from .kernel_choice import BENCH_MS

# Imported on first use (`triton_available`): CUDA builds of torch ship Triton, CPU installs may
# lack it, and Triton reads TRITON_INTERPRET when it is imported, so a test can choose the CPU
# interpreter as long as nothing imported Triton before it.
triton = None
tl = None

__all__ = ["EXACT_STRIDES", "KERNELS", "K_ALIGN", "conv2d_nhwc", "interpreting", "k_waste", "tma_available", "tma_fits", "tma_width",
           "triton_available", "tuned_tiles", "TMA_WIDTHS"]

# The tag of a custom op that wants its inputs with the strides they had when traced (channels-last
# here), so Inductor writes them that way rather than in a layout the kernel would first copy.
EXACT_STRIDES = getattr(torch._C.Tag, "needs_exact_strides", None) or getattr(torch._C.Tag, "needs_fixed_stride_order")
FP8_MIN_BLOCK_K = 32  # the K of one FP8 tensor-core step (wgmma / mma e4m3); narrower tiles do not compile
K_ALIGN = 8  # input channels must be a multiple of this (16-byte rows for vector and TMA loads in fp16)
KERNELS = ("pointer", "tma")


# A constant to torch.compile: traced inline, the lazy import below made a graph guarded on "Triton
# not imported yet", which the next call threw away and compiled again (a whole engine compile).
@torch.compiler.assume_constant_result
def triton_available() -> bool:
    """Triton can be imported (and now is: the kernels below look ``triton``/``tl`` up here)."""
    global triton, tl
    if triton is None:
        try:
            import triton as _triton
            import triton.language as _tl
        except ImportError:
            return False
        triton, tl = _triton, _tl
    return True


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _configs() -> list:
    """Tile shapes to try: few, because each is compiled for every layer shape (the usual Hopper
    GEMM tiles; BLOCK_K 32 and 16 only for C_in that 64 does not divide)."""
    out = []
    for bm, bn, bk, warps, stages in (
        (128, 128, 64, 8, 3), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4), (128, 256, 64, 8, 3),
        (128, 128, 128, 8, 3), (128, 64, 32, 4, 4), (64, 64, 16, 4, 3),
    ):
        out.append(triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8},
                                 num_warps=warps, num_stages=stages))
    return out


def k_waste(c_in: int, block_k: int) -> float:
    """Share of a tap's K steps spent on masked channels when BLOCK_K does not divide C_in."""
    padded = -(-c_in // block_k) * block_k
    return (padded - c_in) / padded


def _operand_bytes(named_args: dict, kwargs: dict) -> int:
    """Bytes per element of the input operand (1 for FP8), from the pointer or the TMA descriptor."""
    x = kwargs.get("x_ptr", named_args.get("x_ptr"))
    if x is None:
        desc = kwargs.get("x_desc", named_args.get("x_desc"))
        x = desc.base if desc is not None else None
    return x.element_size() if x is not None else 2


def _prune(configs, named_args, **kwargs):
    """Keep tiles that waste at most a quarter of each tap's K steps on masked channels (BLOCK_K 16
    only where nothing wider does; FP8 tensor cores take K steps of 32 at least, so FP8 keeps the
    least wasteful of those) and whose BLOCK_N is not far wider than C_out."""
    c_in, c_out = kwargs.get("C_IN", named_args.get("C_IN")), kwargs.get("C_OUT", named_args.get("C_OUT"))
    min_k = FP8_MIN_BLOCK_K if _operand_bytes(named_args, kwargs) == 1 else 16
    usable = [c for c in configs if c.kwargs["BLOCK_K"] >= min_k]
    least = min(k_waste(c_in, c.kwargs["BLOCK_K"]) for c in usable)
    fits_k = [c for c in usable if k_waste(c_in, c.kwargs["BLOCK_K"]) <= max(0.25, least)]
    if any(c.kwargs["BLOCK_K"] >= 32 for c in fits_k):
        fits_k = [c for c in fits_k if c.kwargs["BLOCK_K"] >= 32]
    if any(c.kwargs["BLOCK_K"] >= 64 and k_waste(c_in, c.kwargs["BLOCK_K"]) == 0 for c in fits_k):
        fits_k = [c for c in fits_k if c.kwargs["BLOCK_K"] >= 64]  # channels a multiple of 64: the wide tiles
    return [c for c in fits_k if c.kwargs["BLOCK_N"] <= max(64, 2 * c_out)] or fits_k[:1]


def _autotune_options() -> dict:
    """Short timing runs (an engine tunes ~12 layer shapes x its batch buckets at start-up) and, where
    this Triton can, tuning results kept on disk beside the compiled kernels (a warm restart does not
    tune again)."""
    params = inspect.signature(triton.autotune).parameters
    opts: dict = {}
    if "cache_results" in params:
        opts["cache_results"] = True
    if "do_bench" in params:
        from triton.testing import do_bench

        opts["do_bench"] = lambda fn, quantiles: do_bench(fn, quantiles=quantiles, **BENCH_MS)
    elif "rep" in params:
        opts.update(BENCH_MS)
    return opts


def _tma_configs() -> list:
    """The TMA kernel's tiles: BLOCK_M output pixels as one BH x BW patch, BW chosen from the output
    width at launch (`tma_width`), BLOCK_M 128 or 64; BLOCK_N and BLOCK_K as in `_configs`. The
    pre-hook gives the host-side descriptors the tile's box shapes."""
    out = []
    for bm, tiles in (
        (128, ((128, 64, 8, 3), (64, 64, 4, 4), (256, 64, 8, 3), (128, 128, 8, 3), (64, 32, 4, 4), (64, 16, 4, 3))),
        (64, ((128, 64, 4, 4), (64, 64, 4, 4), (256, 64, 8, 3), (128, 128, 4, 3), (64, 32, 4, 4), (64, 16, 4, 3))),
    ):
        for bn, bk, warps, stages in tiles:
            out.append(triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, num_warps=warps,
                                     num_stages=stages, pre_hook=_set_boxes))
    return out


def _prune_tma(configs, named_args, **kwargs):
    """`_prune` over the tiles whose box rows take at most 128 bytes (the widest swizzled shared-memory
    row TMA writes: BLOCK_K 64 in fp16, 128 in FP8) and whose patch is whole rows of BW pixels, one
    row (BLOCK_M = BW): the box lands in shared memory as the [BLOCK_M, BLOCK_K] operand itself and
    the tensor cores read it in place (a taller patch is reshaped through registers first: seen in
    the kernel compiled for sm_90 by Triton 3.6 and 3.9; `TMA_WIDTHS`)."""
    desc = kwargs.get("x_desc", named_args.get("x_desc"))
    width = desc.base.element_size() if desc is not None else 2
    bw = kwargs.get("BW", named_args.get("BW")) or 128
    rows = [c for c in configs if c.kwargs["BLOCK_M"] == bw]
    keep = _prune([c for c in rows if c.kwargs["BLOCK_K"] * width <= 128], named_args, **kwargs)
    return keep or _prune(rows, named_args, **kwargs)


def _set_boxes(nargs: dict) -> None:
    nargs["x_desc"].block_shape = [1, nargs["BLOCK_M"] // nargs["BW"], nargs["BW"], nargs["BLOCK_K"]]
    nargs["w_desc"].block_shape = [nargs["BLOCK_N"], nargs["BLOCK_K"]]


def _pid_tiles(num_m, num_n, GROUP_M):
    """Grouped tile order: GROUP_M row tiles share each weight column tile while it is in L2."""
    pid = tl.program_id(0)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    group_size = min(num_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % group_size, (pid % per_group) // group_size


def _epilogue(acc, offs_m, m_ok, offs_n, bias_ptr, res_ptr, y_ptr, xs_ptr, ws_ptr, C_OUT, HAS_BIAS, HAS_RES, SCALED):
    """FP8 rescale, bias, residual, store: acc [BLOCK_M, BLOCK_N] float32 for output pixels offs_m."""
    n_ok = offs_n < C_OUT
    if SCALED:
        acc = acc * tl.load(xs_ptr) * tl.load(ws_ptr + offs_n, mask=n_ok, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    out_off = offs_m.to(tl.int64)[:, None] * C_OUT + offs_n[None, :]
    out_ok = m_ok[:, None] & n_ok[None, :]
    if HAS_RES:
        acc += tl.load(res_ptr + out_off, mask=out_ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + out_off, acc.to(y_ptr.dtype.element_ty), mask=out_ok)


def _conv_kernel(
    x_ptr, w_ptr, bias_ptr, res_ptr, y_ptr, xs_ptr, ws_ptr,
    M, H, W, OH, OW,
    C_IN: tl.constexpr, C_OUT: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr,
    PH: tl.constexpr, PW: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, SCALED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    """Pointer loads: BLOCK_M consecutive output pixels (any shapes), masked where a tap falls in
    the padding."""
    pid_m, pid_n = _pid_tiles(tl.cdiv(M, BLOCK_M), tl.cdiv(C_OUT, BLOCK_N), GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    ow = offs_m % OW
    oh = (offs_m // OW) % OH
    img = offs_m // (OW * OH)

    K_TOTAL: tl.constexpr = KH * KW * C_IN
    STEPS_PER_TAP: tl.constexpr = (C_IN + BLOCK_K - 1) // BLOCK_K
    EVEN_K: tl.constexpr = C_IN % BLOCK_K == 0  # else each tap's last step is masked to its channels
    w_cols = w_ptr + offs_n.to(tl.int64)[None, :] * K_TOTAL  # [1, BLOCK_N]
    n_ok = offs_n < C_OUT
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(0, KH * KW * STEPS_PER_TAP):
        tap = step // STEPS_PER_TAP
        ck = (step % STEPS_PER_TAP) * BLOCK_K + offs_k
        ih = oh + (tap // KW) - PH
        iw = ow + (tap % KW) - PW
        ok = m_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
        pix = ((img * H + ih) * W + iw).to(tl.int64) * C_IN
        if EVEN_K:
            a = tl.load(x_ptr + pix[:, None] + ck[None, :], mask=ok[:, None], other=0.0)
            b = tl.load(w_cols + (tap * C_IN + ck)[:, None], mask=n_ok[None, :], other=0.0)
        else:
            k_ok = ck < C_IN
            a = tl.load(x_ptr + pix[:, None] + ck[None, :], mask=ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(w_cols + (tap * C_IN + ck)[:, None], mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc = tl.dot(a, b, acc)
    _epilogue(acc, offs_m, m_ok, offs_n, bias_ptr, res_ptr, y_ptr, xs_ptr, ws_ptr, C_OUT, HAS_BIAS, HAS_RES, SCALED)


def _conv_kernel_tma(
    x_desc, w_desc, bias_ptr, res_ptr, y_ptr, xs_ptr, ws_ptr,
    NB, OH, OW,
    C_IN: tl.constexpr, C_OUT: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr,
    PH: tl.constexpr, PW: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, SCALED: tl.constexpr, BW: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    """Tensor-memory-accelerator loads: each tile is a BH x BW patch of one image's output pixels,
    and each tap's input patch one box of the 4-D [B, H, W, C] input whose out-of-bounds part (the
    zero padding) the hardware fills with zeros — no address arithmetic, no masks in the loop."""
    BH: tl.constexpr = BLOCK_M // BW
    tiles_w = tl.cdiv(OW, BW)
    tiles_h = tl.cdiv(OH, BH)
    pid_m, pid_n = _pid_tiles(NB * tiles_h * tiles_w, tl.cdiv(C_OUT, BLOCK_N), GROUP_M)
    ow0 = (pid_m % tiles_w) * BW
    oh0 = ((pid_m // tiles_w) % tiles_h) * BH
    img = pid_m // (tiles_w * tiles_h)
    n0 = pid_n * BLOCK_N

    # a tap's last step may reach past C_IN: the input box reads zeros there (out of bounds), so the
    # weights it meets (the next tap's, or zeros past the end) add nothing
    STEPS_PER_TAP: tl.constexpr = (C_IN + BLOCK_K - 1) // BLOCK_K
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(0, KH * KW * STEPS_PER_TAP):
        tap = step // STEPS_PER_TAP
        c0 = (step % STEPS_PER_TAP) * BLOCK_K
        a = x_desc.load([img, oh0 + tap // KW - PH, ow0 + tap % KW - PW, c0]).reshape(BLOCK_M, BLOCK_K)
        b = w_desc.load([n0, tap * C_IN + c0])  # [BLOCK_N, BLOCK_K], K-major
        acc = tl.dot(a, b.T, acc)

    r = tl.arange(0, BLOCK_M)
    oh = oh0 + r // BW
    ow = ow0 + r % BW
    offs_m = (img * OH + oh) * OW + ow
    _epilogue(acc, offs_m, (oh < OH) & (ow < OW), n0 + tl.arange(0, BLOCK_N), bias_ptr, res_ptr, y_ptr, xs_ptr, ws_ptr,
              C_OUT, HAS_BIAS, HAS_RES, SCALED)


@functools.lru_cache(maxsize=None)
def _kernels() -> dict:
    """{"pointer" | "tma": (kernel, its autotuned form)}, jitted on first use: ``triton.jit`` reads
    ``TRITON_INTERPRET`` when it decorates, so the interpreter can be chosen before the first call
    rather than before this module's import. The helpers are jitted into the module's globals,
    where the kernels look their names up."""
    if not triton_available():
        raise RuntimeError("the Triton convolution needs the 'triton' package")
    g = globals()
    for name in ("_pid_tiles", "_epilogue"):
        g[name] = triton.jit(_PLAIN[name])
    out = {}
    for name, fn, configs, key, prune in (
        ("pointer", _PLAIN["_conv_kernel"], _configs(), ["M", "H", "W"], _prune),
        ("tma", _PLAIN["_conv_kernel_tma"], _tma_configs(), ["NB", "OH", "OW", "BW"], _prune_tma),
    ):
        kernel = triton.jit(fn)
        tuned = triton.autotune(configs=configs, key=[*key, "C_IN", "C_OUT", "KH", "KW", "PH", "PW"],
                                prune_configs_by={"early_config_prune": prune}, **_autotune_options())(kernel)
        out[name] = (kernel, tuned)
    return out


_PLAIN = {f.__name__: f for f in (_pid_tiles, _epilogue, _conv_kernel, _conv_kernel_tma)}


def tuned_tiles() -> dict[str, dict[str, str]]:
    """The tile the autotuner chose for each layer shape tuned in this process, per kernel
    (``{"pointer": {autotune key: config}, ...}``): what a benchmark's timings were made with."""
    if _kernels.cache_info().currsize == 0:
        return {}
    return {name: {repr(key): str(config) for key, config in getattr(tuned, "cache", {}).items()}
            for name, (_, tuned) in _kernels().items()}


@functools.lru_cache(maxsize=None)
def _dummy(device: torch.device) -> torch.Tensor:
    return torch.zeros(1, dtype=torch.float32, device=device)


#: TMA patch widths: one output row of 128 or 64 pixels per tile. Taller patches of narrower rows
#: are reshaped through registers (slow: seen in the sm_90 code) and on the H200 (Triton 3.6) gave
#: wrong fp16 results for 32-wide layers (2e-1 relative error; twentieth session), so those layers
#: take the pointer kernel.
TMA_WIDTHS = (128, 64)


def tma_width(ow: int, block_m: int = 128) -> int | None:
    """The TMA kernel's patch width for an output ``ow`` pixels wide: the widest of `TMA_WIDTHS`
    that divides it and is at most ``block_m`` (no tile wasted on the right edge), or None (the
    pointer kernel)."""
    return next((bw for bw in TMA_WIDTHS if bw <= block_m and ow % bw == 0), None)


def tma_fits(x: torch.Tensor, packed: torch.Tensor, out_width: int) -> bool:
    """The TMA kernel can take this call: 16-byte rows of input channels and of packed weights (TMA's
    stride alignment) and an output width `tma_width` can tile."""
    return (x.shape[1] * x.element_size() % 16 == 0 and packed.shape[1] * packed.element_size() % 16 == 0
            and tma_width(out_width) is not None)


def tma_available(device: torch.device) -> bool:
    """Host-side tensor descriptors (Triton >= 3.4) and a GPU with a TMA unit (Hopper+), or the
    interpreter."""
    try:
        if not triton_available():
            return False
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
    except ImportError:
        return False
    if interpreting():
        return True
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (9, 0)


def conv2d_nhwc(
    x: torch.Tensor,
    weight: torch.Tensor,
    kernel_size: tuple[int, int],
    padding: tuple[int, int],
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    x_scale: torch.Tensor | None = None,
    w_scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    block: tuple[int, int, int] | None = None,
    kernel: str = "pointer",
) -> torch.Tensor:
    """A stride-1, undilated, ungrouped, zero-padded 2-D convolution of a channels-last ``x``.

    ``x``: [B, C_in, H, W] in ``torch.channels_last`` (NHWC in memory), fp16 / bf16 / float32, or
    ``float8_e4m3fn`` with ``x_scale`` (0-d or [1] float32). ``weight``: the packed matrix
    [C_out, KH*KW*C_in] (row o = W[o] laid out tap-major, channel-minor), same kind as ``x``; FP8
    weights need ``w_scale`` [C_out] float32. ``residual``: [B, C_out, OH, OW] channels-last, added
    after the bias. Returns [B, C_out, OH, OW] channels-last in ``out_dtype`` (default: ``x``'s
    dtype; FP8 input needs one). ``kernel``: ``"pointer"`` (any shape) or ``"tma"`` (Hopper's
    tensor-memory accelerator; needs `tma_width` of the output width). ``block`` fixes (BLOCK_M,
    BLOCK_N, BLOCK_K) instead of autotuning (the interpreter, tests).
    """
    if not triton_available():
        raise RuntimeError("the Triton convolution needs the 'triton' package")
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    kh, kw = kernel_size
    ph, pw = padding
    b, c_in, h, w = x.shape
    c_out = weight.shape[0]
    if weight.shape != (c_out, kh * kw * c_in):
        raise ValueError(f"packed weight must be [C_out, {kh * kw * c_in}], got {tuple(weight.shape)}")
    if c_in % K_ALIGN:
        raise ValueError(f"C_in must be a multiple of {K_ALIGN}, got {c_in}")
    scaled = x.dtype == torch.float8_e4m3fn
    if scaled != (weight.dtype == torch.float8_e4m3fn) or scaled != (x_scale is not None and w_scale is not None):
        raise ValueError("FP8 needs float8_e4m3fn input and weight and both scales; other dtypes take none")
    if not scaled and weight.dtype != x.dtype:
        raise ValueError(f"weight dtype {weight.dtype} differs from input dtype {x.dtype}")
    if out_dtype is None:
        if scaled:
            raise ValueError("FP8 input needs an out_dtype")
        out_dtype = x.dtype
    oh, ow = h + 2 * ph - kh + 1, w + 2 * pw - kw + 1
    if oh <= 0 or ow <= 0:
        raise ValueError(f"kernel {kernel_size} with padding {padding} does not fit a {h}x{w} input")
    x = x.contiguous(memory_format=torch.channels_last)
    weight = weight.contiguous()
    y = torch.empty((b, c_out, oh, ow), dtype=out_dtype, device=x.device, memory_format=torch.channels_last)
    if residual is not None:
        if residual.shape != y.shape:
            raise ValueError(f"residual shape {tuple(residual.shape)} differs from the output's {tuple(y.shape)}")
        residual = residual.contiguous(memory_format=torch.channels_last)
    dummy = _dummy(x.device)
    tail = (bias if bias is not None else dummy, residual if residual is not None else dummy, y,
            x_scale if scaled else dummy, w_scale if scaled else dummy)
    flags = dict(C_IN=c_in, C_OUT=c_out, KH=kh, KW=kw, PH=ph, PW=pw, HAS_BIAS=bias is not None,
                 HAS_RES=residual is not None, SCALED=scaled)
    if x.device.type != "cuda" and not interpreting():
        raise ValueError(f"the Triton convolution runs on CUDA (or in Triton's interpreter), not on {x.device}")
    if block is None and interpreting():  # small fixed tiles; a TMA tile is one row of TMA_WIDTHS pixels
        block = (64 if kernel == "tma" else 32, 32, 32 if c_in >= 32 else 16)
    plain, tuned = _kernels()[kernel]
    if kernel == "pointer":
        m = b * oh * ow
        args = (x, weight, *tail, m, h, w, oh, ow)
        fixed = None if block is None else dict(BLOCK_M=block[0], BLOCK_N=block[1], BLOCK_K=block[2], GROUP_M=8)

        def grid(meta):
            return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(c_out, meta["BLOCK_N"]),)
    else:
        from triton.tools.tensor_descriptor import TensorDescriptor

        bm = 128 if block is None else block[0]
        bw = tma_width(ow, bm)
        if bw is None or not tma_fits(x, weight, ow) or not tma_available(x.device):
            raise ValueError(f"the TMA kernel needs Hopper+, 16-byte channel rows and an output width that one of {TMA_WIDTHS} divides; "
                             f"got {c_in} channels of {x.dtype}, output width {ow}")
        bk, bn = (block[2], block[1]) if block is not None else (16, 16)  # boxes reset per tile config
        x_desc = TensorDescriptor(x, [b, h, w, c_in], [h * w * c_in, w * c_in, c_in, 1], [1, bm // bw, bw, bk])
        w_desc = TensorDescriptor(weight, [c_out, kh * kw * c_in], [kh * kw * c_in, 1], [bn, bk])
        args = (x_desc, w_desc, *tail, b, oh, ow)
        flags["BW"] = bw
        fixed = None if block is None else dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8)

        def grid(meta):
            bh = meta["BLOCK_M"] // bw
            return (b * triton.cdiv(oh, bh) * triton.cdiv(ow, bw) * triton.cdiv(c_out, meta["BLOCK_N"]),)
    if fixed is not None:
        plain[grid(fixed)](*args, **flags, **fixed)
    else:
        tuned[grid](*args, **flags)
    return y
