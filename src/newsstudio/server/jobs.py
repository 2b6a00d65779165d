"""Background jobs (avatar prebakes, clip renders) with progress a client can poll."""
from __future__ import annotations

import threading
import time
import traceback
import uuid
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import logging

log = logging.getLogger("newsstudio.server")


class JobError(Exception):
    """A job failure whose message is meant for the user (no traceback needed)."""


@dataclass
class Job:
    kind: str
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    state: str = "queued"
    progress: float = 0.0
    stage: str = "queued"
    error: str | None = None
    created: float = field(default_factory=time.time)
    started: float | None = None
    finished: float | None = None
    result: dict[str, Any] | None = None

    def update(self, progress: float | None = None, stage: str | None = None) -> None:
        if progress is not None:
            self.progress = float(min(1.0, max(self.progress, progress)))
        if stage is not None:
            self.stage = stage

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("id", "kind", "state", "progress", "stage", "error", "created", "started", "finished", "result")}


class JobManager:
    """Runs jobs on small thread pools (one per kind), keeps the last `keep` finished jobs."""

    def __init__(self, workers: dict[str, int], keep: int = 500):
        self._pools = {kind: ThreadPoolExecutor(max_workers=n, thread_name_prefix=f"newsstudio-{kind}") for kind, n in workers.items()}
        self._jobs: OrderedDict[str, Job] = OrderedDict()
        self._lock = threading.Lock()
        self.keep = keep

    def submit(self, kind: str, fn: Callable[[Job], dict[str, Any] | None], cleanup: Callable[[], None] | None = None) -> Job:
        job = Job(kind)
        with self._lock:
            self._jobs[job.id] = job
            self._prune()
        self._pools[kind].submit(self._run, job, fn, cleanup)
        return job

    def _run(self, job: Job, fn, cleanup) -> None:
        """Run ``fn``, then ``cleanup``, and only then publish the outcome: a client that sees
        "done" or "failed" may retry at once (same avatar id) and must find the temp upload gone
        and the id free (publishing first lost that race under load)."""
        job.state, job.started, job.stage = "running", time.time(), "starting"
        result: dict[str, Any] | None = None
        error: str | None = None
        try:
            result = fn(job)
        except JobError as e:
            error = str(e)
        except Exception as e:  # noqa: BLE001 - reported to the client
            log.warning("job %s (%s) failed:\n%s", job.id, job.kind, traceback.format_exc())
            error = f"{type(e).__name__}: {e}"
        finally:
            if cleanup is not None:
                try:
                    cleanup()
                except Exception:  # noqa: BLE001
                    log.exception("job cleanup failed")
            job.finished = time.time()
        if error is None:
            job.result = result
            job.progress, job.stage, job.state = 1.0, "done", "done"
        else:
            job.state, job.error, job.stage = "failed", error, "failed"

    def _prune(self) -> None:
        done = [j for j in self._jobs.values() if j.state in ("done", "failed")]
        for j in done[: max(0, len(self._jobs) - self.keep)]:
            self._jobs.pop(j.id, None)

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            return self._jobs.get(job_id)

    def counts(self) -> dict[str, int]:
        out = {"queued": 0, "running": 0, "done": 0, "failed": 0}
        with self._lock:
            for j in self._jobs.values():
                out[j.state] += 1
        return out

    def active(self, kind: str | None = None) -> list[Job]:
        with self._lock:
            return [j for j in self._jobs.values() if j.state in ("queued", "running") and (kind is None or j.kind == kind)]

    def shutdown(self) -> None:
        for p in self._pools.values():
            p.shutdown(wait=False, cancel_futures=True)
