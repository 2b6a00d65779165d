"""Prebake as a background job, with progress a client can poll.

`newsstudio.avatar.prebake.prebake` reports progress through tqdm bars (decode, landmarks,
prebake). While a job runs, those bars are swapped for one that forwards to the job; prebake
jobs run one at a time (a single worker), so the swap is never shared by two jobs."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .jobs import Job, JobError

_STAGES = {"decode": (0.02, 0.30), "landmarks": (0.30, 0.70), "prebake": (0.70, 0.97)}
_swap_lock = threading.Lock()


class _JobBar:
    job: Job | None = None

    def __init__(self, iterable=None, total=None, desc=None, **_: Any):
        self.iterable = iterable
        self.total = total if total is not None else (len(iterable) if hasattr(iterable, "__len__") else None)
        self.desc = desc or "working"
        self.n = 0
        self._report()

    def _report(self) -> None:
        job = type(self).job
        if job is None:
            return
        lo, hi = _STAGES.get(self.desc, (job.progress, job.progress))
        frac = (self.n / self.total) if self.total else 0.0
        job.update(lo + (hi - lo) * min(1.0, frac), f"{self.desc} {self.n}/{self.total or '?'}")

    def __iter__(self):
        for x in self.iterable:
            yield x
            self.n += 1
            self._report()

    def update(self, n: int = 1) -> None:
        self.n += n
        self._report()

    def close(self) -> None:
        pass

    def set_postfix(self, *a: Any, **k: Any) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


@contextmanager
def _progress_to(job: Job):
    from ..avatar import prebake as mod

    with _swap_lock:
        saved = mod.tqdm
        mod.tqdm = _JobBar
        _JobBar.job = job
        try:
            yield
        finally:
            mod.tqdm = saved
            _JobBar.job = None


def run_prebake(job: Job, source: Path, avatar_id: str, root: Path, size: tuple[int, int] | None, fit: str) -> dict[str, Any]:
    from ..avatar.landmarks import NoFaceError
    from ..avatar.prebake import prebake
    from ..media.errors import MediaError

    job.update(0.01, "decode")
    try:
        with _progress_to(job):
            packet = prebake(source, avatar_id, root=root, size=size, fit=fit, progress=True)
    except NoFaceError as e:
        raise JobError(f"no face found in the upload: {e}") from None
    except (MediaError, ValueError) as e:
        raise JobError(f"cannot prebake the upload: {e}") from None
    return {"avatar_id": packet.id, "frames": packet.n_frames, "width": packet.size[0], "height": packet.size[1], "avatar_url": f"/avatars/{packet.id}"}
