"""Background jobs: a finished job's outcome is published only after its cleanup ran."""
from __future__ import annotations

import threading
import time

from newsstudio.server.jobs import JobError, JobManager


def _wait_finished(jobs: JobManager, job_id: str, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = jobs.get(job_id)
        if job.state in ("done", "failed"):
            return job.to_dict()
        time.sleep(0.005)
    raise AssertionError("job did not finish")


def test_a_client_that_sees_the_outcome_finds_the_cleanup_done():
    """A client retries as soon as it reads "failed" (same avatar id): the temp upload must be gone
    and the id free by then. The cleanup here is slow on purpose; the state must wait for it."""
    jobs = JobManager({"prebake": 1})
    for outcome in ("done", "failed", "crashed"):
        cleaned = threading.Event()

        def cleanup() -> None:
            time.sleep(0.3)
            cleaned.set()

        def work(job, outcome=outcome):
            if outcome == "failed":
                raise JobError("no face found in 'wall.png'")
            if outcome == "crashed":
                raise RuntimeError("boom")
            return {"ok": True}

        job = jobs.submit("prebake", work, cleanup=cleanup)
        seen = _wait_finished(jobs, job.id)
        assert cleaned.is_set(), f"{outcome}: state {seen['state']} published before the cleanup ran"
        final = jobs.get(job.id)
        assert final.state == ("done" if outcome == "done" else "failed")
        assert final.finished is not None
        if outcome == "done":
            assert final.result == {"ok": True} and final.progress == 1.0
        else:
            assert final.error == ("no face found in 'wall.png'" if outcome == "failed" else "RuntimeError: boom")
    jobs.shutdown()
