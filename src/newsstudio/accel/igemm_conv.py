"""`TritonConv2d`: a plain Conv2d run by the Triton implicit-GEMM kernel, in half precision or FP8.

Why: the render's remaining time is convolutions that cuDNN runs well below the tensor cores'
peak, and PyTorch has no FP8 convolution (accel/triton_conv.py says more). This module holds the
packed weight the kernel wants and calls it through a registered custom op
(``newsstudio::triton_conv2d``), so ``torch.compile`` keeps it as one opaque call with a known
output shape and CUDA graphs capture it like any kernel.

FP8 (mode ``"fp8"`` or ``"fp8-static"``): the weight is quantised once to ``float8_e4m3fn`` with
one scale per output channel (amax / 448); the input with one scale for the whole tensor, either
its amax on every call (``"fp8"``: computed on the GPU, no host sync, graph-capturable, but one
more pass over the input) or a scale fixed beforehand from the largest input seen while
`calibrate_fp8_` runs sample inputs (``"fp8-static"``: the quantisation is then one elementwise op
that ``torch.compile`` fuses into the op before it; larger inputs later saturate at +-448 x scale).

By default each layer shape runs whichever is fastest on this GPU of the two Triton kernels and, in
half precision, cuDNN itself (kernel_choice.py: timed once per shape on first use, like cuDNN's own
autotuning), so swapping a network's convs never makes a layer slower than cuDNN made it.

Where the kernel cannot run (no CUDA tensor, no Triton) the module calls ``F.conv2d`` with the
original weight, so a converted model still works on a CPU. `convert_convs_to_triton_` swaps the
eligible layers of a model that is already on its device and in its final dtype.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .depth_sliced_conv3d import DepthSlicedConv3d
from .fp8 import E4M3, E4M3_MAX, fp8_supported, quantize_e4m3
from .kernel_choice import fastest
from .shared_copy import shared_copy
from .triton_conv import EXACT_STRIDES, K_ALIGN, KERNELS, conv2d_nhwc, interpreting, tma_available, tma_fits, triton_available
from .upsample_conv import PhaseUpsampleConv

__all__ = ["CALIBRATED_MODES", "CONV_MODES", "ENGINE_FP8_HEADROOM", "TRITON_CONV_MODES", "TritonConv2d", "calibrate_fp8_", "channels_fit", "convert_convs_for_mode_", "convert_convs_to_triton_", "eligible_conv", "pack_weight",
           "slot_padding", "triton_conv_supported", "with_triton_convs"]

#: What one `TritonConv2d` computes in.
CONV_MODES = ("half", "fp8", "fp8-static")
#: An engine's setting: ``"mixed"`` is fp8-static on the convs the network names as FP8-safe (its
#: ``fp8_convs`` selection: where FP8's 3-bit mantissa costs least accuracy) and half elsewhere.
#: (A ``"select"`` setting, half on the convs cuDNN runs slowly only, was dropped: Ditto's 7x7 mask conv,
#: the one it named, ran slower on the kernel than on cuDNN on an H100; benchmarks/RESULTS.md, 38th session.)
TRITON_CONV_MODES = ("off", *CONV_MODES, "mixed")
#: The settings whose converted network needs `calibrate_fp8_` before it runs.
CALIBRATED_MODES = ("fp8-static", "mixed")
#: fp8-static's scale covers this many times the largest input seen while calibrating (one binade of
#: e4m3's range given up so that a brighter face than the calibration's does not saturate).
ENGINE_FP8_HEADROOM = 2.0
log = logging.getLogger(__name__)
MIN_OUT_CHANNELS = 16  # narrower outputs (RGB heads) fill no tensor-core tile: cuDNN keeps them
MIN_IN_CHANNELS = 16  # a narrower input (an RGB or latent stem) is a K too short for a tensor-core step


@torch.library.custom_op("newsstudio::triton_conv2d", mutates_args=(), tags=(EXACT_STRIDES,))
def _triton_conv2d(x: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                   residual: torch.Tensor | None, x_scale: torch.Tensor | None, w_scale: torch.Tensor | None,
                   kh: int, kw: int, ph: int, pw: int, out_dtype: torch.dtype, implementation: str) -> torch.Tensor:
    """``implementation``: one of triton_conv.KERNELS, or "auto": the fastest of them and (given the plain
    ``weight``, half precision) cuDNN, per shape (kernel_choice.py). (Not named ``kernel``: Inductor's
    fallback for a custom op can pass its arguments as keywords to ``FallbackKernel.create(kernel, ...)``.)"""
    def triton_call(name: str) -> Callable[[], torch.Tensor]:
        return lambda: conv2d_nhwc(x, packed, (kh, kw), (ph, pw), bias=bias, residual=residual, x_scale=x_scale,
                                   w_scale=w_scale, out_dtype=out_dtype, kernel=name)

    if implementation != "auto":
        return triton_call(implementation)()
    candidates = {"pointer": triton_call("pointer")}
    if tma_fits(x, packed, x.shape[3] + 2 * pw - kw + 1) and tma_available(x.device):
        candidates["tma"] = triton_call("tma")
    if weight is not None:
        candidates["cudnn"] = lambda: _cudnn_conv(x, weight, bias, residual, (ph, pw))
    key = ("conv2d", tuple(x.shape), x.dtype, tuple(packed.shape), packed.dtype, (kh, kw), (ph, pw),
           bias is not None, residual is not None)
    return candidates[fastest(key, candidates, timing=x.is_cuda and not interpreting())]()


def _cudnn_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None,
                padding: tuple[int, int]) -> torch.Tensor:
    y = F.conv2d(x, weight, bias, padding=padding)
    y = y if residual is None else y + residual
    return y.contiguous(memory_format=torch.channels_last)  # the layout the op promises (its fake says so)


@_triton_conv2d.register_fake
def _(x, packed, weight, bias, residual, x_scale, w_scale, kh, kw, ph, pw, out_dtype, implementation):
    b, _, h, w = x.shape
    return torch.empty((b, packed.shape[0], h + 2 * ph - kh + 1, w + 2 * pw - kw + 1), dtype=out_dtype,
                       device=x.device, memory_format=torch.channels_last)


def triton_conv_supported(device: torch.device | str) -> bool:
    """The kernel can run on ``device``: a CUDA device with Triton, or any device in Triton's
    interpreter."""
    return triton_available() and (torch.device(device).type == "cuda" or interpreting())


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """[C_out, C_in, KH, KW] -> [C_out, KH*KW*C_in], tap-major, channel-minor (the kernel's K order)."""
    return weight.permute(0, 2, 3, 1).reshape(weight.shape[0], -1).contiguous()


def channels_fit(c_in: int, c_out: int) -> bool:
    """At least 16 input channels in a multiple of 8, and at least 16 outputs."""
    return c_in % K_ALIGN == 0 and c_in >= MIN_IN_CHANNELS and c_out >= MIN_OUT_CHANNELS


def eligible_conv(conv: nn.Module) -> bool:
    """A Conv2d the kernel computes: stride 1, undilated, ungrouped, zero-padded by integers, and
    channels that fit (`channels_fit`)."""
    return (isinstance(conv, nn.Conv2d) and conv.stride == (1, 1) and conv.dilation == (1, 1)
            and conv.groups == 1 and conv.padding_mode == "zeros" and not isinstance(conv.padding, str)
            and channels_fit(conv.in_channels, conv.out_channels))


class TritonConv2d(nn.Module):
    """``F.conv2d(x, weight, bias, padding=padding)`` (stride 1) by the Triton kernel, channels-last
    output in the weight's dtype (an input of another dtype is cast first, as autocast would);
    optionally ``+ residual`` in the same kernel. ``mode``: ``"half"`` (the weight's own dtype),
    ``"fp8"`` or ``"fp8-static"`` (see the module doc). ``kernel``: ``"pointer"``, ``"tma"`` or
    ``"auto"`` (the fastest of those and, in half precision, cuDNN, timed per shape on first use)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, padding: tuple[int, int],
                 mode: str = "half", kernel: str = "auto") -> None:
        super().__init__()
        w = weight.detach()
        if w.dim() != 4 or w.shape[1] % K_ALIGN:
            raise ValueError(f"TritonConv2d needs a [C_out, C_in, KH, KW] weight with C_in a multiple of {K_ALIGN}, "
                             f"got {tuple(w.shape)}")
        if mode not in CONV_MODES:
            raise ValueError(f"TritonConv2d mode must be one of {CONV_MODES}, got {mode!r}")
        if kernel not in ("auto", *KERNELS):
            raise ValueError(f"TritonConv2d kernel must be 'auto' or one of {KERNELS}, got {kernel!r}")
        self.kernel = kernel
        self.kernel_size = (int(w.shape[2]), int(w.shape[3]))
        self.padding = (int(padding[0]), int(padding[1]))
        self.mode = mode
        self.fp8 = mode != "half"
        self.weight = nn.Parameter(w, requires_grad=False)  # the F.conv2d fallback's
        self.bias = nn.Parameter(bias.detach(), requires_grad=False) if bias is not None else None
        packed = pack_weight(w)
        if self.fp8:
            q, scale = quantize_e4m3(packed, "row")  # one scale per output channel
            self.register_buffer("packed", q)
            self.register_buffer("w_scale", scale.squeeze(1))
        else:
            self.register_buffer("packed", packed)
            self.w_scale = None
        # fp8-static: the input's scale (and its reciprocal), set by calibrate_fp8_
        self.register_buffer("x_scale", torch.ones(1, device=w.device))
        self.register_buffer("x_inv_scale", torch.ones(1, device=w.device))
        self.calibrated = False
        self._amax: torch.Tensor | None = None  # running input amax while calibrating

    @classmethod
    def from_conv(cls, conv: nn.Conv2d, mode: str = "half", kernel: str = "auto") -> TritonConv2d:
        if not eligible_conv(conv):
            raise ValueError(f"not a convolution the Triton kernel computes: {conv}")
        return cls(conv.weight, conv.bias, conv.padding, mode, kernel)

    def extra_repr(self) -> str:
        o, _, kh, kw = self.weight.shape
        return (f"{self.weight.shape[1]}, {o}, kernel_size=({kh}, {kw}), padding={self.padding}, mode={self.mode}, "
                f"kernel={self.kernel}")

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if not triton_conv_supported(x.device):
            y = F.conv2d(x, self.weight, self.bias, padding=self.padding)
            return y if residual is None else y + residual
        (kh, kw), (ph, pw) = self.kernel_size, self.padding
        out_dtype = self.weight.dtype  # the network's dtype, as a conv under autocast gives
        residual = None if residual is None else _nhwc(residual)
        if not self.fp8:
            return _triton_conv2d(_nhwc(x.to(out_dtype)), self.packed, self.weight, self.bias, residual, None, None, kh, kw, ph, pw,
                                  out_dtype, self.kernel)
        if self.mode == "fp8-static" and self._amax is None:
            if not self.calibrated:
                raise RuntimeError("an fp8-static TritonConv2d needs calibrate_fp8_ before it runs")
            xq = _nhwc((x * self.x_inv_scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3))
            return _triton_conv2d(xq, self.packed, None, self.bias, residual, self.x_scale, self.w_scale, kh, kw, ph, pw,
                                  out_dtype, self.kernel)
        if self._amax is not None:  # calibrating
            self._amax = torch.maximum(self._amax, x.abs().amax().float())
        xq, x_scale = quantize_e4m3(x, "tensor")
        return _triton_conv2d(_nhwc(xq), self.packed, None, self.bias, residual, x_scale.reshape(1), self.w_scale, kh, kw, ph, pw,
                              out_dtype, self.kernel)


def _nhwc(t: torch.Tensor) -> torch.Tensor:
    """``t`` channels-last, converted here in the traced graph rather than inside the op: Inductor
    then writes the producer's output (GroupNorm + SiLU, the FP8 quantisation) in that layout in
    the same kernel, where a copy inside the opaque op would be one more pass over the activation
    (the meta GroupNorm, like CUDA's, returns NCHW whatever its input's layout). A no-op when
    ``t`` is channels-last already."""
    return t.contiguous(memory_format=torch.channels_last)


def calibrate_fp8_(module: nn.Module, run: Callable[[], object], headroom: float = 1.0) -> int:
    """Fix the input scale of every ``"fp8-static"`` `TritonConv2d` in ``module`` from the largest
    input it sees while ``run()`` (sample forwards; dynamically scaled meanwhile) executes, times
    ``headroom``; returns how many were calibrated. A conv ``run()`` does not reach (a VAE's encoder
    while decoding) stays uncalibrated and refuses to run later; none reached is an error. Run it
    eagerly, before compiling or capturing a graph."""
    if not headroom >= 1.0:
        raise ValueError(f"headroom must be >= 1, got {headroom!r}")
    convs = [m for m in module.modules() if isinstance(m, TritonConv2d) and m.mode == "fp8-static"]
    for m in convs:
        m._amax = torch.zeros((), device=m.packed.device)
    try:
        with torch.inference_mode():
            run()
        seen = [m for m in convs if bool(m._amax > 0)]
        if convs and not seen:
            raise RuntimeError("calibration saw no input (or only zeros) for any fp8-static convolution")
        for m in seen:
            scale = (m._amax * headroom / E4M3_MAX).reshape(1)
            m.x_scale.copy_(scale)
            m.x_inv_scale.copy_(1.0 / scale)
            m.calibrated = True
    finally:
        for m in convs:
            m._amax = None
    return len(seen)


def slot_padding(m: nn.Module) -> tuple[int, int] | None:
    """The padding of the 2-D convolution inside one of our exact rewrites that has a ``conv`` slot
    for another implementation (a phase conv; a depth-sliced 3-D conv's slice conv), or None."""
    if isinstance(m, PhaseUpsampleConv):
        return (1, 1)
    if isinstance(m, DepthSlicedConv3d) and m.slice_conv is None:
        return (m.padding[1], m.padding[2])
    return None


def convert_convs_to_triton_(module: nn.Module, mode: str = "half", *, kernel: str = "auto",
                             filter: Callable[[str, nn.Module], bool] | None = None,  # noqa: A002
                             force: bool = False) -> int:
    """Swap, in place, every eligible ``nn.Conv2d`` of ``module`` (and the 2-D convolution inside each
    `PhaseUpsampleConv` and `DepthSlicedConv3d`) for a `TritonConv2d`; returns how many. Call it after
    the model is on its device and in its final dtype (an FP8 buffer must not be cast by a later
    ``.half()``). Nothing is swapped where the kernel cannot run (CPU without the interpreter, no
    Triton) unless ``force``."""
    count = 0
    for name, child in list(module.named_modules()):
        if filter is not None and not filter(name, child):
            continue
        pad = slot_padding(child)
        if pad is not None:
            w = child.weight
            if child.conv is None and channels_fit(w.shape[1], w.shape[0]) and (force or triton_conv_supported(w.device)):
                bias = child.bias if isinstance(child, PhaseUpsampleConv) else None  # a sliced conv adds its bias after the sum
                child.conv = TritonConv2d(w, bias, pad, mode, kernel)
                count += 1
            continue
        if not eligible_conv(child) or not (force or triton_conv_supported(child.weight.device)):
            continue
        module.set_submodule(name, TritonConv2d.from_conv(child, mode, kernel))
        count += 1
    return count


def with_triton_convs(module: nn.Module, mode: str, device: torch.device | str, copied: bool = False,
                      fp8_convs: Callable[[str, nn.Module], bool] | None = None) -> tuple[str, nn.Module]:
    """An engine's network with its convolutions on the Triton kernel: ``(mode that applies,
    module)``. ``mode``: one of `TRITON_CONV_MODES`; ``"mixed"`` takes the FP8-safe convs from
    ``fp8_convs`` (a ``(name, module)`` filter; a network without one runs ``"half"``). The layers are swapped in a shared
    copy (same weights; the caller's network, which other engines and the reference pipelines
    share, keeps its convs) unless ``copied`` says ``module`` is already the engine's own copy.
    Where the kernel cannot run (CPU, no Triton) the module is returned as it is and the mode is
    ``"off"``; where FP8 cannot (compute capability below 8.9) ``"mixed"`` becomes ``"half"``; each
    said in the log. ``"fp8-static"`` and ``"mixed"``: the caller calibrates the returned module
    (`calibrate_fp8_`) before it runs."""
    if mode not in TRITON_CONV_MODES:
        raise ValueError(f"triton_convs must be one of {TRITON_CONV_MODES}, got {mode!r}")
    if mode == "off":
        return mode, module
    device = torch.device(device)
    fp8_ok = fp8_supported(device) or interpreting()
    if mode == "mixed" and (fp8_convs is None or not fp8_ok):
        log.warning("'mixed' Triton convolutions run in half: %s", "this network has no convolutions where FP8 stays accurate"
                    if fp8_convs is None else f"FP8 needs compute capability >= 8.9 ({device})")
        mode = "half"
    fp8 = mode in ("fp8", "fp8-static")
    if not triton_conv_supported(device) or (fp8 and not fp8_ok):
        log.warning("Triton convolutions (%s) cannot run on %s (%s): cuDNN keeps them", mode, device,
                    "no triton" if not triton_available() else "needs CUDA" + (" with compute capability >= 8.9" if fp8 else ""))
        return "off", module
    out = module if copied else shared_copy(module)
    convert_convs_for_mode_(out, mode, fp8_convs)
    return mode, out


def convert_convs_for_mode_(module: nn.Module, mode: str, fp8_convs: Callable[[str, nn.Module], bool] | None = None) -> int:
    """`convert_convs_to_triton_` for a setting: one of `CONV_MODES` for every conv, or ``"mixed"``:
    fp8-static on the convs ``fp8_convs`` selects, half on the rest; returns how many were swapped."""
    if mode == "mixed":
        return convert_convs_to_triton_(module, "fp8-static", filter=fp8_convs) + convert_convs_to_triton_(module, "half")
    return convert_convs_to_triton_(module, mode)
