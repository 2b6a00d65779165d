"""The compile and capture work this process has done, for a live server's ``/metrics``.

Why: counts that grow while sessions run are work the engines' warm-up did not cover, and each is a
stall for the sessions of that moment (a torch.compile build takes seconds on a GPU machine; a CUDA
graph capture serialises with their launches). A load test compares them level by level: a cold
first level that captures or compiles more than the next one names its cause.
"""
from __future__ import annotations

import sys

from .graph_capture import captures_total
from .static import fallbacks


def compiled_frames_total() -> int:
    """Python frames torch.compile has compiled, recompiles included (Dynamo's own tally; 0 where
    Dynamo was never imported, i.e. nothing was compiled)."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if counters is None:
        return 0
    return int(counters["frames"].get("total", 0))


def work_counts() -> dict[str, int]:
    """graph_captures, compiled_frames and fallbacks (distinct reasons a runner runs eager), since start."""
    return {"graph_captures": captures_total(), "compiled_frames": compiled_frames_total(), "fallbacks": len(fallbacks())}
