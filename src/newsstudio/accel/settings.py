"""How a neural engine runs on its device: one place that turns the engine's keyword arguments
into the accel mode, the weight layout and cuDNN autotuning, with the measured defaults."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .cudnn import configure_cudnn
from .static import MODES


@dataclass(frozen=True)
class AccelSettings:
    mode: str  # a StaticBatchRunner / BucketedRunner mode
    channels_last: bool
    cudnn_benchmark: bool

    @property
    def front_end_mode(self) -> str:
        """Mode of the small launch-bound networks around the renderer (audio encoders, the LMDM
        sampler): CUDA graphs whenever the engine graphs at all (they are thousands of tiny kernels:
        the launches are the cost), never compiled (compile time for little gain)."""
        return "cudagraph" if "cudagraph" in self.mode else "eager"


def resolve_accel(device: torch.device, accel: str | None = None, compile: bool = False,
                  channels_last: bool | None = None, cudnn_benchmark: bool | None = None,
                  dtype: torch.dtype = torch.float32) -> AccelSettings:
    """Defaults: CUDA graphs on CUDA (``compile=True`` asks for compile + CUDA graphs), eager
    elsewhere; channels_last with a compile mode (measured on an H200, benchmarks/RESULTS.md:
    it pays with torch.compile and costs 6-14 % under plain CUDA graphs) and for half precision on
    the CPU (an NCHW bfloat16/float16 conv takes a slow path there: 35 s vs 0.9 s NHWC for a
    128->256 3x3 conv at 128x128 on an AVX2 CPU); cuDNN autotuning on with CUDA (accel/cudnn.py,
    which sets the process-wide flag)."""
    if accel is None:
        accel = ("compile+cudagraph" if compile else "cudagraph") if device.type == "cuda" else "eager"
    if accel not in MODES:
        raise ValueError(f"accel must be one of {MODES}, got {accel!r}")
    half_cpu = device.type == "cpu" and dtype in (torch.bfloat16, torch.float16)
    cl = ((device.type == "cuda" and "compile" in accel) or half_cpu) if channels_last is None else bool(channels_last)
    return AccelSettings(accel, cl, configure_cudnn(device, cudnn_benchmark))
