"""FP8 (e4m3) linear layers for Hopper-class GPUs (compute capability >= 8.9).

`Fp8Linear` holds the weight quantised once (`float8_e4m3fn`, a float32 scale per tensor or per
output row) and quantises its input on every call (amax of the tensor or of each row, dynamic),
then multiplies on the FP8 tensor cores with `torch._scaled_mm`:

    y = (x_q · s_x) @ (w_q · s_w)^T + b,   x_q = round_e4m3(x / s_x),  s = amax / 448

`torch._scaled_mm(a, b, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None,
use_fast_accum=False)` (unchanged from torch 2.5 to 2.13) wants `a` row-major [M, K], `b`
column-major [K, N] (our [N, K] weight, transposed), K and N multiples of 16, float32 scales:
0-d (per tensor) or [M, 1] and [1, N] (per row; bf16 output). Layers whose dims are not multiples
of 16 are left alone. Where FP8 is not available (CPU, older GPUs, no `_scaled_mm`) nothing is
converted: `to_fp8` returns the layer unchanged and `convert_linears_to_fp8_` returns 0.

Accuracy: e4m3 keeps 3 mantissa bits, so each quantised operand carries a relative rounding
error of at most 2^-4; a product of two such operands lands near 3-5e-2 relative L2 on random
data (`fp8_matmul_reference` restates the arithmetic in plain torch, for tests on any device).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

E4M3 = torch.float8_e4m3fn
E4M3_MAX = float(torch.finfo(E4M3).max)  # 448
GRANULARITIES = ("tensor", "row")
_EPS = 1e-12


def has_scaled_mm() -> bool:
    return hasattr(torch, "_scaled_mm")


def fp8_supported(device: torch.device | str | None = None) -> bool:
    """FP8 matmuls possible on `device` (default: the current CUDA device): CUDA, capability
    >= (8, 9) (Ada, Hopper, Blackwell) and a torch with `_scaled_mm`."""
    if not has_scaled_mm() or not torch.cuda.is_available():
        return False
    dev = torch.device("cuda") if device is None else torch.device(device)
    if dev.type != "cuda":
        return False
    try:
        return torch.cuda.get_device_capability(dev) >= (8, 9)
    except Exception:
        return False


def quantize_e4m3(x: torch.Tensor, granularity: str = "tensor") -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] -> (q float8_e4m3fn, scale float32) with x ≈ q * scale.

    'tensor': one 0-d scale = amax(|x|) / 448; 'row': one scale per row over the last dim,
    shaped [..., 1]. A zero tensor/row gets a tiny scale (its q is 0)."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    xf = x.float()
    amax = xf.abs().amax() if granularity == "tensor" else xf.abs().amax(dim=-1, keepdim=True)
    scale = (amax / E4M3_MAX).clamp_min(_EPS)
    q = (xf / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return q, scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale


def fp8_matmul_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                         granularity: str = "tensor") -> torch.Tensor:
    """Plain-torch float32 restatement of `Fp8Linear`: quantise x (dynamic) and the weight [N, K]
    to e4m3 with the same scales, dequantise, matmul in float32. Any device."""
    xq, xs = quantize_e4m3(x.reshape(-1, x.shape[-1]), granularity)
    wq, ws = quantize_e4m3(weight, granularity)
    y = dequantize(xq, xs) @ dequantize(wq, ws).t()
    if bias is not None:
        y = y + bias.float()
    return y.reshape(*x.shape[:-1], weight.shape[0])


_FUSED_BIAS: dict[tuple[str, int | None], frozenset[torch.dtype]] = {}


def fused_bias_dtypes(device: torch.device | str) -> frozenset[torch.dtype]:
    """Output dtypes (fp16 / bf16) for which this torch's `_scaled_mm` accepts a bias of the same
    dtype on `device`, found by trying a 16x16 product once per device (cached)."""
    dev = torch.device(device)
    key = (dev.type, dev.index)
    if key not in _FUSED_BIAS:
        ok = set()
        a = torch.ones(16, 16, device=dev).to(E4M3)
        one = torch.ones((), device=dev)
        for dt in (torch.float16, torch.bfloat16):
            try:
                y = torch._scaled_mm(a, a.t(), scale_a=one, scale_b=one, bias=torch.ones(16, device=dev, dtype=dt),
                                     out_dtype=dt)
                y = y[0] if isinstance(y, tuple) else y
                if float(y[0, 0]) == 17.0:
                    ok.add(dt)
            except (RuntimeError, TypeError, NotImplementedError):
                pass
        _FUSED_BIAS[key] = frozenset(ok)
    return _FUSED_BIAS[key]


def eligible(linear: nn.Module) -> bool:
    """An nn.Linear with floating weights whose in and out features are multiples of 16."""
    return (isinstance(linear, nn.Linear) and linear.weight.is_floating_point()
            and linear.weight.dtype.itemsize > 1
            and linear.in_features % 16 == 0 and linear.out_features % 16 == 0)


class Fp8Linear(nn.Module):
    """Drop-in for an `nn.Linear` (same call, same output dtype as its input) computing through
    FP8. Holds `weight_fp8` [N, K] e4m3, `weight_scale` float32 (0-d or [1, N]) and the bias in
    the original dtype. Dtype casts of the parent (`.half()`) leave the quantised weight and its
    scale alone; device moves take them along."""

    keeps_buffer_dtypes = True  # precision.cast_ leaves weight_fp8 / weight_scale alone

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, granularity: str = "tensor",
                 fast_accum: bool = True, device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        if granularity not in GRANULARITIES:
            raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
        if in_features % 16 or out_features % 16:
            raise ValueError(f"FP8 matmul needs in/out features divisible by 16, got {in_features}x{out_features}")
        self.in_features, self.out_features = in_features, out_features
        self.granularity, self.fast_accum = granularity, fast_accum
        self.register_buffer("weight_fp8", torch.zeros(out_features, in_features, dtype=E4M3, device=device))
        sshape = () if granularity == "tensor" else (1, out_features)
        self.register_buffer("weight_scale", torch.ones(sshape, dtype=torch.float32, device=device))
        self.bias = nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype), requires_grad=False) if bias else None
        # Output dtypes for which _scaled_mm takes the bias itself (probed once per device at
        # conversion, outside any compiled region); otherwise the bias is added afterwards.
        self.fused_bias_dtypes: tuple[torch.dtype, ...] = ()

    @classmethod
    @torch.no_grad()
    def from_linear(cls, linear: nn.Linear, granularity: str = "tensor", fast_accum: bool = True) -> "Fp8Linear":
        w = linear.weight.detach()
        m = cls(linear.in_features, linear.out_features, linear.bias is not None, granularity=granularity,
                fast_accum=fast_accum, device=w.device, dtype=w.dtype)
        q, s = quantize_e4m3(w, granularity)  # s: 0-d or [N, 1]
        m.weight_fp8.copy_(q)
        m.weight_scale.copy_(s.reshape(m.weight_scale.shape))
        if linear.bias is not None:
            m.bias.copy_(linear.bias.detach())
            m.fused_bias_dtypes = tuple(sorted(fused_bias_dtypes(w.device), key=str))
        return m.train(linear.training)

    def dequantized_weight(self) -> torch.Tensor:
        """The float32 weight this layer multiplies by, [N, K]."""
        s = self.weight_scale if self.granularity == "tensor" else self.weight_scale.reshape(-1, 1)
        return self.weight_fp8.float() * s

    def _apply(self, fn, recurse=True):  # keep e4m3 weights and float32 scales through .half() etc.
        w, s = self.weight_fp8, self.weight_scale
        super()._apply(fn, recurse)
        dev = self.weight_fp8.device
        self.weight_fp8, self.weight_scale = w.to(dev), s.to(dev)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        out_dtype = x.dtype if x.dtype in (torch.float16, torch.bfloat16, torch.float32) else torch.float32
        x2 = x.reshape(-1, self.in_features)
        if x2.shape[0] == 0:
            return x.new_zeros((*lead, self.out_features), dtype=out_dtype)
        xq, xs = quantize_e4m3(x2, self.granularity)
        xq = xq.contiguous()
        wt = self.weight_fp8.t()  # [K, N] column-major view
        bias = None if self.bias is None else self.bias.to(out_dtype)
        if self.granularity == "tensor":
            fuse = bias is not None and out_dtype in self.fused_bias_dtypes
            y = torch._scaled_mm(xq, wt, scale_a=xs, scale_b=self.weight_scale, bias=bias if fuse else None,
                                 out_dtype=out_dtype, use_fast_accum=self.fast_accum)
        else:
            fuse = False
            y = torch._scaled_mm(xq, wt, scale_a=xs.contiguous(), scale_b=self.weight_scale,
                                 out_dtype=torch.bfloat16, use_fast_accum=self.fast_accum)
        if isinstance(y, tuple):  # torch < 2.5 returned (out, amax)
            y = y[0]
        y = y.to(out_dtype)
        if bias is not None and not fuse:
            y = y + bias
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"granularity={self.granularity!r}, fast_accum={self.fast_accum}")


def to_fp8(linear: nn.Module, granularity: str = "tensor", fast_accum: bool = True, *, force: bool = False) -> nn.Module:
    """An `Fp8Linear` copy of `linear`, or `linear` itself when FP8 is unavailable on its device
    (unless `force`, for CPU tests of the arithmetic where `_scaled_mm` exists) or its shape does
    not fit (dims not multiples of 16, not an nn.Linear)."""
    if not eligible(linear):
        return linear
    dev = linear.weight.device
    if not (fp8_supported(dev) or (force and has_scaled_mm())):
        return linear
    return Fp8Linear.from_linear(linear, granularity, fast_accum)


def convert_linears_to_fp8_(
    module: nn.Module,
    filter: Callable[[str, nn.Linear], bool] | None = None,  # noqa: A002 (the brief's name)
    *,
    granularity: str = "tensor",
    fast_accum: bool = True,
    force: bool = False,
) -> int:
    """Replace, in place, every eligible `nn.Linear` of `module` (for which `filter(name, layer)`
    is true, when given) by an `Fp8Linear`. Returns how many were converted: 0, module untouched,
    where FP8 is unavailable (CPU, capability < 8.9, no `_scaled_mm`) unless `force`.
    Convert after casting the module to its half dtype (the bias keeps the dtype it has then)."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    if not has_scaled_mm():
        return 0
    count = 0
    for parent_name, parent in list(module.named_modules()):
        for child_name, child in list(parent.named_children()):
            if not eligible(child):
                continue
            full = f"{parent_name}.{child_name}" if parent_name else child_name
            if filter is not None and not filter(full, child):  # type: ignore[arg-type]
                continue
            new = to_fp8(child, granularity, fast_accum, force=force)
            if new is not child:
                setattr(parent, child_name, new)
                count += 1
    return count


def fp8_linear_reference(layer: Fp8Linear, x: torch.Tensor) -> torch.Tensor:
    """What `layer(x)` should compute, in plain float32 torch (for tests)."""
    xq, xs = quantize_e4m3(x.reshape(-1, x.shape[-1]), layer.granularity)
    y = dequantize(xq, xs) @ layer.dequantized_weight().t()
    if layer.bias is not None:
        y = y + layer.bias.float()
    return y.reshape(*x.shape[:-1], layer.out_features)


__all__ = [
    "E4M3", "E4M3_MAX", "Fp8Linear", "convert_linears_to_fp8_", "dequantize", "eligible", "fp8_linear_reference",
    "fp8_matmul_reference", "fp8_supported", "has_scaled_mm", "quantize_e4m3", "to_fp8",
]
