"""Precision and memory-format helpers: half-precision casts that keep what must stay float32,
channels_last for 4-D and 5-D weights, and a TF32 switch that restores the previous state.

Why not `module.half()`: it also casts schedule/rotary buffers (LMDM's `alphas_cumprod`,
`freqs`), whose float32 values define the function, and `module.to(memory_format=channels_last)`
raises on 5-D (Conv3d) weights, which Ditto's warping network has.
"""
from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterable, Iterator

import torch
from torch import nn

DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32, "float32": torch.float32,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
}
# Buffers whose leaf name contains one of these stay float32 under `cast_` (schedules, rotary
# frequencies): the code reading them upcasts or gathers and casts the result itself.
KEEP_FP32_BUFFERS: tuple[str, ...] = ("freqs", "alphas_cumprod")
# Normalisation layers, for `keep_fp32=NORM_TYPES`. PyTorch's CUDA norm kernels already accumulate
# statistics in float32 for half inputs, so this is only needed where a norm's *output* must be
# float32-accurate (it is cast back to the input dtype afterwards).
NORM_TYPES: tuple[type[nn.Module], ...] = (
    nn.GroupNorm, nn.LayerNorm, nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d,
    nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d,
)


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """'fp16' / 'bf16' / 'fp32' (or a torch.dtype) -> torch.dtype."""
    if isinstance(name, torch.dtype):
        return name
    try:
        return DTYPES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; use one of {sorted(set(DTYPES))}") from None


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}.get(dtype, str(dtype))


def _to_fp32_args(args: tuple) -> tuple:
    return tuple(a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)


def _install_fp32_island(mod: nn.Module) -> None:
    """Hooks that run `mod` in float32 and hand its output back in the caller's dtype."""
    if getattr(mod, "_ns_fp32_island", False):
        return

    def pre(m: nn.Module, args: tuple) -> tuple:
        dt = next((a.dtype for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()), None)
        m._ns_in_dtype = dt  # type: ignore[attr-defined]
        return _to_fp32_args(args)

    def post(m: nn.Module, args: tuple, out):
        dt = getattr(m, "_ns_in_dtype", None)
        if dt is not None and isinstance(out, torch.Tensor) and out.is_floating_point():
            return out.to(dt)
        return out

    mod.register_forward_pre_hook(pre)
    mod.register_forward_hook(post)
    mod._ns_fp32_island = True  # type: ignore[attr-defined]


@torch.no_grad()
def cast_(
    module: nn.Module,
    dtype: torch.dtype | str,
    *,
    keep_fp32: tuple[type[nn.Module], ...] | Callable[[str, nn.Module], bool] = (),
    keep_fp32_buffers: Iterable[str] = KEEP_FP32_BUFFERS,
) -> nn.Module:
    """Cast floating-point parameters and buffers of `module` to `dtype` in place; returns it.

    * `keep_fp32`: module types (e.g. `NORM_TYPES`) or a predicate `(name, module) -> bool`; those
      modules keep float32 weights and get hooks that run them on float32 inputs and return
      their output in the input's dtype.
    * buffers whose leaf name contains an entry of `keep_fp32_buffers` stay float32.
    * float8 tensors (quantised weights) are never touched, nor the buffers of modules that set
      `keeps_buffer_dtypes = True` (`Fp8Linear`'s float32 scales). Works for diffusers models too (it
      does not go through their `.to` override).
    """
    dtype = parse_dtype(dtype)
    keep_buf = tuple(keep_fp32_buffers)
    if isinstance(keep_fp32, tuple):
        types = keep_fp32
        keep_fn: Callable[[str, nn.Module], bool] = lambda _n, m: bool(types) and isinstance(m, types)  # noqa: E731
    else:
        keep_fn = keep_fp32
    kept: set[int] = set()
    for name, mod in module.named_modules():
        if keep_fn(name, mod):
            kept.add(id(mod))
            _install_fp32_island(mod)
    for mod in module.modules():
        target = torch.float32 if id(mod) in kept else dtype
        for pname, p in mod.named_parameters(recurse=False):
            if p.is_floating_point() and p.dtype.itemsize > 1 and p.dtype != target:
                p.data = p.data.to(target)
        for bname, b in mod.named_buffers(recurse=False):
            if b is None or not b.is_floating_point() or b.dtype.itemsize == 1:
                continue
            if getattr(mod, "keeps_buffer_dtypes", False):  # Fp8Linear: float32 scales stay float32
                continue
            t = torch.float32 if any(k in bname for k in keep_buf) else target
            if b.dtype != t:
                setattr(mod, bname, b.to(t))
    return module


def memory_format_for(t: torch.Tensor) -> torch.memory_format | None:
    """channels_last for 4-D, channels_last_3d for 5-D, None otherwise."""
    return {4: torch.channels_last, 5: torch.channels_last_3d}.get(t.dim())


def channels_last(x: torch.Tensor) -> torch.Tensor:
    """A 4-D / 5-D tensor in channels_last(_3d) layout (other ranks unchanged)."""
    fmt = memory_format_for(x)
    return x if fmt is None else x.contiguous(memory_format=fmt)


@torch.no_grad()
def to_channels_last_(module: nn.Module) -> nn.Module:
    """Every 4-D parameter/buffer to channels_last and every 5-D one to channels_last_3d, in place.
    (`module.to(memory_format=torch.channels_last)` raises on Conv3d weights.)"""
    for mod in module.modules():
        for _, p in mod.named_parameters(recurse=False):
            if memory_format_for(p) is not None:
                p.data = channels_last(p.data)
        for bname, b in mod.named_buffers(recurse=False):
            if b is not None and memory_format_for(b) is not None:
                setattr(mod, bname, channels_last(b))
    return module


def prepare_(module: nn.Module, dtype: torch.dtype | str | None = None, *, channels_last: bool = False,
             keep_fp32: tuple[type[nn.Module], ...] | Callable[[str, nn.Module], bool] = ()) -> nn.Module:
    """`cast_` (when `dtype` is given) then `to_channels_last_` (when asked); eval mode, no grads."""
    if dtype is not None:
        cast_(module, dtype, keep_fp32=keep_fp32)
    if channels_last:
        to_channels_last_(module)
    return module.eval().requires_grad_(False)


def _tf32_state() -> tuple[bool, bool, str]:
    try:
        return (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
                torch.get_float32_matmul_precision())
    except RuntimeError:  # flags set through a mix of torch's legacy and new (2.9+) APIs
        return (False, True, "highest")  # torch's defaults


@contextlib.contextmanager
def tf32(enabled: bool = True) -> Iterator[None]:
    """TF32 matmuls and convolutions on (or off) inside the block; the previous state comes back
    after. Off is the float32 reference: cuDNN's default is *on* for convolutions.

    Uses only the legacy switches (`allow_tf32`, `set_float32_matmul_precision`): torch 2.9+
    refuses to *read* them once the new `fp32_precision` API has set conflicting values, and
    Inductor and other libraries still read them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prev = _tf32_state()
        torch.backends.cuda.matmul.allow_tf32 = enabled
        torch.backends.cudnn.allow_tf32 = enabled
        torch.set_float32_matmul_precision("high" if enabled else "highest")
    try:
        yield
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = prev[0], prev[1]
            torch.set_float32_matmul_precision(prev[2])
