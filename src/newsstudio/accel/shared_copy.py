"""A copy of a module tree that shares every parameter and buffer with the original.

Why: the exact conv rewrites (upsample_conv.py, depth_sliced_conv3d.py, Ditto's regrouped.py)
replace a few layers of an engine's networks, while the networks themselves are shared (model
cache) with other engines and the benchmarks' reference pipelines, which must keep the plain
forms. A shared copy costs only the new layers' weights.
"""
from __future__ import annotations

import copy

from torch import nn

__all__ = ["shared_copy"]


def shared_copy(module: nn.Module) -> nn.Module:
    memo = {id(t): t for t in (*module.parameters(), *module.buffers())}
    return copy.deepcopy(module, memo)
