"""Deterministic, order-independent random weights (`--weights random`).

Each value depends only on its state_dict key, its shape and a salt, exactly like the
generator behind ../shared/golden, so a module that names its parameters like the official
one reproduces the golden outputs when filled this way, and benchmarks run on weights that
anyone can rebuild.
"""
from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Sequence

import torch


def _generator(key: str, salt: int) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(f"{salt}:{key}".encode()))


@torch.no_grad()
def seeded_tensor(key: str, shape: Sequence[int], salt: int = 0) -> torch.Tensor:
    """The float32 value a state_dict entry `key` of this shape gets."""
    g = _generator(key, salt)
    shape = tuple(int(s) for s in shape)
    leaf = key.rsplit(".", 1)[-1]
    if leaf == "running_var":
        return torch.rand(shape, generator=g) + 0.5
    if leaf == "running_mean":
        return torch.randn(shape, generator=g) * 0.1
    if leaf.endswith("_u") or leaf.endswith("_v"):
        v = torch.randn(shape, generator=g)
        return v / v.norm().clamp_min(1e-12)
    if len(shape) <= 1:
        if leaf.endswith("bias"):
            return torch.randn(shape, generator=g) * 0.1
        return 1.0 + torch.randn(shape, generator=g) * 0.1
    fan_in = max(1, math.prod(shape) // shape[0])
    return torch.randn(shape, generator=g) / fan_in**0.5


@torch.no_grad()
def fill_seeded_(module: torch.nn.Module, salt: int = 0, skip: Iterable[str] = ("freqs",)) -> torch.nn.Module:
    """Overwrite every floating-point parameter and buffer in place; integer entries and
    deterministic buffers (names containing an entry of `skip`) keep their values."""
    skip = tuple(skip)
    for key, t in module.state_dict(keep_vars=True).items():
        if not t.is_floating_point():
            continue
        if any(s in key.rsplit(".", 1)[-1] for s in skip):
            continue
        t.data.copy_(seeded_tensor(key, t.shape, salt).to(device=t.device, dtype=t.dtype))
    return module


def seeded_input(name: str, shape: Sequence[int], salt: int = 0, scale: float = 1.0) -> torch.Tensor:
    """A reproducible standard-normal test input."""
    return torch.randn(tuple(shape), generator=_generator("input:" + name, salt)) * scale
