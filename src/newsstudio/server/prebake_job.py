"""Prebake as a background job, with progress a client can poll.

`newsstudio.avatar.prebake.prebake` reports each stage (decode, landmarks, prebake) frame by
frame through its `progress_cb`, which is mapped here onto the job's overall fraction."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .jobs import Job, JobError
from .uploads import SavedUpload

_STAGES = {"decode": (0.02, 0.30), "landmarks": (0.30, 0.70), "prebake": (0.70, 0.97)}


def _reporter(job: Job):
    """prebake's progress callback -> the job's overall fraction and message."""

    def report(stage: str, done: int, total: int | None) -> None:
        lo, hi = _STAGES.get(stage, (job.progress, job.progress))
        frac = done / total if total else 0.0
        job.update(lo + (hi - lo) * min(1.0, frac), f"{stage} {done}/{total or '?'}")

    return report


def run_prebake(job: Job, upload: SavedUpload, avatar_id: str, root: Path, size: tuple[int, int] | None, fit: str) -> dict[str, Any]:
    """Prebake `upload` into avatar `avatar_id`, its manifest naming the client's file as the
    source (not the temp copy); a failure is a JobError naming the client's file once (prebake's
    own texts name the temp copy)."""
    from ..avatar.landmarks import NoFaceError
    from ..avatar.prebake import prebake
    from ..media.errors import MediaError

    job.update(0.01, "decode")
    try:
        packet = prebake(upload.path, avatar_id, root=root, size=size, fit=fit, progress=False, progress_cb=_reporter(job),
                         source_name=upload.source_name)
    except NoFaceError as e:  # a photo's names the file ("no face found in x.png"), a video's the frames
        text = upload.explain(e)
        raise JobError(text if upload.name in text else f"{upload.name}: {text}") from None
    except (MediaError, ValueError) as e:
        raise JobError(f"cannot prebake {upload.name}: {upload.explain(e)}") from None
    return {"avatar_id": packet.id, "frames": packet.n_frames, "width": packet.size[0], "height": packet.size[1], "avatar_url": f"/avatars/{packet.id}"}
