"""Small constant tensors (lookup tables, index lists, masks, grids) made once per device.

Why: a render call that builds such a tensor afresh pays a kernel launch or, worse, a host-to-device
copy (a stall) on every call; built once and kept, it costs a dictionary lookup. One cache for all
of them, keyed by a name, the device and whatever else the tensor depends on.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable

import torch

__all__ = ["device_constant"]

_CONSTANTS: dict[tuple, torch.Tensor] = {}


def device_constant(name: str, device: torch.device | str, make: Callable[[torch.device], torch.Tensor],
                    *key: Hashable) -> torch.Tensor:
    """``make(device)``, made at the first call for (``name``, ``device``, ``key``) and returned as is after
    that: callers must not change it in place."""
    device = torch.device(device)
    k = (name, device.type, device.index, *key)
    t = _CONSTANTS.get(k)
    if t is None:
        t = _CONSTANTS[k] = make(device)
    return t
