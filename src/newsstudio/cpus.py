"""How many CPUs this process may use, for sizing thread pools and encoder threads."""
from __future__ import annotations

import os


def usable_cpus() -> int:
    """The CPUs in this process's affinity mask (at least 1). Why not `os.cpu_count()`: that counts
    the host's CPUs, and a container or a `taskset` limited to a few of them would then start
    threads for all of them."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity API on this platform
        return max(1, os.cpu_count() or 1)
