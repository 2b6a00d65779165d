"""A copy of a module tree that shares every parameter and buffer with the original.

Why: the exact conv rewrites (upsample_conv.py, depth_sliced_conv3d.py, Ditto's regrouped.py)
replace a few layers of an engine's networks, while the networks themselves are shared (model
cache) with other engines and the benchmarks' reference pipelines, which must keep the plain
forms. A shared copy costs only the new layers' weights.
"""
from __future__ import annotations

import copy
from collections.abc import Callable

from torch import nn

__all__ = ["shared_copy", "shared_copy_replacing"]


def shared_copy(module: nn.Module) -> nn.Module:
    memo = {id(t): t for t in (*module.parameters(), *module.buffers())}
    return copy.deepcopy(module, memo)


def shared_copy_replacing(module: nn.Module, replacement: Callable[[nn.Module], nn.Module | None]) -> tuple[nn.Module, int]:
    """A `shared_copy` of ``module`` in which every submodule that ``replacement`` maps to a new
    module (not None) is swapped for it, and how many were."""
    out = shared_copy(module)
    count = 0
    for name, child in list(out.named_modules()):
        new = replacement(child)
        if new is not None:
            out.set_submodule(name, new)
            count += 1
    return out, count
