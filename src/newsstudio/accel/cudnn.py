"""cuDNN autotuning (`torch.backends.cudnn.benchmark`) for engines on CUDA.

The engines call every convolution with a few fixed shapes (one per batch bucket), so letting
cuDNN time its algorithms once per shape -- during warm-up, before any CUDA graph is captured --
is cheap and can replace a slow heuristic choice (the first Ditto profile showed an sm80
"indexed" implicit-GEMM kernel taking 30 ms per chunk for one Conv3d). The flag is process-wide;
turning it on does not change results beyond the rounding differences between algorithms.
"""
from __future__ import annotations

import torch


def configure_cudnn(device: torch.device, benchmark: bool | None = None) -> bool:
    """Set cuDNN autotuning for a CUDA engine (default on) and return the setting; on other
    devices nothing changes and False is returned."""
    if torch.device(device).type != "cuda":
        return False
    on = True if benchmark is None else bool(benchmark)
    torch.backends.cudnn.benchmark = on
    return on
